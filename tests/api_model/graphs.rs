//! CUDA graphs in the harness: steps captured on a pool stream with
//! `capture_graph`, replayed on any stream, dropped at any time and on any
//! thread, with the blocks they kept in the harness's buffer slots.
//!
//! # A capture
//! `Op::Capture` allocates `temps` temporaries on the capturing stream,
//! fills the first, copies each into the next and writes it with a
//! kernel, freeing each behind the next (inside the capture: every replay
//! allocates and frees them again). With [`Keep`], one more block is
//! allocated on the capturing stream (by the capturing closure or by
//! another thread), written, and either kept past the capture (it goes to
//! the buffer slots, where every op may use, free or drop it) or dropped on
//! another thread before the capture ends. With `adopt`, a buffer the
//! harness holds is dropped on another thread while the stream captures:
//! when it is the capturing stream's, the graph adopts its free.
//!
//! # What the harness may expect
//! - A kept block has no memory behind it before the first replay, nor
//!   after its graph freed the last replay's instance: a use is refused
//!   with [`ResourceError::GraphMemoryUnbacked`].
//! - A replay is refused with the driver's `CUDA_ERROR_INVALID_VALUE`
//!   while a kept block of its capture still holds the last replay's
//!   output (the user must drop it first).
//! - Every instance is freed exactly once: after the drain the device's
//!   whole capacity is free, and the books agree with it at every step.
//!
//! - A use of a kept block on any stream is ordered after the replay
//!   that wrote it, awaited or not (under a cache too), and a launch that
//!   fails queued no replay.
//!
//! - A buffer dropped during a capture is freed exactly once, at once or
//!   (when the capture refuses its free) when the capture ends.
//!
//! # Open classes
//! None: every bug of graphs this harness found is fixed,
//! `use-after-replay` under a cache and `capture-unjoined` (a buffer whose
//! launch panicked, adopted by a capture) the last.
//!
//! # The launch's contract
//! The captured work touches only what the capture allocated (its
//! temporaries and its kept block): Safety 1 holds by construction. Safety
//! 2 (user work on a kept block the replays write again, a cache's range,
//! ordered before the next replay) is kept by awaiting every stream's
//! work before replaying a graph with a kept block when the stack has a
//! cache; a graph memory node is freed after its uses by the crate.

use streamalloc::CapturedGraph;
use streamalloc::gpu::CaptureMode;
use streamalloc::gpu::driver_code::INVALID_VALUE;

use super::*;

/// A block allocated on the capturing stream besides the temporaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    No,
    /// Allocated by the capturing closure, kept past the capture.
    Here,
    /// Allocated by another thread, kept past the capture.
    Thread,
    /// Allocated by another thread and dropped on a third before the
    /// capture ends: a temporary of the graph.
    DroppedInside,
}

/// A graph the harness holds.
pub(super) struct GraphSlot {
    pub(super) graph: CapturedGraph<Top>,
    /// The block its capture kept, if any.
    kept: Option<BlockId>,
}

impl World {
    pub(super) fn capture(
        &mut self,
        stream: usize,
        size: usize,
        temps: u8,
        keep: Keep,
        adopt: Option<usize>,
    ) -> Verdict {
        let s = self.stream(stream);
        let res = self.res().clone();
        let gpu = self.gpu.clone();
        // A free the capture refuses (a block another capture kept, or one
        // used on another stream under a cache, or a debug guard's
        // quarantine evicting one) is deferred to the capture's end.
        let adopted = adopt
            .filter(|_| !self.buffers.is_empty())
            .map(|slot| Self::take(&mut self.buffers, slot));
        let captured = res.capture_graph(s, CaptureMode::Relaxed, |capture| {
            let raw = capture.raw_stream();
            let write = |b: &Buffer<u8>| gpu.launch_kernel(raw, &[MemAccess::write(b.block())]);
            let mut last: Option<Buffer<u8>> = None;
            for _ in 0..temps {
                let mut t = res.try_allocate_buffer::<u8>(size, s, TAG)?;
                match &last {
                    None => t.fill_bytes_on(s, 1)?,
                    Some(prev) => t.copy_from_on(s, prev)?,
                }
                write(&t)?;
                // The one before is freed here, inside the capture.
                last = Some(t);
            }
            if let Some(b) = adopted {
                std::thread::spawn(move || drop(b)).join().unwrap();
            }
            let on_thread = || {
                std::thread::scope(|scope| {
                    scope
                        .spawn(|| res.try_allocate_buffer::<u8>(size, s, TAG))
                        .join()
                        .unwrap()
                })
            };
            let mut kept = match keep {
                Keep::No => return Ok(None),
                Keep::Here => res.try_allocate_buffer::<u8>(size, s, TAG)?,
                Keep::Thread | Keep::DroppedInside => on_thread()?,
            };
            match &last {
                Some(prev) => kept.copy_from_on(s, prev)?,
                None => write(&kept)?,
            }
            if keep == Keep::DroppedInside {
                std::thread::spawn(move || drop(kept)).join().unwrap();
                return Ok(None);
            }
            Ok::<_, ResourceError>(Some(kept))
        });
        match captured {
            Ok((kept, graph)) => {
                let kept = kept.map(|b| {
                    let id = b.id();
                    self.graph_blocks.push(id);
                    self.buffers.push(b);
                    id
                });
                self.graphs.push(GraphSlot { graph, kept });
                Ok(())
            }
            Err(e) => {
                let expected = matches!(
                    e,
                    ResourceError::BudgetExceeded { .. }
                        | ResourceError::OutOfMemory { .. }
                        | ResourceError::AllocationsWaiting { .. }
                );
                self.judge("capture_graph", &e, expected)
            }
        }
    }

    /// Awaits what is queued on `s` now: whether the host saw it done.
    fn await_stream(&self, s: StreamId) -> Result<bool, String> {
        let e = match self.res().completion(s) {
            Ok(mut p) => match self.settle(&mut p, "a completion before a replay")? {
                Ok(()) => return Ok(true),
                Err(e) => e,
            },
            Err(e) => e,
        };
        self.judge("a completion before a replay", &e, false)?;
        Ok(false)
    }

    pub(super) fn replay(&mut self, slot: usize, stream: usize, then: Then) -> Verdict {
        let n = self.graphs.len();
        if n == 0 {
            return Ok(());
        }
        let i = slot % n;
        let s = self.stream(stream);
        // What must be done before the replay; when an await fails (an
        // injected fault), the harness cannot keep the contract: no replay.
        let mut before = Vec::new();
        if self.graphs[i].kept.is_some() && self.cache {
            // The launch's Safety 2: a cache may have handed out the kept
            // block from memory the graph keeps across replays, which the
            // replay writes again: the user's work on it goes first.
            before.extend((0..STREAMS).map(|k| self.stream(k)));
        }
        for s in before {
            if !self.await_stream(s)? {
                return Ok(());
            }
        }
        let slot = &self.graphs[i];
        // SAFETY: the captured work touches only blocks the capture
        // allocated (Safety 1); user work on a kept block is awaited above
        // where a cache may keep its range across replays, and a graph
        // memory node is freed after its uses by the crate (Safety 2).
        let launches = slot.graph.launches();
        let launched = unsafe { slot.graph.launch(s) };
        match launched {
            // A use of the kept block is ordered after this replay by the
            // crate, whenever the harness makes it: by the plain resource
            // for a graph memory node, by a cache for a range it handed
            // out in the capture.
            Ok(done) => self.then_point(done, then),
            Err(ResourceError::Driver {
                call: DriverCall::GraphLaunch,
                code: INVALID_VALUE,
                ..
            }) if slot.kept.is_some() => Ok(()),
            Err(e) => {
                self.judge("a graph's launch", &e, false)?;
                // A failed call changes nothing: no replay was queued.
                match self.graphs[i].graph.launches() == launches {
                    true => Ok(()),
                    false => fail(format!("a launch that failed ({e:?}) queued a replay")),
                }
            }
        }
    }
}
