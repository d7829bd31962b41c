//! The cache configuration the allocator picks for PyTorch, and the
//! environment variables that change it.
//!
//! # Why not the library's defaults
//!
//! The cache's arena maps physical memory in allocations of up to
//! [`max_mapping_bytes`](streamalloc::CacheConfig::max_mapping_bytes)
//! (the library's default: 1 GiB, the fewest driver calls), and gives an
//! allocation back only when no live block touches any of its pages. A
//! model's large blocks (a decoder's keys and values, a training step's
//! activations) each get one allocation of their size: once freed, a small
//! block placed over the start of one keeps all of it, and the arena grows
//! elsewhere. With allocations of at most 64 MiB, idle memory goes back in
//! pieces of 64 MiB at most. Replayed on the simulated device (`trace_replay
//! TRACE --sim --stack cache --max-mapping BYTES --calls`, peak held over
//! peak requested, allocations created), 1 GiB against 64 MiB:
//!
//! | trace | 1 GiB | 64 MiB |
//! | --- | --- | --- |
//! | BERT training, first 50,000 operations | 1.070, 55 | 1.023, 148 |
//! | GPT-2 inference | 1.040, 21 | 1.040, 24 |
//! | GPT-2 training | 1.070, 49 | 1.071, 136 |
//! | Llama inference, first 50,000 | 1.049, 34 | 1.049, 35 |
//! | synthetic `layered` | 1.062, 29 | 1.018, 41 |
//! | synthetic `plateau_then_spike` | 1.070, 122 | 1.046, 162 |
//! | synthetic `many_streams` (8 streams) | 1.168, 60 | 1.168, 60 |
//!
//! Never more memory (GPT-2 training within 0.1 %), up to 4.5 % less, for
//! up to 2.8× the allocations (each about 50 µs of driver calls, made
//! while the model grows, not once it runs steadily). The slack over the
//! live high-water mark stays the library's (7 %): lower, it held more on
//! the Llama and GPT-2 training traces.
//!
//! # Memory another stream freed: only once the GPU is done with it
//!
//! The library's default ([`CrossStreamReuse::Wait`]) lends a range one
//! stream freed to another stream behind a wait on the GPU when nothing
//! else fits: the least memory, and placement independent of the GPU's
//! timing. But the wait orders everything the freeing stream queued before
//! the free ahead of the borrower's next work. A PyTorch program that puts
//! requests on separate streams means them to run side by side, and
//! PyTorch's own allocator never makes one wait on another: it keeps a
//! pool per stream and grows it. On the H100 the two four-stream Llama
//! servers of `scripts/compare_models.py` borrowed in 14% and 8% of their
//! allocations and took 1.03× and 1.13× PyTorch's time per token, where
//! the allocator's own calls were 2–4% of the run (2026-12-06). So the
//! allocator takes another stream's free only where the host saw the GPU
//! done with it ([`CrossStreamReuse::Done`]), else it grows, as PyTorch
//! does; it still shares what PyTorch's pools cannot (one arena, freed
//! memory any stream takes once done), so it holds less.
//!
//! # Environment
//!
//! Read once, when a device opens:
//!
//! - `STREAMALLOC_TORCH_MAX_MAPPING_MIB`: the most one physical allocation
//!   covers, in MiB (default 64);
//! - `STREAMALLOC_TORCH_SLACK_PERCENT`: how far over the live high-water
//!   mark the arena may hold memory (default 7);
//! - `STREAMALLOC_TORCH_CROSS_STREAM`: `done` (the default: another
//!   stream's free serves only once the GPU is done with it) or `wait`
//!   (the library's default: behind a wait on the GPU when nothing else
//!   fits).
//!
//! A value that is not a whole number (or, for the last, not one of the
//! two words) refuses the device, with the reason.

use streamalloc::{CacheConfig, CrossStreamReuse};

/// Streams one device can register: PyTorch's 32 per priority, four
/// priorities, the default stream, and room for external ones.
pub(crate) const STREAMS: usize = 192;

/// The most one physical allocation of the arena covers, by default.
pub const MAX_MAPPING_BYTES: usize = 64 << 20;

/// Environment variable: the most one physical allocation covers, in MiB.
pub const MAX_MAPPING_ENV: &str = "STREAMALLOC_TORCH_MAX_MAPPING_MIB";

/// Environment variable: the arena's slack, in percent.
pub const SLACK_ENV: &str = "STREAMALLOC_TORCH_SLACK_PERCENT";

/// Environment variable: when another stream's free may serve a stream,
/// `done` or `wait`.
pub const CROSS_STREAM_ENV: &str = "STREAMALLOC_TORCH_CROSS_STREAM";

/// When another stream's free serves a stream, by default.
pub const CROSS_STREAM: CrossStreamReuse = CrossStreamReuse::Done;

/// The configuration without the environment's changes: the library's
/// defaults with [`MAX_MAPPING_BYTES`], [`CROSS_STREAM`] and a slot for
/// each of PyTorch's streams.
pub fn cache_config() -> CacheConfig {
    CacheConfig::default()
        .streams(STREAMS)
        .max_mapping_bytes(MAX_MAPPING_BYTES)
        .cross_stream(CROSS_STREAM)
}

/// The policy a value of [`CROSS_STREAM_ENV`] names.
///
/// # Errors
/// The variable and its value, for any other word.
pub fn parse_cross_stream(value: &str) -> Result<CrossStreamReuse, String> {
    match value.trim() {
        "done" => Ok(CrossStreamReuse::Done),
        "wait" => Ok(CrossStreamReuse::Wait),
        other => Err(format!(
            "{CROSS_STREAM_ENV}=`{other}` is neither `done` nor `wait`"
        )),
    }
}

/// [`cache_config`] with the environment's changes.
///
/// # Errors
/// The variable and its value, for one that is not a whole number (or a
/// mapping of 0 MiB).
pub(crate) fn cache_config_from_env() -> Result<CacheConfig, String> {
    let mut config = cache_config();
    if let Some(mib) = number(MAX_MAPPING_ENV)? {
        if mib == 0 {
            return Err(format!(
                "{MAX_MAPPING_ENV}=0: a mapping needs at least 1 MiB"
            ));
        }
        config = config.max_mapping_bytes(mib.saturating_mul(1 << 20));
    }
    if let Some(percent) = number(SLACK_ENV)? {
        config = config.slack_percent(percent);
    }
    match std::env::var(CROSS_STREAM_ENV) {
        Ok(value) => config = config.cross_stream(parse_cross_stream(&value)?),
        Err(std::env::VarError::NotPresent) => {}
        Err(std::env::VarError::NotUnicode(value)) => {
            return Err(format!("{CROSS_STREAM_ENV}={value:?} is not a word"));
        }
    }
    Ok(config)
}

/// The whole number `name` holds, if it is set.
fn number(name: &str) -> Result<Option<usize>, String> {
    match std::env::var(name) {
        Ok(value) => value
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("{name}=`{value}` is not a whole number")),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(value)) => {
            Err(format!("{name}={value:?} is not a whole number"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cross_stream_words_name_the_two_policies_and_nothing_else() {
        assert_eq!(parse_cross_stream("done"), Ok(CrossStreamReuse::Done));
        assert_eq!(parse_cross_stream(" wait\n"), Ok(CrossStreamReuse::Wait));
        let refused = parse_cross_stream("never").unwrap_err();
        assert!(refused.contains(CROSS_STREAM_ENV) && refused.contains("never"));
        assert_eq!(cache_config().cross_stream_reuse(), CROSS_STREAM);
    }
}
