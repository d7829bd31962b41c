//! Reservations: a request's memory as one unit.
//!
//! A handler that awaits its input, then its activations, then its output
//! holds the first while it waits for the second: under load every handler
//! holds an input and none can go on (hold-and-wait, see
//! [`hold_wait`](super::hold_wait)). [`AsyncResource::reserve`](super::AsyncResource::reserve) asks for
//! all of a request's memory at once, as tokio's
//! `Semaphore::acquire_many_owned` asks for many permits: it waits holding
//! nothing, first come first served with every other waiting allocation,
//! and is served all or nothing.
//!
//! # State
//!
//! A [`MemoryReservation`] holds **blocks, allocated up front**: one per
//! size asked for, on the reservation's stream, through the whole stack
//! (budget, cache, device). It is not a promise of bytes: a promise could
//! not stop a cache below from finding no range of the right size when the
//! buffer is asked for, nor another stream from taking what the device had
//! free. Because the blocks exist, taking a buffer from the reservation
//! ([`MemoryReservation::allocate_buffer`]) never waits and never fails for
//! lack of memory: it hands out one of them, whole.
//!
//! # Who changes it
//!
//! - [`ReserveFuture`] (the head of the queue, when it may try) allocates
//!   the blocks largest first (the size most likely refused, so that a try
//!   refused takes nothing, most often), and keeps them in the order
//!   asked. If one is refused, it gives back the ones it took in this try
//!   and waits again holding nothing: a reservation never holds part of a
//!   request while it waits. Those blocks never left the try (no buffer,
//!   no launch; and a use begun through the hooks meanwhile makes the
//!   give-back an ordinary free), so they go back as unused
//!   ([`deallocate_unused`](crate::DeviceMemoryResource::deallocate_unused)):
//!   a cache below undoes their placement, and the memory is ordered for
//!   its next user as it was before the try. An ordinary free would be a
//!   free at the end of the reservation's stream, which a cache lends to
//!   another stream only behind a wait for all the work queued there,
//!   none of which touched the block (under a service's full budget, the
//!   streams then ran one after another on the GPU). What the try's
//!   placements queued on the reservation's stream stays: a wait on the
//!   GPU for another stream's free, where a block took memory that stream
//!   freed, cannot be taken back. Holding such waits back until every
//!   size is placed would need the cache to hand out blocks not yet
//!   ordered on their stream, and a call to order them once the try
//!   succeeds, through every layer; largest first, a refused try most
//!   often took nothing, and queued nothing.
//! - [`MemoryReservation::allocate_buffer`] takes the smallest block left
//!   that holds the buffer (the first such in the order asked, on a tie);
//!   the buffer owns it from then on, and frees it when dropped.
//! - Dropping the reservation (or cancelling the task that holds it)
//!   gives back the blocks left (announced to the waiting allocations,
//!   as any memory back); nothing waits for the GPU. Those
//!   blocks were never handed to user code either: the reservation gives
//!   a block out only as a buffer, which takes it out, and no accessor
//!   shows a block, its id or its address (only sizes). So, as a failed
//!   try's, they go back unused, the memory ordered for its next user as
//!   it was before the reservation, not behind all the work its stream
//!   queued since: the buffers it handed out may have kept that stream
//!   busy, on other memory. Where that proof does not hold they go back
//!   as ordinary frees at the end of the reservation's stream: after a
//!   use named to this resource's hooks since the reservation's try
//!   began (a caller can build any block's descriptor and name it there;
//!   the count cannot say which block a use named, so any use counts), or
//!   where the cache below saw the block used (a use named to the stack's
//!   hooks directly, a sleep's restore at the wake).
//!
//! # Budget, cache, streams
//!
//! A reservation's blocks are ordinary blocks of the stack: a budget counts
//! each at what the layer below it takes from the device (a cache's size
//! class, its arena's pages), from the moment they are reserved until their
//! frees have executed, used or not. A cache serves them as any
//! allocation, from idle blocks or ranges of the reservation's stream first;
//! the blocks a reservation gives back unused are idle in the cache again,
//! as they were before it took them (a failed try's and a dropped
//! reservation's alike). A buffer's block is a buffer's: used or not, its
//! drop is the buffer's free, ordered after its work.
//! A reservation is made on one stream and its buffers are on that stream;
//! using them on other streams is ordered as for any buffer.
//!
//! # Bounded
//!
//! One try allocates each size once: `n` allocations and, when it fails
//! part way, up to `n - 1` frees. While it waits it tries only as the head
//! of the queue, when memory comes back; without a cache below, the return
//! of the blocks a failed try freed is such an event, so a reservation
//! that cannot fit tries about once per notification round trip until
//! memory held by others comes back.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use super::alloc_future::worth_waiting;
use super::core::Core;
use super::frees::{give_back_failed_try, give_back_unhanded};
use super::hold_wait::current_owner;
use super::waiter::{Attempt, Waiter};
use crate::error::{ResourceError, ResourceResult};
use crate::types::{DeviceBlock, StreamId, Tag};
use crate::util::poll_scope::PollScope;

/// The future of [`AsyncResource::reserve`](super::AsyncResource::reserve):
/// waits, first come first served, until every size fits at once.
///
/// # Errors
/// At its first poll, before it waits:
/// [`EmptyReservation`](ResourceError::EmptyReservation) for no sizes or a
/// zero size, [`ReservationOverflow`](ResourceError::ReservationOverflow)
/// when the sizes add up past `usize`, and as
/// [`AllocFuture`](super::AllocFuture) for an unknown stream or a total
/// more than a budget's limit or the device's memory. While it waits, a
/// device failure, and
/// [`HoldAndWait`](ResourceError::HoldAndWait) when its task holds other
/// memory the queue waits for. Nothing is held after an error.
///
/// # Cancel safety
/// Cancel safe: dropped while waiting, it holds nothing (a try that fails
/// part way gives back what it took within the same poll), and a wake it
/// received passes on to the next waiter.
#[must_use = "a ReserveFuture reserves nothing unless awaited"]
#[derive(Debug)]
pub struct ReserveFuture {
    waiter: Waiter,
    sizes: Vec<usize>,
    /// The indices of `sizes`, largest first: the order a try allocates
    /// them in.
    order: Vec<usize>,
    stream: StreamId,
}

impl ReserveFuture {
    pub(crate) fn new(core: Arc<Core>, sizes: &[usize], stream: StreamId, tag: Tag) -> Self {
        ReserveFuture {
            waiter: Waiter::new(core, tag),
            sizes: sizes.to_vec(),
            order: largest_first(sizes),
            stream,
        }
    }

    /// Whether the reservation is queued, waiting for memory.
    pub fn is_waiting(&self) -> bool {
        self.waiter.is_waiting()
    }
}

/// The total of `sizes`, or why they cannot be reserved.
fn total(sizes: &[usize]) -> ResourceResult<usize> {
    if sizes.is_empty() {
        return Err(ResourceError::EmptyReservation { index: None });
    }
    if let Some(i) = sizes.iter().position(|&s| s == 0) {
        return Err(ResourceError::EmptyReservation { index: Some(i) });
    }
    sizes
        .iter()
        .try_fold(0usize, |sum, &s| sum.checked_add(s))
        .ok_or(ResourceError::ReservationOverflow { sizes: sizes.len() })
}

/// The indices of `sizes`, largest first (the first asked first among
/// equal sizes).
fn largest_first(sizes: &[usize]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sizes[i]));
    order
}

impl Future for ReserveFuture {
    type Output = ResourceResult<MemoryReservation>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let _scope = PollScope::enter();
        let this = &mut *self;
        let (sizes, order, stream) = (&this.sizes, &this.order, this.stream);
        let tag = this.waiter.tag.kind();
        // Overflow is reported by `check`, before anything queues.
        let bytes = sizes.iter().fold(0usize, |sum, &s| sum.saturating_add(s));
        let served = this.waiter.poll(
            cx,
            bytes,
            |core| core.check_request(total(sizes)?, stream),
            |core| {
                // Uses begun through the hooks from here on may name a
                // block of this try (see `give_back_failed_try`).
                let hook_uses = core.hook_uses.load(Ordering::SeqCst);
                let mut blocks = Vec::with_capacity(sizes.len());
                for &i in order {
                    match core.inner.allocate(sizes[i], stream, tag) {
                        Ok(block) => blocks.push((i, block)),
                        Err(e) => {
                            // All or nothing: a waiting reservation holds
                            // nothing. Quietly: the head is this request.
                            for (_, block) in blocks {
                                let id = block.id();
                                if let Err(e) = give_back_failed_try(core, block, hook_uses) {
                                    tracing::error!(block = %id, error = %e, "freeing a reserved block failed");
                                }
                            }
                            return match worth_waiting(core, &e) {
                                true => Attempt::Wait(e),
                                false => Attempt::Fail(e),
                            };
                        }
                    }
                }
                // Back in the order asked.
                blocks.sort_unstable_by_key(|&(i, _)| i);
                let blocks: Vec<DeviceBlock> = blocks.into_iter().map(|(_, b)| b).collect();
                if core.tracks_holdings() {
                    let owner = current_owner();
                    for b in &blocks {
                        core.holdings.served(b.id(), b.size(), owner);
                    }
                }
                Attempt::Served((blocks, hook_uses))
            },
        );
        let core = &this.waiter.core;
        served.map(|r| {
            r.map(|(blocks, hook_uses)| MemoryReservation {
                core: core.clone(),
                blocks,
                hook_uses,
                stream,
                tag: this.waiter.tag.clone(),
            })
        })
    }
}

/// Memory reserved for one request: blocks allocated up front on one
/// stream, from which buffers are taken without waiting and without
/// failing for lack of memory. Dropping it gives back what was not
/// taken, unused.
///
/// Made by [`AsyncResource::reserve`](super::AsyncResource::reserve).
///
/// # What it holds
/// Blocks, allocated up front through the whole stack, one per size asked
/// for: not a promise of bytes, which could not keep a cache below from
/// finding no range of the right size later. A buffer takes one block
/// whole (the smallest that holds it). A budget counts each block at what
/// the layer below it takes from the device (a cache's size class or
/// pages), from the reservation until the block's free has executed, used
/// or not; a cache serves the blocks as any allocation, and takes back
/// those it never handed out as they were before the reservation (no
/// work touched them).
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), streamalloc::ResourceError> {
/// use streamalloc::{AllocTag, AsyncResource, Device, gpu::sim::SimGpu};
///
/// let device = Device::sim(&SimGpu::new(), 1);
/// let res = AsyncResource::on(&device)?;
/// let s = device.stream(0)?;
///
/// // Input, activations and output of one request, as one unit.
/// let mut request = res.reserve(&[4096, 1 << 20, 4096], s, AllocTag("request")).await?;
/// let input = request.allocate_buffer::<f32>(1024)?;
/// let activations = request.allocate_buffer::<u8>(1 << 20)?;
/// let output = request.allocate_buffer::<f32>(1024)?;
/// assert!(request.is_empty());
/// drop((input, activations, output, request));
/// res.reap_pending().await?;
/// assert_eq!(res.bytes_outstanding(), 0);
/// # Ok(()) }
/// ```
///
/// # Stream ordering
/// Every block is usable on [`stream`](Self::stream) from the reservation
/// on; a buffer taken from it is a buffer of that stream, and its free is
/// ordered after its work. At the drop, the blocks not taken go back with
/// the ordering they had before the reservation took them (the next
/// stream to take that memory does not wait for this one's work), unless
/// a use was named to the resource's hooks meanwhile: then as frees at
/// the end of the stream.
#[must_use = "a reservation frees its memory when dropped"]
#[derive(Debug)]
pub struct MemoryReservation {
    core: Arc<Core>,
    /// The blocks not taken yet, in the order asked: never handed to user
    /// code (no accessor gives one out; [`take`](Self::take) removes it).
    blocks: Vec<DeviceBlock>,
    /// The resource's count of hook uses when the try that took the blocks
    /// began: while it is unchanged, no use named one of them.
    hook_uses: u64,
    stream: StreamId,
    tag: Tag,
}

impl MemoryReservation {
    /// The stream of the reservation and of its buffers.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The tag it was asked with (its blocks carry its kind).
    pub fn tag(&self) -> &Tag {
        &self.tag
    }

    /// Blocks not taken yet.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether every block was taken.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The sizes of the blocks not taken yet, in the order asked.
    pub fn sizes(&self) -> impl Iterator<Item = usize> + '_ {
        self.blocks.iter().map(DeviceBlock::size)
    }

    /// Bytes not taken yet.
    pub fn bytes_left(&self) -> usize {
        self.sizes().sum()
    }

    /// Takes the smallest block left that holds `bytes` (the first such,
    /// on a tie).
    ///
    /// # Errors
    /// [`NotReserved`](ResourceError::NotReserved) when none does, or
    /// `bytes` is zero; nothing changes.
    pub(crate) fn take(&mut self, bytes: usize) -> ResourceResult<DeviceBlock> {
        let best = (bytes > 0)
            .then(|| {
                self.blocks
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.size() >= bytes)
                    .min_by_key(|(i, b)| (b.size(), *i))
                    .map(|(i, _)| i)
            })
            .flatten();
        match best {
            Some(i) => Ok(self.blocks.remove(i)),
            None => Err(ResourceError::NotReserved {
                requested: bytes,
                largest: self.sizes().max().unwrap_or(0),
                left: self.blocks.len(),
            }),
        }
    }

    /// The core its buffers' frees go through.
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }
}

impl Drop for MemoryReservation {
    /// Gives back the blocks never handed out, as unused where no use was
    /// named to the hooks meanwhile (see "Who changes it" in the module
    /// documentation).
    fn drop(&mut self) {
        for block in self.blocks.drain(..) {
            let id = block.id();
            if let Err(e) = give_back_unhanded(&self.core, block, self.hook_uses) {
                // Not the caller's to handle, and nothing else can take
                // the block: reported, as an owned buffer's drop does.
                tracing::error!(block = %id, error = %e, "freeing a reserved block failed");
            }
        }
    }
}
