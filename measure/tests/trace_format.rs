//! Reading traces: every malformed line is an error naming its line number,
//! gzip and plain CSV read alike, cuts free what they leave live.

use streamalloc_measure::trace::{OpKind, Requested, Trace, TraceError, TraceOp};

fn parse(text: &str) -> Result<Trace, TraceError> {
    Trace::parse(text.as_bytes())
}

/// The line number and reason of a malformed trace.
fn malformed(text: &str) -> (usize, String) {
    match parse(text) {
        Err(TraceError::Malformed { line, reason }) => (line, reason),
        other => panic!("expected a malformed-line error, got {other:?}"),
    }
}

const GOOD: &str = "op,id,size,stream\na,0,100,0\na,1,300,1\nf,0,100,1\na,2,50,0\n";

#[test]
fn a_good_trace_reads_in_order_with_its_stream_count() {
    let trace = parse(GOOD).unwrap();
    assert_eq!(trace.streams, 2);
    assert_eq!(trace.ops.len(), 4);
    assert_eq!(
        trace.ops[2],
        TraceOp {
            kind: OpKind::Free,
            id: 0,
            size: 100,
            stream: 1
        }
    );
    // CRLF line ends are accepted.
    assert_eq!(parse(&GOOD.replace('\n', "\r\n")).unwrap(), trace);
}

#[test]
fn each_malformed_line_is_reported_with_its_number() {
    let cases: [(&str, usize, &str); 11] = [
        ("", 1, "empty trace"),
        ("id,op,size,stream\n", 1, "header"),
        ("op,id,size,stream\na,0,1\n", 2, "4 fields"),
        ("op,id,size,stream\na,0,1,0,9\n", 2, "4 fields"),
        ("op,id,size,stream\na,0,1,0\nx,1,1,0\n", 3, "`a` or `f`"),
        ("op,id,size,stream\na,zero,1,0\n", 2, "id `zero`"),
        ("op,id,size,stream\na,0,-5,0\n", 2, "size `-5`"),
        ("op,id,size,stream\na,0,5,64\n", 2, "stream 64"),
        ("op,id,size,stream\na,0,5,0\n\na,1,5,0\n", 3, "4 fields"),
        ("op,id,size,stream\na,0,5,0\na,0,5,0\n", 3, "since line 2"),
        (
            "op,id,size,stream\na,0,5,0\nf,0,6,0\n",
            3,
            "allocated with size 5 on line 2",
        ),
    ];
    for (text, line, says) in cases {
        let (at, reason) = malformed(text);
        assert_eq!(at, line, "{text:?}: {reason}");
        assert!(reason.contains(says), "{text:?}: `{reason}` lacks `{says}`");
    }
    let (at, reason) = malformed("op,id,size,stream\na,0,5,0\nf,0,5,0\nf,0,5,0\n");
    assert_eq!(at, 4);
    assert!(reason.contains("not live"), "{reason}");
}

#[test]
fn the_error_message_starts_with_the_line() {
    let err = parse("op,id,size,stream\na,0,1,0\nq,1,1,0\n").unwrap_err();
    assert!(err.to_string().starts_with("line 3: "), "{err}");
}

#[test]
fn gzip_and_plain_files_read_the_same_and_missing_files_name_the_path() {
    let dir = std::env::temp_dir().join(format!("trace_format_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = parse(GOOD).unwrap();
    let gz = dir.join("t.csv.gz");
    trace.write_gz(&gz).unwrap();
    assert_eq!(Trace::read(&gz).unwrap(), trace);
    let plain = dir.join("t.csv");
    std::fs::write(&plain, GOOD).unwrap();
    assert_eq!(Trace::read(&plain).unwrap(), trace);

    let missing = dir.join("nope.csv.gz");
    let err = Trace::read(&missing).unwrap_err();
    assert!(matches!(err, TraceError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("nope.csv.gz"), "{err}");

    // A gzip stream cut short is an I/O error, not a panic or a short trace.
    let bytes = std::fs::read(&gz).unwrap();
    let truncated = dir.join("cut.csv.gz");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let err = Trace::read(&truncated).unwrap_err();
    assert!(matches!(err, TraceError::Io { .. }), "{err:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_cut_frees_what_it_leaves_live_on_the_allocation_stream() {
    let trace = parse(GOOD).unwrap();
    let cut = trace.cut(3); // a0 on 0, a1 on 1, f0: block 1 stays live
    assert_eq!(cut.ops.len(), 4);
    assert_eq!(
        cut.ops[3],
        TraceOp {
            kind: OpKind::Free,
            id: 1,
            size: 300,
            stream: 1
        }
    );
    assert_eq!(Requested::of(&cut).after.last(), Some(&0));
    // Written out, a cut reads back as a valid trace.
    let mut csv = Vec::new();
    cut.write_csv(&mut csv).unwrap();
    assert_eq!(Trace::parse(&csv[..]).unwrap(), cut);
    // A cut longer than the trace is the trace with its frees completed.
    assert_eq!(trace.cut(100).ops.len(), 6);
}

#[test]
fn requested_follows_the_live_bytes_and_their_peak() {
    let requested = Requested::of(&parse(GOOD).unwrap());
    assert_eq!(requested.after, [100, 400, 300, 350]);
    assert_eq!(requested.peak, 400);
}
