//! Reservations at random: a request's memory reserved as one unit, some
//! of its blocks taken as buffers (launched on, dropped, freed as any
//! other buffer of the harness), the reservation kept across other ops or
//! dropped at once, here, on another thread or on another runtime.
//!
//! A reservation dropped with blocks it never handed out gives them back
//! unused (`deallocate_unused`): a cache below undoes their placement,
//! the memory ordered for its next user as it was before. The check after
//! every step (no race on the simulated device, which reports the undo
//! of an allocation any operation touched) holds that claim on every
//! stack: whatever ran on the reservation's stream meanwhile, the next
//! user of that memory is ordered after everything that used it.

use super::*;

impl World {
    pub(super) fn reserve(
        &mut self,
        sizes: [usize; 2],
        stream: usize,
        polls: u8,
        take: u8,
        keep: bool,
    ) -> Verdict {
        let s = self.stream(stream);
        // A size of 0 is refused before anything queues; the rest, as an
        // allocation's refusals.
        let expected = |e: &ResourceError| match e {
            ResourceError::EmptyReservation { .. } => sizes.contains(&0),
            _ => matches!(
                e,
                ResourceError::BudgetExceeded { .. }
                    | ResourceError::OutOfMemory { .. }
                    | ResourceError::AllocationsWaiting { .. }
            ),
        };
        let mut fut = self.res().reserve(&sizes, s, TAG);
        for _ in 0..polls {
            match self.poll_step(&mut fut) {
                Some(Ok(mut reservation)) => {
                    for _ in 0..take {
                        self.take_one(&mut reservation)?;
                    }
                    if keep {
                        self.reservations.push(reservation);
                    }
                    return Ok(());
                }
                Some(Err(e)) => {
                    let expected = expected(&e);
                    return self.judge("reserve", &e, expected);
                }
                // Dropped after the last poll: a cancelled wait.
                None => {}
            }
        }
        Ok(())
    }

    pub(super) fn take_reserved(&mut self, slot: usize) -> Verdict {
        let Some(mut reservation) = Self::take(&mut self.reservations, slot) else {
            return Ok(());
        };
        let taken = self.take_one(&mut reservation);
        if !reservation.is_empty() {
            self.reservations.push(reservation);
        }
        taken
    }

    /// The reservation's first block left, as a buffer of the harness.
    fn take_one(&mut self, reservation: &mut MemoryReservation) -> Verdict {
        let Some(size) = reservation.sizes().next() else {
            return Ok(());
        };
        match reservation.allocate_buffer::<u8>(size) {
            Ok(b) => self.buffers.push(b),
            Err(e) => self.judge("allocate_buffer from a reservation", &e, false)?,
        }
        Ok(())
    }
}
