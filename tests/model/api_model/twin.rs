//! Two devices under one budget: a second simulated device (ordinal 1)
//! whose stack is a budget resource over the *same* [`Budget`] as the
//! first stack's outermost one, maybe over a cache, over its own bottom
//! resource.
//!
//! A budget counts what the devices below it hold, both of them: the
//! check after every step compares the shared budget with the sum. A
//! waiter on either device must be served once idle cached memory anywhere
//! under the budget could serve it: a refusal asks the siblings under the
//! budget to release what they cache idle. So the harness's rule for a
//! hang holds across devices: an awaited allocation that fits, with no
//! memory held by the harness on either device, must be served.
//!
//! The second device runs on its own (not manual): its frees and
//! notifications complete while the harness drives the first.

use super::*;

/// The second device's stack under the shared budget.
#[derive(Debug, Clone, Copy)]
pub(super) struct TwinStack {
    /// A cache below the budget resource: `Some(arena)`.
    pub(super) cache: Option<bool>,
}

pub(super) struct Twin {
    gpu: Arc<SimGpu>,
    stream: StreamId,
    bottom: Arc<SimResource>,
    res: Option<AsyncResource<Top>>,
    pub(super) buffers: Vec<Buffer<u8>>,
}

impl Twin {
    pub(super) fn new(stack: TwinStack, budget: &Budget, granularity: usize) -> Twin {
        let gpu = SimGpu::builder()
            .ordinal(1)
            .capacity(CAPACITY)
            .vm_granularity(granularity)
            .build();
        let device = Device::simulated(&gpu, 1);
        let bottom = Arc::new(SimResource::new(&device));
        let mut top: Top = bottom.clone();
        if let Some(arena) = stack.cache {
            top = Arc::new(
                ResourceBuilder::new()
                    .cache(CacheConfig::default().virtual_memory(arena))
                    .build(top),
            );
        }
        top = Arc::new(ResourceBuilder::new().budget(budget).build(top));
        // SAFETY: the bottom was made on `device` just above, and the
        // layers over it allocate and resolve streams only through it.
        let res = unsafe { AsyncResource::with_device(top, &device) }.expect("futures layer");
        Twin {
            stream: device.stream(0).unwrap(),
            gpu,
            bottom,
            res: Some(res),
            buffers: Vec::new(),
        }
    }

    fn res(&self) -> &AsyncResource<Top> {
        self.res.as_ref().expect("the stack is up")
    }

    pub(super) fn holds_memory(&self) -> bool {
        self.buffers.iter().any(|b| b.num_bytes() > 0)
    }

    /// What the device holds below the budget.
    pub(super) fn below(&self) -> usize {
        self.bottom.bytes_outstanding() + self.gpu.physical_bytes()
    }

    /// Drops everything (the buffers are gone already) and checks that
    /// the device holds nothing and saw no race.
    pub(super) fn drain(&mut self) -> Verdict {
        self.buffers.clear();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let reaped =
            rt.block_on(async { tokio::time::timeout(GUARD, self.res().reap_pending()).await });
        match reaped {
            Err(_) => {
                return fail(format!(
                    "hang: reap_pending did not settle within {GUARD:?}"
                ));
            }
            Ok(Err(e)) => return fail(format!("reap_pending: {e:?}")),
            Ok(Ok(())) => {}
        }
        if let Err(e) = self.res().inner().release_idle() {
            return fail(format!("release_idle: {e:?}"));
        }
        self.res = None;
        self.gpu.run_until_idle();
        if let Err(e) = self.bottom.reap_pending() {
            return fail(format!("the bottom's reap after the drop: {e:?}"));
        }
        self.gpu.run_until_idle();
        let left = (
            self.bottom.bytes_outstanding(),
            self.gpu.physical_bytes(),
            CAPACITY - self.gpu.free_bytes(),
        );
        if left != (0, 0, 0) {
            return fail(format!(
                "left after the drain (outstanding, mapped, device): {left:?}"
            ));
        }
        let races = self.gpu.races();
        if !races.is_empty() {
            return fail(format!("race: {races:?}"));
        }
        Ok(())
    }
}

impl World {
    /// An allocation on the second device, held in its slots: awaited (it
    /// must be served when it fits and the harness holds nothing on
    /// either device) or tried.
    pub(super) fn twin_alloc(&mut self, size: usize, how: AllocHow, granularity: usize) -> Verdict {
        let Some(twin) = &self.twin else {
            return Ok(());
        };
        let (res, s) = (twin.res().clone(), twin.stream);
        let refusal = |e: &ResourceError| {
            matches!(
                e,
                ResourceError::BudgetExceeded { .. }
                    | ResourceError::OutOfMemory { .. }
                    | ResourceError::AllocationsWaiting { .. }
            )
        };
        let got = match how {
            AllocHow::Try | AllocHow::Cancel { .. } => {
                match res.try_allocate_buffer::<u8>(size, s, TAG) {
                    Ok(b) => Some(b),
                    Err(e) => {
                        let expected = refusal(&e);
                        self.judge("the second device's try_allocate_buffer", &e, expected)?;
                        None
                    }
                }
            }
            AllocHow::Await => {
                // Behind a debug guard's quarantine (on the first device,
                // under the shared budget) a wait may last for good.
                let must = !self.holds_memory() && !self.guard && self.fits(size, granularity);
                let mut fut = res.allocate_buffer::<u8>(size, s, TAG);
                let patience = if must { GUARD } else { PATIENCE };
                match self.drive(&mut fut, patience) {
                    Some(Ok(b)) => Some(b),
                    Some(Err(e)) => {
                        let expected = !must && refusal(&e);
                        self.judge("the second device's allocate_buffer", &e, expected)?;
                        None
                    }
                    None if must && !self.faulted => {
                        return fail(format!(
                            "hang: an allocation of {size} B on the second device waited \
                             {GUARD:?} with nothing held on either (budgets {:?})",
                            self.budgets.iter().map(Budget::in_use).collect::<Vec<_>>(),
                        ));
                    }
                    None => None,
                }
            }
        };
        if let (Some(b), Some(twin)) = (got, &mut self.twin) {
            twin.buffers.push(b);
        }
        Ok(())
    }
}
