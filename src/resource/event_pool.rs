//! A pool of reusable events, so that block-use tracking creates events only
//! while the pool is growing.
//!
//! Reusing an event is safe as soon as no one will *queue* a wait on its old
//! record any more: a wait already queued keeps the record it saw.

// Unsafe here: the pool destroys its own events through the `Gpu` seam.
#![allow(unsafe_code)]

use std::sync::Arc;

use crate::gpu::{Gpu, GpuResult, RawEvent};
use crate::util::sync::Mutex;

#[derive(Debug)]
pub(crate) struct EventPool<G: Gpu + ?Sized> {
    gpu: Arc<G>,
    free: Mutex<Vec<RawEvent>>,
}

impl<G: Gpu + ?Sized> EventPool<G> {
    pub(crate) fn new(gpu: Arc<G>) -> Self {
        EventPool {
            gpu,
            free: Mutex::new(Vec::new()),
        }
    }

    /// A free event, created if the pool is empty.
    pub(crate) fn take(&self) -> GpuResult<RawEvent> {
        let reused = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match reused {
            Some(e) => Ok(e),
            None => self.gpu.event_create(),
        }
    }

    /// Returns events to the pool.
    pub(crate) fn give(&self, events: impl IntoIterator<Item = RawEvent>) {
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(events);
    }

    /// Events currently pooled.
    pub(crate) fn len(&self) -> usize {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl<G: Gpu + ?Sized> Drop for EventPool<G> {
    fn drop(&mut self) {
        let free = std::mem::take(self.free.get_mut().unwrap_or_else(|p| p.into_inner()));
        for e in free {
            // SAFETY: every pooled event was made by `self.gpu.event_create`
            // and is destroyed only here, once: the pool is being dropped,
            // and events in use are given back before (or never: then they
            // are not in `free`).
            let _ = unsafe { self.gpu.event_destroy(e) };
        }
    }
}
