//! No input poisons the project (issue 13, section 6): a host result nested past the reader's
//! limit is refused when parsed; a journal row that cannot be decoded is settled by recovery and
//! reported by `doctor` while every other command keeps working; proposals are checked by one
//! validation whichever way they arrive; `extension install` reads only bounded regular files and
//! quotes nothing from a file that is not a manifest.

use crate::support::{Project, turn_run};
use serde_json::Value;

/// A result document whose one observation's `data` is `levels` arrays deep, so the whole
/// document nests `levels + 3` deep (result object, observations array, observation object).
fn nested_result(levels: usize) -> String {
    format!(
        r#"{{"schema_version":"loopx.turn_result.v1","status":"progress","summary":"deep","observations":[{{"kind":"k","data":{}{}}}]}}"#,
        "[".repeat(levels),
        "]".repeat(levels)
    )
}

/// A host that prints `result` (written to a file beside it, so no shell quoting is involved).
fn printing_host(p: &Project, name: &str, result: &str) -> String {
    std::fs::write(p.file(&format!("{name}.json")), result).unwrap();
    p.script(
        name,
        &format!(
            "cat > /dev/null\ncat '{}'\n",
            p.file(&format!("{name}.json")).display()
        ),
    )
}

fn turn_json(p: &Project, agent: &str, host: &str) -> Value {
    let mut args = vec!["--format", "json"];
    args.extend(turn_run(agent, &[], &[host]));
    p.run(&args).ok().json()["turn"].clone()
}

#[test]
fn a_result_nested_past_the_limit_is_refused_and_the_journal_stays_readable() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    // 124 arrays deep inside `data` was accepted before and poisoned the journal.
    let host = printing_host(&p, "deep", &nested_result(124));
    let o = turn_json(&p, "a1", &host);
    assert_eq!(o["kind"], "validation_failed", "{o}");
    assert!(
        o["detail"]
            .as_str()
            .unwrap()
            .contains("levels deep; the limit is 64"),
        "{o}"
    );
    assert_eq!(p.todo_status("t1"), "open");
    p.ok(&["turn", "list"]);
    p.ok(&["turn", "recover"]);
    p.ok(&["doctor"]);

    // The deepest accepted result (64 levels) is journaled and read back by every command.
    let host = printing_host(&p, "max", &nested_result(61));
    let o = turn_json(&p, "a1", &host);
    assert_eq!(o["kind"], "validated_progress", "{o}");
    let key = o["turn_key"].as_str().unwrap();
    let journal = p.journal(key);
    assert_eq!(journal["status"], "committed");
    p.ok(&["turn", "list"]);
    p.ok(&["history", "--goal-id", "g"]);
    p.ok(&["doctor"]);

    let host = printing_host(&p, "over", &nested_result(62));
    let o = turn_json(&p, "a1", &host);
    assert_eq!(o["kind"], "validation_failed", "{o}");
}

/// Starts a turn of `agent` on `todo` and kills the driver right after the start transaction, so
/// the journal row stays `in_progress` with the todo leased; returns the turn key.
fn orphaned_turn(p: &Project, agent: &str, todo: &str) -> String {
    let host = p.script("noop", "cat > /dev/null\n");
    let mut args = vec!["--format", "json"];
    args.extend(turn_run(agent, &["--todo-id", todo], &[&host]));
    let run = p.run_env(&args, &[("LOOPX_TEST_CRASH_AFTER", "start")]);
    assert_ne!(run.code, 0, "the crash hook must kill the driver");
    let list = p.json(&["turn", "list", "--status", "in_progress"]);
    list["turns"][0]["turn_key"].as_str().unwrap().to_string()
}

/// Overwrites the journal `data` of `key` with `sql_value` (an SQL expression).
fn poison(p: &Project, key: &str, sql_value: &str) {
    let conn = rusqlite::Connection::open(p.state().join("loopx.db")).unwrap();
    let n = conn
        .execute(
            &format!("UPDATE turns SET data = {sql_value} WHERE turn_key = ?1"),
            [key],
        )
        .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn recovery_settles_a_journal_row_it_cannot_decode_and_doctor_reports_it() {
    for (what, value) in [
        // Past serde_json's reader limit of 128: what the unlimited parser let through.
        (
            "too deep",
            format!("'{{\"x\":{}{}}}'", "[".repeat(130), "]".repeat(130)),
        ),
        ("not UTF-8", "CAST(X'7B22FF22' AS TEXT)".to_string()),
        ("not a journal", "'{\"unrelated\":true}'".to_string()),
    ] {
        let p = Project::with_goal_g();
        p.add_work("t1");
        p.add_work("t2");
        let key = orphaned_turn(&p, "a1", "t1");
        assert_eq!(p.todo_status("t1"), "claimed", "{what}");
        poison(&p, &key, &value);

        // Reads keep working, and doctor names the row.
        p.ok(&["turn", "list"]);
        p.ok(&["status"]);
        let doctor = p.run(&["doctor"]);
        assert_eq!(doctor.code, 5, "{what}: {doctor:?}");
        assert!(doctor.stderr.contains(&key), "{what}: {}", doctor.stderr);

        // Another agent's turn settles the orphan (recovery at turn start) and runs its own.
        let host = p.script("h", &crate::support::result_host("progress"));
        let o = turn_json(&p, "a2", &host);
        assert_eq!(o["kind"], "validated_progress", "{what}: {o}");
        assert_eq!(o["recovered_turns"][0], key.as_str(), "{what}: {o}");

        let journal = p.journal(&key);
        assert_eq!(journal["status"], "failed", "{what}: {journal}");
        assert_eq!(journal["data"]["kind"], "host_failure", "{what}");
        assert_eq!(journal["data"]["lease"], "released", "{what}");
        assert!(
            journal["data"]["failure"]
                .as_str()
                .unwrap()
                .contains("could not be decoded"),
            "{what}: {journal}"
        );
        assert_eq!(p.todo("t1")["todo"]["claim"], Value::Null, "{what}");
        // One run row for the settled turn, nothing spent for it.
        let runs = p.history();
        assert!(
            runs.iter().any(|r| r["classification"] == "host_failure"),
            "{what}: {runs:?}"
        );
        assert!(!p.spends().contains(&format!("turn:{key}")), "{what}");
        p.ok(&["turn", "recover"]);
        p.ok(&["turn", "list"]);
        p.ok(&["doctor"]);
        // Replaying the settled key returns its stored outcome.
        let mut args = vec!["--format", "json"];
        args.extend(turn_run("a1", &["--turn-key", &key], &[&host]));
        let replay = p.run(&args).ok().json()["turn"].clone();
        assert_eq!(replay["replayed"], true, "{what}: {replay}");
    }
}

#[test]
fn turn_recover_alone_settles_an_undecodable_row() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    let key = orphaned_turn(&p, "a1", "t1");
    poison(
        &p,
        &key,
        &format!("'{}{}'", "[".repeat(200), "]".repeat(200)),
    );
    let out = p.json(&["turn", "recover", "--goal-id", "g"]);
    assert_eq!(out["turns"][0]["turn_key"], key.as_str(), "{out}");
    assert_eq!(out["turns"][0]["kind"], "host_failure", "{out}");
    assert_eq!(p.todo_status("t1"), "open");
    p.ok(&["doctor"]);
}

#[test]
fn a_proposal_with_an_unknown_field_fails_the_result() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    let result = r#"{"schema_version":"loopx.turn_result.v1","status":"progress","summary":"s","proposals":[{"type":"attach_evidence","todo_id":"t1","text":"x","artifact_path":null,"artifact_digest":null,"bogus":1}]}"#;
    let host = printing_host(&p, "bogus", result);
    let o = turn_json(&p, "a1", &host);
    assert_eq!(o["kind"], "validation_failed", "{o}");
    assert!(o["detail"].as_str().unwrap().contains("bogus"), "{o}");
    assert_eq!(p.evidence_count("t1"), 0);
}

#[test]
fn an_attach_evidence_proposal_gets_the_checks_evidence_items_get() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    let path = format!("\\u0000{}", "a".repeat(5000));
    // As an evidence item the path fails the whole result...
    let item = format!(
        r#"{{"schema_version":"loopx.turn_result.v1","status":"progress","summary":"s","evidence":[{{"text":"x","artifact_path":"{path}"}}]}}"#
    );
    let host = printing_host(&p, "item", &item);
    let o = turn_json(&p, "a1", &host);
    assert_eq!(o["kind"], "validation_failed", "{o}");
    // ...and as a proposal it is refused by admission: nothing is stored either way.
    let proposal = format!(
        r#"{{"schema_version":"loopx.turn_result.v1","status":"progress","summary":"s","proposals":[{{"type":"attach_evidence","todo_id":"t1","text":"x","artifact_path":"{path}","artifact_digest":null}}]}}"#
    );
    let host = printing_host(&p, "prop", &proposal);
    let o = turn_json(&p, "a1", &host);
    assert_eq!(o["kind"], "writeback_failed", "{o}");
    let journal = p.journal(o["turn_key"].as_str().unwrap());
    let verdict = &journal["data"]["writeback"]["verdicts"][0];
    assert_eq!(verdict["accepted"], false, "{journal}");
    assert!(
        verdict["reason"]
            .as_str()
            .unwrap()
            .contains("artifact_path"),
        "{verdict}"
    );
    assert_eq!(p.evidence_count("t1"), 0);
}

fn manifest(id: &str, version: &str, component: &str) -> String {
    format!(
        "id = \"{id}\"\nversion = \"{version}\"\napi = \">=0.1, <0.2\"\n[[provides]]\nkind = \"capability\"\nid = \"c\"\ncomponent = \"{component}\"\n"
    )
}

fn install(p: &Project, manifest_text: &str) -> crate::support::Run {
    let dir = p.file("ext");
    std::fs::create_dir_all(&dir).unwrap();
    let _ = std::fs::remove_file(dir.join("extension.toml"));
    std::fs::write(dir.join("extension.toml"), manifest_text).unwrap();
    p.run(&["extension", "install", dir.to_str().unwrap()])
}

/// Runs `loopx extension install DIR` and kills it after `secs`: an unbounded read of a device
/// would otherwise grow memory until the machine gives out. `None` when it had to be killed.
fn install_within(p: &Project, manifest_text: &str, secs: u64) -> Option<std::process::Output> {
    let dir = p.file("ext");
    std::fs::create_dir_all(&dir).unwrap();
    let _ = std::fs::remove_file(dir.join("extension.toml"));
    std::fs::write(dir.join("extension.toml"), manifest_text).unwrap();
    let mut child = p
        .command(&["extension", "install", dir.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Some(child.wait_with_output().unwrap())
}

#[test]
fn install_reads_only_bounded_regular_files() {
    let p = Project::new();
    let out = install_within(&p, &manifest("zero", "0.1.0", "/dev/zero"), 10)
        .expect("install of component = /dev/zero must be refused at once, not read without end");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not a regular file"), "{stderr}");

    // A FIFO nobody writes to would block a plain open forever.
    let fifo = p.file("fifo.wasm");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let r = install(&p, &manifest("fifo", "0.1.0", fifo.to_str().unwrap()));
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("FIFO"), "{r:?}");

    // A component over the cap is refused from its size, before it is read.
    let big = p.file("big.wasm");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(65 << 20).unwrap();
    let r = install(&p, &manifest("big", "0.1.0", big.to_str().unwrap()));
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("the limit is 67108864"), "{r:?}");

    // A manifest over its cap, or one that is a device, is refused the same way.
    let mut huge = manifest("huge", "0.1.0", "c.wasm");
    huge.push_str(&format!("# {}\n", "x".repeat(70 * 1024)));
    let r = install(&p, &huge);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("the limit is 65536"), "{r:?}");
    let dir = p.file("ext");
    std::fs::remove_file(dir.join("extension.toml")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.join("extension.toml")).unwrap();
    let r = p.run(&["extension", "install", dir.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("not a regular file"), "{r:?}");
    let list = p.json(&["extension", "list"]);
    assert!(!list.to_string().contains("zero"), "{list}");
}

#[test]
fn install_never_echoes_a_line_of_a_file_that_is_not_a_component_or_manifest() {
    let p = Project::new();
    let secret = p.file("secret.txt");
    std::fs::write(
        &secret,
        "password = \"hunter2-secret\"\nroot:x:0:0:hunter2-line:/root:/bin/bash\n",
    )
    .unwrap();
    // Named as the component: the engine would read text as WAT and quote the line.
    let r = install(&p, &manifest("text", "0.1.0", secret.to_str().unwrap()));
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("not a WebAssembly binary"), "{r:?}");
    // Linked as the manifest: the TOML error must not quote it.
    let dir = p.file("ext");
    std::fs::remove_file(dir.join("extension.toml")).unwrap();
    std::os::unix::fs::symlink(&secret, dir.join("extension.toml")).unwrap();
    let r = p.run(&["extension", "install", dir.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{r:?}");
    // A binary file as the manifest.
    std::fs::remove_file(dir.join("extension.toml")).unwrap();
    std::fs::write(
        dir.join("extension.toml"),
        b"\x7fELF\x00\xffhunter2-binary\n",
    )
    .unwrap();
    let r2 = p.run(&["extension", "install", dir.to_str().unwrap()]);
    assert_eq!(r2.code, 2, "{r2:?}");
    for out in [&r, &r2] {
        for leak in ["hunter2", "password", "root:x"] {
            assert!(!out.stderr.contains(leak), "{leak} echoed: {}", out.stderr);
            assert!(!out.stdout.contains(leak), "{leak} echoed: {}", out.stdout);
        }
    }
}

#[test]
fn install_refuses_loose_versions_and_ids_that_start_with_a_dash() {
    let p = Project::new();
    let wasm = p.file("c.wasm");
    std::fs::write(&wasm, b"\0asm\x0d\x00\x01\x00").unwrap();
    for (id, version, expect) in [
        ("x", "1", "SemVer"),
        ("x", " 1 . 2 . 3 ", "SemVer"),
        ("x", "1.2.3\\u001b[2J", "SemVer"),
        ("-x", "0.1.0", "start with a letter or digit"),
    ] {
        let r = install(&p, &manifest(id, version, wasm.to_str().unwrap()));
        assert_eq!(r.code, 2, "{id} {version}: {r:?}");
        assert!(r.stderr.contains(expect), "{id} {version}: {}", r.stderr);
    }
    let text = manifest("x", "0.1.0", wasm.to_str().unwrap())
        .replace(">=0.1, <0.2", "^0.18446744073709551615");
    let r = install(&p, &text);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("api"), "{r:?}");
}
