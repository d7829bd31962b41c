//! Auto-trait matrix: every public handle, adaptor and layer can cross
//! threads (`Send + Sync`) and be moved freely (`Unpin`). A regression here
//! fails to compile.

use std::sync::Arc;

use streamalloc::adaptors::{
    Budget, BudgetLayer, BudgetResource, DebugGuard, DebugGuardLayer, GpuPoison, GuardConfig,
    Identity, RetryOnOom, RetryOnOomLayer, Stack, Stats, StatsLayer, StatsResource, StatsSnapshot,
    TracingLayer, TracingResource,
};
use streamalloc::gpu::sim::SimGpu;
use streamalloc::launch::LaunchRecorder;
use streamalloc::{DeviceMemoryResource, ResourceBuilder, SimResource};

fn all<T: Send + Sync + Unpin>() {}
fn resource<T: DeviceMemoryResource + Send + Sync + Unpin>() {}

#[test]
fn handles_layers_and_adaptors_are_send_sync_unpin() {
    all::<Budget>();
    all::<Stats>();
    all::<StatsSnapshot>();
    all::<GuardConfig>();
    all::<GpuPoison<SimGpu>>();
    all::<BudgetLayer>();
    all::<StatsLayer>();
    all::<TracingLayer>();
    all::<RetryOnOomLayer>();
    all::<DebugGuardLayer>();
    all::<Stack<StatsLayer, Identity>>();
    all::<ResourceBuilder<Stack<BudgetLayer, Identity>>>();
    all::<LaunchRecorder<'static, SimResource>>();

    type R = Arc<SimResource>;
    resource::<BudgetResource<R>>();
    resource::<StatsResource<R>>();
    resource::<TracingResource<R>>();
    resource::<RetryOnOom<R>>();
    resource::<DebugGuard<R>>();
    resource::<TracingResource<RetryOnOom<BudgetResource<StatsResource<DebugGuard<R>>>>>>();
}
