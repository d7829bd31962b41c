//! What the harness checks: after every op (the books against the device,
//! no race) and after the last (the drain, after which nothing is left).

use super::*;

impl World {
    /// What the books and the device say now.
    pub(super) fn books(&self) -> (Vec<usize>, usize, usize, usize) {
        (
            self.budgets.iter().map(Budget::in_use).collect(),
            self.bottom.bytes_outstanding(),
            self.gpu.physical_bytes(),
            self.gpu.held_bytes(),
        )
    }

    /// The invariants of every step (see the module documentation). The
    /// futures' fallback thread may be between two counters of a reap: a
    /// disagreement must persist for a while to count.
    pub(super) fn check(&mut self) -> Verdict {
        let races = self.gpu.races();
        if !races.is_empty() {
            return fail(format!("race: {races:?}"));
        }
        let errors = drop_error_count();
        if errors != self.drop_errors && !self.faulted {
            return fail(format!(
                "a buffer's drop failed: {:?}",
                streamalloc::take_drop_error()
            ));
        }
        self.drop_errors = errors;
        let mut last = String::new();
        for _ in 0..50 {
            let (budgets, outstanding, physical, held) = self.books();
            let below = outstanding + physical;
            // The device rounds each allocation up to its alignment, so
            // what it holds is compared with the books only after the
            // drain, where both must be 0.
            let _ = held;
            // The shared budget counts what both devices hold below it.
            let twin = self.twin.as_ref().map_or(0, Twin::below);
            let wrong = budgets
                .iter()
                .enumerate()
                .find(|&(i, &b)| b != below + if self.shared == Some(i) { twin } else { 0 });
            last = if let Some((i, b)) = wrong {
                format!(
                    "budget {i} counts {b} B, the device holds {below} B below it \
                     (the second device {twin} B, shared: {:?}): {budgets:?}",
                    self.shared
                )
            } else {
                return Ok(());
            };
            std::thread::sleep(Duration::from_millis(1));
        }
        fail(last)
    }

    /// Cancels, drops and reaps everything, then checks that nothing is
    /// left.
    pub(super) fn drain(mut self) -> Verdict {
        for t in std::mem::take(&mut self.tasks) {
            t.handle.abort();
            let mut handle = t.handle;
            match self.settle(&mut handle, "an aborted task")? {
                Ok(Ok(())) => {}
                Ok(Err(e)) => self.judge("request task", &e, false)?,
                Err(join) if join.is_cancelled() => {}
                Err(join) => return fail(format!("request task panicked: {join}")),
            }
        }
        self.points.clear();
        self.frees.clear();
        self.buffers.clear();
        self.reservations.clear();
        self.graphs.clear();
        if let Some(t) = &mut self.twin {
            t.buffers.clear();
        }
        self.check()?;
        let mut reap = self.res().reap_pending();
        let reaped = self.settle(&mut reap, "the last reap_pending")?;
        // The future holds the futures layer.
        drop(reap);
        if let Err(e) = reaped {
            self.judge("the last reap_pending", &e, false)?;
        }
        if let Some(reaper) = self.reaper.take() {
            let mut shut = Box::pin(reaper.shutdown());
            if let Err(e) = self.settle(&mut shut, "the reaper's shutdown")? {
                self.judge("the reaper's shutdown", &e, false)?;
            }
        }
        if let Err(e) = self.res().inner().release_idle() {
            self.judge("the last release_idle", &e, false)?;
        }
        if let Some(mut twin) = self.twin.take() {
            // Its budget is shared: it is counted below only once both
            // stacks are down.
            twin.drain()
                .map_err(|e| format!("the second device: {e}"))?;
        }
        self.check()?;
        // The stack's drop returns what it keeps (cached blocks, the
        // quarantine); then the bottom reaps what is left.
        self.res = None;
        // Host functions queued on the device may hold the futures layer
        // until they run.
        for _ in 0..100 {
            self.gpu.run_until_idle();
            if self.weak_top.strong_count() <= self.bare {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if self.weak_top.strong_count() > self.bare {
            return fail(format!(
                "the stack outlives the futures layer: {} strong references left",
                self.weak_top.strong_count()
            ));
        }
        self.gpu.run_until_idle();
        if let Err(e) = self.bottom.reap_pending() {
            self.judge("the bottom's reap after the drop", &e, false)?;
        }
        self.gpu.run_until_idle();
        let left = (
            self.bottom.bytes_outstanding(),
            self.gpu.physical_bytes(),
            self.budgets.iter().map(Budget::in_use).collect::<Vec<_>>(),
            CAPACITY - self.gpu.free_bytes(),
        );
        if left != (0, 0, vec![0; self.budgets.len()], 0) && !self.faulted {
            return fail(format!(
                "left after the drain (outstanding, mapped, budgets, device): {left:?}"
            ));
        }
        let races = self.gpu.races();
        if !races.is_empty() {
            return fail(format!("race: {races:?}"));
        }
        Ok(())
    }
}

/// Whether the books `after` count more anywhere than `before`.
pub(super) fn took(
    before: &(Vec<usize>, usize, usize, usize),
    after: &(Vec<usize>, usize, usize, usize),
) -> bool {
    after.0.iter().zip(&before.0).any(|(a, b)| a > b)
        || after.1 > before.1
        || after.2 > before.2
        || after.3 > before.3
}
