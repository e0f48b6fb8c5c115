//! A plain `loopx loop` waiting for work says so on every wait (why, and how long until it
//! decides again), on stderr and only on a terminal, never with `-q` (issue 16). A pseudo-terminal
//! comes from util-linux `script`; `timeout -s INT` ends each loop as Ctrl-C would.

use std::process::{Command, Stdio};

use crate::support::{self, Project, loopx_bin};

const LOOP: &str = "loop --goal-id g --agent-id a --max-sleep-seconds 1 -- true";
const WAIT_LINE: &str = "waiting 1 s before the next decision (";

/// Runs `loopx [extra] loop ...` for about three seconds on a terminal; returns the screen.
fn on_a_terminal(p: &Project, extra: &str) -> String {
    let line = format!(
        "timeout --preserve-status -s INT 3 {} {extra} {LOOP}",
        loopx_bin()
    );
    let mut cmd = Command::new("script");
    cmd.args(["-qec", &line, "/dev/null"]).current_dir(p.path());
    for k in [
        "LOOPX_ROOT",
        "LOOPX_TURN_KEY",
        "LOOPX_AGENT_ID",
        "LOOPX_CLAIM_KEY",
    ] {
        cmd.env_remove(k);
    }
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    let screen = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{screen}");
    screen
}

#[test]
fn a_waiting_loop_reports_each_wait_on_a_terminal_only() {
    if Command::new("script").arg("--version").output().is_err() {
        support::skip(
            "script",
            "util-linux `script` is not installed: no pseudo-terminal",
        );
        return;
    }
    let p = Project::new();
    p.ok(&[
        "goal",
        "create",
        "--id",
        "g",
        "--title",
        "Nothing to do yet",
    ]);

    let screen = on_a_terminal(&p, "");
    assert!(
        screen.matches(WAIT_LINE).count() >= 2,
        "every wait is reported, not only the first: {screen}"
    );

    let quiet = on_a_terminal(&p, "-q");
    assert!(!quiet.contains(WAIT_LINE), "-q prints no progress: {quiet}");

    // Not a terminal: stderr stays free of progress.
    let out = Command::new("timeout")
        .args(["--preserve-status", "-s", "INT", "3", loopx_bin()])
        .args(LOOP.split(' '))
        .current_dir(p.path())
        .env_remove("LOOPX_ROOT")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains(WAIT_LINE), "{stderr}");
}
