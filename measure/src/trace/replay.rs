//! Replaying a [`Trace`] through a resource stack: the time per operation,
//! and the device memory the stack held.
//!
//! # Timing, as `torch_cpp_replay.py` does it
//! So that the figures compare with PyTorch's allocator measured by
//! `measure/traces/torch_cpp_replay.py`, the method is the same: one timed
//! loop runs the trace, frees the blocks left live, and synchronizes every
//! stream; a control loop then does the same bookkeeping without allocating.
//! Both are divided by the trace's operation count, and the figure is their
//! difference: what the allocator costs per operation.
//!
//! The bookkeeping is lighter than the script's hash map: each operation's
//! slot in a table of live blocks is worked out before the clock starts
//! (`Slots`), and the table is written once before it, so neither loop
//! takes page faults. With a fresh 64 Ki-entry hash map, first touches cost
//! both loops 200–350 ns per operation on gpt2_train's 18 k operations,
//! and the difference of two such figures moved by more than the
//! allocator's own cost from run to run.
//!
//! # Streams, and frees from another stream
//! Trace stream `i` is stream `i` of the target's pool. A block is allocated
//! on its trace stream and freed *on its allocation stream*, as PyTorch's
//! allocator does (`raw_delete` returns a block to the pool of the stream it
//! was allocated on). When the trace frees it from another stream, that
//! stream used the block: PyTorch's program had to declare it with
//! `record_stream`, which holds the memory until the work then queued on
//! that stream is done. The replay says the same to the resource with
//! [`record_block_use`](DeviceMemoryResource::record_block_use) on the
//! freeing stream before the free (a no-op on resources that do not track
//! uses). The two GPT-2 traces free every block on its allocation stream.
//!
//! # Held memory
//! Read from the backend with [`Gpu::memory_held`] (on CUDA the memory
//! pool's reserved bytes), never reconstructed here: its high-water mark is
//! reset before the timed loop and read after it.

use std::collections::HashMap;
use std::fmt;
use std::time::Instant;

use streamalloc::gpu::{Gpu, GpuError, HeldMemory};
use streamalloc::{AllocTag, Device, DeviceBlock, DeviceMemoryResource, ResourceError, StreamId};

use super::format::{OpKind, Trace};
use crate::calls::CallCounts;

const TAG: AllocTag = AllocTag("trace");

/// What a trace is replayed through: a resource stack and the device under
/// it (its backend, where held memory is read, and its streams, which stand
/// for the trace's streams).
pub struct Target<'a, R: ?Sized, G: Gpu> {
    /// The stack (any [`DeviceMemoryResource`]).
    pub resource: &'a R,
    /// The device the stack allocates from, with at least as many streams
    /// as the trace uses.
    pub device: &'a Device<G>,
    /// Called after every `n`-th operation, inside the timed loop: the
    /// simulated device in manual mode runs its queued work there, so that
    /// executed frees coalesce. `None` on CUDA.
    pub housekeeping: Option<(usize, &'a dyn Fn())>,
}

/// The figures of one replay.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// Operations in the trace (the count the times are divided by).
    pub ops: usize,
    /// Nanoseconds per operation, the control's subtracted.
    pub ns_per_op: f64,
    /// Nanoseconds per operation of the control loop (bookkeeping only).
    pub control_ns_per_op: f64,
    /// Device memory held: `high` over the replay, `current` after it (the
    /// stack still alive, every block freed).
    pub held: HeldMemory,
    /// When sampling was asked for: `(operations done, the most bytes held
    /// since the previous sample)`, so that no peak falls between two
    /// samples; the last is `(ops, bytes held after the end's frees)`.
    pub samples: Vec<(usize, usize)>,
    /// The driver calls the replay made, when they were counted
    /// ([`ReplayConfig::count_calls`](super::ReplayConfig::count_calls)).
    pub calls: Option<CallCounts>,
}

/// Why a replay stopped.
#[derive(Debug)]
pub enum ReplayError {
    /// The target's pool has fewer streams than the trace uses.
    TooFewStreams {
        /// Streams the trace uses.
        trace: usize,
        /// Streams in the pool.
        pool: usize,
    },
    /// The resource refused an operation; every block allocated so far was
    /// freed again.
    Resource {
        /// 0-based index of the operation in the trace (on line `op + 2`).
        op: usize,
        /// What the resource said.
        error: ResourceError,
    },
    /// The device, its memory pool or its streams could not be set up.
    Setup(ResourceError),
    /// Synchronizing or reading held memory failed.
    Gpu(GpuError),
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::TooFewStreams { trace, pool } => {
                write!(f, "the trace uses {trace} streams, the pool has {pool}")
            }
            ReplayError::Resource { op, error } => {
                write!(f, "operation {op} (line {}): {error}", op + 2)
            }
            ReplayError::Setup(e) => write!(f, "setting up the stack: {e}"),
            ReplayError::Gpu(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ReplayError {}

impl From<GpuError> for ReplayError {
    fn from(e: GpuError) -> Self {
        ReplayError::Gpu(e)
    }
}

/// Replays `trace` through `target` once, then runs the control loop.
///
/// With `sample_every = Some(n)`, the held bytes are read (and their
/// high-water mark restarted) after every `n`-th operation, for plots; the
/// reads cost driver calls, so timed figures are taken without.
///
/// # Errors
/// [`ReplayError`]; the blocks allocated before a failure are freed.
pub fn replay<R, G>(
    trace: &Trace,
    target: &Target<'_, R, G>,
    sample_every: Option<usize>,
) -> Result<Replay, ReplayError>
where
    R: DeviceMemoryResource + ?Sized,
    G: Gpu,
{
    if target.device.streams().len() < trace.streams {
        return Err(ReplayError::TooFewStreams {
            trace: trace.streams,
            pool: target.device.streams().len(),
        });
    }
    let streams: Vec<StreamId> = target.device.streams().ids().collect();
    let mut samples = Vec::new();
    target.device.gpu().reset_memory_held_high()?;

    let slots = Slots::of(trace);
    // Written before the clock starts: no page fault inside the loop.
    let mut live: Vec<Option<DeviceBlock>> = (0..slots.len).map(|_| None).collect();
    let start = Instant::now();
    let run = run_ops(trace, &slots, target, &streams, &mut live, |done| {
        if let Some(n) = sample_every
            && done % n == 0
        {
            // The mark restarts at each sample: each point is its stretch's
            // peak.
            samples.push((done, target.device.gpu().memory_held()?.high));
            target.device.gpu().reset_memory_held_high()?;
        }
        Ok(())
    });
    // Frees the blocks left live (never freed by the trace, or live when it
    // failed), each on its allocation stream.
    let mut leftover = Ok(());
    for block in live.iter_mut().filter_map(Option::take) {
        let done = trace.ops.len();
        if let Err(error) = target.resource.deallocate(block) {
            leftover = leftover.and(Err(ReplayError::Resource { op: done, error }));
        }
    }
    for &stream in &streams {
        let raw = target
            .device
            .raw(stream)
            .map_err(|error| ReplayError::Resource {
                op: trace.ops.len(),
                error,
            })?;
        // SAFETY: a stream of the pool this code holds.
        unsafe { target.device.gpu().stream_synchronize(raw) }?;
    }
    let elapsed = start.elapsed();
    run?;
    leftover?;
    let mut held = target.device.gpu().memory_held()?;
    if sample_every.is_some() {
        // The stretch since the last sample, then the state after the
        // leftover blocks were freed.
        if samples
            .last()
            .is_none_or(|&(done, _)| done != trace.ops.len())
        {
            samples.push((trace.ops.len(), held.high));
        }
        held.high = samples.iter().map(|&(_, b)| b).max().unwrap_or(0);
        samples.push((trace.ops.len(), held.current));
    }

    let control = control_loop(trace, &slots);
    let ops = trace.ops.len().max(1) as f64;
    let ns = elapsed.as_nanos() as f64 / ops;
    let control_ns = control.as_nanos() as f64 / ops;
    Ok(Replay {
        ops: trace.ops.len(),
        ns_per_op: ns - control_ns,
        control_ns_per_op: control_ns,
        held,
        samples,
        calls: None,
    })
}

/// The timed loop: every operation of `trace`, live blocks in `live`.
/// `after(done)` runs after each operation with the count done so far.
fn run_ops<R, G>(
    trace: &Trace,
    slots: &Slots,
    target: &Target<'_, R, G>,
    streams: &[StreamId],
    live: &mut [Option<DeviceBlock>],
    mut after: impl FnMut(usize) -> Result<(), GpuError>,
) -> Result<(), ReplayError>
where
    R: DeviceMemoryResource + ?Sized,
    G: Gpu,
{
    let resource = target.resource;
    for (i, (op, &slot)) in trace.ops.iter().zip(&slots.of_op).enumerate() {
        let stream = streams[op.stream as usize];
        let fail = |error| ReplayError::Resource { op: i, error };
        match op.kind {
            OpKind::Alloc => {
                let block = resource.allocate(op.size, stream, TAG).map_err(fail)?;
                live[slot as usize] = Some(block);
            }
            OpKind::Free => {
                // A checked trace frees only live blocks; a miss (no slot)
                // is ignored as torch_cpp_replay.py does.
                if let Some(block) = live.get_mut(slot as usize).and_then(Option::take) {
                    if block.stream() != stream {
                        resource.record_block_use(&block, stream).map_err(fail)?;
                    }
                    resource.deallocate(block).map_err(fail)?;
                }
            }
        }
        let done = i + 1;
        if let Some((n, housekeeping)) = target.housekeeping
            && done % n == 0
        {
            housekeeping();
        }
        after(done)?;
    }
    Ok(())
}

/// Where each operation's block lives in the table of live blocks, worked
/// out before the timed loop: an allocation takes a free slot (the most
/// recently freed, as an allocator's free list would), a free gives its
/// block's slot back. The table has as many slots as blocks are live at
/// once at most.
struct Slots {
    /// Per operation, its block's slot; [`Slots::NONE`] for a free of a
    /// block that is not live.
    of_op: Vec<u32>,
    /// Slots in the table.
    len: usize,
}

impl Slots {
    const NONE: u32 = u32::MAX;

    fn of(trace: &Trace) -> Slots {
        let mut by_id: HashMap<u64, u32> = HashMap::new();
        let mut free: Vec<u32> = Vec::new();
        let mut len = 0u32;
        let of_op = trace
            .ops
            .iter()
            .map(|op| match op.kind {
                OpKind::Alloc => {
                    let slot = free.pop().unwrap_or_else(|| {
                        len += 1;
                        len - 1
                    });
                    by_id.insert(op.id, slot);
                    slot
                }
                OpKind::Free => match by_id.remove(&op.id) {
                    Some(slot) => {
                        free.push(slot);
                        slot
                    }
                    None => Slots::NONE,
                },
            })
            .collect();
        Slots {
            of_op,
            len: len as usize,
        }
    }
}

/// A stand-in for a block in the control loop: the same size, so that the
/// table moves as many bytes as the timed loop's.
type StandIn = [u8; std::mem::size_of::<DeviceBlock>()];

/// The control: the same bookkeeping with a stand-in for each block, no
/// allocation.
fn control_loop(trace: &Trace, slots: &Slots) -> std::time::Duration {
    let mut live: Vec<Option<StandIn>> = vec![None; slots.len];
    let start = Instant::now();
    for (op, &slot) in trace.ops.iter().zip(&slots.of_op) {
        match op.kind {
            OpKind::Alloc => {
                let stand_in: StandIn = [op.size as u8; std::mem::size_of::<DeviceBlock>()];
                live[slot as usize] = Some(std::hint::black_box(stand_in));
            }
            OpKind::Free => {
                std::hint::black_box(live.get_mut(slot as usize).and_then(Option::take));
            }
        }
    }
    for entry in live.iter_mut().filter_map(Option::take) {
        std::hint::black_box(entry);
    }
    start.elapsed()
}
