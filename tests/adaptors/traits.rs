//! Auto-trait matrix: every public handle, adaptor and layer can cross
//! threads (`Send + Sync`) and be moved freely (`Unpin`). A regression here
//! fails to compile.

use std::sync::Arc;

use streamalloc::LaunchRecorder;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{
    Budget, BudgetLayer, BudgetResource, DebugGuardLayer, DebugGuardResource, GuardConfig,
    Identity, MemsetPoisonFill, RetryOnOomLayer, RetryOnOomResource, Stack, Stats, StatsLayer,
    StatsResource, StatsSnapshot, TracingLayer, TracingResource,
};
use streamalloc::{DeviceMemoryResource, ResourceBuilder, SimResource};

fn all<T: Send + Sync + Unpin>() {}
fn resource<T: DeviceMemoryResource + Send + Sync + Unpin>() {}

#[test]
fn handles_layers_and_adaptors_are_send_sync_unpin() {
    all::<Budget>();
    all::<Stats>();
    all::<StatsSnapshot>();
    all::<GuardConfig>();
    all::<MemsetPoisonFill<SimGpu>>();
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
    resource::<RetryOnOomResource<R>>();
    resource::<DebugGuardResource<R>>();
    resource::<
        TracingResource<RetryOnOomResource<BudgetResource<StatsResource<DebugGuardResource<R>>>>>,
    >();
}
