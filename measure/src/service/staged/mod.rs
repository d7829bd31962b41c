//! The service with real input and output copies (`service_bench
//! --staged`, issue 35): each request's input is written by the host
//! into pinned memory, copied host → device, run through the model, and
//! its result copied device → host, where the host checks it.
//!
//! The plain service copies from one shared pinned input and into one
//! pinned output per client that the model owns, so its ways differ only
//! in device memory and completion. Here each way also stages the bytes
//! its own way, as its users would:
//!
//! ```text
//!  way                  pinned host memory                       copies
//!  streamalloc+hostpool HostBuffers from a HostPool per request,  copy_to_device / copy_to_host,
//!                       back to the pool once their copies are    one future each (the last
//!                       seen complete (warm: pinned in warm-up)   awaited)
//!  cudarc+pinned        PinnedHostSlices per client, pinned once  memcpy_htod / memcpy_dtoh,
//!                       (input write-combined), reused            stream.synchronize() in
//!                                                                 spawn_blocking
//!  cuda-async+pinned    PinnedHostBuffers per client, pinned      cuMemcpy*Async inside the
//!                       once, moved into the DeviceOp and back    DeviceOp (cuda-core), its
//!                                                                 DeviceFuture awaited
//! ```
//!
//! A per-client buffer of the largest request is the fastest a peer
//! without a pool can do (no pin on the request path at all), at the cost
//! of pinned memory for every client's largest request; the pool pins what
//! requests in flight need, by size class. Each row says how much each
//! held pinned.
//!
//! Every request's input elements are one value drawn per request
//! ([`input_value`]), so that on CUDA each way checks every element of
//! its result ([`check_output`]): a copy out of the wrong buffer, or read
//! before it completed, fails the level. On the simulated device (only
//! the streamalloc way runs) copies move no data, so values go unchecked
//! and the race detector judges the ordering, the host side included.

#[cfg(feature = "peer-cuda-async")]
pub mod cuda_async_way;
pub mod cudarc_way;
pub mod streamalloc_way;

use super::Dims;
use super::cuda_model::expected_output;

/// The error of a staged level: a driver's, the library's, or a wrong
/// result.
pub type StagedError = Box<dyn std::error::Error + Send + Sync>;

/// What one staged level of one way measured, beyond the plain row.
#[derive(Debug, Clone)]
pub struct StagedRow {
    /// Requests/s, latencies, device memory (as the plain service).
    pub row: super::LevelResult,
    /// The most pinned host bytes the way held for staging.
    pub pinned_peak: usize,
    /// Host allocations pinned during the measured requests (0 for a warm
    /// pool and for the peers, which pinned beforehand).
    pub pins: u64,
}

impl StagedRow {
    /// The Markdown row: the plain columns, then pinned host memory.
    pub fn markdown_row(&self) -> String {
        format!(
            "{} {:.0} MiB | {} |",
            self.row.markdown_row(),
            self.pinned_peak as f64 / (1u64 << 20) as f64,
            self.pins
        )
    }

    /// The CSV row (see [`csv_header`]).
    pub fn csv_row(&self) -> String {
        format!("{},{},{}", self.row.csv_row(), self.pinned_peak, self.pins)
    }
}

/// The header of [`StagedRow::csv_row`].
pub fn csv_header() -> String {
    format!("{},pinned_peak_bytes,pins", super::csv_header())
}

/// The header of [`StagedRow::markdown_row`].
pub fn table_header() -> &'static str {
    "| way | clients | requests | requests/s | p50 | p99 | peak held | peak live requested | held / requested | threads blocked (peak) | process threads (peak) | pinned host held (peak) | pins while serving |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
}

/// The value of every input element of request `request` of `client`:
/// positive (the model's ReLUs then pass everything, so the result is
/// linear in it), and different from one request of a client to the next.
pub fn input_value(client: usize, request: usize) -> f32 {
    0.25 + ((client * 3 + request) % 8) as f32 * 0.125
}

/// Whether `output` holds the model's result for an input of `input`
/// everywhere (to 0.1 %); the first wrong element otherwise.
///
/// # Errors
/// A message naming the first wrong element.
pub fn check_output(dims: Dims, input: f32, output: &[f32]) -> Result<(), String> {
    let want = expected_output(dims, input);
    match output
        .iter()
        .position(|v| (v - want).abs() > want.abs() * 1e-3)
    {
        None => Ok(()),
        Some(i) => Err(format!(
            "output element {i} of {} is {}, not {want} (input {input})",
            output.len(),
            output[i]
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_vary_and_outputs_are_checked() {
        let dims = Dims::BENCH;
        assert_ne!(input_value(0, 0), input_value(0, 1));
        assert!((0..64).all(|r| input_value(5, r) > 0.0));
        let want = expected_output(dims, input_value(2, 3));
        let mut out = vec![want; 100];
        assert_eq!(check_output(dims, input_value(2, 3), &out), Ok(()));
        // Another request's result is not this one's.
        assert!(check_output(dims, input_value(2, 4), &out).is_err());
        out[57] = 0.0;
        let err = check_output(dims, input_value(2, 3), &out).unwrap_err();
        assert!(err.contains("element 57"), "{err}");
    }
}
