//! Crash injection: `loopx turn run` is SIGKILLed right after each phase commits
//! (LOOPX_TEST_CRASH_AFTER, a test-only hook), then `loopx turn recover` must finish the turn
//! exactly once: one spend row, the evidence once, the host never re-run, the lease held until
//! recovery and released (or cleared by completion) after it, and a second recover is a no-op.

use std::os::unix::process::ExitStatusExt;

use crate::support::{Project, alive, result_host, turn_run, wait_for};
use serde_json::Value;

/// Runs a validated completion turn that dies after `point`; returns the project and turn key.
fn crashed_turn(point: &str) -> (Project, String) {
    let p = Project::with_goal_g();
    p.add_work("t1");
    p.add_work("t2");
    let host = p.script("host.sh", &result_host("completed"));
    let validator = p.script("validate.sh", "cat > /dev/null\nexit 0\n");
    let out = p
        .command(&turn_run(
            "a1",
            &["--validate-json", &format!("[\"{validator}\"]")],
            &[&host],
        ))
        .env("LOOPX_TEST_CRASH_AFTER", point)
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "loopx should have been killed after {point}: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let log = p.hosts_log();
    let key = if point == "start" {
        assert!(
            log.is_empty(),
            "the host must not have run before start committed"
        );
        // The journal row exists; recovery reports its key.
        String::new()
    } else {
        assert_eq!(log.len(), 1, "host ran once before the crash");
        log[0].split(' ').nth(2).unwrap().to_string()
    };
    (p, key)
}

fn recover(p: &Project) -> Vec<Value> {
    p.json(&["turn", "recover", "--goal-id", "g"])["turns"]
        .as_array()
        .unwrap()
        .clone()
}

fn assert_completed_once(p: &Project, key: &str) {
    let j = p.journal(key);
    assert_eq!(j["status"], "committed", "journal: {j}");
    assert_eq!(j["data"]["kind"], "validated_completion");
    assert_eq!(
        j["phases"],
        serde_json::json!([
            "host_execute",
            "typed_result",
            "validation",
            "durable_writeback",
            "quota_spend",
            "terminal_closeout"
        ])
    );
    assert_eq!(p.todo_status("t1"), "completed");
    assert!(p.todo("t1")["todo"]["claim"].is_null());
    assert_eq!(p.evidence_count("t1"), 1, "evidence exactly once");
    assert_eq!(
        p.spends(),
        vec![format!("turn:{key}")],
        "exactly one spend row"
    );
    assert_eq!(p.spent_slots(), 1);
    assert_eq!(p.hosts_log().len(), 1, "the host is never re-run");
    let runs = p.history();
    assert_eq!(runs.len(), 1, "one run row: {runs:?}");
    assert_eq!(runs[0]["classification"], "validated_completion");
    let run_id = runs[0]["run_id"].as_str().unwrap();
    assert!(
        loopx::paths::ProjectPaths::at(p.path())
            .run_json("g", run_id)
            .exists(),
        "run report written"
    );
    // t2 untouched.
    assert_eq!(p.todo_status("t2"), "open");
}

fn crash_then_recover(point: &str) {
    let (p, key) = crashed_turn(point);
    // Until recovery the lease is kept (the turn is unsettled), unless the phase that committed
    // already completed the todo.
    let t1 = p.todo("t1");
    match point {
        "durable_writeback" | "quota_spend" | "terminal_closeout" => {
            assert_eq!(t1["todo"]["status"], "completed")
        }
        _ => {
            assert_eq!(t1["todo"]["status"], "claimed", "lease kept until recovery");
            assert_eq!(t1["todo"]["claim"]["agent_id"], "a1");
        }
    }
    let spends_before = p.spends().len();
    assert_eq!(
        spends_before,
        usize::from(matches!(point, "quota_spend" | "terminal_closeout")),
        "spend only once quota_spend committed"
    );
    let turns = recover(&p);
    if point == "terminal_closeout" {
        assert!(turns.is_empty(), "already settled: {turns:?}");
    } else {
        assert_eq!(turns.len(), 1, "{turns:?}");
        assert_eq!(turns[0]["recovered"], true);
        assert_ne!(turns[0]["status"], "in_progress");
    }
    assert_completed_once(&p, &key);
    // A second recovery finds nothing and changes nothing.
    assert!(recover(&p).is_empty());
    assert_completed_once(&p, &key);
    // Replaying the key returns the stored result without effects.
    let host = p.file("host.sh");
    let replay = p.json(&turn_run(
        "a1",
        &["--turn-key", &key],
        &[host.to_str().unwrap()],
    ));
    assert_eq!(replay["turn"]["replayed"], true);
    assert_eq!(replay["turn"]["kind"], "validated_completion");
    assert_completed_once(&p, &key);
}

#[test]
fn crash_after_host_execute() {
    crash_then_recover("host_execute");
}

#[test]
fn crash_after_typed_result() {
    crash_then_recover("typed_result");
}

#[test]
fn crash_after_validation() {
    crash_then_recover("validation");
}

#[test]
fn crash_after_durable_writeback() {
    crash_then_recover("durable_writeback");
}

#[test]
fn crash_after_quota_spend() {
    crash_then_recover("quota_spend");
}

#[test]
fn crash_after_terminal_closeout() {
    crash_then_recover("terminal_closeout");
}

/// Killed after the claim and journal row committed but before the host outcome was journaled:
/// the outcome is unknown, so recovery settles host_failure, releases the lease, spends nothing,
/// and does not run the host.
#[test]
fn crash_before_host_outcome_settles_host_failure() {
    let (p, _) = crashed_turn("start");
    assert_eq!(p.todo_status("t1"), "claimed");
    let turns = recover(&p);
    assert_eq!(turns.len(), 1);
    assert_eq!(turns[0]["kind"], "host_failure");
    assert_eq!(turns[0]["status"], "failed");
    let key = turns[0]["turn_key"].as_str().unwrap().to_string();
    let j = p.journal(&key);
    assert_eq!(j["phases"], serde_json::json!(["terminal_closeout"]));
    assert_eq!(j["data"]["failed_phase"], "host_execute");
    assert_eq!(j["data"]["lease"], "released");
    assert_eq!(p.todo_status("t1"), "open");
    assert!(p.todo("t1")["todo"]["claim"].is_null());
    assert!(p.spends().is_empty());
    assert_eq!(p.evidence_count("t1"), 0);
    assert!(p.hosts_log().is_empty(), "host not run by recovery");
    assert_eq!(p.history().len(), 1, "a settled turn always has a run row");
    assert!(recover(&p).is_empty());
}

/// The next `turn run` of the same agent settles its interrupted turn first, then runs a new one.
#[test]
fn next_turn_run_recovers_first() {
    let (p, key) = crashed_turn("validation");
    let host = p.file("host.sh");
    let out = p.json(&turn_run(
        "a1",
        &["--trust-host-completion"],
        &[host.to_str().unwrap()],
    ));
    assert_eq!(out["turn"]["recovered_turns"], serde_json::json!([key]));
    assert_eq!(out["turn"]["todo_id"], "t2");
    assert_eq!(out["turn"]["kind"], "validated_completion");
    assert_eq!(p.todo_status("t1"), "completed");
    assert_eq!(p.todo_status("t2"), "completed");
    assert_eq!(p.spends().len(), 2);
    assert_eq!(p.hosts_log().len(), 2);
}

/// Another agent's `turn run` settles a1's orphaned turn first (its driver is gone, so its lock is
/// free): the lease a1's dead turn held is released at once instead of blocking t1 until expiry.
#[test]
fn other_agents_settle_orphaned_turns_of_the_goal() {
    let (p, key) = crashed_turn("typed_result");
    let host = p.file("host.sh");
    let out = p.json(&turn_run(
        "a2",
        &["--trust-host-completion"],
        &[host.to_str().unwrap()],
    ));
    assert_eq!(out["turn"]["recovered_turns"], serde_json::json!([key]));
    let j = p.journal(&key);
    assert_eq!(j["status"], "committed");
    assert_eq!(j["data"]["recovered"], true);
    // a1's turn completed t1 during recovery (its result was journaled), so a2 works t2.
    assert_eq!(out["turn"]["todo_id"], "t2");
    assert_eq!(p.todo_status("t1"), "completed");
    assert_eq!(p.spends().len(), 2);
}

/// A turn whose driver is alive is never touched by recovery (its lock is held).
#[test]
fn recovery_leaves_live_turns_alone() {
    use std::time::Duration;
    let p = Project::with_goal_g();
    p.add_work("t1");
    p.add_work("t2");
    // The host runs until the test lets it go, so recovery certainly meets a live driver.
    let slow = p.script(
        "slow.sh",
        "cat >/dev/null\ntouch started\nwhile [ ! -e release ]; do sleep 0.05; done\nexit 1\n",
    );
    let a1 = p.spawn(&turn_run("a1", &[], &[&slow]));
    wait_for("the host to start", Duration::from_secs(30), || {
        p.file("started").exists()
    });
    let turns = recover(&p);
    assert_eq!(turns.len(), 1);
    assert_eq!(turns[0]["status"], "in_progress", "{turns:?}");
    assert!(turns[0]["detail"].as_str().unwrap().contains("in flight"));
    assert_eq!(p.todo_status("t1"), "claimed");
    std::fs::write(p.file("release"), "").unwrap();
    let out = a1.wait_with_output().unwrap();
    assert!(out.status.success());
    // The live driver settled its own turn.
    assert!(recover(&p).is_empty());
    assert_eq!(p.todo_status("t1"), "open");
}

/// `kill -9` of loopx while the host runs: the host dies with it (PR_SET_PDEATHSIG), and the
/// child the host started is killed by recovery, which settles the turn as host_failure without
/// running anything again.
#[test]
fn sigkill_of_loopx_mid_host_leaves_nothing_running() {
    use std::time::Duration;
    let p = Project::with_goal_g();
    p.add_work("t1");
    let host = p.script(
        "host.sh",
        "cat >/dev/null\necho $$ > host.pid\nsleep 60 &\necho $! > child.pid\nsleep 60\n",
    );
    // Unisolated, a host's child outlives a SIGKILLed driver until recovery finds it; isolated,
    // the PID namespace dies with the driver (next test).
    let mut child = p.spawn(&turn_run("a1", &["--isolation", "off"], &[&host]));
    // A pid file is complete once it holds a line (the shell writes the number and a newline).
    let read = |f: &str| -> Option<i32> {
        let text = std::fs::read_to_string(p.file(f)).ok()?;
        text.ends_with('\n').then(|| text.trim().parse().ok())?
    };
    wait_for(
        "the host and its child to run",
        Duration::from_secs(30),
        || read("host.pid").is_some_and(alive) && read("child.pid").is_some_and(alive),
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let (host_pid, bg_pid) = (read("host.pid").unwrap(), read("child.pid").unwrap());
    wait_for(
        "the host to die with loopx",
        Duration::from_secs(10),
        || !alive(host_pid),
    );
    assert!(alive(bg_pid), "precondition: the host's child is orphaned");
    assert_eq!(p.todo_status("t1"), "claimed", "lease kept until recovery");
    let turns = recover(&p);
    assert_eq!(turns.len(), 1);
    assert_eq!(turns[0]["kind"], "host_failure");
    // Recovery sent the kill; the process is gone once the kernel has reaped it.
    wait_for(
        "recovery to kill what the turn left running",
        Duration::from_secs(10),
        || !alive(bg_pid),
    );
    let j = p.journal(turns[0]["turn_key"].as_str().unwrap());
    let killed = j["data"]["orphans_killed"].as_array().unwrap();
    assert!(killed.contains(&serde_json::json!(bg_pid)), "{killed:?}");
    assert_eq!(p.todo_status("t1"), "open");
    assert!(p.spends().is_empty());
}

/// Isolated, the host and everything it started die with a SIGKILLed driver (the PID
/// namespace's init goes with the process the driver started), before any recovery.
#[test]
fn sigkill_of_loopx_kills_an_isolated_host_and_its_children_at_once() {
    use std::time::Duration;
    let p = Project::with_goal_g();
    p.add_work("t1");
    let host = p.script(
        "host.sh",
        "cat >/dev/null\n(setsid sleep 60 &)\nsleep 60 &\ntouch started\nsleep 60\n",
    );
    let mut child = p.spawn(&turn_run("a1", &["--isolation", "required"], &[&host]));
    wait_for(
        "the host and its children to run",
        Duration::from_secs(30),
        || p.file("started").exists() && crate::support::processes_in(p.path()).len() >= 3,
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let left = crate::support::wait_until_gone(p.path(), Duration::from_secs(2));
    assert!(left.is_empty(), "processes outlived the driver: {left:?}");
    // The dead driver's agent channel (a socket in a private directory) is left behind until
    // recovery settles the turn, which removes it.
    let turns = p.json(&["turn", "list", "--goal-id", "g"]);
    let key = turns["turns"][0]["turn_key"].as_str().unwrap().to_string();
    let channel_dirs = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with(&format!("loopx-agent-{key}-")))
            })
            .map(|e| e.path())
            .collect()
    };
    assert_eq!(
        channel_dirs().len(),
        1,
        "the killed driver's channel is still there"
    );
    assert_eq!(recover(&p).len(), 1);
    assert!(
        channel_dirs().is_empty(),
        "recovery removed {:?}",
        channel_dirs()
    );
}

/// A plain loop and the heartbeat tick that find the only work held by a dead driver's turn
/// settle that turn while they wait, go on, and name it in their report (`recovered_turns`).
#[test]
fn a_loop_names_the_dead_drivers_turns_it_settles_while_waiting() {
    for tick in [false, true] {
        let p = Project::with_goal_g();
        p.add_work("t1");
        let host = p.script("host.sh", &result_host("completed"));
        let out = p
            .command(&turn_run("a1", &["--trust-host-completion"], &[&host]))
            .env("LOOPX_TEST_CRASH_AFTER", "host_execute")
            .output()
            .unwrap();
        assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{out:?}");
        let key = p.hosts_log()[0].split(' ').nth(2).unwrap().to_string();
        let mut args = vec![
            "loop",
            "--goal-id",
            "g",
            "--agent-id",
            "a2",
            "--max-turns",
            "3",
            "--trust-host-completion",
            "--timeout-seconds",
            "30",
            if tick { "--once" } else { "--until-idle" },
            "--",
        ];
        args.push(&host);
        let r = p.json(&args);
        let report = if tick { &r["heartbeat"] } else { &r["loop"] };
        assert_eq!(report["recovered_turns"], serde_json::json!([key]), "{r}");
        assert!(recover(&p).is_empty(), "the loop left nothing to settle");
        let text = p.run(&[&args[..args.len() - 2], &["--", &host]].concat());
        assert!(
            text.stdout.contains("recovered turns") && text.stdout.contains("  -"),
            "{}",
            text.stdout
        );
    }
}
