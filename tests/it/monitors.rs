//! Scheduled monitors and the heartbeat, on the test clock: a test build reads
//! `.loopx/test-clock-offset-ms` (`@N` freezes the clock at N ms), which only `test-hooks` builds
//! compile in (src/clock.rs). Due times, backoff, material changes, `--until`, deferred todos, the
//! exact scheduler hint, overlapping heartbeats and failing providers.

use std::process::Stdio;

use serde_json::Value;

use crate::support::Project;
use crate::support::plugin::{repo, wasm};

/// 2026-12-02T05:00:00Z.
const T0: i64 = 1_796_187_600_000;
const HOUR: i64 = 3_600_000;
const MINUTE: i64 = 60_000;

pub(crate) fn project() -> Project {
    let p = Project::new();
    p.ok(&["goal", "create", "--id", "g", "--title", "Monitors"]);
    p
}

fn freeze(p: &Project, at: i64) {
    std::fs::write(p.state().join("test-clock-offset-ms"), format!("@{at}")).unwrap();
}

fn should_run(p: &Project) -> Value {
    p.json(&["quota", "should-run", "--goal-id", "g", "--agent-id", "a"])
}

fn hint(d: &Value) -> (String, u64) {
    (
        d["scheduler_hint"]["action"].as_str().unwrap().to_string(),
        d["scheduler_hint"]["next_check_after_seconds"]
            .as_u64()
            .unwrap(),
    )
}

fn check(p: &Project, todo: &str, observation: &str) -> Value {
    p.json(&[
        "todo",
        "check",
        "--goal-id",
        "g",
        "--todo-id",
        todo,
        "--observation",
        observation,
    ])["check"]
        .clone()
}

fn show(p: &Project, todo: &str) -> Value {
    p.json(&["todo", "show", "--goal-id", "g", "--todo-id", todo])
}

fn todo_ids(p: &Project) -> Vec<String> {
    p.json(&["todo", "list", "--goal-id", "g"])["todos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect()
}

/// The argv of one cron tick (`loop --once`) on goal `g` as `agent`, with `extra` flags, running
/// `host` for any turn.
pub(crate) fn once_argv<'a>(agent: &'a str, extra: &[&'a str], host: &'a str) -> Vec<&'a str> {
    let mut args = vec![
        "--format",
        "json",
        "loop",
        "--once",
        "--goal-id",
        "g",
        "--agent-id",
        agent,
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", host]);
    args
}

fn once(p: &Project, extra: &[&str]) -> Value {
    p.run(&once_argv("a", extra, "true")).ok().json()["heartbeat"].clone()
}

#[test]
fn an_hourly_monitor_is_due_at_the_hour_not_before() {
    let p = project();
    freeze(&p, T0);
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "m",
        "--kind",
        "monitor",
        "--every",
        "1h",
        "--title",
        "watch the metric",
    ]);
    let d = should_run(&p);
    assert_eq!(hint(&d), ("monitor_due".to_string(), 0));
    assert_eq!(d["selected_todo"]["id"], "m");
    assert_eq!(check(&p, "m", "rps=10")["result"], "baseline");

    freeze(&p, T0 + HOUR - 1000);
    let d = should_run(&p);
    assert_eq!(hint(&d), ("monitor_quiet".to_string(), 1), "{d}");
    assert_eq!(d["route"], "wait");
    assert_eq!(d["should_run"], false);

    freeze(&p, T0 + HOUR);
    let d = should_run(&p);
    assert_eq!(hint(&d), ("monitor_due".to_string(), 0), "{d}");
    assert_eq!(d["route"], "ready_for_host");
    assert_eq!(d["selected_todo"]["id"], "m");
    assert_eq!(d["monitor"]["next_due_at"], "2026-12-02T06:00:00.000Z");
}

/// docs/state-model.md, "Monitors": x1 until `--max-no-change` (3) quiet checks, then x2, x4,
/// x8, capped at x8.
#[test]
fn twenty_quiet_checks_back_off_as_documented() {
    let p = project();
    freeze(&p, T0);
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "m",
        "--kind",
        "monitor",
        "--every",
        "1h",
        "--title",
        "nightly benchmark",
    ]);
    assert_eq!(check(&p, "m", "same")["result"], "baseline");
    let mut at = T0;
    let mut intervals = Vec::new();
    for quiet in 0..20 {
        let factor = match quiet {
            0..=2 => 1,
            3 => 2,
            4 => 4,
            _ => 8,
        };
        let due = at + factor * HOUR;
        freeze(&p, due - 1000);
        assert_eq!(
            hint(&should_run(&p)),
            ("monitor_quiet".to_string(), 1),
            "quiet check {quiet} is not due a second early"
        );
        freeze(&p, due);
        assert_eq!(
            hint(&should_run(&p)).0,
            "monitor_due",
            "quiet check {quiet}"
        );
        let c = check(&p, "m", "same");
        assert_eq!(c["result"], "unchanged");
        assert_eq!(c["monitor"]["no_change_count"], quiet + 1);
        intervals.push((due - at) / HOUR);
        at = due;
    }
    assert_eq!(
        intervals,
        vec![1, 1, 1, 2, 4, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8]
    );
    // Twenty quiet checks recorded no evidence.
    assert_eq!(show(&p, "m")["evidence"].as_array().unwrap().len(), 0);
    // A change resets the cadence.
    let c = check(&p, "m", "different");
    assert_eq!(c["result"], "changed");
    assert_eq!(c["monitor"]["interval_seconds"], 3600.0);
}

#[test]
fn a_material_change_records_exactly_one_evidence_row_and_one_follow_up() {
    let p = project();
    freeze(&p, T0);
    for (id, extra) in [
        ("m", vec![]),
        ("w", vec!["--watch-only"]),
        ("r", vec!["--on-change", "replan"]),
    ] {
        let mut args = vec![
            "todo",
            "add",
            "--goal-id",
            "g",
            "--id",
            id,
            "--kind",
            "monitor",
            "--every",
            "1h",
            "--title",
            "watch",
            "--target",
            "rps",
        ];
        args.extend(extra);
        p.ok(&args);
        assert_eq!(check(&p, id, "rps=10")["result"], "baseline");
        assert_eq!(check(&p, id, "rps=10")["result"], "unchanged");
    }
    let before = todo_ids(&p).len();
    let c = check(&p, "m", "rps=12");
    assert_eq!(c["result"], "changed");
    let follow = c["follow_up_todo"].as_str().unwrap().to_string();
    assert_eq!(check(&p, "m", "rps=12")["result"], "unchanged");
    let evidence = show(&p, "m")["evidence"].as_array().unwrap().clone();
    assert_eq!(evidence.len(), 1, "{evidence:?}");
    assert!(evidence[0]["text"].as_str().unwrap().contains("rps=12"));
    assert_eq!(todo_ids(&p).len(), before + 1);
    let t = show(&p, &follow)["todo"].clone();
    assert_eq!(
        (t["kind"].as_str(), t["priority"].as_str()),
        (Some("task"), Some("P1"))
    );

    // Watch-only: the evidence, no follow-up.
    let c = check(&p, "w", "rps=12");
    assert_eq!(
        (c["result"].as_str(), c["follow_up_todo"].as_null()),
        (Some("changed"), Some(()))
    );
    assert_eq!(show(&p, "w")["evidence"].as_array().unwrap().len(), 1);
    assert_eq!(todo_ids(&p).len(), before + 1);

    // Replan: a P0 todo to replan the goal.
    let c = check(&p, "r", "rps=12");
    let replan = show(&p, c["follow_up_todo"].as_str().unwrap())["todo"].clone();
    assert_eq!(replan["priority"], "P0");
    assert!(replan["title"].as_str().unwrap().starts_with("Replan"));

    // The goal's projections show each monitor's schedule and last check.
    p.ok(&["refresh-state", "--goal-id", "g"]);
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(p.state().join("goals/g/state.json")).unwrap(),
    )
    .unwrap();
    let listed: Vec<&str> = state["monitors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["todo_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), 3, "{state}");
    let m = state["monitors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["todo_id"] == "m")
        .unwrap();
    assert_eq!(
        (m["last_result"].as_str(), m["every_seconds"].as_f64()),
        (Some("unchanged"), Some(3600.0))
    );
    let md = std::fs::read_to_string(p.state().join("goals/g/STATE.md")).unwrap();
    assert!(
        md.contains("## Monitors") && md.contains("- `m` every 3600 s"),
        "{md}"
    );
    // A check never completes a monitor.
    let r = p.run(&["todo", "complete", "--goal-id", "g", "--todo-id", "m"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(show(&p, "m")["todo"]["status"], "open");
}

#[test]
fn until_ends_the_monitor() {
    let p = project();
    freeze(&p, T0);
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "m",
        "--kind",
        "monitor",
        "--every",
        "1h",
        "--until",
        "+150m",
        "--title",
        "watch until the release",
    ]);
    check(&p, "m", "x");
    freeze(&p, T0 + 2 * HOUR);
    assert_eq!(once(&p, &[])["ended_monitors"], serde_json::json!([]));
    assert_eq!(show(&p, "m")["todo"]["status"], "open");
    freeze(&p, T0 + 150 * MINUTE);
    // Past --until the monitor is not due (the decision is a pure read) and takes no check.
    assert_eq!(should_run(&p)["monitor"], Value::Null);
    let r = p.run(&[
        "todo",
        "check",
        "--goal-id",
        "g",
        "--todo-id",
        "m",
        "--observation",
        "y",
    ]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    // Nor can it be claimed: an ended monitor only waits to be archived.
    let claim = p.run(&[
        "todo",
        "claim",
        "--goal-id",
        "g",
        "--todo-id",
        "m",
        "--agent-id",
        "a1",
    ]);
    assert_eq!(claim.code, 1, "{}", claim.stderr);
    assert!(claim.stderr.contains("ended at"), "{}", claim.stderr);
    let beat = once(&p, &[]);
    assert_eq!(beat["ended_monitors"], serde_json::json!(["m"]));
    assert_eq!(show(&p, "m")["todo"]["status"], "archived");
    assert_eq!(should_run(&p)["route"], "replan_required");
}

#[test]
fn a_deferred_todo_resumes_at_its_time() {
    let p = project();
    freeze(&p, T0);
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "t",
        "--title",
        "later",
    ]);
    p.ok(&[
        "todo",
        "update",
        "--goal-id",
        "g",
        "--todo-id",
        "t",
        "--status",
        "deferred",
        "--until",
        "+2m",
    ]);
    assert_eq!(
        show(&p, "t")["todo"]["resumes_at"],
        "2026-12-02T05:02:00.000Z"
    );
    let d = should_run(&p);
    assert_eq!(d["route"], "wait");
    assert_eq!(d["scheduler_hint"]["next_check_after_seconds"], 120);
    freeze(&p, T0 + 2 * MINUTE - 1);
    assert_eq!(once(&p, &[])["resumed_todos"], serde_json::json!([]));
    assert_eq!(show(&p, "t")["todo"]["status"], "deferred");
    freeze(&p, T0 + 2 * MINUTE);
    let beat = once(&p, &["--max-turns", "1"]);
    assert_eq!(beat["resumed_todos"], serde_json::json!(["t"]));
    assert_ne!(show(&p, "t")["todo"]["status"], "deferred");
    assert_eq!(show(&p, "t")["todo"]["resumes_at"], Value::Null);
    // The resumed todo is ordinary work again: the tick ran a turn on it.
    assert_eq!(beat["turns"][0]["todo_id"], "t");
    // --until on a todo that is not deferred is refused, the state untouched.
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "u",
        "--title",
        "now",
    ]);
    let before = p.db_dump(None);
    let r = p.run(&[
        "todo",
        "update",
        "--goal-id",
        "g",
        "--todo-id",
        "u",
        "--until",
        "+1h",
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert_eq!(p.db_dump(None), before);
}

/// The hint is the earliest of the next monitor due, the next lease expiry and the next deferred
/// todo resuming, to the second, and the decision writes nothing.
#[test]
fn should_run_stays_pure_and_its_hint_is_exact() {
    let p = project();
    freeze(&p, T0);
    for (id, every) in [("m1", "1h"), ("m2", "30m")] {
        p.ok(&[
            "todo",
            "add",
            "--goal-id",
            "g",
            "--id",
            id,
            "--kind",
            "monitor",
            "--every",
            every,
            "--title",
            "watch",
        ]);
        check(&p, id, "v");
    }
    freeze(&p, T0 + 10 * MINUTE);
    p.ok(&[
        "todo",
        "claim",
        "--goal-id",
        "g",
        "--todo-id",
        "m1",
        "--agent-id",
        "b",
        "--ttl-seconds",
        "600",
    ]);
    let before = p.db_dump(None);
    let d = should_run(&p);
    assert_eq!(p.db_dump(None), before, "should-run wrote to the store");
    // m1 is leased to b until T0+20m, m2 due at T0+30m: the lease expiry comes first.
    assert_eq!(hint(&d), ("monitor_quiet".to_string(), 600), "{d}");
    // After the lease expired without a check, m1 waits a cadence from the claim (T0+70m);
    // m2 is next, at T0+30m.
    freeze(&p, T0 + 25 * MINUTE);
    assert_eq!(hint(&should_run(&p)), ("monitor_quiet".to_string(), 300));
    // A deferred todo resuming sooner is pending work (route wait), and the hint is exact.
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "t",
        "--title",
        "later",
    ]);
    p.ok(&[
        "todo",
        "update",
        "--goal-id",
        "g",
        "--todo-id",
        "t",
        "--status",
        "deferred",
        "--until",
        "+90s",
    ]);
    let d = should_run(&p);
    assert_eq!(
        hint(&d),
        ("backoff_until_state_change".to_string(), 90),
        "{d}"
    );
    freeze(&p, T0 + 30 * MINUTE);
    let d = should_run(&p);
    assert_eq!(hint(&d), ("monitor_due".to_string(), 0));
    assert_eq!(d["selected_todo"]["id"], "m2");
}

pub(crate) fn fs_project(dir: &std::path::Path) -> Project {
    wasm("fs-observe");
    let p = project();
    let grant = format!("fs.read:workspace={}", dir.display());
    p.ok(&[
        "extension",
        "install",
        repo().join("extensions/fs-observe").to_str().unwrap(),
        "--grant",
        &grant,
    ]);
    p
}

fn monitor_json(p: &Project, id: &str) -> Value {
    show(p, id)["todo"]["monitor"].clone()
}

/// Several `loop --once` processes at once (cron firing twice) and one `loop --watch`: each due
/// provider-backed check runs exactly once.
#[test]
fn overlapping_heartbeats_never_run_one_due_monitor_twice() {
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("metric.txt"), "rps = 10\n").unwrap();
    let p = fs_project(data.path());
    freeze(&p, T0);
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "m",
        "--kind",
        "monitor",
        "--every",
        "1h",
        "--title",
        "rps",
        "--probe",
        "fs-observe/fs",
        "metric",
        "metric.txt",
    ]);
    for round in 0..3i64 {
        freeze(&p, T0 + round * HOUR);
        let children: Vec<_> = (0..4)
            .map(|_| {
                p.command(&once_argv("a", &[], "true"))
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut ran = 0;
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            ran += v["heartbeat"]["checks"].as_array().unwrap().len();
        }
        assert_eq!(ran, 1, "round {round}: one check among four ticks");
        assert_eq!(monitor_json(&p, "m")["checks"], round + 1);
    }
    let ops = p.db_dump(Some(&["ops"]));
    assert_eq!(ops.matches("monitor_check_claim").count(), 3, "{ops}");
}

#[test]
fn a_failing_provider_is_a_failed_check_retried_next_cadence_that_blocks_nothing() {
    let data = tempfile::tempdir().unwrap();
    let p = fs_project(data.path());
    freeze(&p, T0);
    // The file does not exist: the provider fails. Another names no installed provider.
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "m",
        "--kind",
        "monitor",
        "--every",
        "1h",
        "--title",
        "rps",
        "--probe",
        "fs-observe/fs",
        "metric",
        "missing.txt",
    ]);
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "n",
        "--kind",
        "monitor",
        "--every",
        "1h",
        "--title",
        "gone",
        "--probe",
        "nope/nope",
        "metric",
        "x",
    ]);
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "t",
        "--title",
        "ordinary work",
    ]);
    let beat = once(&p, &["--max-turns", "1"]);
    let results: Vec<(String, String)> = beat["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["todo_id"].as_str().unwrap().to_string(),
                c["result"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        results,
        vec![("m".into(), "failed".into()), ("n".into(), "failed".into())]
    );
    for id in ["m", "n"] {
        let m = monitor_json(&p, id);
        assert_eq!(m["failures"], 1);
        assert!(
            m["last_failure"].as_str().unwrap().contains("failed"),
            "{m}"
        );
        assert_eq!(m["next_due_at"], "2026-12-02T06:00:00.000Z");
    }
    // The failures did not block the ordinary todo: the tick ran its turn.
    assert_eq!(beat["turns"][0]["todo_id"], "t");
    // Retried on the next cadence, not before; a disabled provider fails the same way.
    p.ok(&["extension", "disable", "fs-observe"]);
    freeze(&p, T0 + HOUR - 1000);
    assert_eq!(
        once(&p, &["--max-turns", "1"])["checks"],
        serde_json::json!([])
    );
    freeze(&p, T0 + HOUR);
    let beat = once(&p, &["--max-turns", "1"]);
    assert_eq!(beat["checks"].as_array().unwrap().len(), 2);
    assert_eq!(monitor_json(&p, "m")["failures"], 2);
}

/// examples/heartbeat/metric-watch.sh end to end with a 2-second cadence: the change in the file
/// is seen by the provider-backed monitor, opens one agent todo, and the heartbeat's turn works it.
#[test]
fn the_metric_watch_example_runs_in_under_a_minute() {
    wasm("fs-observe");
    let started = std::time::Instant::now();
    let out = std::process::Command::new("sh")
        .arg(repo().join("examples/heartbeat/metric-watch.sh"))
        .env("LOOPX", crate::support::loopx_bin())
        .env("EVERY", "2s")
        .env_remove("LOOPX_ROOT")
        .env_remove("LOOPX_AGENT_ID")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    assert!(text.contains("of monitor p95: changed"), "{text}");
    assert!(text.contains("t2: looked at p95_ms = 480"), "{text}");
    assert_eq!(
        text.matches("Act on the change seen by monitor p95")
            .count(),
        1,
        "{text}"
    );
}

/// An agent-backed monitor due once, four heartbeat ticks at once (two of agent a, two of b): one
/// turn runs the host, which records the check through the agent channel; the others find the
/// monitor leased or already checked.
#[test]
fn overlapping_ticks_run_one_turn_on_a_due_agent_backed_monitor() {
    let p = project();
    freeze(&p, T0);
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "m",
        "--kind",
        "monitor",
        "--every",
        "1h",
        "--title",
        "read the dashboard",
    ]);
    let host = p.script(
        "host.sh",
        &format!(
            r#"cat > /dev/null
echo "$LOOPX_AGENT_ID $LOOPX_TODO_ID" >> hosts.log
sleep 0.3
{loopx} todo check --goal-id g --todo-id m --observation "p95=120" >&2
printf '{{"schema_version":"loopx.turn_result.v1","status":"progress","summary":"checked","evidence":[{{"text":"checked m"}}]}}'
"#,
            loopx = crate::support::loopx_bin()
        ),
    );
    let children: Vec<_> = ["a", "a", "b", "b"]
        .iter()
        .map(|agent| {
            p.command(&once_argv(agent, &["--max-turns", "1"], &host))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut turns = 0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        turns += v["heartbeat"]["turns"].as_array().unwrap().len();
    }
    let log = std::fs::read_to_string(p.path().join("hosts.log")).unwrap();
    assert_eq!(log.lines().count(), 1, "{log}");
    assert_eq!(turns, 1);
    let m = monitor_json(&p, "m");
    assert_eq!(
        (m["checks"].as_i64(), m["last_result"].as_str()),
        (Some(1), Some("baseline"))
    );
    assert_eq!(
        show(&p, "m")["todo"]["status"],
        "open",
        "a check never completes a monitor"
    );
    assert_eq!(hint(&should_run(&p)), ("monitor_quiet".to_string(), 3600));
}

/// A turn on a due monitor reports its check in the result (`monitor_observation`), with no
/// `todo check` by the host: the settle records baseline, then unchanged, then changed with one
/// evidence row and one follow-up; a monitor turn that reports none records a failed check.
#[test]
fn a_turn_result_carries_the_monitor_check_without_todo_check() {
    let p = project();
    freeze(&p, T0);
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "m",
        "--kind",
        "monitor",
        "--every",
        "1h",
        "--title",
        "read the dashboard",
        "--target",
        "p95",
    ]);
    let host = p.script(
        "host.sh",
        r#"cat > /dev/null
if [ -f obs.txt ]; then
  printf '{"schema_version":"loopx.turn_result.v1","status":"progress","summary":"looked","monitor_observation":"%s"}' "$(cat obs.txt)"
else
  printf '{"schema_version":"loopx.turn_result.v1","status":"progress","summary":"looked away"}'
fi
"#,
    );
    let tick = |at: i64| {
        freeze(&p, at);
        let out = p
            .run(&once_argv("a", &["--max-turns", "1"], &host))
            .ok()
            .json();
        let turns = out["heartbeat"]["turns"].as_array().unwrap().clone();
        assert_eq!(turns.len(), 1, "{out}");
        assert_eq!(turns[0]["todo_id"], "m");
        monitor_json(&p, "m")
    };
    std::fs::write(p.path().join("obs.txt"), "p95=120").unwrap();
    let before = todo_ids(&p).len();
    let m = tick(T0);
    assert_eq!(
        (m["checks"].as_i64(), m["last_result"].as_str()),
        (Some(1), Some("baseline"))
    );
    let m = tick(T0 + HOUR);
    assert_eq!(
        (m["checks"].as_i64(), m["last_result"].as_str()),
        (Some(2), Some("unchanged"))
    );
    assert_eq!(m["no_change_count"], 1);
    assert!(show(&p, "m")["evidence"].as_array().unwrap().is_empty());
    std::fs::write(p.path().join("obs.txt"), "p95=480").unwrap();
    let m = tick(T0 + 2 * HOUR);
    assert_eq!(
        (m["checks"].as_i64(), m["last_result"].as_str()),
        (Some(3), Some("changed"))
    );
    let evidence = show(&p, "m")["evidence"].as_array().unwrap().clone();
    assert_eq!(evidence.len(), 1, "{evidence:?}");
    assert!(evidence[0]["text"].as_str().unwrap().contains("p95=480"));
    let ids = todo_ids(&p);
    assert_eq!(ids.len(), before + 1, "one follow-up: {ids:?}");
    let follow_up = ids.iter().find(|id| *id != "m").unwrap().clone();
    assert_eq!(show(&p, "m")["todo"]["status"], "open");
    let ops = p.db_dump(Some(&["ops"]));
    assert_eq!(ops.matches("\"monitor_check\"").count(), 3, "{ops}");

    // The follow-up outranks the monitor: a tick works it first. Then the monitor's turn reports
    // no observation: a failed check with the reason, retried one cadence later.
    std::fs::remove_file(p.path().join("obs.txt")).unwrap();
    freeze(&p, T0 + 3 * HOUR);
    p.ok(&[
        "todo",
        "update",
        "--goal-id",
        "g",
        "--todo-id",
        &follow_up,
        "--status",
        "archived",
    ]);
    let m = tick(T0 + 3 * HOUR);
    assert_eq!(
        (m["checks"].as_i64(), m["last_result"].as_str()),
        (Some(4), Some("failed"))
    );
    assert_eq!(m["last_failure"], "the turn reported no observation");
    assert_eq!(m["next_due_at"], "2026-12-02T09:00:00.000Z");
    assert_eq!(
        m["last_digest"].as_str().map(str::len),
        Some(64),
        "the digest stays"
    );
}

fn add(p: &Project, args: &[&str]) {
    let mut full = vec!["todo", "add", "--goal-id", "g"];
    full.extend_from_slice(args);
    p.ok(&full);
}

fn update(p: &Project, todo: &str, args: &[&str]) {
    let mut full = vec!["todo", "update", "--goal-id", "g", "--todo-id", todo];
    full.extend_from_slice(args);
    p.ok(&full);
}

/// A monitor that is blocked (a check's turn asked for repair) or deferred has no check due:
/// handing it to an agent, whose claim is then refused, stopped every turn on the goal.
#[test]
fn a_blocked_or_deferred_monitor_stops_no_other_work() {
    let p = project();
    freeze(&p, T0);
    add(
        &p,
        &[
            "--id", "m", "--kind", "monitor", "--every", "1h", "--title", "watch",
        ],
    );
    add(&p, &["--id", "k", "--title", "[P0] ordinary work"]);
    for status in [
        &["--status", "blocked", "--reason", "needs repair"][..],
        &["--status", "deferred"][..],
    ] {
        update(&p, "m", status);
        let d = should_run(&p);
        assert_eq!(d["route"], "ready_for_host", "{d}");
        assert_eq!(d["selected_todo"]["id"], "k", "{status:?}: {d}");
        let beat = p.run(&once_argv(
            "a",
            &["--max-turns", "1", "--trust-host-completion"],
            "true",
        ));
        assert_eq!(beat.code, 0, "{status:?}: {} {}", beat.stdout, beat.stderr);
        update(&p, "m", &["--status", "open"]);
        update(&p, "k", &["--status", "open"]);
    }
    // Open again, the monitor is due as before.
    assert_eq!(should_run(&p)["selected_todo"]["id"], "m");
}

/// `--until` on a deferred monitor is when it resumes, as on any deferred todo; it does not end
/// the monitor.
#[test]
fn deferring_a_monitor_until_a_time_resumes_it_then() {
    let p = project();
    freeze(&p, T0);
    add(
        &p,
        &[
            "--id", "m", "--kind", "monitor", "--every", "1h", "--title", "watch",
        ],
    );
    update(&p, "m", &["--status", "deferred", "--until", "+2h"]);
    let shown = show(&p, "m");
    assert_eq!(
        shown["todo"]["resumes_at"], "2026-12-02T07:00:00.000Z",
        "{shown}"
    );
    assert_eq!(monitor_json(&p, "m")["until"], Value::Null);
    freeze(&p, T0 + 2 * HOUR);
    let beat = once(&p, &[]);
    assert_eq!(beat["resumed_todos"], serde_json::json!(["m"]), "{beat}");
    assert_eq!(beat["ended_monitors"], serde_json::json!([]), "{beat}");
    assert_eq!(show(&p, "m")["todo"]["status"], "open");
    assert_eq!(monitor_json(&p, "m")["until"], Value::Null);
}

/// A paused or closed goal runs nothing: the heartbeat makes no provider check on it.
#[test]
fn the_heartbeat_checks_no_provider_on_a_paused_or_closed_goal() {
    let p = project();
    freeze(&p, T0);
    add(
        &p,
        &[
            "--id",
            "m",
            "--kind",
            "monitor",
            "--every",
            "1h",
            "--title",
            "gone",
            "--probe",
            "nope/nope",
            "metric",
            "x",
        ],
    );
    p.ok(&["goal", "pause", "--goal-id", "g"]);
    assert_eq!(once(&p, &[])["checks"], serde_json::json!([]));
    assert_eq!(monitor_json(&p, "m")["failures"], 0);
    p.ok(&["goal", "close", "--goal-id", "g"]);
    assert_eq!(once(&p, &[])["checks"], serde_json::json!([]));
    assert_eq!(monitor_json(&p, "m")["failures"], 0);
}

/// `todo update` prints the todo as `todo show` does: a monitor with its schedule as changed, a
/// deferred todo with its resume time.
#[test]
fn todo_update_shows_the_schedule_it_changed() {
    let p = Project::new();
    p.goal("g");
    let m = p.add_todo("g", "watch", &["--kind", "monitor", "--every", "1h"]);
    let t = p.add_todo("g", "later", &[]);
    let updated = p.json(&[
        "todo",
        "update",
        "--goal-id",
        "g",
        "--todo-id",
        &m,
        "--every",
        "2h",
        "--target",
        "rps",
    ]);
    assert_eq!(
        updated["todo"]["monitor"]["every_seconds"], 7200.0,
        "{updated}"
    );
    assert_eq!(updated["todo"]["monitor"]["target"], "rps", "{updated}");
    // Never checked: the new cadence leaves the first check (the baseline) due at once.
    assert_eq!(updated["todo"]["monitor"]["due"], true, "{updated}");
    let shown = p.json(&["todo", "show", "--goal-id", "g", "--todo-id", &m]);
    assert_eq!(updated["todo"]["monitor"], shown["todo"]["monitor"]);
    // Once checked, a new cadence counts from the last check.
    p.ok(&[
        "todo",
        "check",
        "--goal-id",
        "g",
        "--todo-id",
        &m,
        "--observation",
        "v=1",
    ]);
    let recadenced = p.json(&[
        "todo",
        "update",
        "--goal-id",
        "g",
        "--todo-id",
        &m,
        "--every",
        "3h",
    ]);
    let monitor = &recadenced["todo"]["monitor"];
    assert_eq!(monitor["due"], false, "{recadenced}");
    let at = |v: &Value| {
        v.as_str()
            .and_then(loopx::clock::parse_rfc3339)
            .unwrap_or_else(|| panic!("a time: {recadenced}"))
    };
    assert_eq!(
        at(&monitor["next_due_at"]) - at(&monitor["last_check_at"]),
        3 * 3_600_000
    );
    let deferred = p.json(&[
        "todo",
        "update",
        "--goal-id",
        "g",
        "--todo-id",
        &t,
        "--status",
        "deferred",
        "--until",
        "+1h",
    ]);
    let shown = p.json(&["todo", "show", "--goal-id", "g", "--todo-id", &t]);
    assert!(deferred["todo"]["resumes_at"].is_string(), "{deferred}");
    assert_eq!(deferred["todo"]["resumes_at"], shown["todo"]["resumes_at"]);
    let text = p.ok(&[
        "todo",
        "update",
        "--goal-id",
        "g",
        "--todo-id",
        &t,
        "--priority",
        "P1",
    ]);
    assert!(text.stdout.contains("resumes at"), "{}", text.stdout);
    let plain = p.json(&[
        "todo",
        "update",
        "--goal-id",
        "g",
        "--todo-id",
        &t,
        "--status",
        "open",
    ]);
    assert!(plain["todo"].get("resumes_at").is_none(), "{plain}");
    assert!(plain["todo"].get("monitor").is_none(), "{plain}");
}

/// `should-run` names what a host does with a due monitor as commands that work when run as
/// given: claim it, then check it (a monitor is never completed, and `todo complete` refuses one).
#[test]
fn the_commands_should_run_names_for_a_due_monitor_run_as_given() {
    let p = project();
    freeze(&p, T0);
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "m",
        "--kind",
        "monitor",
        "--every",
        "1h",
        "--title",
        "watch the metric",
    ]);
    let d = should_run(&p);
    assert_eq!(hint(&d), ("monitor_due".to_string(), 0), "{d}");
    let argvs: Vec<Vec<String>> =
        serde_json::from_value(d["interaction_contract"]["cli_channel"]["next_cli_argv"].clone())
            .unwrap();
    let verbs: Vec<String> = argvs.iter().map(|a| a[1..3].join(" ")).collect();
    assert_eq!(&verbs[..2], ["todo claim", "todo check"], "{argvs:?}");
    for argv in &argvs[..2] {
        let args: Vec<&str> = argv[1..]
            .iter()
            .map(|a| {
                if a.starts_with('<') {
                    "rps=10"
                } else {
                    a.as_str()
                }
            })
            .collect();
        p.ok(&args);
    }
    let m = show(&p, "m");
    assert_eq!(m["todo"]["monitor"]["checks"], 1, "{m}");
    assert_eq!(m["todo"]["monitor"]["last_result"], "baseline", "{m}");
}

/// A monitor that is not due is nobody's work: the attention queue does not list it as ready
/// work and a claim without a todo id does not take it, as `should-run` says to wait; once due,
/// the claim takes it before ordinary work, as the decision would hand it.
#[test]
fn a_monitor_not_due_is_neither_ready_work_nor_claimed_by_a_bare_claim() {
    let p = project();
    freeze(&p, T0);
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "m",
        "--kind",
        "monitor",
        "--every",
        "1h",
        "--title",
        "nightly benchmark",
    ]);
    assert_eq!(check(&p, "m", "same")["result"], "baseline");
    freeze(&p, T0 + 10 * MINUTE);
    assert_eq!(should_run(&p)["decision"], "skip");
    let status = p.json(&["status", "--goal-id", "g"]);
    assert!(
        status["attention"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["kind"] != "work"),
        "{status}"
    );
    assert_eq!(status["goals"][0]["ready_count"], 0, "{status}");
    let bare = p.run(&["todo", "claim", "--goal-id", "g", "--agent-id", "z"]);
    assert_eq!(bare.code, 3, "{bare:?}");
    // With ordinary work beside it, the bare claim takes the work.
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "w",
        "--title",
        "work",
    ]);
    let claimed = p.json(&["todo", "claim", "--goal-id", "g", "--agent-id", "z"]);
    assert_eq!(claimed["todo"]["id"], "w", "{claimed}");
    // Due again (and z's lease on w run out): the monitor is the agent's work again, and a
    // bare claim takes it first, as the decision hands it first.
    freeze(&p, T0 + 2 * HOUR);
    let status = p.json(&["status", "--goal-id", "g"]);
    assert_eq!(status["goals"][0]["ready_count"], 2, "{status}");
    assert_eq!(status["goals"][0]["top_agent_todo"]["id"], "m", "{status}");
    let claimed = p.json(&["todo", "claim", "--goal-id", "g", "--agent-id", "y"]);
    assert_eq!(claimed["todo"]["id"], "m", "{claimed}");
}
