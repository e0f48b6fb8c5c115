//! The database half of `loopx doctor`: opening the store, SQLite's integrity check, the damage
//! marker that stops writes, and the content checks (text that is not UTF-8, JSON that does not
//! parse, dangling references). It lives in the kernel because only the kernel reaches the store;
//! the CLI adds the checks of the layers above (turn journal rows, projections, component
//! artifacts) and renders the report.

use std::path::{Path, PathBuf};

use super::Kernel;
use super::store::{self, Backend};
use crate::error::{LoopxError, Result};
use crate::paths::ProjectPaths;

/// One check's result.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
    /// The file the check is about (the first failing one is the path of exit 5).
    pub path: PathBuf,
}

/// What [`check_database`] found, and the kernel over the store when it could be opened.
pub struct DatabaseChecks {
    pub checks: Vec<Check>,
    /// A check the machine kept from running (read-only filesystem, permission, full disk): it
    /// says nothing about the state, so doctor fails with exit 6, never 5.
    pub io: Option<(String, LoopxError)>,
    pub kernel: Option<Kernel>,
}

/// Checks the database of the project at `paths` without changing it, except that damaged pages
/// set the damage marker (writes refuse from then on) and a healthy database clears it.
pub fn check_database(paths: &ProjectPaths) -> DatabaseChecks {
    let mut checks: Vec<Check> = Vec::new();
    let mut record = |name: &str, ok: bool, detail: String, path: &Path| {
        checks.push(Check {
            name: name.to_string(),
            ok,
            detail,
            path: path.to_path_buf(),
        });
    };
    // A check the machine kept from running (read-only filesystem, permission, full disk) says
    // nothing about the state: it fails doctor with exit 6, never 5 (`io`).
    let mut io: Option<(String, LoopxError)> = None;
    let db = paths.db();
    match store::open(Backend::default(), &db) {
        Err(e @ LoopxError::Io { .. }) => {
            record("database", false, e.to_string(), &db);
            io.get_or_insert(("database".to_string(), e));
        }
        // A file SQLite cannot read as a database was marked damaged by the open itself.
        Err(e) => record("database", false, e.to_string(), &db),
        Ok(store) => {
            let integrity = store.integrity_check();
            match &integrity {
                Ok(p) if p.is_empty() => record("database integrity", true, "ok".to_string(), &db),
                Ok(p) => {
                    // Damaged pages: writes refuse from now on (`.loopx/CORRUPT`), until a
                    // restored database checks healthy here again.
                    store::mark_damaged(&db, &p.join("; "));
                    record("database integrity", false, p.join("; "), &db)
                }
                Err(e @ LoopxError::Io { .. }) => {
                    record("database integrity", false, e.to_string(), &db);
                }
                Err(e) => record("database integrity", false, e.to_string(), &db),
            }
            let pages_ok = matches!(&integrity, Ok(p) if p.is_empty());
            if let Err(e @ LoopxError::Io { .. }) = integrity {
                io.get_or_insert(("database integrity".to_string(), e));
            }
            let marker = store::damage_marker(&db);
            if marker.exists() {
                match pages_ok {
                    true => match std::fs::remove_file(&marker) {
                        Ok(()) => record(
                            "damage marker",
                            true,
                            format!(
                                "{} removed: the database checks healthy again",
                                marker.display()
                            ),
                            &marker,
                        ),
                        Err(e) => {
                            let e = LoopxError::io(
                                &marker,
                                format!("removing {}", marker.display()),
                                e,
                            );
                            record("damage marker", false, e.to_string(), &marker);
                            io.get_or_insert(("damage marker".to_string(), e));
                        }
                    },
                    false => record(
                        "damage marker",
                        false,
                        format!("{} exists: writes are refused", marker.display()),
                        &marker,
                    ),
                }
            }
            match store.content_problems() {
                Ok(p) if p.is_empty() => record("database content", true, "ok".to_string(), &db),
                Ok(p) => record("database content", false, p.join("; "), &db),
                Err(e) => record("database content", false, e.to_string(), &db),
            }
            let kernel = Kernel::from_store(paths.clone(), store);
            if let Ok(goals) = kernel.goals() {
                for goal in goals {
                    let (ok, detail, path) = check_run_reports(paths, &goal.id);
                    record(&format!("goal {} run reports", goal.id), ok, detail, &path);
                }
            }
            return DatabaseChecks {
                checks,
                io,
                kernel: Some(kernel),
            };
        }
    }
    DatabaseChecks {
        checks,
        io,
        kernel: None,
    }
}

/// Reads every run report file of a goal in both layouts (month folders `runs/<YYYY-MM>/`, and
/// the flat `runs/` of projects written before them): each must parse. Months whose files
/// `loopx gc` retired are counted; their reports are rendered from the database.
fn check_run_reports(paths: &ProjectPaths, goal_id: &str) -> (bool, String, PathBuf) {
    let runs = paths.runs_dir(goal_id);
    let (mut sharded, mut flat, mut retired) = (0usize, 0usize, 0usize);
    let mut bad: Vec<String> = Vec::new();
    let mut first_bad = runs.clone();
    let mut check = |path: &Path, in_month: bool| {
        if path.extension().is_some_and(|x| x == "json") {
            if in_month {
                sharded += 1;
            } else {
                flat += 1;
            }
            if let Err(e) = super::projection::check_json_projection(path) {
                if bad.is_empty() {
                    first_bad = path.to_path_buf();
                }
                bad.push(e.to_string());
            }
        }
    };
    let entries = match std::fs::read_dir(&runs) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return (true, "no run reports".to_string(), runs);
        }
        Err(e) => {
            let detail = format!(
                "{} cannot be read as the folder of run reports ({e}); if it is not a folder, \
                 move it aside",
                runs.display()
            );
            return (false, detail, runs);
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            for inner in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                check(&inner.path(), true);
            }
        } else if path.extension().is_some_and(|x| x == "retired") {
            retired += 1;
        } else {
            check(&path, false);
        }
    }
    let summary = format!(
        "{sharded} in month folders, {flat} in the flat layout, {retired} month(s) retired by gc"
    );
    if bad.is_empty() {
        (true, summary, runs)
    } else {
        (false, format!("{summary}; {}", bad.join("; ")), first_bad)
    }
}

/// A consistent copy of the project's database in one new file at `dest` (SQLite's online
/// backup API, then `integrity_check` on the copy); returns the number of pages copied. Opens the
/// store directly, not a kernel: a damaged projection must not stand between an operator and a
/// copy of the database.
pub fn backup_database(paths: &ProjectPaths, dest: &Path) -> Result<u64> {
    store::open(Backend::default(), &paths.db())?.backup_to(dest)
}
