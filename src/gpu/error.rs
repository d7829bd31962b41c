//! [`GpuError`]: what a backend call fails with, and its one conversion to
//! the crate's [`ResourceError`].
//!
//! A backend knows which driver call failed and with which code, but not why
//! the crate made the call. So there are exactly two ways up:
//!
//! - `From<GpuError> for ResourceError` (what `?` uses), for a call made
//!   for no request of the user: an event, a wait, a free, a fill. Every
//!   failure becomes [`ResourceError::Driver`] with its call and code named,
//!   an out-of-memory included;
//! - [`GpuError::for_request`], for the one call made for a request of
//!   `requested` bytes on a stream (the allocation): an out-of-memory becomes
//!   [`ResourceError::OutOfMemory`] with that context, which waiting
//!   allocations and [`RetryOnOomResource`](crate::RetryOnOomResource) recognise.

use crate::error::{DriverCall, ResourceError, driver_code};
use crate::types::StreamId;

/// What a backend call can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    /// An allocation ([`DriverCall::AllocAsync`]) found no room;
    /// `available` bytes were free.
    #[error("out of device memory ({available} B available)")]
    OutOfMemory {
        /// Bytes the device reported free.
        available: usize,
    },
    /// Any other driver failure.
    #[error("driver call {call:?} failed: {message} (code {code})")]
    Driver {
        /// The failing call.
        call: DriverCall,
        /// The driver's code (`CUresult`, see [`driver_code`]).
        code: i32,
        /// The driver's name for the code.
        message: String,
    },
}

impl GpuError {
    /// A driver failure of `call` with `code` (one of [`driver_code`]) and
    /// `message`.
    pub fn driver(call: DriverCall, code: i32, message: impl Into<String>) -> Self {
        GpuError::Driver {
            call,
            code,
            message: message.into(),
        }
    }

    /// The driver call that failed.
    pub fn call(&self) -> DriverCall {
        match self {
            GpuError::OutOfMemory { .. } => DriverCall::AllocAsync,
            GpuError::Driver { call, .. } => *call,
        }
    }

    /// The driver's code for the failure (one of [`driver_code`], or any
    /// other `CUresult` the driver returned).
    pub fn code(&self) -> i32 {
        match self {
            GpuError::OutOfMemory { .. } => driver_code::OUT_OF_MEMORY,
            GpuError::Driver { code, .. } => *code,
        }
    }

    /// The crate's error for this failure of the call made for a request of
    /// `requested` bytes on `stream`: an out-of-memory carries that context
    /// as [`ResourceError::OutOfMemory`]; any other failure converts as
    /// `From` does.
    pub fn for_request(self, requested: usize, stream: StreamId) -> ResourceError {
        match self {
            GpuError::OutOfMemory { available } => ResourceError::OutOfMemory {
                requested,
                available,
                stream,
            },
            other => other.into(),
        }
    }
}

impl From<GpuError> for ResourceError {
    /// A failure of a call made for no request: [`ResourceError::Driver`]
    /// naming the call and code (an out-of-memory too: without a request
    /// there is no `requested` or stream to report).
    fn from(e: GpuError) -> Self {
        match e {
            GpuError::OutOfMemory { available } => ResourceError::Driver {
                call: DriverCall::AllocAsync,
                code: driver_code::OUT_OF_MEMORY,
                message: format!("CUDA_ERROR_OUT_OF_MEMORY ({available} B available)"),
            },
            GpuError::Driver {
                call,
                code,
                message,
            } => ResourceError::Driver {
                call,
                code,
                message,
            },
        }
    }
}

/// A backend result.
pub type GpuResult<T> = Result<T, GpuError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_failure_keeps_its_call_code_and_message() {
        let e = GpuError::driver(
            DriverCall::EventRecord,
            driver_code::INVALID_HANDLE,
            "CUDA_ERROR_INVALID_HANDLE",
        );
        assert_eq!(e.call(), DriverCall::EventRecord);
        assert_eq!(e.code(), 400);
        let expected = ResourceError::Driver {
            call: DriverCall::EventRecord,
            code: 400,
            message: "CUDA_ERROR_INVALID_HANDLE".into(),
        };
        assert_eq!(ResourceError::from(e.clone()), expected);
        let stream = StreamId::new(0, 1);
        assert_eq!(
            e.for_request(64, stream),
            expected,
            "only OOM takes context"
        );
    }

    #[test]
    fn out_of_memory_without_a_request_is_a_driver_failure_of_the_allocation() {
        let e = GpuError::OutOfMemory { available: 4096 };
        assert_eq!(e.call(), DriverCall::AllocAsync);
        assert_eq!(e.code(), driver_code::OUT_OF_MEMORY);
        match ResourceError::from(e) {
            ResourceError::Driver {
                call,
                code,
                message,
            } => {
                assert_eq!(call, DriverCall::AllocAsync);
                assert_eq!(code, 2);
                assert!(message.contains("4096 B available"), "{message}");
            }
            other => panic!("expected a driver error, got {other:?}"),
        }
    }

    #[test]
    fn out_of_memory_for_a_request_carries_the_request() {
        let stream = StreamId::new(3, 2);
        let e = GpuError::OutOfMemory { available: 10 };
        assert_eq!(
            e.for_request(1 << 20, stream),
            ResourceError::OutOfMemory {
                requested: 1 << 20,
                available: 10,
                stream,
            }
        );
    }

    #[test]
    fn question_mark_converts() {
        fn fails() -> Result<(), ResourceError> {
            Err(GpuError::driver(
                DriverCall::MemGetInfo,
                driver_code::UNKNOWN,
                "x",
            ))?;
            Ok(())
        }
        assert!(matches!(
            fails(),
            Err(ResourceError::Driver {
                call: DriverCall::MemGetInfo,
                code: 999,
                ..
            })
        ));
    }
}
