//! The state every future, handle and background task of one
//! [`AsyncResource`](super::AsyncResource) shares.
//!
//! [`Core`] holds the wrapped resource (type-erased, so that the public
//! futures are not generic), the backend, the stream pool, one
//! [`Notifier`] per pool stream (each with the spare events of its
//! completion points), and the [queue of waiting allocations](super::wait_queue). Futures hold it by
//! `Arc`; the [watchdog] and the [`Reaper`](super::Reaper)
//! hold it weakly, so that dropping the last user handle drops it.
//!
//! [`dispatch`](Core::dispatch) is the one place where landed notifications
//! become accounting: it applies completed frees to the inner resource
//! (`reap_through`), wakes the head of the allocation queue when bytes came
//! back, and queues the next notification of every stream that still has
//! something pending. It runs on the reaper, the watchdog, or inside a poll,
//! never inside a host function.

use std::sync::{Arc, OnceLock};

use super::hold_wait::Holdings;
use super::kick::Kick;
use super::notifier::Notifier;
use super::wait_policy::SharedPolicy;
use super::wait_queue::AllocQueue;
use super::watchdog::{self, Patrolled};
use crate::adaptors::Stats;
use crate::device::StreamPool;
use crate::error::{DriverCall, ResourceError, ResourceResult};
use crate::gpu::Gpu;
use crate::observe::history::{self, MemoryAction, MemoryEvent};
use crate::resource::DeviceMemoryResource;
use crate::resource::relief::{BudgetRelief, HolderRegistration, IdleHolder};
use crate::types::{BlockState, StreamId};
use crate::util::poll_scope::PollScope;
use crate::util::sync::{AtomicBool, AtomicU64, Ordering};
use crate::waiters;

/// Shared state of one async resource. See the [module documentation](self).
pub(crate) struct Core {
    pub(crate) inner: Arc<dyn DeviceMemoryResource>,
    pub(crate) gpu: Arc<dyn Gpu>,
    pub(crate) pool: Arc<StreamPool>,
    notifiers: Vec<Notifier>,
    pub(crate) allocs: Arc<AllocQueue>,
    /// The queue is one of the process's waiters while the core lives,
    /// woken by memory coming back to its device or to a budget its stack
    /// charges.
    _registered: waiters::Registration,
    /// The device's memory as this layer's backend sees it: what a sleep
    /// or a shutdown that gave pages back names (see
    /// [`device_memory_returned`](Self::device_memory_returned)).
    device_scope: waiters::Scope,
    pub(crate) kick: Arc<Kick>,
    /// How new completion points wait before parking.
    pub(crate) policy: SharedPolicy,
    /// Total device memory, to refuse at once a request that could never
    /// fit; asked again when the query at construction failed.
    capacity: OnceLock<usize>,
    /// Whether a free through `inner` may queue frees on other streams
    /// (see [`DeviceMemoryResource::frees_across_streams`]).
    frees_across: bool,
    /// The stack's registrations with the budgets it charges, when built
    /// by [`AsyncResource::build`](super::AsyncResource::build): a request
    /// refused under one of them on another device asks this stack for its
    /// idle memory (see [`Core::hold_budget_relief`]).
    relief: OnceLock<Vec<HolderRegistration>>,
    /// Block uses begun through the resource's own hooks
    /// ([`AsyncResource::prepare_block_use`](super::AsyncResource::prepare_block_use)
    /// and its two siblings), counted: an owned buffer's drop frees as
    /// completed only if none began since its last launch (such a use is
    /// work on the block that the launch's point does not cover).
    pub(crate) hook_uses: AtomicU64,
    /// Blocks served through the layer and their tasks, for the
    /// [hold-and-wait](super::hold_wait) verdict.
    pub(crate) holdings: Holdings,
    /// Whether the hold-and-wait verdict is given (off by default: see
    /// [`AsyncResource::set_hold_and_wait_check`](super::AsyncResource::set_hold_and_wait_check)).
    hold_wait_check: AtomicBool,
    /// The statistics layers of the stack, found once
    /// ([`DeviceMemoryResource::visit_layers`]): a request that waited is
    /// counted in each when it leaves the queue.
    stats: Vec<Stats>,
    /// Set by [`AsyncResource::close`](super::AsyncResource::close): no
    /// new allocation is served, waiting ones fail.
    closed: AtomicBool,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("streams", &self.notifiers.len())
            .field("waiting_allocations", &self.allocs.len())
            .finish_non_exhaustive()
    }
}

impl Core {
    pub(crate) fn new(
        inner: Arc<dyn DeviceMemoryResource>,
        gpu: Arc<dyn Gpu>,
        pool: Arc<StreamPool>,
    ) -> ResourceResult<Arc<Core>> {
        ResourceError::check_device(inner.device_ordinal(), pool.device())?;
        ResourceError::check_device(inner.device_ordinal(), gpu.ordinal())?;
        let kick = Arc::new(Kick::default());
        let mut notifiers = Vec::with_capacity(pool.len());
        for id in pool.ids() {
            let made = pool
                .raw(id)
                .and_then(|raw| Notifier::new(&*gpu, id, raw, kick.clone()));
            match made {
                Ok(n) => notifiers.push(n),
                Err(e) => {
                    notifiers.iter().for_each(|n| n.release_handles(&*gpu));
                    return Err(e);
                }
            }
        }
        let capacity = OnceLock::new();
        if let Ok((_, total)) = gpu.mem_info() {
            let _ = capacity.set(total);
        }
        let allocs = Arc::new(AllocQueue::default());
        let inner_across = inner.frees_across_streams();
        let mut stats = Vec::new();
        inner.visit_layers(&mut |layer| {
            if let Some(s) = layer.downcast_ref::<Stats>() {
                stats.push(s.clone());
            }
        });
        let scopes = Self::scopes(&*inner, &*gpu);
        let device_scope = scopes[0];
        let core = Arc::new_cyclic(|me| Core {
            inner,
            gpu,
            pool,
            notifiers,
            _registered: waiters::register(
                me.clone() as std::sync::Weak<dyn waiters::Waiters>,
                scopes,
            ),
            device_scope,
            allocs,
            kick: kick.clone(),
            policy: SharedPolicy::default(),
            capacity,
            frees_across: inner_across,
            hook_uses: AtomicU64::new(0),
            relief: OnceLock::new(),
            holdings: Holdings::default(),
            hold_wait_check: AtomicBool::new(false),
            stats,
            closed: AtomicBool::new(false),
        });
        let patrolled: std::sync::Weak<dyn Patrolled> = Arc::downgrade(&core) as _;
        watchdog::spawn(patrolled, kick).map_err(|e| ResourceError::Driver {
            call: DriverCall::Init,
            code: -1,
            message: format!("cannot start the watchdog thread: {e}"),
        })?;
        Ok(core)
    }

    /// What memory coming back can serve this layer's waiters: the device
    /// (in the backend's context) and each budget the stack charges, as it
    /// reports them.
    fn scopes(inner: &dyn DeviceMemoryResource, gpu: &dyn Gpu) -> Vec<waiters::Scope> {
        let mut budgets = Vec::new();
        inner.budget_reliefs(&mut budgets);
        let device = waiters::Scope::Device {
            ordinal: gpu.ordinal(),
            context: gpu.context_id(),
        };
        // The device first: `Core::new` keeps it as `device_scope`.
        let mut scopes = vec![device];
        for scope in budgets.iter().map(BudgetRelief::scope) {
            if !scopes.contains(&scope) {
                scopes.push(scope);
            }
        }
        scopes
    }

    /// The stack gave device memory back other than by a drain of frees
    /// (a sleep's or a shutdown's unmapped pages): wakes the waiters of
    /// every queue on the device, which may fit now.
    pub(crate) fn device_memory_returned(&self) {
        waiters::memory_returned(self.device_scope);
    }

    /// The notifier of `stream`, after checking the stream belongs to the
    /// pool.
    pub(crate) fn notifier(&self, stream: StreamId) -> ResourceResult<&Notifier> {
        // Each notifier knows its stream, so a stream of the pool is
        // recognised without reading the pool (one cache line fewer on
        // every `completion()`); the pool names what is wrong otherwise.
        // The pool too must match: an id of another pool with the same
        // index names another stream, whose completion proves nothing here.
        match self.notifiers.get(stream.index() as usize) {
            Some(n) if n.stream.is(stream) => Ok(n),
            _ => {
                self.pool.raw(stream)?;
                Err(ResourceError::UnknownStream {
                    stream,
                    pool_len: self.notifiers.len(),
                })
            }
        }
    }

    /// The notifier of a stream already checked by [`notifier`](Self::notifier)
    /// (the pool never shrinks).
    pub(crate) fn checked_notifier(&self, stream: StreamId) -> Option<&Notifier> {
        self.notifiers.get(stream.index() as usize)
    }

    pub(crate) fn notifiers(&self) -> &[Notifier] {
        &self.notifiers
    }

    /// Refuses new allocations from now on, and fails the waiting ones.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.allocs.wake_all();
    }

    /// `Err(Closed)` once [`close`](Self::close) was called.
    pub(crate) fn check_open(&self) -> ResourceResult<()> {
        match self.closed.load(Ordering::Relaxed) {
            true => Err(ResourceError::Closed),
            false => Ok(()),
        }
    }

    /// The statistics layers of the stack.
    pub(crate) fn stats(&self) -> &[Stats] {
        &self.stats
    }

    /// Total device memory, asked again of the driver while unknown (a
    /// failed query at construction must not make every request look as if
    /// it could fit some day). `None` while the driver cannot say.
    pub(crate) fn capacity(&self) -> Option<usize> {
        if let Some(&c) = self.capacity.get() {
            return Some(c);
        }
        let (_, total) = self.gpu.mem_info().ok()?;
        Some(*self.capacity.get_or_init(|| total))
    }

    /// Refuses at once a request that waiting could never serve: a stream
    /// outside the pool (or of another device), more bytes than a budget in
    /// the stack allows in all, or more bytes than the device has.
    pub(crate) fn check_request(&self, bytes: usize, stream: StreamId) -> ResourceResult<()> {
        self.notifier(stream)?;
        if let Some(limit) = self.inner.allocation_limit()
            && bytes > limit
        {
            return Err(ResourceError::BudgetExceeded {
                requested: bytes,
                limit,
                in_use: self.inner.bytes_outstanding(),
            });
        }
        match self.capacity() {
            Some(capacity) if bytes > capacity => Err(ResourceError::OutOfMemory {
                requested: bytes,
                available: self.gpu.mem_info().map_or(0, |(free, _)| free),
                stream,
            }),
            _ => Ok(()),
        }
    }

    /// The error of a stream whose device failed (its notifications will
    /// never come): nothing waiting on this resource can succeed.
    pub(crate) fn failure(&self) -> Option<ResourceError> {
        self.notifiers.iter().find_map(Notifier::failure)
    }

    /// Frees queued on the inner resource without this layer (a cache
    /// giving blocks back, a decorator, the user on the inner resource)
    /// get a completion point, so that a notification applies them and
    /// wakes the allocations waiting for that memory. Makes no blocking
    /// call.
    pub(crate) fn adopt_frees(&self) {
        for n in &self.notifiers {
            if n.mark_free_if_new(self.inner.pending_free_seq(n.stream)) {
                n.launch(&*self.gpu);
            }
        }
        self.kick.pending();
    }

    /// Registers the whole stack with each of `budgets` (those it charges):
    /// a request refused under one of them on another device asks the
    /// stack for its idle memory, whatever the order of its layers (a
    /// cache above a budget included). Once; the registrations end with
    /// the core.
    pub(crate) fn hold_budget_relief(self: &Arc<Self>, budgets: &[BudgetRelief]) {
        if budgets.is_empty() {
            return;
        }
        let me: std::sync::Weak<dyn IdleHolder> = Arc::downgrade(self) as _;
        let registrations = budgets.iter().map(|b| b.register(me.clone())).collect();
        let _ = self.relief.set(registrations);
    }

    /// After a call of the inner resource that may have queued frees on
    /// streams other than `except` (an eviction, a cache giving its blocks
    /// back on memory pressure): when the inner resource does that at all,
    /// gives each such free a point on its own stream, so that its
    /// notification reaps it like any other.
    pub(crate) fn mark_frees_elsewhere(&self, except: Option<StreamId>) {
        if !self.frees_across {
            return;
        }
        for n in self.notifiers.iter().filter(|n| Some(n.stream) != except) {
            if n.mark_free_if_new(self.inner.pending_free_seq(n.stream)) {
                n.launch(&*self.gpu);
            }
        }
    }

    /// Turns the [hold-and-wait](super::hold_wait) verdict on or off.
    pub(crate) fn set_hold_wait_check(&self, on: bool) {
        self.hold_wait_check.store(on, Ordering::SeqCst);
    }

    /// Whether blocks served are recorded with their task: only while the
    /// verdict is on (off, serving and freeing take no lock for it).
    pub(crate) fn tracks_holdings(&self) -> bool {
        self.hold_wait_check.load(Ordering::Relaxed)
    }

    /// The head of the queue was just refused with `refusal`, and no memory
    /// came back since: whether the queue is in hold-and-wait, judged from
    /// the facts of the [module `hold_wait`](super::hold_wait). `Some`
    /// names the waiter to fail (the newest that holds memory) and its
    /// error. Makes no blocking call; may ask the stack for its idle memory
    /// (then the verdict waits for it to come back).
    pub(crate) fn judge_hold_and_wait(
        &self,
        refusal: &ResourceError,
    ) -> Option<(u64, ResourceError)> {
        if !self.hold_wait_check.load(Ordering::SeqCst) {
            return None;
        }
        // 1. Nobody outside this stack holds what was refused.
        let outstanding = self.inner.bytes_outstanding();
        match refusal {
            ResourceError::BudgetExceeded { in_use, .. } if *in_use <= outstanding => {}
            ResourceError::OutOfMemory { .. } => {
                let (free, total) = self.gpu.mem_info().ok()?;
                if total.saturating_sub(free) > outstanding {
                    return None;
                }
            }
            _ => return None,
        }
        // 2. Every block served and held belongs to a task that waits.
        let waiting = self.allocs.owners();
        let mut holders = Vec::new();
        let mut held = 0usize;
        {
            let mut blocks = self.holdings.lock();
            // Blocks freed around the layer are no longer anyone's.
            blocks.retain(
                |id, _| !matches!(self.inner.block_state(*id), Some(s) if s != BlockState::Live),
            );
            for h in blocks.values() {
                let owner = h.owner?;
                if !waiting.iter().any(|(_, w)| *w == Some(owner)) {
                    return None;
                }
                held = held.saturating_add(h.bytes);
                if !holders.contains(&owner) {
                    holders.push(owner);
                }
            }
        }
        if holders.is_empty() {
            return None;
        }
        // 3. Idle memory the stack could give back: given back, and judged
        // again once it is (its frees' notifications wake the head).
        if self.inner.release_idle().unwrap_or(0) > 0 {
            self.adopt_frees();
            self.allocs.memory_returned();
            return None;
        }
        // 4. Nothing pending on any stream: no free to execute, no task
        // awaiting the GPU that may free after.
        if self.notifiers.iter().any(Notifier::has_pending) {
            return None;
        }
        let victim = waiting
            .iter()
            .rev()
            .find(|(_, o)| o.is_some_and(|o| holders.contains(&o)))?
            .0;
        Some((
            victim,
            ResourceError::HoldAndWait {
                held,
                tasks: holders.len(),
                waiting: waiting.len(),
            },
        ))
    }

    /// Applies frees known done to `stream`'s accounting up to `free_seq`.
    pub(crate) fn reap(&self, stream: StreamId, free_seq: u64) {
        if free_seq == 0 {
            return;
        }
        let notifier = self.notifier(stream).ok();
        let one_at_a_time = notifier.map(Notifier::reaping);
        let drained = self.inner.reap_through(stream, free_seq);
        if drained > 0 {
            history::record(|| {
                MemoryEvent::new(MemoryAction::FreeCompleted, stream.device())
                    .on(stream)
                    .at(0, drained)
            });
        }
        if let Some(n) = notifier {
            n.note_reaped(free_seq);
        }
        drop(one_at_a_time);
        if drained > 0 {
            self.allocs.memory_returned();
        }
    }

    /// Applies landed notifications and queues the next ones.
    pub(crate) fn dispatch(&self) {
        // It may run inside the reaper's task: a poll.
        let _scope = PollScope::enter();
        for n in &self.notifiers {
            if let Some(to) = n.take_reap() {
                // `reap` calls the inner resource (user decorators
                // included): if it panics, the number goes back for the
                // next dispatch instead of being lost with the frees.
                let undo = RestoreReap { n, to: Some(to) };
                self.reap(n.stream, to);
                undo.done();
            }
            n.launch(&*self.gpu);
        }
    }
}

/// Puts a taken reap number back on its notifier unless [`done`](Self::done).
struct RestoreReap<'a> {
    n: &'a Notifier,
    to: Option<u64>,
}

impl RestoreReap<'_> {
    fn done(mut self) {
        self.to = None;
    }
}

impl Drop for RestoreReap<'_> {
    fn drop(&mut self) {
        if let Some(to) = self.to {
            self.n.restore_reap(to);
        }
    }
}

impl Patrolled for Core {
    fn patrol(&self, fallback: bool) {
        // The fallback first: it calls no user code, so a wrapped resource
        // whose `reap_through` keeps panicking (the dispatch below, retried
        // every period) cannot keep a dead stream's waiters from failing.
        if fallback {
            self.fallback();
        }
        self.dispatch();
    }

    /// Whether any stream waits on a notification, or any allocation waits
    /// for memory.
    fn has_pending(&self) -> bool {
        self.allocs.len() > 0 || self.notifiers.iter().any(Notifier::has_pending)
    }
}

impl Core {
    /// The fallback query of every stream with something pending; for
    /// waiting allocations, a probe of the device, the adoption of frees
    /// queued below and a retry of the head.
    fn fallback(&self) {
        let mut failed = false;
        for n in &self.notifiers {
            if n.has_pending() {
                failed |= n.fallback_check(&*self.gpu);
            }
        }
        if self.allocs.len() > 0 {
            // Allocations wait: a fault must reach them even when no
            // notification is pending (one query of a notifier's own event
            // tells), and memory freed where no notification reports it
            // (another process) is tried for once a period.
            if !failed && let Some(n) = self.notifiers.first() {
                n.probe(&*self.gpu);
            }
            self.adopt_frees();
            self.allocs.memory_returned();
        } else if failed {
            // Waiting allocations retry, and see the device's error.
            self.allocs.memory_returned();
        }
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        self.kick.close();
        for n in &self.notifiers {
            n.release_handles(&*self.gpu);
        }
    }
}

/// The whole stack under the futures layer, as a holder of idle memory for
/// the budgets it charges (see [`Core::hold_budget_relief`]).
impl IdleHolder for Core {
    /// Gives back what the stack holds for no caller (a cache's idle
    /// blocks and pages, a guard's quarantine). The frees that queues get
    /// completion points, whose notifications reap them and so release
    /// them from the budgets below: nothing blocks, inside a poll or not.
    fn give_back_idle(&self) -> usize {
        let given = self.inner.release_idle().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "giving idle memory back for a refused request failed part way");
            0
        });
        if given > 0 {
            self.adopt_frees();
            self.allocs.memory_returned();
        }
        given
    }

    fn whole_stack_of(&self) -> Option<u64> {
        Some(self.pool.id_of_pool())
    }
}

/// The core as one of the process's futures layers (see [`waiters`]).
impl waiters::Waiters for Core {
    fn memory_returned(&self) {
        self.allocs.memory_returned();
    }

    /// Frees queued below this layer without it (a cache trimmed for a
    /// request refused on another device) get completion points, whose
    /// notifications reap them. Makes no blocking call.
    fn frees_queued(&self) {
        self.adopt_frees();
    }
}
