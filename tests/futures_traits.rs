//! The auto-trait matrix of every public future and handle of the futures
//! layer: a future that stopped being `Send` (or `Unpin`) would break users
//! who spawn it; this file stops compiling first.

use streamalloc::SimResource;
use streamalloc::{AllocFuture, AsyncResource, DeallocHandle, EventFuture, ReapFuture, Reaper};

fn send_sync_unpin_static<T: Send + Sync + Unpin + 'static>() {}
fn future_of<T: std::future::Future<Output = O>, O>() {}

#[test]
fn every_future_and_handle_is_send_sync_unpin_static() {
    send_sync_unpin_static::<EventFuture>();
    send_sync_unpin_static::<AllocFuture>();
    send_sync_unpin_static::<DeallocHandle>();
    send_sync_unpin_static::<ReapFuture>();
    send_sync_unpin_static::<Reaper>();
    send_sync_unpin_static::<AsyncResource<SimResource>>();
    send_sync_unpin_static::<AsyncResource<streamalloc::AsyncCudaResource>>();
}

#[test]
fn the_futures_resolve_to_results() {
    future_of::<EventFuture, streamalloc::ResourceResult<()>>();
    future_of::<AllocFuture, streamalloc::ResourceResult<streamalloc::DeviceBlock>>();
    future_of::<DeallocHandle, streamalloc::ResourceResult<()>>();
    future_of::<ReapFuture, streamalloc::ResourceResult<()>>();
}
