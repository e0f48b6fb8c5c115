//! Retention (`loopx gc`, `gc policy`, the projections' live window): gc is operator-only, its
//! dry run changes nothing, it never touches what a live lease, an unsettled turn, the quota
//! window, an open gate or history within the retention window needs, a SIGKILL anywhere in it
//! leaves a consistent project, and a settled turn costs under 1 KB on disk after it.
//!
//! Work is made old by moving its times back in the database (the test's own connection, with no
//! loopx process running): gc and the projections judge age by those times.

use std::time::Instant;

use serde_json::Value;

use crate::support::{Project, result_host, turn_run};

const DAY_MS: i64 = 86_400_000;

fn db(p: &Project) -> rusqlite::Connection {
    rusqlite::Connection::open(p.state().join("loopx.db")).expect("open the test's connection")
}

/// Goal `g` with `n` todos each completed by one settled turn whose host prints a short summary
/// and one evidence line.
fn settled_project(n: usize) -> Project {
    let p = Project::with_goal_g();
    p.ok(&["quota", "set", "--goal-id", "g", "--allowed-slots", "10000"]);
    let host = p.script("host.sh", &result_host("completed"));
    for i in 0..n {
        let id = format!("t{i}");
        p.add_work(&id);
        let out = p.json(&turn_run("a1", &["--trust-host-completion"], &[&host]));
        assert_eq!(out["turn"]["kind"], "validated_completion", "{out}");
    }
    p
}

/// Moves every settled turn, every run and every finished todo `days` back in time.
fn age(p: &Project, days: i64) {
    let d = days * DAY_MS;
    let c = db(p);
    c.execute(
        "UPDATE turns SET created_at = created_at - ?1, updated_at = updated_at - ?1 \
         WHERE status <> 'in_progress'",
        [d],
    )
    .unwrap();
    c.execute("UPDATE runs SET created_at = created_at - ?1", [d])
        .unwrap();
    c.execute(
        "UPDATE todos SET updated_at = updated_at - ?1 WHERE status IN ('completed', 'archived')",
        [d],
    )
    .unwrap();
}

fn count(p: &Project, sql: &str) -> i64 {
    db(p).query_row(sql, [], |r| r.get(0)).unwrap()
}

/// The invariants the soak checks: each todo completed once, a spend for each spending turn,
/// nothing claimed or running, and `doctor` healthy.
fn assert_invariants(p: &Project, completed: i64) {
    assert_eq!(
        count(p, "SELECT COUNT(*) FROM todos WHERE status = 'completed'"),
        completed
    );
    assert_eq!(
        count(
            p,
            "SELECT COUNT(DISTINCT todo_id) FROM turns WHERE json_extract(data, '$.kind') = 'validated_completion'"
        ),
        completed,
        "each todo completed by exactly one turn"
    );
    assert_eq!(
        count(p, "SELECT COUNT(*) FROM quota_ledger WHERE kind = 'spend'"),
        count(
            p,
            "SELECT COUNT(*) FROM turns WHERE json_extract(data, '$.spend') IS NOT NULL"
        ),
        "spends = spending turns"
    );
    assert_eq!(
        count(p, "SELECT COUNT(*) FROM todos WHERE status = 'claimed'"),
        0
    );
    assert_eq!(
        count(p, "SELECT COUNT(*) FROM turns WHERE status = 'in_progress'"),
        0
    );
    let doctor = p.run(&["doctor"]);
    assert_eq!(
        doctor.code, 0,
        "doctor: {} {}",
        doctor.stdout, doctor.stderr
    );
}

/// Report files under the goal's `runs/`, and the bytes they take on disk.
fn report_files(p: &Project) -> (usize, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut stack = vec![p.state().join("goals/g/runs")];
    let (mut n, mut bytes) = (0, 0);
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "json" || x == "md") {
                n += 1;
                bytes += e.metadata().unwrap().blocks() * 512;
            }
        }
    }
    (n, bytes)
}

#[test]
fn agents_are_refused_and_the_dry_run_changes_nothing() {
    let p = settled_project(4);
    age(&p, 400);
    let before = p.snapshot();
    let dump = p.db_dump(None);
    for args in [
        &["gc"][..],
        &["gc", "--apply"],
        &["gc", "policy", "--history-days", "1"],
    ] {
        let run = p.run_env(args, &[("LOOPX_AGENT_ID", "a1")]);
        assert_eq!(run.code, 1, "{args:?}: {} {}", run.stdout, run.stderr);
        assert!(run.stderr.contains("only an operator"), "{}", run.stderr);
    }
    let plan = p.json(&["gc"]);
    assert_eq!(plan["applied"], false);
    assert_eq!(plan["turns"].as_array().unwrap().len(), 4, "{plan}");
    assert_eq!(plan["payloads"].as_array().unwrap().len(), 4, "{plan}");
    assert_eq!(plan["report_months"].as_array().unwrap().len(), 1, "{plan}");
    assert!(plan["bytes_freed"].as_u64().unwrap() > 4 * 2000, "{plan}");
    let text = p.ok(&["gc"]).stdout;
    assert!(text.contains("nothing was changed"), "{text}");
    assert_eq!(text.matches("compact turn turn-").count(), 4, "{text}");
    assert_eq!(p.db_dump(None), dump, "the dry run wrote no row");
    assert_eq!(p.snapshot(), before, "the dry run changed no file");
}

#[test]
fn gc_keeps_what_live_work_needs_and_history_inside_the_window() {
    let p = settled_project(6);
    // A lease held by hand, an open gate, and a turn killed after it started (unsettled, holding
    // its todo's lease and a quota reservation).
    p.add_work("held");
    p.ok(&[
        "todo",
        "claim",
        "--goal-id",
        "g",
        "--todo-id",
        "held",
        "--agent-id",
        "k1",
    ]);
    p.add_work("crashing");
    let host = p.script("host2.sh", &result_host("completed"));
    let crashed = p.run_env(
        &turn_run("a2", &[], &[&host]),
        &[("LOOPX_TEST_CRASH_AFTER", "start")],
    );
    assert_ne!(crashed.code, 0, "{} {}", crashed.stdout, crashed.stderr);
    p.add_todo("g", "decide", &["--kind", "user_gate", "--global-gate"]);
    assert_eq!(
        count(
            &p,
            "SELECT COUNT(*) FROM turns WHERE status = 'in_progress'"
        ),
        1
    );
    // Everything is old, the live work too: age alone never makes gc touch it.
    age(&p, 400);
    let c = db(&p);
    c.execute("UPDATE turns SET created_at = created_at - ?1, updated_at = updated_at - ?1 WHERE status = 'in_progress'", [400 * DAY_MS]).unwrap();
    drop(c);
    // Runs inside the retention window: two recent runs recorded now.
    p.ok(&["refresh-state", "--goal-id", "g", "--summary", "recent one"]);
    p.ok(&["refresh-state", "--goal-id", "g", "--summary", "recent two"]);
    let live_tables = |p: &Project| {
        p.db_dump(Some(&[
            "todos",
            "todo_deps",
            "quota_ledger",
            "quota_policy",
            "evidence",
            "rewards",
        ]))
    };
    let live_before = live_tables(&p);
    let unsettled = "SELECT turn_key || data || phases FROM turns WHERE status = 'in_progress'";
    let unsettled_before: String = db(&p).query_row(unsettled, [], |r| r.get(0)).unwrap();
    let page_before = p.json(&["history", "--goal-id", "g", "--limit", "2"]);
    let should_run = |p: &Project| {
        let mut v = p.json(&["quota", "should-run", "--goal-id", "g", "--agent-id", "a9"]);
        v.as_object_mut().unwrap().remove("decided_at");
        v
    };
    let should_run_before = should_run(&p);
    let status_before = p.json(&["status"]);

    let applied = p.json(&["gc", "--apply"]);
    assert_eq!(applied["applied"], true);
    assert_eq!(applied["turns"].as_array().unwrap().len(), 6, "{applied}");

    assert_eq!(
        live_tables(&p),
        live_before,
        "todos, leases, gates, ledger, evidence untouched"
    );
    let unsettled_after: String = db(&p).query_row(unsettled, [], |r| r.get(0)).unwrap();
    assert_eq!(
        unsettled_after, unsettled_before,
        "the unsettled turn's journal is whole"
    );
    assert_eq!(
        p.json(&["history", "--goal-id", "g", "--limit", "2"]),
        page_before,
        "history inside the window reads the same"
    );
    assert_eq!(should_run(&p), should_run_before);
    assert_eq!(p.json(&["status"]), status_before);
    assert_eq!(
        count(
            &p,
            "SELECT COUNT(*) FROM turns WHERE compacted_at IS NOT NULL"
        ),
        6
    );
    // Every removal is in the operation log, naming what it removed.
    let logged: String = db(&p)
        .query_row(
            "SELECT group_concat(detail, ' ') FROM ops WHERE kind LIKE 'gc_%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let keys: Vec<String> = {
        let c = db(&p);
        let mut s = c
            .prepare("SELECT turn_key FROM turns WHERE compacted_at IS NOT NULL")
            .unwrap();
        s.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    for k in &keys {
        assert!(logged.contains(k.as_str()), "{k} not in the op log");
    }
    let (files, _) = report_files(&p);
    assert_eq!(files, 4, "only the two recent runs keep their report files");
    assert!(
        logged.contains(".json"),
        "the removed report files are logged: {logged}"
    );
    // Every turn and run stays reachable by id.
    for k in &keys {
        let shown = p.json(&["turn", "inspect", "--turn-key", k]);
        assert_eq!(shown["journal"]["status"], "committed", "{shown}");
    }
    let old_run: String = db(&p)
        .query_row("SELECT id FROM runs ORDER BY created_at LIMIT 1", [], |r| {
            r.get(0)
        })
        .unwrap();
    let report = p.json(&["gc", "run-report", "--goal-id", "g", "--run-id", &old_run]);
    assert_eq!(report["report"]["run_id"], old_run.as_str());
    assert_eq!(report["file"], Value::Null, "rendered from the database");
    // A re-projection does not bring retired report files back.
    p.ok(&["refresh-state"]);
    assert_eq!(report_files(&p).0, 4, "no retired report is re-created");
    let doctor = p.run(&["doctor"]);
    assert_eq!(doctor.code, 0, "{} {}", doctor.stdout, doctor.stderr);
    // A second gc finds nothing left to do.
    let again = p.json(&["gc"]);
    assert_eq!(again["turns"].as_array().unwrap().len(), 0, "{again}");
    assert_eq!(
        again["report_months"].as_array().unwrap().len(),
        0,
        "{again}"
    );
}

#[test]
fn state_files_hold_live_work_and_older_work_moves_to_the_monthly_archive() {
    let p = settled_project(3);
    p.add_work("open1");
    age(&p, 70);
    p.add_work("open2");
    p.ok(&["refresh-state", "--goal-id", "g"]);
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(p.state().join("goals/g/state.json")).unwrap(),
    )
    .unwrap();
    let ids: Vec<&str> = state["todos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["open1", "open2"],
        "finished work older than the window is left out"
    );
    assert_eq!(state["live_window"]["days"], 7);
    assert_eq!(state["live_window"]["older_todos"]["agent"]["completed"], 3);
    let md = std::fs::read_to_string(p.state().join("goals/g/STATE.md")).unwrap();
    assert!(md.contains("3 todo(s) finished before"), "{md}");
    assert!(!md.contains("work t0"), "{md}");
    // The month they finished in is archived once, and reachable by id as before.
    let archive = p.state().join("goals/g/archive");
    let months: Vec<String> = std::fs::read_dir(&archive)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    let archived: Vec<Value> = months
        .iter()
        .map(|m| serde_json::from_str(&std::fs::read_to_string(archive.join(m)).unwrap()).unwrap())
        .collect();
    let todos: Vec<&str> = archived
        .iter()
        .flat_map(|a| a["todos"].as_array().unwrap())
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(todos.len(), 3, "{archived:?}");
    let runs = archived
        .iter()
        .flat_map(|a| a["runs"].as_array().unwrap())
        .count();
    assert_eq!(runs, 3, "each settled turn's run is archived: {archived:?}");
    // Streamed through temp files, each put in place whole: the Markdown beside its JSON, and
    // no temp file left behind.
    let names: Vec<String> = std::fs::read_dir(&archive)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
    let md: String = months
        .iter()
        .map(|m| std::fs::read_to_string(archive.join(m.replace(".json", ".md"))).unwrap())
        .collect();
    assert_eq!(md.matches("## Runs").count(), months.len(), "{md}");
    assert_eq!(
        md.matches("\n- ").count(),
        6,
        "three todos and three runs: {md}"
    );
    let stamp = std::fs::metadata(archive.join(&months[0]))
        .unwrap()
        .modified()
        .unwrap();
    p.ok(&["refresh-state", "--goal-id", "g"]);
    assert_eq!(
        std::fs::metadata(archive.join(&months[0]))
            .unwrap()
            .modified()
            .unwrap(),
        stamp,
        "an archive is written once"
    );
    assert_eq!(p.todo_status("t0"), "completed");
    // The operator sets the window.
    p.ok(&["gc", "policy", "--live-window-days", "100"]);
    p.ok(&["refresh-state", "--goal-id", "g"]);
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(p.state().join("goals/g/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["todos"].as_array().unwrap().len(), 5);
    let policy = p.json(&["gc", "policy"]);
    assert_eq!(policy["policy"]["live_window_days"], 100);
    assert_eq!(
        policy["policy"]["history_days"], 365,
        "unchanged fields keep their value"
    );
    assert_eq!(
        count(
            &p,
            "SELECT COUNT(*) FROM ops WHERE kind = 'retention_policy_set'"
        ),
        1
    );
}

#[test]
fn new_run_reports_are_sharded_by_month_and_flat_ones_stay_readable() {
    let p = settled_project(2);
    let runs = p.state().join("goals/g/runs");
    let top: Vec<String> = std::fs::read_dir(&runs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        top.len(),
        1,
        "one month directory, no report at the top: {top:?}"
    );
    assert_eq!(report_files(&p).0, 4);
    // A report of the flat layout (an existing project's) is found where it is.
    let month = runs.join(&top[0]);
    let first = std::fs::read_dir(&month)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .unwrap();
    let run_id = first.file_stem().unwrap().to_string_lossy().into_owned();
    std::fs::rename(&first, runs.join(format!("{run_id}.json"))).unwrap();
    let shown = p.json(&["gc", "run-report", "--goal-id", "g", "--run-id", &run_id]);
    assert!(
        shown["file"]
            .as_str()
            .unwrap()
            .ends_with(&format!("runs/{run_id}.json")),
        "{shown}"
    );
    // `doctor` reads both layouts, and reports a report that does not parse.
    let doctor = p.json(&["doctor"]);
    let detail = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "goal g run reports")
        .unwrap_or_else(|| panic!("{doctor}"))["detail"]
        .clone();
    assert_eq!(
        detail,
        "1 in month folders, 1 in the flat layout, 0 month(s) retired by gc"
    );
    let bad = runs.join("01M8TE60TWR7N03SDJ0434C1TA.json");
    std::fs::write(&bad, b"{ not json").unwrap();
    let broken = p.run(&["doctor"]);
    assert_eq!(broken.code, 5, "{}", broken.stderr);
    assert!(
        broken.stderr.contains("01M8TE60TWR7N03SDJ0434C1TA.json"),
        "{}",
        broken.stderr
    );
    std::fs::remove_file(&bad).unwrap();
    // `refresh-state` re-creates only what is missing: the flat report counts as present.
    p.ok(&["refresh-state"]);
    assert!(!month.join(format!("{run_id}.json")).exists());
    let doctor = p.run(&["doctor"]);
    assert_eq!(doctor.code, 0, "{} {}", doctor.stdout, doctor.stderr);
}

/// The on-disk bytes of the `turns` table and its indexes: a vacuumed copy of the database,
/// measured with the table and without it.
/// A projection write killed mid-way leaves its temp file (`.<name>.<pid>.tmp`) behind; a crash
/// loop would pile them up. `gc` lists those whose writer is gone and that are over a minute old,
/// removes them with `--apply` (logged), and keeps any other: a live writer's, a fresh one's, and
/// a file that only looks similar.
#[test]
fn gc_removes_the_temp_files_of_killed_writes_and_only_those() {
    let p = settled_project(1);
    let goal_dir = p.state().join("goals/g");
    let archive = goal_dir.join("archive");
    std::fs::create_dir_all(&archive).unwrap();
    // pid_max is at most 2^22 on Linux: these writers cannot be alive.
    let dead = [
        goal_dir.join(".state.json.4194305.tmp"),
        archive.join(".2026-01.md.4194306.tmp"),
    ];
    let live = goal_dir.join(format!(".STATE.md.{}.tmp", std::process::id()));
    let fresh = goal_dir.join(".state.json.4194307.tmp");
    let lookalike = goal_dir.join("notes.4194308.tmp");
    for f in dead.iter().chain([&live, &fresh, &lookalike]) {
        std::fs::write(f, vec![b'x'; 5000]).unwrap();
    }
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    for f in dead.iter().chain([&live, &lookalike]) {
        std::fs::File::options()
            .write(true)
            .open(f)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    let listed = |v: &Value| -> Vec<String> {
        let mut paths: Vec<String> = v["temp_files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["path"].as_str().unwrap().to_string())
            .collect();
        paths.sort();
        paths
    };
    let mut expected: Vec<String> = dead.iter().map(|f| f.display().to_string()).collect();
    expected.sort();
    let plan = p.json(&["gc"]);
    assert_eq!(listed(&plan), expected, "{plan}");
    assert!(dead.iter().all(|f| f.exists()), "a dry run removes nothing");
    let applied = p.json(&["gc", "--apply"]);
    assert_eq!(listed(&applied), expected);
    assert!(dead.iter().all(|f| !f.exists()));
    assert!(live.exists() && fresh.exists() && lookalike.exists());
    assert_eq!(
        count(
            &p,
            "SELECT COUNT(*) FROM ops WHERE kind = 'gc_remove_temp_files'"
        ),
        1
    );
    assert!(
        listed(&p.json(&["gc"])).is_empty(),
        "nothing left to remove"
    );
}

fn turns_table_bytes(p: &Project) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy.db");
    db(p)
        .execute("VACUUM INTO ?1", [copy.to_str().unwrap()])
        .unwrap();
    let with = std::fs::metadata(&copy).unwrap().len();
    let c = rusqlite::Connection::open(&copy).unwrap();
    c.execute_batch("DELETE FROM turns; VACUUM").unwrap();
    drop(c);
    with - std::fs::metadata(&copy).unwrap().len()
}

#[test]
fn a_settled_turn_takes_under_1_kib_on_disk_after_gc_with_the_default_policy() {
    const N: usize = 40;
    let p = settled_project(N);
    let journal_before = turns_table_bytes(&p);
    let (_, reports_before) = report_files(&p);
    // Older than the full journals and report files are kept (30 days), inside the year of
    // history: the default policy compacts and retires, and keeps every run's payload.
    age(&p, 70);
    assert_eq!(p.json(&["gc", "policy"])["policy"]["journal_full_days"], 30);
    let applied = p.json(&["gc", "--apply"]);
    assert_eq!(applied["turns"].as_array().unwrap().len(), N, "{applied}");
    assert_eq!(
        applied["payloads"].as_array().unwrap().len(),
        0,
        "payloads kept a year"
    );
    let journal_after = turns_table_bytes(&p);
    let (files, reports_after) = report_files(&p);
    assert_eq!(files, 0, "every report file of the old month retired");
    let per_turn = (journal_after + reports_after) / N as u64;
    eprintln!(
        "bytes on disk per settled turn: journal {} -> {}, report files {} -> {}; after gc {per_turn}",
        journal_before / N as u64,
        journal_after / N as u64,
        reports_before / N as u64,
        reports_after / N as u64
    );
    assert!(
        per_turn < 1024,
        "{per_turn} bytes per settled turn after gc"
    );
    assert_invariants(&p, N as i64);
}

#[test]
fn sigkill_at_many_points_of_gc_leaves_a_consistent_project() {
    const N: usize = 24;
    let template = settled_project(N);
    age(&template, 400);
    // How long a whole gc takes here, on a copy.
    let timing = copy_of(&template);
    let t0 = Instant::now();
    timing.ok(&["gc", "--apply"]);
    let total = t0.elapsed();
    // At least KILLS attempts spread over the measured time; more (up to three rounds) while too
    // few land mid-gc, each round over a shorter window, since the machine's load moves the
    // time a gc takes between the measurement and the attempts.
    const KILLS: u32 = 16;
    let mut window = total;
    let mut killed = 0;
    // (compacted journals, dropped payloads, report files left) at each kill.
    let mut states = std::collections::BTreeSet::new();
    for i in 0..3 * KILLS {
        if i >= KILLS && states.len() >= 2 && killed >= KILLS / 4 {
            break;
        }
        if i > 0 && i % KILLS == 0 {
            window = window.mul_f64(0.5);
        }
        let p = copy_of(&template);
        let mut child = p
            .command(&["gc", "--apply"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(window.mul_f64(f64::from(i % KILLS) / f64::from(KILLS)));
        if child.try_wait().unwrap().is_none() {
            killed += 1;
        }
        let _ = child.kill();
        let status = child.wait().unwrap();
        assert_ne!(status.code(), Some(101), "gc panicked");
        assert_invariants(&p, N as i64);
        states.insert((
            count(
                &p,
                "SELECT COUNT(*) FROM turns WHERE compacted_at IS NOT NULL",
            ),
            count(
                &p,
                "SELECT COUNT(*) FROM runs WHERE payload_dropped_at IS NOT NULL",
            ),
            report_files(&p).0,
        ));
        // Every removal made so far is logged, and a second gc finishes the work.
        let logged = count(
            &p,
            "SELECT COUNT(*) FROM ops WHERE kind = 'gc_compact_turns'",
        );
        let compacted = count(
            &p,
            "SELECT COUNT(*) FROM turns WHERE compacted_at IS NOT NULL",
        );
        assert!(
            compacted == 0 || logged > 0,
            "compacted {compacted} with no op row"
        );
        p.ok(&["gc", "--apply"]);
        assert_eq!(
            count(&p, "SELECT COUNT(*) FROM turns WHERE compacted_at IS NULL"),
            0
        );
        assert_eq!(report_files(&p).0, 0);
        assert_invariants(&p, N as i64);
    }
    eprintln!("gc took {total:?} here; {killed} kills landed mid-gc: {states:?}");
    // Kills before any change and after some (the states between are seen when a kill lands
    // between two of gc's transactions, which depends on the machine's load).
    assert!(
        states.len() >= 2,
        "kills landed at too few points: {states:?}"
    );
    assert!(
        killed >= KILLS / 4,
        "only {killed} kills landed mid-gc in {} attempts",
        3 * KILLS
    );
}

/// A copy of `p`'s project in a new directory (nothing runs on `p` meanwhile).
fn copy_of(p: &Project) -> Project {
    let q = Project::empty();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(p.state())
        .arg(q.path())
        .status()
        .unwrap();
    assert!(status.success());
    q
}

/// One applying gc at a time: each logs the removals it planned before making them, so two at
/// once both logged, and counted, the same work.
#[test]
fn a_second_gc_apply_while_one_runs_is_a_conflict_and_changes_nothing() {
    let p = Project::new();
    let g = p.goal("g");
    p.json(&["refresh-state", "--goal-id", &g, "--summary", "one run"]);
    // Another process (this test) holds the gc lock, taken as gc takes it.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(p.state().join("gc.lock"))
        .unwrap();
    assert!(loopx::state_file::lock_exclusively(&lock).unwrap());
    let ops_before = count(&p, "SELECT count(*) FROM ops");
    let r = p.run(&["gc", "--apply"]);
    assert_eq!(r.code, 4, "{} {}", r.stdout, r.stderr);
    assert!(r.stderr.contains("another gc"), "{}", r.stderr);
    assert_eq!(count(&p, "SELECT count(*) FROM ops"), ops_before);
    // The dry run only reads: it needs no lock.
    p.ok(&["gc"]);
    drop(lock);
    p.ok(&["gc", "--apply"]);
}

/// `gc --apply` on a nearly full disk: its removals commit, then VACUUM, which needs room for a
/// copy of the database, fails. That failure cannot undo the removals, so the command succeeds
/// with a warning (a caller that retried on an error code would find the work done anyway), and
/// the next `gc` with room vacuums. The disk is a small tmpfs mounted in a private user and
/// mount namespace, so the test needs no privileges.
#[test]
fn a_vacuum_that_fails_after_gc_committed_is_a_warning() {
    let p = settled_project(3);
    age(&p, 400);
    let work = tempfile::tempdir().unwrap();
    let script = format!(
        r#"set -e
mount -t tmpfs -o size=8m tmpfs "$MNT"
cp -a "$SRC/." "$MNT/"
cd "$MNT"
free=$(df -k . | awk 'NR==2 {{print $4}}')
# 160 KB left: room for gc's commits (under 120 KB of WAL), not for VACUUM's copy of the
# database (over 200 KB).
dd if=/dev/zero of=filler bs=1k count=$((free - 160)) 2>/dev/null || true
set +e
{loopx} --format json gc --apply > "$OUT/full.json" 2> "$OUT/full.err"; echo $? > "$OUT/full.rc"
rm filler
{loopx} --format json gc --apply > "$OUT/room.json" 2> "$OUT/room.err"; echo $? > "$OUT/room.rc"
"#,
        loopx = crate::support::loopx_bin()
    );
    let mnt = work.path().join("mnt");
    let out = work.path().join("out");
    std::fs::create_dir(&mnt).unwrap();
    std::fs::create_dir(&out).unwrap();
    let ran = std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c", &script])
        .env("MNT", &mnt)
        .env("SRC", p.path())
        .env("OUT", &out)
        .output()
        .expect("unshare (util-linux) runs the test in its own namespaces");
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap();
    let full: Value = serde_json::from_str(&read("full.json"))
        .unwrap_or_else(|e| panic!("{e}: {} {}", read("full.json"), read("full.err")));
    assert_eq!(read("full.rc").trim(), "0", "{full} {}", read("full.err"));
    assert_eq!(full["applied"], true, "{full}");
    assert!(full["database_bytes_after"].is_null(), "{full}");
    assert!(
        read("full.err").contains("VACUUM") || full.to_string().contains("VACUUM"),
        "the failed vacuum is reported: {full} {}",
        read("full.err")
    );
    let room: Value = serde_json::from_str(&read("room.json")).unwrap();
    assert_eq!(read("room.rc").trim(), "0", "{room} {}", read("room.err"));
    assert!(room["database_bytes_after"].as_u64().is_some(), "{room}");
    assert_eq!(
        room["turns"].as_array().unwrap().len(),
        0,
        "done before: {room}"
    );
}
