//! Honest failure on a broken machine (issue 13, section 5): a lost or empty database is never
//! silently replaced, damaged content is exit 5 naming its row, damage stops writes, the machine
//! refusing I/O is exit 6 with the path and the OS reason, reads work on a read-only filesystem,
//! a command that committed succeeds, closed or failing standard streams never panic, and
//! `loopx backup` makes a copy that restores.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{Project, Run, loopx_bin, to_run};

fn seeded() -> (Project, String) {
    let p = Project::new();
    let g = p.goal("demo");
    p.add_todo(&g, "first", &[]);
    p.add_todo(&g, "second", &[]);
    p.json(&["refresh-state", "--goal-id", &g, "--summary", "seeded"]);
    (p, g)
}

fn db(p: &Project) -> PathBuf {
    p.state().join("loopx.db")
}

/// Every kind of command, reads and writes, as a broken project must answer them.
fn every_kind_of_command(g: &str) -> Vec<Vec<String>> {
    [
        vec!["status"],
        vec!["doctor"],
        vec!["goal", "list"],
        vec!["goal", "create", "--title", "after the loss"],
        vec!["todo", "list", "--goal-id", g],
        vec!["todo", "add", "--goal-id", g, "--title", "x"],
        vec!["history", "--goal-id", g],
        vec!["quota", "should-run", "--goal-id", g],
        vec!["refresh-state", "--goal-id", g],
        vec!["refresh-state"],
        vec!["start-goal", "--goal-text", "a new goal"],
        vec!["backup", "copy.db"],
    ]
    .into_iter()
    .map(|args| args.into_iter().map(str::to_string).collect())
    .collect()
}

fn run_strings(p: &Project, args: &[String]) -> Run {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    p.run(&args)
}

#[test]
fn an_empty_database_is_exit_5_for_every_command_and_never_reinitialized() {
    let (p, g) = seeded();
    let registry = std::fs::read(p.state().join("registry.json")).unwrap();
    std::fs::write(db(&p), b"").unwrap();
    let mut commands = every_kind_of_command(&g);
    commands.push(vec!["init".to_string()]);
    for args in &commands {
        let r = run_strings(&p, args);
        assert_eq!(r.code, 5, "{args:?}: {} {}", r.stdout, r.stderr);
        assert!(
            r.stderr.contains(&db(&p).display().to_string()),
            "{args:?} names the database: {}",
            r.stderr
        );
        assert_eq!(std::fs::metadata(db(&p)).unwrap().len(), 0, "{args:?}");
    }
    // Nothing started an empty project in its place: the registry still lists the old goal.
    assert_eq!(
        std::fs::read(p.state().join("registry.json")).unwrap(),
        registry
    );
    assert!(!p.path().join("copy.db").exists());
}

#[test]
fn a_missing_database_is_exit_5_and_only_init_creates_one() {
    let (p, g) = seeded();
    let wal = p.state().join("loopx.db-wal");
    std::fs::remove_file(db(&p)).unwrap();
    for args in &every_kind_of_command(&g) {
        let r = run_strings(&p, args);
        assert_eq!(r.code, 5, "{args:?}: {} {}", r.stdout, r.stderr);
        assert!(
            r.stderr.contains(&db(&p).display().to_string()),
            "{args:?}: {}",
            r.stderr
        );
        assert!(!db(&p).exists(), "{args:?} created a database");
    }
    // From a subdirectory too: the search does not walk past the lost project.
    let sub = p.path().join("src");
    std::fs::create_dir(&sub).unwrap();
    let mut cmd = p.command(&["status"]);
    cmd.current_dir(&sub);
    let r = to_run(cmd.output().unwrap());
    assert_eq!(r.code, 5, "{}", r.stderr);
    // The committed work may live in the WAL alone: `init` refuses to start over beside it.
    assert!(std::fs::metadata(&wal).unwrap().len() > 0);
    let r = p.run(&["init"]);
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert!(r.stderr.contains("loopx.db-wal"), "{}", r.stderr);
    assert!(!db(&p).exists());
    // An empty `.loopx/` is no project (a turn's sandbox lays one over the real one): the search
    // goes on past it, and finds nothing here (exit 3).
    let empty = Project::empty();
    std::fs::create_dir(empty.state()).unwrap();
    assert_eq!(empty.run(&["status"]).code, 3);
    // With the WAL moved aside as well, the operator's explicit `init` starts an empty project.
    std::fs::rename(&wal, p.path().join("old-wal")).unwrap();
    let _ = std::fs::remove_file(p.state().join("loopx.db-shm"));
    let created = p.json(&["init"]);
    assert_eq!(created["created"], true);
    assert_eq!(
        p.json(&["goal", "list"])["goals"].as_array().unwrap().len(),
        0
    );
}

/// Opens the project's database the way an outside tool would, to damage it.
fn sql(p: &Project, batch: &str) {
    let conn = rusqlite::Connection::open(db(p)).unwrap();
    conn.execute_batch(batch).unwrap();
}

#[test]
fn doctor_finds_content_damage_and_commands_name_the_row() {
    let (p, g) = seeded();
    assert_eq!(p.run(&["doctor"]).code, 0);
    // Invalid UTF-8 in a title, a stored JSON column that does not parse, an enum value no
    // reader knows, and references to rows that do not exist.
    sql(
        &p,
        &format!(
            "UPDATE todos SET title = CAST(X'4142FF43' AS TEXT) WHERE goal_id = '{g}' AND id = 't1';
             UPDATE runs SET payload = '{{not json';
             INSERT INTO evidence (goal_id, todo_id, text, actor, created_at)
                 VALUES ('{g}', 't404', 'orphan', 'operator', 1);
             INSERT INTO rewards (goal_id, run_id, score, comment, actor, created_at)
                 VALUES ('{g}', 'no-such-run', 1, '', 'operator', 1);"
        ),
    );
    let r = p.run(&["doctor"]);
    assert_eq!(r.code, 5, "{} {}", r.stdout, r.stderr);
    for needle in [
        &format!("table todos row ({g}, t1) column title: not UTF-8"),
        "table runs row (",
        "column payload: stored JSON does not parse",
        "dangling reference evidence -> todo",
        "t404",
        "dangling reference reward -> run",
        "no-such-run",
    ] {
        assert!(
            r.stderr.contains(needle),
            "doctor names {needle:?}: {}",
            r.stderr
        );
    }
    // Content damage is not page damage: writes are not stopped for it.
    assert!(!p.state().join("CORRUPT").exists());

    // A row that does not decode is exit 5 naming its table and key, never exit 1 "internal".
    let r = p.run(&["todo", "list", "--goal-id", &g]);
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!("row ({g}, t1) of table todos")),
        "{}",
        r.stderr
    );
    let r = p.run(&["--format", "json", "history", "--goal-id", &g]);
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert_eq!(r.json()["error"]["kind"], "corrupt");
    assert!(r.stderr.contains("of table runs"), "{}", r.stderr);

    // A priority no rank has is reported, not shown as some priority it is not.
    sql(
        &p,
        &format!(
            "UPDATE todos SET title = 'first' WHERE goal_id = '{g}' AND id = 't1';
             UPDATE todos SET priority = 99 WHERE goal_id = '{g}' AND id = 't2';"
        ),
    );
    for args in [
        vec!["todo", "list", "--goal-id", g.as_str()],
        vec!["doctor"],
    ] {
        let r = p.run(&args);
        assert_eq!(r.code, 5, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr
                .contains("priority rank 99 is none of 0 (P0) to 4 (P4)"),
            "{args:?}: {}",
            r.stderr
        );
    }

    sql(
        &p,
        &format!("UPDATE goals SET status = 'bogus' WHERE id = '{g}'"),
    );
    let r = p.run(&["status"]);
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!("row ({g}) of table goals")),
        "{}",
        r.stderr
    );
}

#[test]
fn cached_projection_lines_that_do_not_decode_are_rendered_afresh() {
    let (p, g) = seeded();
    // `refresh-state` cached each todo's rendered lines in its row; damage them.
    sql(
        &p,
        "UPDATE todos SET view_json = CAST(X'7B22FF' AS TEXT), view_md = CAST(X'2DFF' AS TEXT) \
         WHERE view_json IS NOT NULL",
    );
    let r = p.run(&["refresh-state", "--goal-id", &g]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let state = std::fs::read_to_string(p.state().join("goals").join(&g).join("state.json"))
        .expect("state.json is UTF-8");
    assert!(state.contains("\"title\":\"first\""), "{state}");
}

/// Fills the todos table past one page, moves everything into the main file, and scribbles over
/// the middle of the table's root page (header intact), as a bad disk would.
fn damage_a_page(p: &Project, g: &str) {
    for i in 0..150 {
        p.add_todo(g, &format!("filler {i} {}", "x".repeat(200)), &[]);
    }
    let conn = rusqlite::Connection::open(db(p)).unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .unwrap();
    let root: usize = conn
        .query_row(
            "SELECT rootpage FROM sqlite_master WHERE name = 'todos'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    drop(conn);
    let mut bytes = std::fs::read(db(p)).unwrap();
    let page = (root - 1) * 4096;
    for b in &mut bytes[page + 100..page + 1000] {
        *b = 0xa5;
    }
    std::fs::write(db(p), &bytes).unwrap();
}

#[test]
fn a_damaged_page_stops_writes_until_doctor_sees_a_healthy_database() {
    let (p, g) = seeded();
    let backup = p.path().join("before.db");
    p.ok(&["backup", backup.to_str().unwrap()]);
    damage_a_page(&p, &g);
    let marker = p.state().join("CORRUPT");

    // A command that reads the damaged pages reports them and marks the project.
    let r = p.run(&["todo", "list", "--goal-id", &g]);
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert!(marker.is_file(), "SQLITE_CORRUPT marks the project");
    // A write that need not touch those pages is refused all the same, before it begins.
    let r = p.run(&["goal", "create", "--title", "on a damaged file"]);
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert!(r.stderr.contains("writes are refused"), "{}", r.stderr);
    // Reads are not refused by the marker: what is still readable can be read (and copied).
    assert_eq!(p.run(&["goal", "list"]).code, 0);
    // doctor confirms the damage and keeps the marker.
    assert_eq!(p.run(&["doctor"]).code, 5);
    assert!(marker.is_file());
    // A backup of the damaged file is refused, against the project's database, and leaves no
    // file behind.
    let damaged_copy = p.path().join("damaged.db");
    let r = p.run(&["backup", damaged_copy.to_str().unwrap()]);
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert!(
        r.stderr.contains(&db(&p).display().to_string()),
        "{}",
        r.stderr
    );
    assert!(!damaged_copy.exists());
    assert!(!std::fs::read_dir(p.path()).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .contains("backup-tmp")
    }));

    // Restore the copy: doctor checks it healthy, removes the marker, writes work again.
    for f in ["loopx.db", "loopx.db-wal", "loopx.db-shm"] {
        let _ = std::fs::remove_file(p.state().join(f));
    }
    std::fs::copy(&backup, db(&p)).unwrap();
    let r = p.run(&["doctor"]);
    assert_eq!(r.code, 0, "{} {}", r.stdout, r.stderr);
    assert!(r.stdout.contains("removed"), "{}", r.stdout);
    assert!(!marker.exists());
    p.ok(&["goal", "create", "--title", "after the restore"]);
}

#[test]
fn doctor_marks_damage_it_finds_and_writes_refuse() {
    let (p, g) = seeded();
    damage_a_page(&p, &g);
    assert_eq!(p.run(&["doctor"]).code, 5);
    assert!(p.state().join("CORRUPT").is_file());
    let r = p.run(&["--format", "json", "goal", "create", "--title", "x"]);
    assert_eq!(r.code, 5, "{}", r.stderr);
    assert_eq!(r.json()["error"]["kind"], "corrupt");
}

/// Runs `script` with `sh` inside a new user and mount namespace (`unshare -rm`), which works
/// unprivileged and as root. Panics, loudly, when the machine cannot create one: these tests
/// then cannot check anything, and a silent skip would read as a pass.
fn in_mount_namespace(script: &str) -> Run {
    let probe = Command::new("unshare")
        .args(["-rm", "true"])
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run `unshare` ({e}); install util-linux to run this test")
        });
    assert!(
        probe.status.success(),
        "this test needs a user+mount namespace (`unshare -rm`), which this machine refuses: {}",
        String::from_utf8_lossy(&probe.stderr)
    );
    to_run(
        Command::new("unshare")
            .args(["-rm", "sh", "-c", script])
            .env("LOOPX", loopx_bin())
            .env_remove("LOOPX_ROOT")
            .env_remove("LOOPX_AGENT_ID")
            .env_remove("LOOPX_TURN_KEY")
            .env_remove("LOOPX_CLAIM_KEY")
            .output()
            .expect("spawn unshare"),
    )
}

/// A script line that prints `name=<exit code>` after running loopx with `args` in `dir`.
fn step(name: &str, dir: &Path, args: &str) -> String {
    format!(
        "cd '{}' && \"$LOOPX\" {args} >/dev/null 2>>'{}/errors'; echo {name}=$?\n",
        dir.display(),
        dir.parent().unwrap().display()
    )
}

fn codes(r: &Run) -> std::collections::BTreeMap<String, i32> {
    r.stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim().parse().unwrap_or(-1)))
        .collect()
}

#[test]
fn reads_work_on_a_read_only_filesystem_and_writes_exit_6() {
    let (p, g) = seeded();
    // A second project whose WAL index is gone and cannot be re-created there.
    let outer = tempfile::tempdir().unwrap();
    let dir = outer.path().join("ro");
    std::fs::create_dir(&dir).unwrap();
    let lost_index = outer.path().join("lost-index");
    std::fs::create_dir(&lost_index).unwrap();
    let root = p.path().display().to_string();
    let mut script = format!(
        "set -u\nmount --bind '{root}' '{root}' && mount -o remount,bind,ro '{root}' || exit 97\n"
    );
    for (name, args) in [
        ("status", "status".to_string()),
        ("todo_list", format!("todo list --goal-id {g}")),
        ("history", format!("history --goal-id {g}")),
        ("should_run", format!("quota should-run --goal-id {g}")),
        ("doctor", "doctor".to_string()),
        ("goal_create", "goal create --title nope".to_string()),
        ("refresh", format!("refresh-state --goal-id {g}")),
    ] {
        script.push_str(&step(name, p.path(), &args));
    }
    script.push_str(&format!(
        "cd '{root}' && \"$LOOPX\" --format json goal create --title nope 2>/dev/null; echo\n"
    ));
    let r = in_mount_namespace(&script);
    let errors =
        std::fs::read_to_string(p.path().parent().unwrap().join("errors")).unwrap_or_default();
    let got = codes(&r);
    for read in ["status", "todo_list", "history", "should_run", "doctor"] {
        assert_eq!(
            got.get(read),
            Some(&0),
            "{read}: {got:?}\n{errors}\n{}",
            r.stderr
        );
    }
    for write in ["goal_create", "refresh"] {
        assert_eq!(got.get(write), Some(&6), "{write}: {got:?}\n{errors}");
    }
    assert!(errors.contains(&db(&p).display().to_string()), "{errors}");
    assert!(
        errors.to_lowercase().contains("read"),
        "the OS reason: {errors}"
    );
    let json_start = r.stdout.find('{').expect("the JSON error envelope");
    let envelope: serde_json::Value =
        serde_json::from_str(r.stdout[json_start..].trim()).expect("JSON");
    assert_eq!(envelope["error"]["kind"], "io");
    assert_eq!(envelope["error"]["exit_code"], 6);

    // Without the WAL index, a WAL that holds commits cannot be read on read-only media: exit
    // 6 for every command, doctor included; never "corrupt".
    let copy = lost_index.join("p");
    copy_dir(p.path(), &copy);
    std::fs::remove_file(copy.join(".loopx/loopx.db-shm")).unwrap();
    let c = copy.display().to_string();
    let mut script =
        format!("mount --bind '{c}' '{c}' && mount -o remount,bind,ro '{c}' || exit 97\n");
    script.push_str(&step("status", &copy, "status"));
    script.push_str(&step("doctor", &copy, "doctor"));
    let r = in_mount_namespace(&script);
    let got = codes(&r);
    let errors = std::fs::read_to_string(lost_index.join("errors")).unwrap_or_default();
    assert_eq!(got.get("status"), Some(&6), "{got:?} {errors} {}", r.stderr);
    assert_eq!(got.get("doctor"), Some(&6), "{got:?} {errors}");
    assert!(errors.contains("loopx.db-shm"), "{errors}");

    // A database with no WAL content (a restored backup) is read without its index.
    let restored = dir.join("p");
    std::fs::create_dir_all(restored.join(".loopx")).unwrap();
    let backup = outer.path().join("b.db");
    p.ok(&["backup", backup.to_str().unwrap()]);
    std::fs::copy(&backup, restored.join(".loopx/loopx.db")).unwrap();
    let rr = restored.display().to_string();
    let mut script =
        format!("mount --bind '{rr}' '{rr}' && mount -o remount,bind,ro '{rr}' || exit 97\n");
    script.push_str(&step("status", &restored, "status"));
    script.push_str(&step(
        "todo_list",
        &restored,
        &format!("todo list --goal-id {g}"),
    ));
    script.push_str(&step("doctor", &restored, "doctor"));
    script.push_str(&step("goal_create", &restored, "goal create --title nope"));
    let r = in_mount_namespace(&script);
    let got = codes(&r);
    let errors = std::fs::read_to_string(dir.join("errors")).unwrap_or_default();
    for read in ["status", "todo_list", "doctor"] {
        assert_eq!(
            got.get(read),
            Some(&0),
            "{read}: {got:?} {errors} {}",
            r.stderr
        );
    }
    assert_eq!(got.get("goal_create"), Some(&6), "{got:?} {errors}");
}

#[test]
fn a_full_disk_is_exit_6_with_the_path_and_the_os_reason() {
    let outer = tempfile::tempdir().unwrap();
    let mnt = outer.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let m = mnt.display().to_string();
    // A 2 MiB tmpfs holding a project, then filled to the last block.
    let big = "y".repeat(15_000);
    let mut script = format!(
        "mount -t tmpfs -o size=2m tmpfs '{m}' || exit 97\ncd '{m}' && \"$LOOPX\" init >/dev/null || exit 98\n\
         \"$LOOPX\" goal create --title g --id g >/dev/null || exit 99\n\
         dd if=/dev/zero of='{m}/fill' bs=4096 2>/dev/null; true\n"
    );
    // Each todo needs new WAL frames; the first that finds no block left is the one to see.
    script.push_str(&format!(
        "i=0; while [ $i -lt 60 ]; do i=$((i+1)); \"$LOOPX\" todo add --goal-id g --title big --detail {big} \
         >/dev/null 2>'{err}'; c=$?; [ $c -ne 0 ] && break; done; echo code=$c; cat '{err}' >&2\n",
        // Outside the full disk, or the error could not be written either.
        err = outer.path().join("err").display()
    ));
    let r = in_mount_namespace(&script);
    let got = codes(&r);
    assert_eq!(
        got.get("code"),
        Some(&6),
        "{got:?}\n{}\n{}",
        r.stdout,
        r.stderr
    );
    assert!(r.stderr.contains("loopx.db"), "{}", r.stderr);
    assert!(
        r.stderr.contains("No space left on device") || r.stderr.contains("full"),
        "the OS reason: {}",
        r.stderr
    );
}

#[test]
fn permission_denied_is_exit_6_and_reads_still_work() {
    let (p, g) = seeded();
    let uid = String::from_utf8(Command::new("id").arg("-u").output().unwrap().stdout).unwrap();
    // As root, permissions do not bind: the commands run as `nobody` (setpriv), for whom the
    // root-owned project is readable but not writable. As anyone else, the project is made
    // read-only for its owner.
    let as_other_user: Vec<String> = if uid.trim() == "0" {
        let mut dir = p.path().to_path_buf();
        while let Some(parent) = dir.parent() {
            // `nobody` must be able to reach the project (tempdirs are 0700).
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
            if mode & 0o005 != 0o005 && dir.starts_with(std::env::temp_dir()) {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode | 0o005))
                    .unwrap();
            }
            dir = parent.to_path_buf();
        }
        let probe = Command::new("setpriv").arg("--version").output();
        assert!(
            probe.is_ok_and(|o| o.status.success()),
            "this test runs as root and needs `setpriv` (util-linux) to drop to `nobody`"
        );
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]
        .map(str::to_string)
        .to_vec()
    } else {
        use std::os::unix::fs::PermissionsExt;
        for entry in std::fs::read_dir(p.state()).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
            }
        }
        std::fs::set_permissions(p.state(), std::fs::Permissions::from_mode(0o555)).unwrap();
        Vec::new()
    };
    let run = |args: &[&str]| {
        let mut cmd = match as_other_user.split_first() {
            Some((first, rest)) => {
                let mut cmd = Command::new(first);
                cmd.args(rest).arg(loopx_bin());
                cmd
            }
            None => Command::new(loopx_bin()),
        };
        cmd.args(args).current_dir(p.path());
        for k in [
            "LOOPX_ROOT",
            "LOOPX_TURN_KEY",
            "LOOPX_AGENT_ID",
            "LOOPX_CLAIM_KEY",
        ] {
            cmd.env_remove(k);
        }
        to_run(cmd.output().unwrap())
    };
    for args in [
        vec!["status"],
        vec!["todo", "list", "--goal-id", g.as_str()],
        vec!["history", "--goal-id", g.as_str()],
        vec!["quota", "should-run", "--goal-id", g.as_str()],
        vec!["doctor"],
    ] {
        let r = run(&args);
        assert_eq!(r.code, 0, "{args:?}: {}", r.stderr);
    }
    let r = run(&[
        "--format",
        "json",
        "todo",
        "add",
        "--goal-id",
        &g,
        "--title",
        "x",
    ]);
    assert_eq!(r.code, 6, "{}", r.stderr);
    assert_eq!(r.json()["error"]["kind"], "io");
    assert!(
        r.stderr.contains(&db(&p).display().to_string()),
        "{}",
        r.stderr
    );
    if as_other_user.is_empty() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p.state(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn a_projection_failure_after_the_commit_is_a_warning_and_the_run_is_recorded_once() {
    let (p, g) = seeded();
    let runs_dir = p.state().join("goals").join(&g).join("runs");
    let before = p.json(&["history", "--goal-id", &g])["runs"]
        .as_array()
        .unwrap()
        .len();
    // The runs folder cannot be written: a file stands in its place.
    std::fs::rename(&runs_dir, p.path().join("runs-aside")).unwrap();
    std::fs::write(&runs_dir, b"in the way").unwrap();
    let r = p.run(&[
        "--format",
        "json",
        "refresh-state",
        "--goal-id",
        &g,
        "--summary",
        "after the commit",
    ]);
    // The run committed: the command succeeded, and says what it could not write.
    assert_eq!(r.code, 0, "{} {}", r.stdout, r.stderr);
    assert!(r.stderr.contains("loopx: warning:"), "{}", r.stderr);
    assert!(r.stderr.contains("run report"), "{}", r.stderr);
    let out = r.json();
    assert!(!out["warnings"].as_array().unwrap().is_empty(), "{out}");
    let run_id = out["run_id"].as_str().unwrap().to_string();
    let history = p.json(&["history", "--goal-id", &g]);
    let runs = history["runs"].as_array().unwrap();
    assert_eq!(runs.len(), before + 1, "recorded exactly once");
    assert_eq!(
        runs.iter()
            .filter(|r| r["summary"] == "after the commit")
            .count(),
        1
    );
    // Once the folder is back, `refresh-state` without a goal writes the missing report.
    std::fs::remove_file(&runs_dir).unwrap();
    std::fs::rename(p.path().join("runs-aside"), &runs_dir).unwrap();
    p.ok(&["refresh-state"]);
    assert!(
        loopx::paths::ProjectPaths::at(p.path())
            .run_json(&g, &run_id)
            .is_file()
    );
    assert_eq!(
        p.json(&["history", "--goal-id", &g])["runs"]
            .as_array()
            .unwrap()
            .len(),
        before + 1
    );
}

/// Runs loopx through `sh` with the redirections `redirect` (`>&-`, `2>/dev/full`, ...).
/// `loopx {args}` in the project with the shell redirections `redirect` applied to it.
fn streams_command(p: &Project, redirect: &str, args: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &format!("exec \"$LOOPX\" {args} {redirect}")])
        .env("LOOPX", loopx_bin())
        .current_dir(p.path());
    for k in [
        "LOOPX_ROOT",
        "LOOPX_TURN_KEY",
        "LOOPX_AGENT_ID",
        "LOOPX_CLAIM_KEY",
    ] {
        cmd.env_remove(k);
    }
    cmd
}

fn with_streams(p: &Project, redirect: &str, args: &str) -> Run {
    to_run(
        streams_command(p, redirect, args)
            .output()
            .expect("spawn sh"),
    )
}

#[test]
fn closed_or_failing_standard_streams_never_panic() {
    let (p, g) = seeded();
    let cases: Vec<(String, i32)> = vec![
        ("status".to_string(), 0),
        (format!("todo list --goal-id {g}"), 0),
        (format!("refresh-state --goal-id {g}"), 0),
        ("goal create --title streams".to_string(), 0),
        ("doctor".to_string(), 0),
        ("goal show --goal-id no-such-goal".to_string(), 3),
        (
            "--format json goal show --goal-id no-such-goal".to_string(),
            3,
        ),
        ("no-such-command".to_string(), 2),
        ("--version".to_string(), 0),
        ("--help".to_string(), 0),
    ];
    for redirect in [
        ">&-",
        "2>&-",
        ">&- 2>&-",
        "<&- >&- 2>&-",
        "2>/dev/full",
        ">/dev/full 2>/dev/full",
        ">&- 2>/dev/full",
    ] {
        for (args, expected) in &cases {
            let r = with_streams(&p, redirect, args);
            assert_ne!(
                r.code, 101,
                "`loopx {args} {redirect}` panicked: {}",
                r.stderr
            );
            // A full stdout is an I/O failure of the output (exit 6) for a command that prints
            // and changed nothing, `--help` and `--version` included; a command that committed
            // keeps its own code (a retry would write twice), as with a reader that went away.
            let stdout_full = redirect.starts_with(">/dev/full");
            let writes = args.starts_with("refresh-state") || args.starts_with("goal create");
            if stdout_full && *expected == 0 && !writes {
                assert_eq!(r.code, 6, "`loopx {args} {redirect}`");
            } else {
                assert_eq!(r.code, *expected, "`loopx {args} {redirect}`: {}", r.stderr);
            }
        }
    }
    // A write whose output was lost says so where it can, and exits as the write did.
    let r = with_streams(&p, ">/dev/full", &format!("refresh-state --goal-id {g}"));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("committed, but its output could not be written"),
        "{}",
        r.stderr
    );
    // With stdout closed, what the commands printed went nowhere, and into no file of the
    // project: every projection still parses and the project checks healthy.
    assert_eq!(p.run(&["doctor"]).code, 0, "{}", p.run(&["doctor"]).stderr);
}

/// Output into a pipe whose reader has gone is an `EPIPE` the command answers with its own exit
/// code, never a SIGPIPE that kills it mid-command: `loopx` ignores SIGPIPE itself (it enters at
/// C's `main`, without Rust's runtime start-up that used to).
#[test]
fn a_reader_that_went_away_ends_no_command_by_signal() {
    let (p, g) = seeded();
    for i in 0..200 {
        p.add_todo(
            &g,
            &format!("todo {i} with a title long enough to fill the pipe"),
            &[],
        );
    }
    for args in [
        vec!["todo", "list", "--goal-id", g.as_str()],
        vec!["--format", "json", "todo", "list", "--goal-id", g.as_str()],
        vec!["refresh-state", "--goal-id", g.as_str()],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let status = p.command(&args).stdout(writer).status().unwrap();
        assert_eq!(
            status.code(),
            Some(0),
            "`loopx {}`: {status:?}",
            args.join(" ")
        );
    }
    assert_eq!(p.run(&["doctor"]).code, 0);
}

/// Descriptors 0-2 that are closed at start are `/dev/null`, open for reading and writing, before
/// the command opens anything, so no file it opens later takes their numbers. (SQLite alone would
/// put a read-only `/dev/null` on a low descriptor it was handed, which a write then fails on.)
#[test]
fn closed_standard_descriptors_are_dev_null_open_for_both() {
    let (p, _g) = seeded();
    let mut child = streams_command(&p, "<&- >&- 2>&-", "status --watch")
        .spawn()
        .unwrap();
    let proc_dir = PathBuf::from(format!("/proc/{}", child.id()));
    let exe_is_loopx =
        || std::fs::read_link(proc_dir.join("exe")).is_ok_and(|e| e == Path::new(loopx_bin()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !exe_is_loopx() {
        assert!(std::time::Instant::now() < deadline, "loopx never started");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // The watch has opened its database by the time it waits for a commit.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let seen: Vec<(PathBuf, String)> = (0..3)
        .map(|fd| {
            let target = std::fs::read_link(proc_dir.join(format!("fd/{fd}"))).unwrap();
            let info = std::fs::read_to_string(proc_dir.join(format!("fdinfo/{fd}"))).unwrap();
            let flags = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .unwrap()
                .trim()
                .to_string();
            (target, flags)
        })
        .collect();
    child.kill().unwrap();
    child.wait().unwrap();
    for (fd, (target, flags)) in seen.iter().enumerate() {
        assert_eq!(target, Path::new("/dev/null"), "descriptor {fd}");
        let mode = u32::from_str_radix(flags, 8).unwrap() & 0o3;
        assert_eq!(
            mode, 0o2,
            "descriptor {fd} is open for reading and writing: {flags}"
        );
    }
}

#[test]
fn backup_copies_committed_state_refuses_to_overwrite_and_restores() {
    let (p, g) = seeded();
    p.add_todo(&g, "only in the WAL", &[]);
    let copy = p.path().join("backup.db");
    // What a killed backup to the same path left beside it (outside `.loopx/`, where `gc` does
    // not look): the next backup there removes it.
    for litter in [".backup.db.4194300.tmp", ".backup.db.4194300.tmp-journal"] {
        std::fs::write(p.path().join(litter), b"a killed backup's copy").unwrap();
    }
    let out = p.json(&["backup", copy.to_str().unwrap()]);
    assert_eq!(out["integrity_check"], "ok");
    // One file: no WAL beside it, and it passes SQLite's own check.
    assert!(!p.path().join("backup.db-wal").exists());
    let conn =
        rusqlite::Connection::open_with_flags(&copy, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let todos: i64 = conn
        .query_row("SELECT count(*) FROM todos", [], |r| r.get(0))
        .unwrap();
    assert_eq!(todos, 3, "the copy holds what the WAL held");
    drop(conn);

    // Never over an existing file, even an empty one.
    let size = std::fs::metadata(&copy).unwrap().len();
    let r = p.run(&["backup", copy.to_str().unwrap()]);
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert!(r.stderr.contains("already exists"), "{}", r.stderr);
    assert_eq!(std::fs::metadata(&copy).unwrap().len(), size);
    let empty = p.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    assert_eq!(p.run(&["backup", empty.to_str().unwrap()]).code, 4);
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0);
    let leftovers: Vec<_> = std::fs::read_dir(p.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp") || n.ends_with(".tmp-journal"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Restored alone into a new project directory, it is the project.
    let other = Project::empty();
    std::fs::create_dir(other.state()).unwrap();
    std::fs::copy(&copy, other.state().join("loopx.db")).unwrap();
    let todos = other.json(&["todo", "list", "--goal-id", &g]);
    assert_eq!(todos["todos"].as_array().unwrap().len(), 3, "{todos}");
    assert_eq!(other.run(&["doctor"]).code, 0);
    other.ok(&[
        "todo",
        "add",
        "--goal-id",
        &g,
        "--title",
        "after the restore",
    ]);
}

/// A path that is not the kind of file it must be (a file where a directory belongs, a directory
/// where a file belongs) is the machine's state, not a defect of LoopX: exit 6 with the path, as
/// for a full disk, never 1 ("internal").
#[test]
fn a_file_where_a_directory_belongs_is_exit_6_with_the_path() {
    let (p, g) = seeded();
    let file = p.path().join("afile");
    std::fs::write(&file, "x").unwrap();
    let r = p.run(&["--format", "json", "--root", file.to_str().unwrap(), "init"]);
    assert_eq!(r.code, 6, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("\"kind\": \"io\"") || r.stdout.contains("\"kind\":\"io\""),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("afile"), "{}", r.stdout);
    let r = p.run(&["man", "--out", file.to_str().unwrap()]);
    assert_eq!(r.code, 6, "{}", r.stderr);
    // The goal's projection directory replaced by a file: re-creating the projections (no
    // commit to report) fails with the path.
    let goal_dir = p.state().join("goals").join(&g);
    std::fs::rename(&goal_dir, p.path().join("moved")).unwrap();
    std::fs::write(&goal_dir, "x").unwrap();
    let r = p.run(&["refresh-state"]);
    assert_eq!(r.code, 6, "{}", r.stderr);
    assert!(
        r.stderr.contains(&goal_dir.display().to_string()),
        "{}",
        r.stderr
    );
}

#[test]
fn an_init_killed_at_any_point_is_finished_by_the_next_init() {
    // An `init` killed before its database is linked into place leaves only temp files in
    // `.loopx/`: no project (exit 3, not a lost one), and the next `init` makes it.
    let p = Project::empty();
    std::fs::create_dir(p.state()).unwrap();
    std::fs::write(p.state().join(".loopx.db.4194300.tmp"), b"half a database").unwrap();
    std::fs::write(p.state().join(".loopx.db.4194300.tmp-journal"), b"").unwrap();
    let r = p.run(&["status"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    p.ok(&["init"]);
    p.ok(&["status"]);
    // `init` itself leaves no temp file behind.
    let names: Vec<String> = std::fs::read_dir(p.state())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".loopx.db.") && !n.contains("4194300"))
        .collect();
    assert!(names.is_empty(), "{names:?}");

    // Killed for real at points spread over its run: the next `init` always succeeds and the
    // project then works. (Before the database was built under a temp name, about one kill in
    // seven left an empty `loopx.db` that every command called damage.)
    let mut seed = std::process::id() as u64;
    for i in 0..40 {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap().to_string();
        let mut child = Command::new(loopx_bin())
            .args(["--root", &root, "init"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        std::thread::sleep(std::time::Duration::from_micros((seed >> 33) % 6000));
        let _ = child.kill();
        let _ = child.wait();
        let out = to_run(
            Command::new(loopx_bin())
                .args(["--root", &root, "init"])
                .output()
                .unwrap(),
        );
        assert_eq!(out.code, 0, "kill {i}: {}", out.stderr);
        let out = to_run(
            Command::new(loopx_bin())
                .args(["--root", &root, "goal", "create", "--title", "after"])
                .output()
                .unwrap(),
        );
        assert_eq!(out.code, 0, "kill {i}: {}", out.stderr);
    }
}

#[test]
fn something_not_a_file_where_state_md_belongs_is_left_in_place() {
    let (p, g) = seeded();
    let goal_dir = p.state().join("goals").join(&g);
    let md = goal_dir.join("STATE.md");
    std::fs::remove_file(&md).unwrap();
    std::fs::create_dir(&md).unwrap();
    std::fs::write(md.join("notes.txt"), b"the operator's notes").unwrap();
    // The run commits; the file it could not write is a warning naming it.
    let r = p.run(&["refresh-state", "--goal-id", &g, "--summary", "x"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains("STATE.md") && r.stderr.contains("directory"),
        "{}",
        r.stderr
    );
    // With nothing to commit, the failure is the command's: exit 6.
    let r = p.run(&["refresh-state"]);
    assert_eq!(r.code, 6, "{}", r.stderr);
    assert!(r.stderr.contains("STATE.md"), "{}", r.stderr);
    assert_eq!(
        std::fs::read(md.join("notes.txt")).unwrap(),
        b"the operator's notes"
    );
    let litter: Vec<_> = std::fs::read_dir(&goal_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(litter.is_empty(), "{litter:?}");
    // A FIFO there stays a FIFO.
    std::fs::remove_dir_all(&md).unwrap();
    let c = std::ffi::CString::new(md.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let r = p.run(&["refresh-state", "--goal-id", &g, "--summary", "y"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("FIFO"), "{}", r.stderr);
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(&md)
            .unwrap()
            .file_type()
            .is_fifo()
    );
}

#[test]
fn refresh_state_restores_whichever_run_report_is_missing() {
    let (p, g) = seeded();
    let run_id = p.json(&["refresh-state", "--goal-id", &g, "--summary", "two files"])["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let paths = loopx::paths::ProjectPaths::at(p.path());
    let (json, md) = (paths.run_json(&g, &run_id), paths.run_md(&g, &run_id));
    let (json_bytes, md_bytes) = (std::fs::read(&json).unwrap(), std::fs::read(&md).unwrap());
    // A kill between the two writes leaves the JSON alone; a crash before the data reached the
    // disk leaves one empty.
    std::fs::remove_file(&md).unwrap();
    let out = p.json(&["refresh-state"]);
    assert_eq!(out["run_reports_written"], 1, "{out}");
    assert_eq!(std::fs::read(&md).unwrap(), md_bytes);
    std::fs::write(&json, b"").unwrap();
    p.ok(&["refresh-state"]);
    assert_eq!(std::fs::read(&json).unwrap(), json_bytes);
    let out = p.json(&["refresh-state"]);
    assert_eq!(out["run_reports_written"], 0, "{out}");
}

#[test]
fn a_deleted_working_directory_needs_only_an_absolute_root() {
    let (p, g) = seeded();
    let gone = tempfile::tempdir().unwrap();
    let root = p.path().to_str().unwrap();
    let run_in_deleted_dir = |args: &str| {
        let script = format!(
            "cd {dir} && rmdir {dir} && exec {bin} {args}",
            dir = gone.path().display(),
            bin = loopx_bin()
        );
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &script]).env_remove("LOOPX_ROOT");
        to_run(cmd.output().unwrap())
    };
    let r = run_in_deleted_dir(&format!("--root {root} todo list --goal-id {g}"));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("first"), "{}", r.stdout);
    std::fs::create_dir(gone.path()).unwrap();
    let r = run_in_deleted_dir("--format json status");
    assert_eq!(r.code, 6, "{} {}", r.stdout, r.stderr);
    assert!(r.stdout.contains("\"io\""), "{}", r.stdout);
    assert!(r.stdout.contains("working directory"), "{}", r.stdout);
    assert!(r.stdout.contains("absolute path"), "{}", r.stdout);
}
