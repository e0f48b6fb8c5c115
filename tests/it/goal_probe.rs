//! A goal's provider probe: `probe set --provider`, `probe run` and the heartbeat's run of each
//! new revision, with the first-party fs-observe provider reading a file. Digests as monitor
//! checks compare them, failures recorded with their reason, the note that is never run, and
//! bad specs refused with nothing changed.

use std::process::Stdio;

use serde_json::Value;

use crate::monitors::{fs_project, project};
use crate::support::Project;

fn set(p: &Project, provider: &str, operation: &str, target: &str) -> Value {
    p.json(&[
        "probe",
        "set",
        "--goal-id",
        "g",
        "--provider",
        provider,
        "--operation",
        operation,
        "--target",
        target,
    ])
}

fn run(p: &Project) -> Value {
    p.json(&["probe", "run", "--goal-id", "g"])
}

fn ops(p: &Project, op: &str) -> usize {
    p.db_dump(Some(&["ops"])).matches(op).count()
}

fn tick(p: &Project) -> std::process::Child {
    p.command(&crate::monitors::once_argv("a", &[], "true"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn probe_runs(child: std::process::Child) -> Vec<Value> {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["heartbeat"]["probe_runs"].as_array().unwrap().clone()
}

#[test]
fn probe_run_records_baseline_then_unchanged_then_changed_with_the_observation() {
    let data = tempfile::tempdir().unwrap();
    let metric = data.path().join("metric.txt");
    std::fs::write(&metric, "rps = 10\n").unwrap();
    let p = fs_project(data.path());
    let set = set(&p, "fs-observe/fs", "metric", "metric.txt");
    assert_eq!(set["provider_probe"]["provider"], "fs-observe/fs");
    assert_eq!(set["provider_probe"]["pending"], true);
    assert_eq!(set["provider_probe"]["last_result"], Value::Null);

    let first = run(&p);
    assert_eq!(first["run"]["result"], "baseline", "{first}");
    let digest = first["run"]["digest"].as_str().unwrap().to_string();
    assert_eq!(digest.len(), 64);
    assert!(
        first["provider_probe"]["last_observation"]
            .as_str()
            .unwrap()
            .contains("rps"),
        "{first}"
    );
    let second = run(&p);
    assert_eq!(second["run"]["result"], "unchanged");
    assert_eq!(second["run"]["digest"], digest.as_str());

    std::fs::write(&metric, "rps = 99\n").unwrap();
    let third = run(&p);
    assert_eq!(third["run"]["result"], "changed");
    assert_ne!(third["run"]["digest"], digest.as_str());
    let shown = p.json(&["probe", "show", "--goal-id", "g"])["provider_probe"].clone();
    assert_eq!(shown["runs"], 3);
    assert_eq!(shown["last_result"], "changed");
    assert!(shown["changed_at"].is_string(), "{shown}");
    assert!(
        shown["last_observation"].as_str().unwrap().contains("99"),
        "{shown}"
    );
    assert_eq!(ops(&p, "goal_probe_run"), 3);
    assert_eq!(ops(&p, "goal_probe_claim"), 3);

    // goal show and both projections carry the probe and its last outcome.
    let goal = p.json(&["goal", "show", "--goal-id", "g"]);
    assert_eq!(goal["provider_probe"]["last_result"], "changed");
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(p.state().join("goals/g/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["goal_probe"]["last_result"], "changed");
    assert_eq!(state["goal_probe"]["operation"], "metric");
    let md = std::fs::read_to_string(p.state().join("goals/g/STATE.md")).unwrap();
    assert!(md.contains("## Provider probe"), "{md}");
    assert!(
        md.contains("last run: ") && md.contains("(changed)"),
        "{md}"
    );
}

#[test]
fn a_failing_missing_or_disabled_provider_is_a_recorded_failed_run_with_its_reason() {
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("metric.txt"), "rps = 10\n").unwrap();
    let p = fs_project(data.path());
    for (provider, target) in [
        ("fs-observe/fs", "missing.txt"),
        ("nope/nope", "metric.txt"),
    ] {
        set(&p, provider, "metric", target);
        let out = run(&p);
        assert_eq!(out["run"]["result"], "failed", "{out}");
        let why = out["run"]["failure"].as_str().unwrap();
        assert!(why.contains(provider) && why.contains("failed"), "{why}");
        assert_eq!(out["provider_probe"]["last_digest"], Value::Null);
    }
    // A disabled provider fails the same way, and a failure keeps the last good digest.
    set(&p, "fs-observe/fs", "metric", "metric.txt");
    assert_eq!(run(&p)["run"]["result"], "baseline");
    p.ok(&["extension", "disable", "fs-observe"]);
    let out = run(&p);
    assert_eq!(out["run"]["result"], "failed");
    assert_eq!(out["provider_probe"]["failures"], 1);
    assert!(out["provider_probe"]["last_digest"].is_string(), "{out}");
    p.ok(&["extension", "enable", "fs-observe"]);
    let out = run(&p);
    assert_eq!(out["run"]["result"], "unchanged", "{out}");
    assert_eq!(out["provider_probe"]["failures"], 0);
}

#[test]
fn a_text_probe_is_refused_by_probe_run_and_nothing_changes() {
    let p = project();
    let before = p.db_dump(None);
    let none = p.run(&["probe", "run", "--goal-id", "g"]);
    assert_eq!(none.code, 1, "{none:?}");
    assert!(none.stderr.contains("no provider probe"), "{}", none.stderr);
    p.ok(&[
        "probe",
        "set",
        "--goal-id",
        "g",
        "--text",
        "rm -rf / # check the disk",
    ]);
    let before_run = p.db_dump(None);
    assert_ne!(before, before_run);
    let note = p.run(&["probe", "run", "--goal-id", "g"]);
    assert_eq!(note.code, 1, "{note:?}");
    assert!(
        note.stderr.contains("never executes") && note.stderr.contains("provider probe"),
        "{}",
        note.stderr
    );
    assert_eq!(p.db_dump(None), before_run, "a refused run writes nothing");
    // The note is shown as such; clearing removes it.
    let shown = p.json(&["probe", "show", "--goal-id", "g"]);
    assert_eq!(shown["executed"], false);
    assert_eq!(shown["provider_probe"], Value::Null);
}

#[test]
fn a_bad_provider_spec_is_bad_input_and_leaves_state_unchanged() {
    let data = tempfile::tempdir().unwrap();
    let p = fs_project(data.path());
    set(&p, "fs-observe/fs", "metric", "metric.txt");
    let before = p.db_dump(None);
    for (provider, operation, target) in [
        ("fs-observe", "metric", "metric.txt"),
        ("fs-observe/fs", "bad op", "metric.txt"),
        ("../x/fs", "metric", "metric.txt"),
        ("fs-observe/fs", "metric", ""),
    ] {
        let r = p.run(&[
            "probe",
            "set",
            "--goal-id",
            "g",
            "--provider",
            provider,
            "--operation",
            operation,
            "--target",
            target,
        ]);
        assert_eq!(r.code, 2, "{provider} {operation} {target:?}: {r:?}");
        assert!(!r.stderr.is_empty());
        assert_eq!(p.db_dump(None), before, "{provider} {operation} {target:?}");
    }
    let r = p.run(&[
        "probe",
        "set",
        "--goal-id",
        "g",
        "--provider",
        "fs-observe/fs",
        "--operation",
        "metric",
    ]);
    assert_eq!(r.code, 2, "{r:?}");
    assert_eq!(p.db_dump(None), before);
}

/// Four `loop --once` at once (cron firing four times) run a new revision of the goal's probe
/// once between them; a later tick does not run it again; setting it again is a new revision,
/// run once more.
#[test]
fn overlapping_ticks_run_the_goal_probe_once_per_revision() {
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("metric.txt"), "rps = 10\n").unwrap();
    let p = fs_project(data.path());
    set(&p, "fs-observe/fs", "metric", "metric.txt");
    let ticks: Vec<_> = (0..4).map(|_| tick(&p)).collect();
    let runs: Vec<Value> = ticks.into_iter().flat_map(probe_runs).collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["result"], "baseline");
    assert_eq!(runs[0]["revision"], 1);
    assert!(
        probe_runs(tick(&p)).is_empty(),
        "a run revision is not run again"
    );
    assert_eq!(ops(&p, "goal_probe_claim"), 1);

    set(&p, "fs-observe/fs", "metric", "metric.txt");
    let ticks: Vec<_> = (0..3).map(|_| tick(&p)).collect();
    let runs: Vec<Value> = ticks.into_iter().flat_map(probe_runs).collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["revision"], 2);
    assert_eq!(
        runs[0]["result"], "unchanged",
        "the same probe keeps its digest"
    );
    let shown = p.json(&["probe", "show", "--goal-id", "g"])["provider_probe"].clone();
    assert_eq!(
        (shown["runs"].clone(), shown["pending"].clone()),
        (2.into(), false.into())
    );
}

/// A failing goal probe is recorded with its reason and blocks nothing: the same tick runs the
/// agent's turn.
#[test]
fn a_failing_goal_probe_in_a_tick_blocks_no_work() {
    let data = tempfile::tempdir().unwrap();
    let p = fs_project(data.path());
    set(&p, "fs-observe/fs", "metric", "missing.txt");
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "t",
        "--title",
        "work",
    ]);
    let out = p
        .run(&crate::monitors::once_argv(
            "a",
            &["--max-turns", "1"],
            "true",
        ))
        .ok()
        .json();
    let beat = &out["heartbeat"];
    assert_eq!(beat["probe_runs"][0]["result"], "failed", "{beat}");
    assert!(
        beat["probe_runs"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("fs-observe/fs failed"),
        "{beat}"
    );
    assert_eq!(beat["turns"][0]["todo_id"], "t");
}

/// A sleeping `loop --watch` is woken by the commit of `probe set` and runs the new revision
/// once, however many times it wakes after.
#[test]
fn a_watching_heartbeat_runs_a_probe_set_while_it_sleeps_once() {
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("metric.txt"), "rps = 10\n").unwrap();
    let p = fs_project(data.path());
    let child = p
        .command(&[
            "--format",
            "json",
            "loop",
            "--watch",
            "--goal-id",
            "g",
            "--agent-id",
            "a",
            "--",
            "true",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Let it reach its sleep, then set the probe; later commits wake it again.
    std::thread::sleep(std::time::Duration::from_millis(800));
    set(&p, "fs-observe/fs", "metric", "metric.txt");
    crate::support::wait_for(
        "the probe's run",
        std::time::Duration::from_secs(60),
        || p.json(&["probe", "show", "--goal-id", "g"])["provider_probe"]["runs"] == 1,
    );
    // A note is a commit too: it wakes the heartbeat, and runs nothing.
    p.ok(&["probe", "set", "--goal-id", "g", "--text", "look at rps"]);
    std::thread::sleep(std::time::Duration::from_millis(800));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let runs = probe_runs(child);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["result"], "baseline");
    assert_eq!(ops(&p, "goal_probe_claim"), 1);
}
