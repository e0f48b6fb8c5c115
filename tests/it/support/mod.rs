//! The one project helper of the integration tests: [`Project`] drives the real `loopx` binary
//! against a temporary project. The turn and loop tests add theirs on top ([`turn`]); the plugin
//! suites wrap a [`Project`] with an in-process kernel and plugin host ([`plugin::Sandbox`]).
// Not every module uses every helper.
#![allow(dead_code)]

pub mod plugin;
pub mod turn;

pub use turn::{alive, processes_in, result_host, turn_run, wait_for, wait_until_gone};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub fn loopx_bin() -> &'static str {
    env!("CARGO_BIN_EXE_loopx")
}

/// A temporary project with `.loopx/` initialized.
pub struct Project {
    pub dir: tempfile::TempDir,
}

/// What one command did.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }
    pub fn ok(self) -> Run {
        assert_eq!(
            self.code, 0,
            "command failed: stdout={} stderr={}",
            self.stdout, self.stderr
        );
        self
    }
}

impl Project {
    pub fn new() -> Project {
        let p = Project {
            dir: tempfile::tempdir().expect("tempdir"),
        };
        p.run(&["init"]).ok();
        p
    }

    /// A directory with no project in it.
    pub fn empty() -> Project {
        Project {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn state(&self) -> PathBuf {
        self.path().join(".loopx")
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(loopx_bin());
        cmd.args(args).current_dir(self.path());
        for k in [
            "LOOPX_ROOT",
            "LOOPX_TURN_KEY",
            "LOOPX_AGENT_ID",
            "LOOPX_CLAIM_KEY",
            "LOOPX_TEST_CRASH_AFTER",
        ] {
            cmd.env_remove(k);
        }
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Run {
        self.run_env(args, &[])
    }

    pub fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut cmd = self.command(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        to_run(cmd.output().expect("spawn loopx"))
    }

    /// Runs and requires exit 0.
    pub fn ok(&self, args: &[&str]) -> Run {
        self.run(args).ok()
    }

    /// `--format json` + args, asserting success.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut full = vec!["--format", "json"];
        full.extend_from_slice(args);
        self.run(&full).ok().json()
    }

    pub fn goal(&self, id: &str) -> String {
        self.json(&[
            "goal",
            "create",
            "--title",
            &format!("Goal {id}"),
            "--id",
            id,
        ]);
        id.to_string()
    }

    /// `todo <verb> --goal-id <goal> --todo-id <todo> --agent-id <agent> <extra...>`: the
    /// argument list of the lease tests.
    pub fn todo_args<'a>(
        verb: &'a str,
        goal: &'a str,
        todo: &'a str,
        agent: &'a str,
        extra: &[&'a str],
    ) -> Vec<&'a str> {
        let mut args = vec![
            "todo",
            verb,
            "--goal-id",
            goal,
            "--todo-id",
            todo,
            "--agent-id",
            agent,
        ];
        args.extend_from_slice(extra);
        args
    }

    pub fn add_todo(&self, goal: &str, title: &str, extra: &[&str]) -> String {
        let mut args = vec!["todo", "add", "--goal-id", goal, "--title", title];
        args.extend_from_slice(extra);
        self.json(&args)["todo"]["id"]
            .as_str()
            .expect("todo id")
            .to_string()
    }

    /// sha256 of every file under the project, keyed by relative path. SQLite's `-shm` file is
    /// left out: it is the WAL's shared-memory index (read marks and locks, rebuilt from the WAL on
    /// open), which every reader updates and which holds no data. The database and any non-empty
    /// WAL are in.
    pub fn snapshot(&self) -> BTreeMap<String, String> {
        use sha2::{Digest, Sha256};
        let mut out = BTreeMap::new();
        let mut stack = vec![self.path().to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("read_dir") {
                let entry = entry.expect("entry");
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "db-shm") {
                    continue;
                } else if path.extension().is_some_and(|e| e == "db-wal")
                    && std::fs::metadata(&path).is_ok_and(|m| m.len() == 0)
                {
                    // An empty WAL is what opening a WAL database creates; SQLite reads it
                    // exactly as an absent one.
                    continue;
                } else {
                    let bytes = std::fs::read(&path).expect("read");
                    let rel = path
                        .strip_prefix(self.path())
                        .unwrap()
                        .display()
                        .to_string();
                    out.insert(rel, hex::encode(Sha256::digest(&bytes)));
                }
            }
        }
        out
    }
}

impl Project {
    /// Every row of every table of the project's database (or of `only`), read through a
    /// read-only connection: tables sorted by name, rows sorted, each value with its SQLite type.
    /// Comparing two dumps is "nothing changed" for the whole store, including tables a later
    /// schema adds; the text keeps a failure readable.
    pub fn db_dump(&self, only: Option<&[&str]>) -> String {
        use rusqlite::types::ValueRef;
        let db = self.state().join("loopx.db");
        let conn = rusqlite::Connection::open_with_flags(
            &db,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .unwrap_or_else(|e| panic!("open {} read-only: {e}", db.display()));
        let tables: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        if let Some(only) = only {
            for t in only {
                assert!(tables.iter().any(|x| x == t), "no table {t} in {tables:?}");
            }
        }
        let mut out = String::new();
        for t in tables
            .iter()
            .filter(|t| only.is_none_or(|o| o.contains(&t.as_str())))
        {
            let mut stmt = conn
                .prepare(&format!("SELECT * FROM \"{}\"", t.replace('"', "\"\"")))
                .unwrap();
            let n = stmt.column_count();
            let mut rows: Vec<String> = stmt
                .query_map([], |r| {
                    let mut cells = Vec::with_capacity(n);
                    for i in 0..n {
                        cells.push(match r.get_ref(i)? {
                            ValueRef::Null => "NULL".to_string(),
                            ValueRef::Integer(v) => format!("i:{v}"),
                            ValueRef::Real(v) => format!("r:{v:?}"),
                            ValueRef::Text(v) => format!("t:{:?}", String::from_utf8_lossy(v)),
                            ValueRef::Blob(v) => format!("b:{}", hex::encode(v)),
                        });
                    }
                    Ok(cells.join(" | "))
                })
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            rows.sort();
            out.push_str(&format!("== {t} ({} rows)\n", rows.len()));
            for r in rows {
                out.push_str(&r);
                out.push('\n');
            }
        }
        out
    }
}

/// A test that cannot check anything on this machine calls this instead of returning quietly: it
/// prints why, and fails in CI (`CI` set to anything but `false`) unless `LOOPX_TEST_SKIPS` (a
/// comma-separated list) declares `key` for that machine. A silent skip would read as a pass.
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

pub fn to_run(out: Output) -> Run {
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
