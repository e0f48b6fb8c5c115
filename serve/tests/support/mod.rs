//! What this crate's test binaries share: where the built executables are, and the skip that
//! fails under CI.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;

/// The `loopx-serve` Cargo built for this test, in the directory above the test's own `deps/`.
/// (Not `env!("CARGO_BIN_EXE_loopx-serve")`: the build's rustc wrapper, `.cargo/static-bins`,
/// runs under `/bin/sh`, which drops variables whose names hold a `-`.)
pub fn server_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("loopx-serve")
}

/// The `loopx` beside it (built by `cargo build`/`cargo test` for the whole workspace).
pub fn loopx_bin() -> PathBuf {
    server_bin().with_file_name("loopx")
}

/// A test that cannot check anything on this machine calls this instead of returning quietly:
/// it prints why, and fails in CI (`CI` set to anything but `false`) unless `LOOPX_TEST_SKIPS`
/// declares `key`. The contract of `skip` in tests/it/support/mod.rs, which lives in the root
/// crate's test binary, out of this crate's reach.
pub fn skip(key: &str, why: &str) {
    eprintln!("SKIPPED ({key}): {why}");
    let in_ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false");
    let declared =
        std::env::var("LOOPX_TEST_SKIPS").is_ok_and(|v| v.split(',').any(|k| k.trim() == key));
    assert!(
        !in_ci || declared,
        "skipped in CI ({key}): {why}. Declare the skip for this machine with LOOPX_TEST_SKIPS={key}"
    );
}
