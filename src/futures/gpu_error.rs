//! A backend error outside an allocation, as the crate's error (the bottom
//! floor of the futures layer: every floor above may use it).

use crate::error::{DriverCall, ResourceError};
use crate::gpu::GpuError;

/// A backend error outside an allocation, as the crate's error.
pub(crate) fn gpu_error(e: GpuError) -> ResourceError {
    match e {
        GpuError::Driver {
            call,
            code,
            message,
        } => ResourceError::Driver {
            call,
            code,
            message,
        },
        GpuError::OutOfMemory { available } => ResourceError::Driver {
            call: DriverCall::Init,
            code: 2,
            message: format!("CUDA_ERROR_OUT_OF_MEMORY ({available} B available)"),
        },
    }
}
