//! Runs the `order_lines` example as 4 real processes over loopback TLS (through
//! examples/order_lines_check.sh) and checks they all print the same delivered sequence.
//! `cargo test -p bft` builds the examples first; a lone `--test` run may need
//! `cargo build -p bft --features transport --example order_lines`.

use std::path::PathBuf;
use std::process::Command;

fn example_binary() -> PathBuf {
    // Test binaries live in <target>/<profile>/deps/, examples in <target>/<profile>/examples/.
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    profile_dir.join("examples").join("order_lines")
}

#[test]
fn four_processes_order_lines_identically() {
    let binary = example_binary();
    assert!(binary.exists(), "{} not built; run `cargo build -p bft --features transport --example order_lines`", binary.display());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/order_lines_check.sh");
    let output = Command::new("bash").arg(&script).arg(&binary).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("OK: 4 processes delivered the same 200 requests"),
        "order_lines_check.sh failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
