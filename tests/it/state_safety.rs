//! Bad input and damaged files: clear errors with documented exit codes, and state left exactly as
//! it was. Also the pure-read guarantee of `quota should-run` and the operator-only writes.

use crate::support::Project;

fn seeded() -> (Project, String) {
    let p = Project::new();
    let g = p.goal("demo");
    p.add_todo(&g, "[P0] first", &[]);
    p.add_todo(&g, "second", &["--depends-on", "t1"]);
    p.json(&["refresh-state", "--goal-id", &g]);
    (p, g)
}

#[test]
fn unknown_goal_or_todo_exits_3_names_it_and_creates_nothing() {
    let (p, g) = seeded();
    let before = p.snapshot();
    let cases: Vec<Vec<&str>> = vec![
        vec!["quota", "should-run", "--goal-id", "no-such-goal"],
        vec!["todo", "add", "--goal-id", "no-such-goal", "--title", "x"],
        vec!["todo", "list", "--goal-id", "no-such-goal"],
        vec!["todo", "claim", "--goal-id", "no-such-goal"],
        vec![
            "todo",
            "update",
            "--goal-id",
            "no-such-goal",
            "--todo-id",
            "t1",
            "--status",
            "completed",
        ],
        vec!["refresh-state", "--goal-id", "no-such-goal"],
        vec!["quota", "spend-slot", "--goal-id", "no-such-goal"],
        vec![
            "reward",
            "add",
            "--goal-id",
            "no-such-goal",
            "--run-id",
            "r1",
            "--score",
            "1",
        ],
        vec!["history", "--goal-id", "no-such-goal"],
        vec!["status", "--goal-id", "no-such-goal"],
        vec!["summary_all", "--goal-id", "no-such-goal"],
        vec!["probe", "show", "--goal-id", "no-such-goal"],
        vec!["gate", "list", "--goal-id", "no-such-goal"],
        vec!["goal", "close", "--goal-id", "no-such-goal"],
    ];
    for args in cases {
        let r = p.run(&args);
        assert_eq!(r.code, 3, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains("no-such-goal"),
            "{args:?} message names the goal: {}",
            r.stderr
        );
    }
    for args in [
        vec!["todo", "claim", "--goal-id", g.as_str(), "--todo-id", "t99"],
        vec![
            "todo",
            "complete",
            "--goal-id",
            g.as_str(),
            "--todo-id",
            "t99",
        ],
        vec!["todo", "show", "--goal-id", g.as_str(), "--todo-id", "t99"],
        vec!["refresh-state", "--goal-id", g.as_str(), "--todo-id", "t99"],
        vec![
            "reward",
            "add",
            "--goal-id",
            g.as_str(),
            "--run-id",
            "01NOSUCHRUN",
            "--score",
            "1",
        ],
    ] {
        let r = p.run(&args);
        assert_eq!(r.code, 3, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains("t99") || r.stderr.contains("01NOSUCHRUN"),
            "{}",
            r.stderr
        );
    }
    assert_eq!(
        before,
        p.snapshot(),
        "nothing was created or changed on disk"
    );
    assert!(!p.state().join("goals/no-such-goal").exists());
}

#[test]
fn bad_input_exits_2_and_changes_nothing() {
    let (p, g) = seeded();
    let before = p.snapshot();
    let long_text = "a".repeat(16 * 1024 + 1);
    for args in [
        vec!["todo", "add", "--goal-id", g.as_str(), "--title", ""],
        vec![
            "todo",
            "add",
            "--goal-id",
            g.as_str(),
            "--title",
            "x",
            "--priority",
            "P9",
        ],
        vec![
            "todo",
            "add",
            "--goal-id",
            g.as_str(),
            "--title",
            "gate",
            "--kind",
            "user_gate",
        ],
        vec!["todo", "add", "--goal-id", "../escape", "--title", "x"],
        vec![
            "quota",
            "show",
            "--goal-id",
            g.as_str(),
            "--agent-id",
            "no such agent",
        ],
        vec![
            "quota",
            "should-run",
            "--goal-id",
            g.as_str(),
            "--agent-id",
            "--help",
        ],
        vec![
            "todo",
            "update",
            "--goal-id",
            g.as_str(),
            "--todo-id",
            "t1",
            "--status",
            "done",
        ],
        vec![
            "todo",
            "claim",
            "--goal-id",
            g.as_str(),
            "--ttl-seconds",
            "0",
        ],
        vec![
            "quota",
            "spend-slot",
            "--goal-id",
            g.as_str(),
            "--slots",
            "0",
            "--effect-id",
            "e1",
        ],
        vec![
            "quota",
            "spend-slot",
            "--goal-id",
            g.as_str(),
            "--slots",
            "-1",
            "--effect-id",
            "e1",
        ],
        vec!["quota", "set", "--goal-id", g.as_str(), "--compute", "-2"],
        // A slot longer than the window would pause the goal without anyone asking.
        vec![
            "quota",
            "set",
            "--goal-id",
            g.as_str(),
            "--window-hours",
            "1",
            "--slot-minutes",
            "61",
        ],
        // Every stored text has a limit.
        vec![
            "todo",
            "update",
            "--goal-id",
            g.as_str(),
            "--todo-id",
            "t1",
            "--status",
            "blocked",
            "--reason",
            &long_text,
        ],
        vec!["goal", "create", "--title", "x", "--objective", &long_text],
        vec![
            "reward",
            "add",
            "--goal-id",
            g.as_str(),
            "--run-id",
            "x",
            "--score",
            "NaN",
        ],
    ] {
        let r = p.run(&args);
        assert_eq!(r.code, 2, "{args:?}: {} {}", r.stdout, r.stderr);
        assert!(!r.stderr.is_empty());
    }
    assert_eq!(before, p.snapshot());
}

#[test]
fn corrupt_registry_projection_exits_5_with_path_and_is_not_overwritten() {
    let (p, g) = seeded();
    let registry = p.state().join("registry.json");
    std::fs::write(&registry, b"{\"goals\": [ truncated").unwrap();
    let before = p.snapshot();
    for args in [
        vec!["goal", "create", "--title", "another"],
        vec!["todo", "list", "--goal-id", g.as_str()],
        vec!["quota", "should-run", "--goal-id", g.as_str()],
        vec!["refresh-state", "--goal-id", g.as_str()],
        vec!["doctor"],
    ] {
        let r = p.run(&args);
        assert_eq!(r.code, 5, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains(&registry.display().to_string()),
            "{args:?} names the path: {}",
            r.stderr
        );
    }
    assert_eq!(
        before,
        p.snapshot(),
        "the corrupt file and everything else is untouched"
    );
    // The documented repair: move it aside and re-create the projections.
    std::fs::rename(&registry, p.state().join("registry.json.corrupt")).unwrap();
    p.json(&["refresh-state"]);
    assert!(loopx::registry::inspect_registry(&registry).ok);
}

/// A FIFO or a device where a projection belongs is reported (exit 5), never waited on or read
/// without end; the snapshot of the project skips it, as it is no file to hash.
#[test]
fn a_projection_that_is_no_regular_file_is_reported_not_waited_on() {
    let (p, g) = seeded();
    let registry = p.state().join("registry.json");
    let state = p.state().join(format!("goals/{g}/state.json"));
    let run_bounded = |args: &[&str]| {
        let mut child = p
            .command(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("{args:?} still running after 20 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        crate::support::to_run(child.wait_with_output().unwrap())
    };
    for (path, how) in [
        (&registry, "fifo"),
        (&registry, "zero"),
        (&state, "fifo"),
        (&state, "zero"),
    ] {
        let saved = std::fs::read(path).unwrap();
        std::fs::remove_file(path).unwrap();
        if how == "fifo" {
            assert!(
                std::process::Command::new("mkfifo")
                    .arg(path)
                    .status()
                    .unwrap()
                    .success()
            );
        } else {
            std::os::unix::fs::symlink("/dev/zero", path).unwrap();
        }
        let mut commands = vec![
            vec!["refresh-state", "--goal-id", g.as_str()],
            vec!["refresh-state"],
        ];
        if path == &registry {
            commands.push(vec!["goal", "create", "--title", "another"]);
        }
        for args in commands {
            let r = run_bounded(&args);
            assert_eq!(r.code, 5, "{how} at {path:?}, {args:?}: {}", r.stderr);
            assert!(r.stderr.contains("not a regular file"), "{}", r.stderr);
        }
        let r = run_bounded(&[
            "--format",
            "json",
            "inspect_registry",
            path.to_str().unwrap(),
        ]);
        assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
        assert!(
            r.stdout.contains("not a regular file"),
            "{how}: {}{}",
            r.stdout,
            r.stderr
        );
        std::fs::remove_file(path).unwrap();
        std::fs::write(path, saved).unwrap();
    }
    // What doctor finds in the places of the goal's Markdown projection and its runs folder.
    let md = p.state().join(format!("goals/{g}/STATE.md"));
    let runs = p.state().join(format!("goals/{g}/runs"));
    std::fs::remove_file(&md).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&md)
            .status()
            .unwrap()
            .success()
    );
    let moved = p.path().join("runs-aside");
    std::fs::rename(&runs, &moved).unwrap();
    std::fs::write(&runs, b"not a folder").unwrap();
    let r = run_bounded(&["doctor"]);
    assert_ne!(r.code, 0, "{}", r.stdout);
    for named in [
        "STATE.md is not a regular file",
        "cannot be read as the folder of run reports",
    ] {
        assert!(
            r.stdout.contains(named) || r.stderr.contains(named),
            "{named}: {} {}",
            r.stdout,
            r.stderr
        );
    }
    std::fs::remove_file(&md).unwrap();
    std::fs::remove_file(&runs).unwrap();
    std::fs::rename(&moved, &runs).unwrap();
    p.ok(&["refresh-state", "--goal-id", g.as_str()]);
    assert_eq!(run_bounded(&["doctor"]).code, 0);
}

#[test]
fn corrupt_goal_state_projection_is_reported_not_overwritten() {
    let (p, g) = seeded();
    let state = p.state().join(format!("goals/{g}/state.json"));
    std::fs::write(&state, b"not json").unwrap();
    let before = p.snapshot();
    let r = p.run(&["refresh-state", "--goal-id", &g]);
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert!(r.stderr.contains("state.json"));
    assert_eq!(std::fs::read(&state).unwrap(), b"not json");
    // Refused before the run is recorded: the database and every file are as they were.
    assert_eq!(before, p.snapshot());
}

#[test]
fn damaged_database_exits_5_with_path_and_is_not_overwritten() {
    let (p, g) = seeded();
    let db = p.state().join("loopx.db");
    // Move everything into the main file first (the WAL persists between commands), then damage
    // its header as a bad disk or a stray write would.
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .unwrap();
    let mut bytes = std::fs::read(&db).unwrap();
    for b in bytes.iter_mut().take(100) {
        *b = 0x5a;
    }
    std::fs::write(&db, &bytes).unwrap();
    let before = p.snapshot();
    for args in [
        vec!["todo", "list", "--goal-id", g.as_str()],
        vec!["quota", "should-run", "--goal-id", g.as_str()],
        vec!["todo", "add", "--goal-id", g.as_str(), "--title", "x"],
        vec!["doctor"],
        // Not called initialized: init opens an existing project as every command does.
        vec!["init"],
    ] {
        let r = p.run(&args);
        assert_eq!(r.code, 5, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains(&db.display().to_string()),
            "{args:?}: {}",
            r.stderr
        );
    }
    // The only file written: the marker that makes later writes refuse (docs/decisions.md).
    let marker = p.state().join("CORRUPT");
    assert!(
        marker.is_file(),
        "SQLite's NOTADB marks the project damaged"
    );
    std::fs::remove_file(&marker).unwrap();
    assert_eq!(before, p.snapshot());
}

#[test]
fn a_damaged_database_keeps_its_wal_and_its_pages() {
    // The WAL holds committed work a repair can still recover; the commands that find the main
    // file damaged must neither checkpoint it into that file nor delete it.
    let (p, g) = seeded();
    for i in 0..20 {
        p.add_todo(&g, &format!("more {i}"), &[]);
    }
    let db = p.state().join("loopx.db");
    let wal = p.state().join("loopx.db-wal");
    assert!(
        std::fs::metadata(&wal).unwrap().len() > 0,
        "the WAL holds commits"
    );
    let mut bytes = std::fs::read(&db).unwrap();
    // Page 1 (the header and the schema's root) stays; every later page is garbage.
    for b in bytes.iter_mut().skip(4096) {
        *b = 0x5a;
    }
    std::fs::write(&db, &bytes).unwrap();
    let before = p.snapshot();
    for args in [
        vec!["status"],
        vec!["goal", "list"],
        vec!["todo", "list", "--goal-id", g.as_str()],
        vec!["refresh-state"],
        vec!["doctor"],
    ] {
        let r = p.run(&args);
        assert_eq!(r.code, 5, "{args:?}: {}", r.stderr);
        let _ = std::fs::remove_file(p.state().join("CORRUPT"));
        assert_eq!(before, p.snapshot(), "{args:?} changed the project");
    }
}

#[test]
fn re_creating_projections_refuses_while_the_damage_marker_exists() {
    let (p, g) = seeded();
    p.json(&["refresh-state", "--goal-id", &g]);
    std::fs::write(p.state().join("CORRUPT"), "found damage\n").unwrap();
    let before = p.snapshot();
    let r = p.run(&["refresh-state"]);
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert!(r.stderr.contains("CORRUPT"), "{}", r.stderr);
    assert_eq!(before, p.snapshot(), "no projection was rewritten");
}

#[test]
fn paths_that_are_not_utf8_are_refused_with_exit_2_and_change_nothing() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let (p, g) = seeded();
    let odd = |name: &[u8]| p.path().join(OsStr::from_bytes(name));
    let before = p.snapshot();
    let run = |cmd: &mut std::process::Command| crate::support::to_run(cmd.output().unwrap());
    // Path arguments: refused while parsing, before anything is created.
    for (args, made) in [
        (
            vec![OsStr::new("backup"), odd(b"bk\xff.db").as_os_str()],
            Some(odd(b"bk\xff.db")),
        ),
        (
            vec![OsStr::new("init"), odd(b"in\xffit").as_os_str()],
            Some(odd(b"in\xffit")),
        ),
        (
            vec![
                OsStr::new("man"),
                OsStr::new("--out"),
                odd(b"m\xff").as_os_str(),
            ],
            Some(odd(b"m\xff")),
        ),
        (
            vec![
                OsStr::new("--format"),
                OsStr::new("json"),
                OsStr::new("inspect_registry"),
                odd(b"r\xff.json").as_os_str(),
            ],
            None,
        ),
    ] {
        let r = run(p.command(&[]).args(&args));
        assert_eq!(r.code, 2, "{args:?}: {}{}", r.stdout, r.stderr);
        assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
        // The refusal names the argument, not only that some argument was not UTF-8.
        let position = format!("argument {} ", args.len());
        assert!(r.stderr.contains(&position), "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains("not valid UTF-8"), "{}", r.stderr);
        if let Some(path) = made {
            assert!(!path.exists(), "{args:?} created {path:?}");
        }
    }
    // `LOOPX_ROOT`, the one variable the parser reads, is named when it is the cause, in the
    // JSON envelope when JSON was asked for.
    let r = run(p
        .command(&["--format", "json", "status"])
        .env("LOOPX_ROOT", odd(b"root\xff")));
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    let envelope: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let message = envelope["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("LOOPX_ROOT is not valid UTF-8"),
        "{message}"
    );
    assert_eq!(envelope["error"]["kind"], "bad_input");
    assert_eq!(before, p.snapshot());
    // A project found under a directory whose name is not UTF-8: refused before it is opened, so
    // a command that commits (refresh-state records a run) commits nothing.
    let moved = tempfile::tempdir().unwrap();
    let home = moved.path().join(OsStr::from_bytes(b"pro\xffject"));
    std::fs::create_dir(&home).unwrap();
    let copy = |from: &std::path::Path, to: &std::path::Path| {
        assert!(
            std::process::Command::new("cp")
                .arg("-a")
                .arg(from)
                .arg(to)
                .status()
                .unwrap()
                .success()
        );
    };
    copy(&p.state(), &home);
    let dump = |dir: &std::path::Path| {
        let db = rusqlite::Connection::open(dir.join(".loopx/loopx.db")).unwrap();
        db.query_row("SELECT count(*) FROM runs", [], |r| r.get::<_, i64>(0))
            .unwrap()
    };
    let runs_before = dump(&home);
    for args in [
        vec!["refresh-state", "--goal-id", g.as_str()],
        vec!["status"],
        vec!["doctor"],
    ] {
        let mut cmd = p.command(&args);
        cmd.current_dir(&home);
        let r = run(&mut cmd);
        assert_eq!(r.code, 2, "{args:?}: {}{}", r.stdout, r.stderr);
        assert!(r.stderr.contains("not valid UTF-8"), "{}", r.stderr);
        let mut cmd = p.command(&args);
        cmd.arg("--root").arg(&home);
        let r = run(&mut cmd);
        assert_eq!(r.code, 2, "--root {args:?}: {}{}", r.stdout, r.stderr);
    }
    assert_eq!(runs_before, dump(&home), "no run was recorded");
}

#[test]
fn should_run_writes_nothing() {
    let (p, g) = seeded();
    p.add_todo(
        &g,
        "gate",
        &["--kind", "user_gate", "--blocks-agent", "other"],
    );
    p.json(&["quota", "spend-slot", "--goal-id", &g, "--effect-id", "e-1"]);
    let before = p.snapshot();
    for agent in ["agent", "other", "third"] {
        for format in ["text", "json", "markdown"] {
            let r = p.run(&[
                "--format",
                format,
                "quota",
                "should-run",
                "--goal-id",
                &g,
                "--agent-id",
                agent,
            ]);
            assert_eq!(r.code, 0, "{}", r.stderr);
        }
    }
    assert_eq!(
        before,
        p.snapshot(),
        "file hashes and the database are unchanged"
    );
}

#[test]
fn agent_inside_a_turn_cannot_resolve_gates_or_set_quota() {
    let (p, g) = seeded();
    let gate = p.add_todo(&g, "approve", &["--kind", "user_gate", "--global-gate"]);
    let before = p.snapshot();
    let turn = [("LOOPX_TURN_KEY", "turn-x"), ("LOOPX_AGENT_ID", "a1")];
    let r = p.run_env(
        &["gate", "resolve", "--goal-id", &g, "--todo-id", &gate],
        &turn,
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("only an operator can resolve a gate"),
        "{}",
        r.stderr
    );
    let r = p.run_env(&["quota", "set", "--goal-id", &g, "--compute", "5"], &turn);
    assert_eq!(r.code, 1, "{}", r.stderr);
    // Nor can an agent close the gate through todo update/complete.
    let r = p.run_env(
        &["todo", "complete", "--goal-id", &g, "--todo-id", &gate],
        &turn,
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    let r = p.run_env(&["goal", "close", "--goal-id", &g], &turn);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(before, p.snapshot());
    // The operator can.
    p.json(&[
        "gate",
        "resolve",
        "--goal-id",
        &g,
        "--todo-id",
        &gate,
        "--comment",
        "ok",
    ]);
}

#[test]
fn an_empty_projection_counts_as_missing_and_is_recreated() {
    // What a power cut can leave behind after a rename whose data had not reached the disk.
    let (p, g) = seeded();
    let state = p.state().join(format!("goals/{g}/state.json"));
    let registry = p.state().join("registry.json");
    std::fs::write(&state, b"").unwrap();
    std::fs::write(&registry, b"").unwrap();
    let run = p.json(&["refresh-state", "--goal-id", &g])["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let report = loopx::paths::ProjectPaths::at(p.path()).run_json(&g, &run);
    std::fs::write(&report, b"").unwrap();
    p.json(&["refresh-state"]);
    for path in [&state, &registry, &report] {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        assert!(
            v["schema_version"].is_string(),
            "{} re-created",
            path.display()
        );
    }
}

#[test]
fn a_damaged_page_is_found_by_doctor() {
    let (p, g) = seeded();
    for i in 0..200 {
        p.add_todo(&g, &format!("filler {i} {}", "x".repeat(200)), &[]);
    }
    let db = p.state().join("loopx.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .unwrap();
    // A page in use (the todos table's root), not one a migration left on the freelist.
    let root: usize = conn
        .query_row(
            "SELECT rootpage FROM sqlite_master WHERE name = 'todos'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    drop(conn);
    let mut bytes = std::fs::read(&db).unwrap();
    let page = (root - 1) * 4096;
    assert!(bytes.len() >= page + 4096);
    // Scribble over the middle of the b-tree page, leaving its header intact.
    for b in &mut bytes[page + 100..page + 1000] {
        *b = 0xa5;
    }
    std::fs::write(&db, &bytes).unwrap();
    let before = p.snapshot();
    let r = p.run(&["doctor"]);
    assert_eq!(r.code, 5, "{} {}", r.stdout, r.stderr);
    assert!(r.stderr.contains(&db.display().to_string()), "{}", r.stderr);
    // The only file doctor writes: the marker that makes later writes refuse.
    let marker = p.state().join("CORRUPT");
    assert!(marker.is_file(), "doctor marks the damaged database");
    std::fs::remove_file(&marker).unwrap();
    assert_eq!(before, p.snapshot());
}

#[test]
fn same_length_edit_of_state_projection_is_still_reported() {
    // The write stamp lets refresh-state skip re-parsing its own last write; an in-place edit that
    // keeps the length and the inode must still be caught, because the modification time moves.
    use std::io::{Seek, SeekFrom, Write};
    let (p, g) = seeded();
    let state = p.state().join(format!("goals/{g}/state.json"));
    let before = std::fs::read(&state).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&state)
        .unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(b"x").unwrap();
    drop(f);
    let edited = std::fs::read(&state).unwrap();
    assert_eq!(edited.len(), before.len());
    let r = p.run(&["refresh-state", "--goal-id", &g]);
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert_eq!(std::fs::read(&state).unwrap(), edited);
}

#[test]
fn damaged_write_stamp_falls_back_to_parsing() {
    let (p, g) = seeded();
    let dir = p.state().join(format!("goals/{g}"));
    std::fs::write(dir.join(".state.json.stamp"), b"garbage").unwrap();
    p.json(&["refresh-state", "--goal-id", &g]);
    std::fs::write(dir.join(".state.json.stamp"), b"garbage").unwrap();
    std::fs::write(dir.join("state.json"), b"{ broken").unwrap();
    let r = p.run(&["refresh-state", "--goal-id", &g]);
    assert_eq!(r.code, 5, "{}", r.stderr);
}

/// A refused id is named, not repeated: 100 KB of it would bury the message (and a terminal).
#[test]
fn a_huge_invalid_id_is_named_by_its_start_and_length() {
    let (p, g) = seeded();
    let huge = "a".repeat(100_000);
    for format in ["text", "json"] {
        let r = p.run(&[
            "--format",
            format,
            "todo",
            "show",
            "--goal-id",
            &g,
            "--todo-id",
            &huge,
        ]);
        assert_eq!(r.code, 2, "{}", r.stderr);
        let said = format!("{}{}", r.stdout, r.stderr);
        assert!(said.len() < 2_000, "{format}: {} bytes", said.len());
        assert!(said.contains("(100000 characters)"), "{said}");
    }
}

/// SQLite reads a log whose header is damaged as empty: the project would look as of its last
/// checkpoint, `doctor` would call it healthy, and the next write would discard the log's
/// commits. Every command reports it instead (exit 5, naming the log) and writes nothing.
#[test]
fn a_wal_whose_header_is_damaged_is_reported_and_its_commits_kept() {
    let (p, g) = seeded();
    let wal = p.state().join("loopx.db-wal");
    let mut bytes = std::fs::read(&wal).unwrap();
    assert!(
        bytes.len() > 4096,
        "the seeded project's commits are in its log"
    );
    bytes[..32].fill(0);
    std::fs::write(&wal, &bytes).unwrap();
    let before = p.snapshot();
    for args in [
        vec!["goal", "list"],
        vec!["todo", "add", "--goal-id", g.as_str(), "--title", "x"],
        vec!["goal", "create", "--id", "h", "--title", "H"],
        vec!["doctor"],
        vec!["init"],
    ] {
        let r = p.run(&args);
        assert_eq!(r.code, 5, "{args:?}: {} {}", r.stdout, r.stderr);
        assert!(
            r.stderr.contains("loopx.db-wal") && r.stderr.contains("move loopx.db-wal aside"),
            "{args:?}: {}",
            r.stderr
        );
    }
    assert_eq!(before, p.snapshot());
    assert_eq!(std::fs::read(&wal).unwrap(), bytes);
}

/// `init` where a directory takes the database's place reports it as every other command
/// does, instead of calling the project initialized (a damaged file: the test above).
#[test]
fn init_reports_a_directory_in_the_databases_place() {
    let other = Project::empty();
    std::fs::create_dir_all(other.state().join("loopx.db")).unwrap();
    let r = other.run(&["init"]);
    assert_eq!(r.code, 5, "{} {}", r.stdout, r.stderr);
    assert!(r.stderr.contains("not a regular file"), "{}", r.stderr);
}

/// The variables that name who a process acts as are refused when they are not UTF-8, not read
/// as unset: unset means the operator, so an agent whose id was mangled would act as one.
#[test]
fn identity_variables_that_are_not_utf8_are_refused() {
    use std::os::unix::ffi::OsStrExt;
    let (p, g) = seeded();
    let before = p.snapshot();
    for var in ["LOOPX_AGENT_ID", "LOOPX_TURN_KEY", "LOOPX_CLAIM_KEY"] {
        for format in [&[][..], &["--format", "json"][..]] {
            let mut cmd =
                p.command(&[format, &["goal", "pause", "--goal-id", g.as_str()]].concat());
            cmd.env(var, std::ffi::OsStr::from_bytes(b"agent\xff"));
            let r = crate::support::to_run(cmd.output().unwrap());
            assert_eq!(r.code, 2, "{var} {format:?}: {} {}", r.stdout, r.stderr);
            let said = if format.is_empty() {
                r.stderr.clone()
            } else {
                r.json()["error"]["message"].as_str().unwrap().to_string()
            };
            assert!(said.contains(var), "{var}: {said}");
        }
    }
    assert_eq!(before, p.snapshot());
}
