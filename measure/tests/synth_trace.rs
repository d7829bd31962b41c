//! The `synth_trace` binary writes the synthetic traces of
//! `trace_unseen.rs` as trace files, read back as the same trace.

use streamalloc_measure::trace::{Trace, synthetic};

fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_synth_trace"))
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

#[test]
fn a_written_shape_reads_back_as_the_generated_trace() {
    let dir = std::env::temp_dir().join(format!("synth_trace_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("layered.csv.gz");
    let out = path.to_str().unwrap();

    let (code, text) = run(&["layered", out]);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(
        Trace::read(&path).unwrap(),
        synthetic::layered(13, 24, 40),
        "the test's seed by default"
    );
    let (code, text) = run(&["layered", "--seed", "7", out]);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(Trace::read(&path).unwrap(), synthetic::layered(7, 24, 40));

    std::fs::remove_file(&path).unwrap();
    for bad in [
        &["sawtoth", out][..],
        &["churn", "--seed", "x", out],
        &["churn"],
        &["churn", "--fast", out],
    ] {
        let (code, text) = run(bad);
        assert_eq!(code, Some(2), "{bad:?}: {text}");
        assert!(text.contains("usage: synth_trace"), "{text}");
        assert!(!path.exists(), "{bad:?} wrote a file");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
