//! Runs the dashboard's browser test (`tests/browser/dashboard.test.mjs`: the system Chromium
//! driven by playwright-core) as part of `cargo test`, with the `loopx` built beside
//! `loopx-serve`. A machine without Node, Chromium or the test's npm install cannot run it: the
//! test then says so, and fails under CI unless the skip is declared, as every skip in this
//! repository does (`support::skip`).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::{loopx_bin, skip};

const CHROMIUM: &str = "/usr/bin/chromium";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn the_dashboard_works_in_chromium() {
    let dir = repo().join("tests/browser");
    let node_ok = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !node_ok {
        return skip(
            "browser",
            "node is not installed (apt-get install -y nodejs)",
        );
    }
    if !Path::new(CHROMIUM).exists() {
        return skip(
            "browser",
            "/usr/bin/chromium is missing (apt-get install -y chromium)",
        );
    }
    if !dir.join("node_modules/playwright-core").is_dir() {
        return skip(
            "browser",
            "playwright-core is not installed (cd tests/browser && npm install)",
        );
    }
    let loopx = loopx_bin();
    if !loopx.is_file() {
        return skip(
            "browser",
            "target/debug/loopx is not built beside loopx-serve (run `cargo build` first, or \
             `cargo test` for the whole workspace)",
        );
    }
    // The test writes screenshots only where asked, so `cargo test` leaves docs/ alone.
    let shots = tempfile::tempdir().unwrap();
    let out = Command::new("node")
        .arg(dir.join("dashboard.test.mjs"))
        .env("LOOPX_BIN", &loopx)
        .env("LOOPX_SCREENSHOTS", shots.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the browser test failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    for shot in ["attention-queue.png", "goal.png"] {
        assert!(shots.path().join(shot).is_file(), "{shot} was not written");
    }
}
