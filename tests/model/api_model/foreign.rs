//! Streams the crate cannot vouch for: a [`StreamId`] handed out by
//! another pool (a second [`Device`] over the same simulated device, or
//! one over another simulated device of the same ordinal) or built by hand
//! with [`StreamId::new`], passed to the entry points that take a stream.
//!
//! Each must answer [`ResourceError::ForeignStream`] naming that stream,
//! and change nothing: no byte more in any book or on the device, no work
//! queued (a user's enqueue closure is never called), no race. Whatever
//! the stack, whatever the harness holds, at any step.

use std::sync::atomic::{AtomicBool, Ordering};

use streamalloc::Access;
use streamalloc::gpu::CaptureMode;

use super::*;

/// Where the stream id comes from.
#[derive(Debug, Clone, Copy)]
pub(super) enum Stranger {
    /// A second pool of the harness's own simulated device.
    SameGpu,
    /// A pool of another simulated device of the same ordinal.
    OtherGpu,
    /// `StreamId::new`: no pool.
    ByHand,
}

/// The entry point given the stream; `slot` picks a buffer or a graph
/// (nothing is called when there is none).
#[derive(Debug, Clone, Copy)]
pub(super) enum Entry {
    TryAllocate,
    Allocate,
    TryAllocateBuffer,
    Fill { slot: usize },
    CopyFrom { slot: usize },
    Launch { slot: usize },
    Completion,
    Prepare { slot: usize },
    Finish { slot: usize },
    Record { slot: usize },
    Replay { slot: usize },
    Capture,
}

/// The other pools, kept alive for the whole case.
pub(super) struct Strangers {
    same: Device<SimGpu>,
    other: Device<SimGpu>,
}

impl Strangers {
    pub(super) fn new(gpu: &Arc<SimGpu>) -> Strangers {
        Strangers {
            same: Device::simulated(gpu, STREAMS),
            other: Device::simulated(&SimGpu::builder().manual().build(), STREAMS),
        }
    }

    fn stream(&self, from: Stranger, index: usize) -> StreamId {
        match from {
            Stranger::SameGpu => self.same.stream(index % STREAMS).unwrap(),
            Stranger::OtherGpu => self.other.stream(index % STREAMS).unwrap(),
            Stranger::ByHand => StreamId::new(0, (index % STREAMS) as u32),
        }
    }
}

impl World {
    pub(super) fn foreign(&mut self, from: Stranger, index: usize, call: Entry) -> Verdict {
        let bad = self.strangers.stream(from, index);
        let before = self.books();
        let res = self.res().clone();
        let called = AtomicBool::new(false);
        let n = self.buffers.len();
        let got: ResourceResult<()> = match call {
            Entry::TryAllocate => res.try_allocate(64, bad, TAG).map(drop),
            Entry::Allocate => {
                let mut fut = res.allocate(64, bad, TAG);
                match self.drive(&mut fut, GUARD) {
                    Some(r) => r.map(drop),
                    None => return fail(format!("hang: an allocation on {bad:?} waits")),
                }
            }
            Entry::TryAllocateBuffer => res.try_allocate_buffer::<u8>(64, bad, TAG).map(drop),
            Entry::Completion => res.completion(bad).map(drop),
            Entry::Capture => res.begin_capture(bad, CaptureMode::Relaxed).map(drop),
            Entry::Replay { slot } => match self.graphs.len() {
                0 => return Ok(()),
                g => {
                    let graph = &self.graphs[slot % g].graph;
                    // SAFETY: refused before anything is queued; even so the
                    // graph touches only what its capture allocated.
                    unsafe { graph.launch(bad) }.map(drop)
                }
            },
            _ if n == 0 => return Ok(()),
            Entry::Fill { slot } => self.buffers[slot % n].fill_bytes_on(bad, 3),
            Entry::CopyFrom { slot } => {
                let w = slot % n;
                let len = self.buffers[w].num_bytes();
                // A source of the same length (else the lengths are refused
                // first).
                let Some(r) = (0..n).find(|&r| r != w && self.buffers[r].num_bytes() == len) else {
                    return Ok(());
                };
                let (dst, src) = if r < w {
                    let (lo, hi) = self.buffers.split_at_mut(w);
                    (&mut hi[0], &lo[r])
                } else {
                    let (lo, hi) = self.buffers.split_at_mut(r);
                    (&mut lo[w], &hi[0])
                };
                dst.copy_from_on(bad, src)
            }
            Entry::Launch { slot } => res
                .launch(bad)
                .write(&mut self.buffers[slot % n])
                .enqueue(|_| {
                    called.store(true, Ordering::SeqCst);
                    Ok::<(), ResourceError>(())
                })
                .map(drop),
            Entry::Prepare { slot } => {
                res.prepare_block_use(self.buffers[slot % n].id(), bad, Access::Write)
            }
            Entry::Finish { slot } => res
                .finish_block_use(self.buffers[slot % n].id(), bad, Access::Read)
                .map(drop),
            Entry::Record { slot } => res.record_block_use(self.buffers[slot % n].block(), bad),
        };
        let what = format!("{call:?} with {bad:?} ({from:?})");
        match got {
            Err(ResourceError::ForeignStream { stream }) if stream == bad => {}
            other => return fail(format!("{what}: {other:?}, not ForeignStream")),
        }
        if called.load(Ordering::SeqCst) {
            return fail(format!("{what}: the user's enqueue closure ran"));
        }
        // The futures' fallback thread may reap meanwhile: the books may go
        // down, never up.
        if took(&before, &self.books()) {
            return fail(format!(
                "{what}: a refused call took memory: {before:?} -> {:?}",
                self.books()
            ));
        }
        Ok(())
    }
}
