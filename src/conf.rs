//! [`AllocConf`]: configuration without code, from the environment
//! variable `STREAMALLOC_CONF`, in the style of PyTorch's
//! `PYTORCH_CUDA_ALLOC_CONF`.
//!
//! # Grammar
//!
//! ```text
//! STREAMALLOC_CONF = [ pair { "," pair } ]
//! pair             = key ":" value          (spaces around either are ignored)
//! ```
//!
//! | key | value | what it does |
//! | --- | --- | --- |
//! | `cache` | `on` / `off` | the caching tier ([`CacheConfig::default`](crate::CacheConfig)) |
//! | `cache_max` | bytes | the most idle bytes the cache keeps ([`CacheConfig::max_cached_bytes`](crate::CacheConfig::max_cached_bytes)); needs `cache:on` |
//! | `cache_virtual_memory` | `on` / `off` | the cache's virtual-memory arena, or size classes ([`CacheConfig::virtual_memory`](crate::CacheConfig::virtual_memory)); needs `cache:on` |
//! | `budget` | bytes | a [`Budget`](crate::Budget) of that limit over the stack |
//! | `debug_guard` | `on` / `off` | a [`DebugGuardResource`](crate::DebugGuardResource) with the default quarantine, outermost |
//! | `history` | a count | record the last N events in the [memory history](crate::observe::history) (0: off) |
//! | `history_backtraces` | `on` / `off` | keep each allocation's Rust backtrace in the history; needs `history` |
//! | `wait` | `default` / `park` | the completion futures' [`WaitPolicy`](crate::WaitPolicy) (`DEFAULT` or `PARK_AT_ONCE`) |
//!
//! Bytes are a whole number with an optional unit: `B`, `KiB`, `MiB`,
//! `GiB`, `TiB` (powers of 1024) or `KB`, `MB`, `GB`, `TB` (powers of
//! 1000), as `budget:12GiB`. Switches take `on`/`off`, `true`/`false`,
//! `1`/`0`.
//!
//! # Who reads it
//!
//! [`AsyncResource::configured`](crate::AsyncResource::configured) builds
//! its whole stack from it. [`AsyncResource::on`](crate::AsyncResource::on)
//! and [`AsyncResource::build`](crate::AsyncResource::build), whose stack
//! the code chose, apply what does not change the stack (`history`,
//! `history_backtraces`, `wait`; the code may change the wait policy after)
//! and say in a `tracing` event that they keep their own layers.
//!
//! # Failure
//!
//! A key it does not know, a key given twice, a value it cannot read, a
//! key whose prerequisite is missing: a
//! [`ResourceError::Config`] naming the key
//! and the value, never a silent default. Nothing is built then.

#![forbid(unsafe_code)]

use crate::error::{ResourceError, ResourceResult};

/// The environment variable [`AllocConf::from_env`] reads.
pub const CONF_ENV: &str = "STREAMALLOC_CONF";

/// The completion futures' wait policy, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitChoice {
    /// [`WaitPolicy::DEFAULT`](crate::WaitPolicy::DEFAULT).
    Default,
    /// [`WaitPolicy::PARK_AT_ONCE`](crate::WaitPolicy::PARK_AT_ONCE).
    Park,
}

/// What `STREAMALLOC_CONF` says; `None` where it says nothing (see
/// [`AllocConf::parse`] for the grammar).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AllocConf {
    /// `cache`.
    pub cache: Option<bool>,
    /// `cache_max`, in bytes.
    pub cache_max: Option<usize>,
    /// `cache_virtual_memory`.
    pub cache_virtual_memory: Option<bool>,
    /// `budget`, in bytes.
    pub budget: Option<usize>,
    /// `debug_guard`.
    pub debug_guard: Option<bool>,
    /// `history`, in events.
    pub history: Option<usize>,
    /// `history_backtraces`.
    pub history_backtraces: Option<bool>,
    /// `wait`.
    pub wait: Option<WaitChoice>,
}

impl AllocConf {
    /// What `STREAMALLOC_CONF` says; an empty configuration when it is not
    /// set.
    ///
    /// # Errors
    /// As [`parse`](Self::parse); a value that is not Unicode is refused
    /// too.
    pub fn from_env() -> ResourceResult<Self> {
        match std::env::var(CONF_ENV) {
            Ok(text) => Self::parse(&text),
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Err(std::env::VarError::NotUnicode(v)) => Err(ResourceError::Config {
                key: CONF_ENV.to_string(),
                value: v.to_string_lossy().into_owned(),
                reason: "not Unicode".to_string(),
            }),
        }
    }

    /// Reads `text` in the grammar of `STREAMALLOC_CONF` (the essay of
    /// `src/conf.rs`).
    ///
    /// ```
    /// use streamalloc::AllocConf;
    ///
    /// let conf = AllocConf::parse("cache:on, budget:12GiB, history:10000")?;
    /// assert_eq!(conf.budget, Some(12 << 30));
    /// assert!(AllocConf::parse("budget:lots").is_err());
    /// # Ok::<(), streamalloc::ResourceError>(())
    /// ```
    ///
    /// # Errors
    /// [`ResourceError::Config`] naming the key: unknown, given twice, its
    /// value unreadable, or its prerequisite missing.
    pub fn parse(text: &str) -> ResourceResult<Self> {
        let mut conf = AllocConf::default();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, value)) = pair.split_once(':') else {
                return Err(bad(pair, "", "not `key:value`"));
            };
            let (key, value) = (key.trim(), value.trim());
            let twice = || bad(key, value, "given twice");
            match key {
                "cache" => set(&mut conf.cache, switch(key, value)?).ok_or_else(twice)?,
                "cache_max" => set(&mut conf.cache_max, bytes(key, value)?).ok_or_else(twice)?,
                "cache_virtual_memory" => {
                    set(&mut conf.cache_virtual_memory, switch(key, value)?).ok_or_else(twice)?
                }
                "budget" => set(&mut conf.budget, bytes(key, value)?).ok_or_else(twice)?,
                "debug_guard" => {
                    set(&mut conf.debug_guard, switch(key, value)?).ok_or_else(twice)?
                }
                "history" => set(&mut conf.history, count(key, value)?).ok_or_else(twice)?,
                "history_backtraces" => {
                    set(&mut conf.history_backtraces, switch(key, value)?).ok_or_else(twice)?
                }
                "wait" => {
                    let choice = match value {
                        "default" => WaitChoice::Default,
                        "park" => WaitChoice::Park,
                        _ => return Err(bad(key, value, "expected `default` or `park`")),
                    };
                    set(&mut conf.wait, choice).ok_or_else(twice)?
                }
                _ => {
                    return Err(bad(
                        key,
                        value,
                        "unknown key (cache, cache_max, cache_virtual_memory, budget, debug_guard, history, history_backtraces, wait)",
                    ));
                }
            }
        }
        for (key, given, needs, on) in [
            (
                "cache_max",
                conf.cache_max.is_some(),
                "cache:on",
                conf.cache == Some(true),
            ),
            (
                "cache_virtual_memory",
                conf.cache_virtual_memory.is_some(),
                "cache:on",
                conf.cache == Some(true),
            ),
            (
                "history_backtraces",
                conf.history_backtraces == Some(true),
                "history:N with N > 0",
                conf.history.is_some_and(|n| n > 0),
            ),
        ] {
            if given && !on {
                return Err(bad(key, "", &format!("needs {needs}")));
            }
        }
        Ok(conf)
    }

    /// Whether it says anything about the layers of a stack (`cache*`,
    /// `budget`, `debug_guard`).
    pub fn shapes_the_stack(&self) -> bool {
        self.cache.is_some() || self.budget.is_some() || self.debug_guard.is_some()
    }
}

/// Sets `slot` to `value` if it was unset; `None` if it was set.
fn set<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    match slot {
        Some(_) => None,
        None => {
            *slot = Some(value);
            Some(())
        }
    }
}

fn bad(key: &str, value: &str, reason: &str) -> ResourceError {
    ResourceError::Config {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

fn switch(key: &str, value: &str) -> ResourceResult<bool> {
    match value.to_ascii_lowercase().as_str() {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(bad(key, value, "expected on or off")),
    }
}

fn count(key: &str, value: &str) -> ResourceResult<usize> {
    value
        .parse()
        .map_err(|_| bad(key, value, "expected a whole number"))
}

fn bytes(key: &str, value: &str) -> ResourceResult<usize> {
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let unit_bytes: u128 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => {
            return Err(bad(
                key,
                value,
                "expected bytes: a whole number and B, KiB, MiB, GiB, TiB, KB, MB, GB or TB",
            ));
        }
    };
    let n: u128 = number
        .parse()
        .map_err(|_| bad(key, value, "expected bytes: a whole number first"))?;
    n.checked_mul(unit_bytes)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| bad(key, value, "more bytes than the address space"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(e: ResourceError) -> String {
        match e {
            ResourceError::Config { key, .. } => key,
            other => panic!("not a configuration error: {other}"),
        }
    }

    #[test]
    fn every_key_reads_its_value() {
        let conf = AllocConf::parse(
            " cache:on , cache_max:512MiB,cache_virtual_memory:off, budget:12GB,debug_guard:true,history:10000,history_backtraces:1,wait:park",
        )
        .unwrap();
        assert_eq!(
            conf,
            AllocConf {
                cache: Some(true),
                cache_max: Some(512 << 20),
                cache_virtual_memory: Some(false),
                budget: Some(12_000_000_000),
                debug_guard: Some(true),
                history: Some(10_000),
                history_backtraces: Some(true),
                wait: Some(WaitChoice::Park),
            }
        );
        assert!(conf.shapes_the_stack());
        assert_eq!(AllocConf::parse("").unwrap(), AllocConf::default());
        assert!(!AllocConf::parse("history:5").unwrap().shapes_the_stack());
        assert_eq!(AllocConf::parse("budget:4096").unwrap().budget, Some(4096));
        assert_eq!(
            AllocConf::parse("budget:1TiB").unwrap().budget,
            Some(1 << 40)
        );
    }

    #[test]
    fn a_bad_value_names_its_key() {
        for (text, key) in [
            ("budget:lots", "budget"),
            ("budget:12 parsecs", "budget"),
            ("budget:-1", "budget"),
            ("budget:99999999999999999999TiB", "budget"),
            ("cache:maybe", "cache"),
            ("history:ten", "history"),
            ("wait:sometimes", "wait"),
            ("colour:blue", "colour"),
            ("cache", "cache"),
            ("cache:on,cache:off", "cache"),
            ("cache_max:1GiB", "cache_max"),
            ("cache:off,cache_virtual_memory:on", "cache_virtual_memory"),
            ("history_backtraces:on", "history_backtraces"),
            ("history:0,history_backtraces:on", "history_backtraces"),
        ] {
            let e = AllocConf::parse(text).unwrap_err();
            assert!(e.to_string().contains(key), "{e}");
            assert_eq!(key_of(e), key, "{text}");
        }
    }
}
