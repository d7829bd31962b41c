//! A snapshot in the formats of the tools users already have: JSON, and
//! the pickled dict of PyTorch's `torch.cuda.memory._snapshot()`, which
//! the memory viewer (pytorch.org/memory_viz) and `torch.cuda._memory_viz`
//! (`trace_plot`, `segment_plot`, `segsum`, `trace`) open.
//!
//! # The PyTorch form
//!
//! ```text
//! {'segments': [{'device', 'address', 'total_size', 'allocated_size',
//!                'active_size', 'requested_size', 'stream', 'segment_type',
//!                'segment_pool_id', 'is_expandable', 'frames',
//!                'blocks': [{'address', 'size', 'requested_size',
//!                            'state', 'frames'}]}],
//!  'device_traces': [[{'action', 'addr', 'size', 'stream', 'time_us',
//!                      'frames', 'device_free'?}], ...one list per device]}
//! ```
//!
//! How the crate's picture maps onto it:
//! - **segments**: a cache's range is one segment (expandable where its
//!   memory is mapped in pages), its blocks the caller blocks inside it and
//!   its free ranges `inactive` blocks between them, so that the blocks
//!   tile the segment as `segsum` checks. Without a cache every block is
//!   its own segment, as every `cudaMallocAsync` of the driver's pool is.
//!   A quarantined block is `active_pending_free`.
//! - **device_traces**: `alloc`, `free_requested`, `segment_map`,
//!   `segment_unmap` and `oom` map one to one. The history records a
//!   stream's completed frees as bytes (frees of one stream run in the
//!   order they were queued), so each is spread here over the oldest
//!   requested frees of its stream, one `free_completed` per block. The
//!   waits, which PyTorch has no word for, stay in the JSON form.
//! - **frames**: an allocation's Rust backtrace, when the history kept
//!   them, as `{'filename', 'line', 'name'}` frames, innermost first.
//! - **stream**: the stream's index in its pool (PyTorch writes the
//!   `cudaStream_t`).

use std::collections::{HashMap, VecDeque};

use serde::Serialize;

use super::history::{MemoryAction, MemoryEvent};
use super::snapshot::{BlockInfo, BlockInfoState, MemorySnapshot};

impl MemorySnapshot {
    /// The snapshot as pretty-printed JSON (every section, the history and
    /// its waits included).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a snapshot is plain data")
    }

    /// The snapshot as the pickled dict of PyTorch's
    /// `torch.cuda.memory._snapshot()`.
    ///
    /// The form:
    ///
    /// ```text
    /// {'segments': [{'device', 'address', 'total_size', 'allocated_size',
    ///                'active_size', 'requested_size', 'stream', 'segment_type',
    ///                'segment_pool_id', 'is_expandable', 'frames',
    ///                'blocks': [{'address', 'size', 'requested_size',
    ///                            'state', 'frames'}]}],
    ///  'device_traces': [[{'action', 'addr', 'size', 'stream', 'time_us',
    ///                      'frames', 'device_free'?}], ...one list per device]}
    /// ```
    ///
    /// How the crate's picture maps onto it:
    /// - **segments**: a cache's range is one segment (expandable where its
    ///   memory is mapped in pages), its blocks the caller blocks inside it and
    ///   its free ranges `inactive` blocks between them, so that the blocks
    ///   tile the segment as `segsum` checks. Without a cache every block is
    ///   its own segment, as every `cudaMallocAsync` of the driver's pool is.
    ///   A quarantined block is `active_pending_free`.
    /// - **device_traces**: `alloc`, `free_requested`, `segment_map`,
    ///   `segment_unmap` and `oom` map one to one. The history records a
    ///   stream's completed frees as bytes (frees of one stream run in the
    ///   order they were queued), so each is spread here over the oldest
    ///   requested frees of its stream, one `free_completed` per block. The
    ///   waits, which PyTorch has no word for, stay in the JSON form.
    /// - **frames**: an allocation's Rust backtrace, when the history kept
    ///   them, as `{'filename', 'line', 'name'}` frames, innermost first.
    /// - **stream**: the stream's index in its pool (PyTorch writes the
    ///   `cudaStream_t`).
    ///
    /// # Examples
    /// ```
    /// use streamalloc::{AllocTag, AsyncResource, Device, gpu::sim::SimGpu};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), streamalloc::ResourceError> {
    /// let device = Device::sim(&SimGpu::new(), 1);
    /// let res = AsyncResource::on(&device)?;
    /// let block = res.allocate(4096, device.stream(0)?, AllocTag("weights")).await?;
    /// let pickle = res.snapshot().to_torch_pickle(); // write it to a file for the viewer
    /// assert_eq!(pickle.first(), Some(&0x80)); // a pickle's PROTO opcode
    /// # drop(res.deallocate(block)?);
    /// # Ok(()) }
    /// ```
    pub fn to_torch_pickle(&self) -> Vec<u8> {
        serde_pickle::to_vec(&self.to_torch(), serde_pickle::SerOptions::new())
            .expect("a snapshot is plain data")
    }

    fn to_torch(&self) -> TorchSnapshot {
        let frames = alloc_frames(&self.history);
        let frames_of = |addr: u64| frames.get(&addr).cloned().unwrap_or_default();
        let mut segments = Vec::new();
        let caller: Vec<&BlockInfo> = self.caller_blocks().collect();
        let mut placed = vec![false; caller.len()];
        for seg in &self.segments {
            let end = seg.address + seg.reserved as u64;
            // The blocks inside, and the free ranges, in address order.
            let mut parts: Vec<(u64, usize, Option<&BlockInfo>)> = Vec::new();
            for (i, b) in caller.iter().enumerate() {
                if b.address >= seg.address && b.address < end {
                    placed[i] = true;
                    parts.push((b.address, b.size, Some(b)));
                }
            }
            for &(addr, bytes, _) in &seg.free_ranges {
                parts.push((addr, bytes, None));
            }
            parts.sort_by_key(|p| p.0);
            let mut blocks = Vec::new();
            let mut at = seg.address;
            let fill = |blocks: &mut Vec<TorchBlock>, from: u64, to: u64| {
                if to > from {
                    blocks.push(TorchBlock::inactive(from, (to - from) as usize));
                }
            };
            for (addr, size, block) in parts {
                let addr = addr.max(at);
                fill(&mut blocks, at, addr);
                let size = size.min((end - addr) as usize);
                blocks.push(match block {
                    Some(b) => TorchBlock::active(b, frames_of(b.address)),
                    None => TorchBlock::inactive(addr, size),
                });
                at = addr + size as u64;
            }
            fill(&mut blocks, at, end);
            segments.push(TorchSegment::new(
                self.device,
                seg.address,
                seg.reserved,
                seg.stream.unwrap_or(0),
                seg.expandable,
                blocks,
            ));
        }
        for (b, _) in caller.iter().zip(&placed).filter(|(_, p)| !**p) {
            let block = TorchBlock::active(b, frames_of(b.address));
            segments.push(TorchSegment::new(
                self.device,
                b.address,
                b.size,
                b.stream,
                false,
                vec![block],
            ));
        }
        segments.sort_by_key(|s| s.address);
        let mut device_traces = vec![Vec::new(); self.device as usize + 1];
        device_traces[self.device as usize] = trace(&self.history, &frames);
        TorchSnapshot {
            segments,
            device_traces,
        }
    }
}

/// One stack frame, as PyTorch writes it.
#[derive(Debug, Clone, Serialize)]
struct Frame {
    filename: String,
    line: u32,
    name: String,
}

#[derive(Debug, Serialize)]
struct TorchSnapshot {
    segments: Vec<TorchSegment>,
    device_traces: Vec<Vec<TraceEntry>>,
}

#[derive(Debug, Serialize)]
struct TorchSegment {
    device: u32,
    address: u64,
    total_size: usize,
    allocated_size: usize,
    active_size: usize,
    requested_size: usize,
    stream: u32,
    segment_type: &'static str,
    segment_pool_id: (u64, u64),
    is_expandable: bool,
    frames: Vec<Frame>,
    blocks: Vec<TorchBlock>,
}

impl TorchSegment {
    fn new(
        device: u32,
        address: u64,
        total_size: usize,
        stream: u32,
        is_expandable: bool,
        blocks: Vec<TorchBlock>,
    ) -> Self {
        let active = |b: &&TorchBlock| b.state != "inactive";
        TorchSegment {
            device,
            address,
            total_size,
            allocated_size: blocks
                .iter()
                .filter(|b| b.state == "active_allocated")
                .map(|b| b.size)
                .sum(),
            active_size: blocks.iter().filter(active).map(|b| b.size).sum(),
            requested_size: blocks.iter().filter(active).map(|b| b.requested_size).sum(),
            stream,
            segment_type: if total_size <= 1 << 20 {
                "small"
            } else {
                "large"
            },
            segment_pool_id: (0, 0),
            is_expandable,
            frames: Vec::new(),
            blocks,
        }
    }
}

#[derive(Debug, Serialize)]
struct TorchBlock {
    address: u64,
    size: usize,
    requested_size: usize,
    state: &'static str,
    frames: Vec<Frame>,
}

impl TorchBlock {
    fn active(b: &BlockInfo, frames: Vec<Frame>) -> Self {
        TorchBlock {
            address: b.address,
            size: b.size,
            requested_size: b.requested.min(b.size),
            state: match b.state {
                BlockInfoState::Quarantined | BlockInfoState::Freeing => "active_pending_free",
                _ => "active_allocated",
            },
            frames,
        }
    }

    fn inactive(address: u64, size: usize) -> Self {
        TorchBlock {
            address,
            size,
            requested_size: 0,
            state: "inactive",
            frames: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct TraceEntry {
    action: &'static str,
    addr: u64,
    size: usize,
    stream: u32,
    time_us: u64,
    frames: Vec<Frame>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device_free: Option<usize>,
}

/// Each allocated address's frames, from the newest allocation at it.
fn alloc_frames(history: &[MemoryEvent]) -> HashMap<u64, Vec<Frame>> {
    let mut out = HashMap::new();
    for e in history {
        if e.action == MemoryAction::Alloc
            && let Some(bt) = &e.backtrace
        {
            out.insert(e.addr, parse_backtrace(&bt.to_string()));
        }
    }
    out
}

/// Frames of a Rust backtrace's text (`N: name` lines, each followed by an
/// `at file:line:col` line when known), innermost first.
fn parse_backtrace(text: &str) -> Vec<Frame> {
    let mut frames: Vec<Frame> = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(at) = line.strip_prefix("at ") {
            if let Some(last) = frames.last_mut() {
                let mut parts = at.rsplitn(3, ':');
                let _col = parts.next();
                let line_no = parts.next().and_then(|l| l.parse().ok());
                if let (Some(line_no), Some(file)) = (line_no, parts.next()) {
                    last.filename = file.to_string();
                    last.line = line_no;
                }
            }
        } else if let Some((index, name)) = line.split_once(": ")
            && index.chars().all(|c| c.is_ascii_digit())
        {
            frames.push(Frame {
                filename: "??".to_string(),
                line: 0,
                name: name.to_string(),
            });
        }
    }
    frames
}

/// The history as PyTorch trace entries (see the module documentation).
fn trace(history: &[MemoryEvent], frames: &HashMap<u64, Vec<Frame>>) -> Vec<TraceEntry> {
    let mut out = Vec::new();
    // Requested frees of each stream not yet completed, oldest first.
    let mut requested: HashMap<u32, VecDeque<(u64, usize)>> = HashMap::new();
    for e in history {
        let stream = e.stream.unwrap_or(0);
        let entry = |action: &'static str, addr: u64, size: usize| TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us: e.time_us,
            frames: frames.get(&addr).cloned().unwrap_or_default(),
            device_free: None,
        };
        match e.action {
            MemoryAction::Alloc => out.push(entry("alloc", e.addr, e.size)),
            MemoryAction::FreeRequested => {
                requested
                    .entry(stream)
                    .or_default()
                    .push_back((e.addr, e.size));
                out.push(entry("free_requested", e.addr, e.size));
            }
            MemoryAction::FreeCompleted => {
                let queue = requested.entry(stream).or_default();
                let mut left = e.size;
                while let Some(&(addr, size)) = queue.front() {
                    if size > left {
                        break;
                    }
                    left -= size;
                    queue.pop_front();
                    out.push(entry("free_completed", addr, size));
                }
            }
            MemoryAction::SegmentMap => out.push(entry("segment_map", e.addr, e.size)),
            MemoryAction::SegmentUnmap => out.push(entry("segment_unmap", e.addr, e.size)),
            MemoryAction::Oom => out.push(TraceEntry {
                device_free: Some(e.free),
                ..entry("oom", 0, e.size)
            }),
            MemoryAction::WaitBegun | MemoryAction::WaitServed => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backtrace_becomes_frames_with_files_and_lines() {
        let text = "   0: std::backtrace::Backtrace::force_capture\n             at /rustc/library/std/src/backtrace.rs:312:13\n   1: app::handler\n             at ./src/main.rs:42:9\n   2: main\n";
        let frames = parse_backtrace(text);
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[1].name, "app::handler");
        assert_eq!(frames[1].filename, "./src/main.rs");
        assert_eq!(frames[1].line, 42);
        assert_eq!(frames[2].filename, "??");
    }
}
