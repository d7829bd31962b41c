//! The trace format: reading (and writing) `op,id,size,stream` CSV, gzip or
//! plain, into a checked [`Trace`].
//!
//! ```text
//! op,id,size,stream
//! a,0,154389504,0      allocate 154389504 bytes on stream 0, call the block 0
//! f,0,154389504,1      free block 0 (the stream the program freed it from)
//! ```
//!
//! Reading checks every line and stops at the first bad one with a
//! [`TraceError::Malformed`] that names its line number (the header is line
//! 1): a wrong field count, an op other than `a` or `f`, a number that does
//! not parse, a stream beyond [`MAX_STREAMS`], an allocation of a block that
//! is live, a free of a block that is not, a free whose size is not the
//! allocation's. A replay can then trust every operation. Blocks the trace
//! never frees are legal: the replay frees them after the last operation.

use std::collections::HashMap;
use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

/// The header line every trace starts with.
pub const HEADER: &str = "op,id,size,stream";

/// The most streams a trace may name (stream numbers `0..MAX_STREAMS`): a
/// replay opens one pool stream per trace stream.
pub const MAX_STREAMS: usize = 64;

/// What one line of a trace does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// `a`: allocate.
    Alloc,
    /// `f`: free.
    Free,
}

/// One operation of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceOp {
    /// Allocate or free.
    pub kind: OpKind,
    /// The block's name in the trace (unique among live blocks).
    pub id: u64,
    /// Bytes requested (for a free: the allocation's size).
    pub size: usize,
    /// The trace stream (`0..Trace::streams`): where an allocation is
    /// ordered, or the stream a free was made from.
    pub stream: u32,
}

/// A checked trace: every free names a live block of the same size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The operations, in order.
    pub ops: Vec<TraceOp>,
    /// Streams the trace uses: one more than its highest stream number.
    pub streams: usize,
}

/// Why a trace could not be read.
#[derive(Debug)]
pub enum TraceError {
    /// The file could not be opened or read (or is not valid gzip).
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A line is not a valid operation at its place in the trace.
    Malformed {
        /// 1-based line number (the header is line 1).
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            TraceError::Malformed { line, reason } => write!(f, "line {line}: {reason}"),
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TraceError::Io { source, .. } => Some(source),
            TraceError::Malformed { .. } => None,
        }
    }
}

fn malformed(line: usize, reason: impl Into<String>) -> TraceError {
    TraceError::Malformed {
        line,
        reason: reason.into(),
    }
}

impl Trace {
    /// Reads the trace at `path`: gzip when it starts with the gzip magic
    /// bytes, plain CSV otherwise.
    ///
    /// # Errors
    /// [`TraceError::Io`] when the file cannot be read or decompressed,
    /// [`TraceError::Malformed`] at the first bad line.
    pub fn read(path: impl AsRef<Path>) -> Result<Trace, TraceError> {
        let path = path.as_ref();
        let io = |source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = BufReader::new(std::fs::File::open(path).map_err(io)?);
        let gzip = file.fill_buf().map_err(io)?.starts_with(&[0x1f, 0x8b]);
        let parsed = if gzip {
            Trace::parse(BufReader::new(flate2::bufread::MultiGzDecoder::new(file)))
        } else {
            Trace::parse(file)
        };
        // A read failure inside the parse has no path: add it.
        parsed.map_err(|e| match e {
            TraceError::Io { source, .. } => io(source),
            other => other,
        })
    }

    /// Parses a trace from CSV text (see the module documentation).
    ///
    /// # Errors
    /// As [`Trace::read`]; an [`Io`](TraceError::Io) error here has an empty
    /// path.
    pub fn parse(input: impl Read) -> Result<Trace, TraceError> {
        let mut input = BufReader::new(input);
        let mut ops = Vec::new();
        let mut streams = 0usize;
        // Live blocks: id -> (size, line of the allocation).
        let mut live: HashMap<u64, (usize, usize)> = HashMap::new();
        let mut text = String::new();
        let mut line = 0usize;
        loop {
            text.clear();
            let read = input
                .read_line(&mut text)
                .map_err(|source| TraceError::Io {
                    path: PathBuf::new(),
                    source,
                })?;
            if read == 0 {
                break;
            }
            line += 1;
            let row = text.trim_end_matches(['\n', '\r']);
            if line == 1 {
                if row != HEADER {
                    return Err(malformed(
                        1,
                        format!("expected the header `{HEADER}`, found `{row}`"),
                    ));
                }
                continue;
            }
            let op = parse_op(row).map_err(|reason| malformed(line, reason))?;
            match op.kind {
                OpKind::Alloc => {
                    if let Some((_, at)) = live.insert(op.id, (op.size, line)) {
                        return Err(malformed(
                            line,
                            format!(
                                "block {} allocated again while live (since line {at})",
                                op.id
                            ),
                        ));
                    }
                }
                OpKind::Free => match live.remove(&op.id) {
                    None => {
                        return Err(malformed(
                            line,
                            format!("free of block {}, which is not live", op.id),
                        ));
                    }
                    Some((size, at)) if size != op.size => {
                        return Err(malformed(
                            line,
                            format!(
                                "free of block {} with size {}, allocated with size {size} on line {at}",
                                op.id, op.size
                            ),
                        ));
                    }
                    Some(_) => {}
                },
            }
            streams = streams.max(op.stream as usize + 1);
            ops.push(op);
        }
        if line == 0 {
            return Err(malformed(1, format!("empty trace: no header `{HEADER}`")));
        }
        Ok(Trace { ops, streams })
    }

    /// The first `ops` operations, with the blocks they leave live freed at
    /// the end (in allocation order, each on its allocation stream): a
    /// shorter trace that is complete on its own.
    pub fn cut(&self, ops: usize) -> Trace {
        let head = &self.ops[..ops.min(self.ops.len())];
        let mut live: HashMap<u64, usize> = HashMap::new();
        for (i, op) in head.iter().enumerate() {
            match op.kind {
                OpKind::Alloc => {
                    live.insert(op.id, i);
                }
                OpKind::Free => {
                    live.remove(&op.id);
                }
            }
        }
        let mut left: Vec<usize> = live.into_values().collect();
        left.sort_unstable();
        let mut out: Vec<TraceOp> = head.to_vec();
        out.extend(left.into_iter().map(|i| TraceOp {
            kind: OpKind::Free,
            ..head[i]
        }));
        let streams = out
            .iter()
            .map(|op| op.stream as usize + 1)
            .max()
            .unwrap_or(0);
        Trace { ops: out, streams }
    }

    /// Writes the trace as CSV (header first) to `out`.
    ///
    /// # Errors
    /// What `out` reports.
    pub fn write_csv(&self, mut out: impl Write) -> std::io::Result<()> {
        writeln!(out, "{HEADER}")?;
        for op in &self.ops {
            let kind = match op.kind {
                OpKind::Alloc => 'a',
                OpKind::Free => 'f',
            };
            writeln!(out, "{kind},{},{},{}", op.id, op.size, op.stream)?;
        }
        out.flush()
    }

    /// Writes the trace as gzip CSV to `path`.
    ///
    /// # Errors
    /// What the file system reports.
    pub fn write_gz(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        let file = std::io::BufWriter::new(std::fs::File::create(path)?);
        let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::best());
        self.write_csv(&mut gz)?;
        gz.finish()?.flush()
    }
}

/// Parses one data line, or says what is wrong with it.
fn parse_op(row: &str) -> Result<TraceOp, String> {
    let fields: Vec<&str> = row.split(',').collect();
    let [op, id, size, stream] = fields[..] else {
        return Err(format!(
            "expected 4 fields `{HEADER}`, found {} in `{row}`",
            fields.len()
        ));
    };
    let kind = match op {
        "a" => OpKind::Alloc,
        "f" => OpKind::Free,
        other => return Err(format!("op must be `a` or `f`, found `{other}`")),
    };
    let number = |name: &str, text: &str| {
        text.parse::<u64>()
            .map_err(|e| format!("{name} `{text}` is not a non-negative integer ({e})"))
    };
    let id = number("id", id)?;
    let size = usize::try_from(number("size", size)?).map_err(|e| format!("size: {e}"))?;
    let stream = number("stream", stream)?;
    if stream >= MAX_STREAMS as u64 {
        return Err(format!(
            "stream {stream} is beyond the {MAX_STREAMS} streams a replay opens"
        ));
    }
    Ok(TraceOp {
        kind,
        id,
        size,
        stream: stream as u32,
    })
}
