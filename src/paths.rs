//! Where a project's state lives, and how a command finds it.
//!
//! One project root holds `.loopx/` (found upward from the working directory unless `--root` or
//! `LOOPX_ROOT` names it). Every path the kernel writes is derived here, so "what does LoopX put on
//! disk" has one answer.

use std::path::{Path, PathBuf};

use crate::error::{LoopxError, NextAction, Param, Result, msg, not_found};

pub const STATE_DIR: &str = ".loopx";
pub const DB_FILE: &str = "loopx.db";

/// The resolved locations of one project's `.loopx/` tree.
#[derive(Debug, Clone)]
pub struct ProjectPaths {
    /// The project directory (parent of `.loopx/`).
    pub project: PathBuf,
    /// The `.loopx/` directory itself.
    pub state: PathBuf,
}

impl ProjectPaths {
    /// Paths for a project rooted at `project` (which need not exist yet).
    pub fn at(project: &Path) -> ProjectPaths {
        let project = if project.file_name().is_some_and(|n| n == STATE_DIR) {
            project
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| project.to_path_buf())
        } else {
            project.to_path_buf()
        };
        let state = project.join(STATE_DIR);
        ProjectPaths { project, state }
    }

    /// Refuses a project directory whose path is not UTF-8 (exit 2): every path LoopX reports is
    /// derived from it, and its JSON, Markdown and messages hold text.
    pub fn require_text_path(&self) -> Result<()> {
        if self.project.to_str().is_some() {
            return Ok(());
        }
        Err(crate::error::bad_input(format!(
            "the project directory {} is not valid UTF-8, and LoopX writes its path into JSON and \
             Markdown, which hold text: rename the directory (or one above it) or move the project",
            self.project.display()
        )))
    }

    /// Resolves the project: an explicit root (flag or `LOOPX_ROOT`) must contain `.loopx/`;
    /// otherwise search upward from `cwd`. Never creates anything.
    ///
    /// `cwd` is asked only when it is needed (no root, or a relative one): a command given an
    /// absolute root works from a working directory that has been deleted.
    pub fn discover(
        explicit: Option<&Path>,
        cwd: impl FnOnce() -> Result<PathBuf>,
    ) -> Result<ProjectPaths> {
        let paths = ProjectPaths::find(explicit, cwd)?;
        paths.require_text_path()?;
        Ok(paths)
    }

    fn find(
        explicit: Option<&Path>,
        cwd: impl FnOnce() -> Result<PathBuf>,
    ) -> Result<ProjectPaths> {
        if let Some(root) = explicit {
            let root = if root.is_absolute() {
                root.to_path_buf()
            } else {
                cwd()?.join(root)
            };
            let paths = ProjectPaths::at(&root);
            if paths.state.join(DB_FILE).is_file() {
                return Ok(paths);
            }
            paths.refuse_lost_database()?;
            return Err(not_found(msg![
                format!(
                    "no LoopX project at {} (missing {}); run ",
                    paths.project.display(),
                    paths.db().display()
                ),
                NextAction::InitProject,
                format!(" in {} first", paths.project.display())
            ]));
        }
        let cwd = cwd()?;
        let mut dir = Some(cwd.as_path());
        while let Some(d) = dir {
            let candidate = ProjectPaths::at(d);
            if candidate.db().is_file() {
                return Ok(candidate);
            }
            // A second `stat`, paid only at a level without a database: none when the command
            // runs at the project's root (every tick command), one per level below it otherwise.
            candidate.refuse_lost_database()?;
            dir = d.parent();
        }
        Err(not_found(msg![
            format!(
                "no LoopX project found in {} or any parent; run ",
                cwd.display()
            ),
            NextAction::InitProject,
            " there, or pass ",
            Param::Root,
            " / set LOOPX_ROOT"
        ]))
    }

    /// Refuses a `.loopx/` directory whose database is gone (exit 5): searching on upward, or
    /// reporting "no project", would let the next `init` or `start-goal` start an empty project
    /// in place of the lost one. `loopx init` alone may create the database. An empty `.loopx/`
    /// is no project at all (a directory made by hand, or the empty filesystem a turn's sandbox
    /// lays over the real one), so the search goes on past it as before; so is one that holds
    /// only the temp files of writes that never finished (an `init` killed before its database
    /// was linked into place).
    pub fn refuse_lost_database(&self) -> Result<()> {
        let holds_project_files = std::fs::read_dir(&self.state).is_ok_and(|mut entries| {
            entries.any(|entry| {
                entry.is_ok_and(|entry| {
                    entry
                        .file_name()
                        .to_str()
                        .and_then(crate::state_file::temp_writer_pid)
                        .is_none()
                })
            })
        });
        if !holds_project_files {
            return Ok(());
        }
        Err(LoopxError::Corrupt {
            path: self.db(),
            detail: msg![
                format!(
                    "the project's state directory {} holds project files but its database is \
                     missing; restore {DB_FILE} (and {DB_FILE}-wal) from a backup, or run ",
                    self.state.display()
                ),
                NextAction::InitProject,
                " to start an empty project there"
            ],
        })
    }

    pub fn db(&self) -> PathBuf {
        self.state.join(DB_FILE)
    }
    pub fn registry(&self) -> PathBuf {
        self.state.join("registry.json")
    }
    pub fn goals_dir(&self) -> PathBuf {
        self.state.join("goals")
    }
    pub fn goal_dir(&self, goal_id: &str) -> PathBuf {
        self.goals_dir().join(goal_id)
    }
    pub fn goal_state_json(&self, goal_id: &str) -> PathBuf {
        self.goal_dir(goal_id).join("state.json")
    }
    pub fn goal_state_md(&self, goal_id: &str) -> PathBuf {
        self.goal_dir(goal_id).join("STATE.md")
    }
    pub fn runs_dir(&self, goal_id: &str) -> PathBuf {
        self.goal_dir(goal_id).join("runs")
    }
    /// A run's JSON report. New reports are sharded by the month in the run id (run ids are
    /// ULIDs, which begin with their creation time): `runs/<YYYY-MM>/<run-id>.json`, so `runs/`
    /// holds a dozen entries a year instead of two per run. A report of the flat layout that
    /// projects wrote before (`runs/<run-id>.json`) is found where it is: this path is the flat
    /// one when that file exists, so every reader finds both layouts and nothing is written twice.
    pub fn run_json(&self, goal_id: &str, run_id: &str) -> PathBuf {
        self.run_report(goal_id, run_id, "json")
    }
    /// A run's Markdown report, beside its JSON report (see [`ProjectPaths::run_json`]).
    pub fn run_md(&self, goal_id: &str, run_id: &str) -> PathBuf {
        self.run_report(goal_id, run_id, "md")
    }
    fn run_report(&self, goal_id: &str, run_id: &str, ext: &str) -> PathBuf {
        let flat = self.runs_dir(goal_id).join(format!("{run_id}.{ext}"));
        match run_month(run_id) {
            Some(month) if !flat.exists() => self
                .runs_dir(goal_id)
                .join(month)
                .join(format!("{run_id}.{ext}")),
            _ => flat,
        }
    }
    /// Every place a run's report files may be: the sharded pair and the flat pair.
    pub fn run_report_files(&self, goal_id: &str, run_id: &str) -> Vec<PathBuf> {
        let runs = self.runs_dir(goal_id);
        let mut out = Vec::with_capacity(4);
        if let Some(month) = run_month(run_id) {
            out.push(runs.join(&month).join(format!("{run_id}.json")));
            out.push(runs.join(&month).join(format!("{run_id}.md")));
        }
        out.push(runs.join(format!("{run_id}.json")));
        out.push(runs.join(format!("{run_id}.md")));
        out
    }
    /// The mark `loopx gc` leaves for a month whose run report files it removed: reports of
    /// the month are rendered from the database on demand from then on, never written again.
    pub fn retired_reports(&self, goal_id: &str, month: &str) -> PathBuf {
        self.runs_dir(goal_id).join(format!("{month}.retired"))
    }
    /// A goal's monthly archive projection (`archive/<YYYY-MM>.json` and `.md`): the work that
    /// finished in the month, written once when the month leaves the projections' live window.
    pub fn goal_archive_dir(&self, goal_id: &str) -> PathBuf {
        self.goal_dir(goal_id).join("archive")
    }
    /// Installed extension components, one directory per extension and revision.
    pub fn extensions_dir(&self) -> PathBuf {
        self.state.join("extensions")
    }
    /// Precompiled component cache (operator-owned; keyed by content hash and engine).
    pub fn component_cache_dir(&self) -> PathBuf {
        self.state.join("cache").join("components")
    }
}

/// `YYYY-MM` of the time at the start of a ULID run id; `None` for an id that is not a ULID
/// (a run recorded under another id scheme keeps the flat layout).
pub fn run_month(run_id: &str) -> Option<String> {
    let ulid = ulid::Ulid::from_string(run_id).ok()?;
    let ms = i64::try_from(ulid.timestamp_ms()).ok()?;
    let date = crate::clock::rfc3339(ms);
    Some(date[..7].to_string())
}

/// The process's working directory. A directory deleted under the process (or made unreadable)
/// is the machine's doing: an I/O failure (exit 6) that says how to go on, never an internal one.
pub fn working_directory() -> Result<PathBuf> {
    std::env::current_dir().map_err(|source| LoopxError::Io {
        path: PathBuf::new(),
        context: "reading the working directory (deleted or unreadable); change to an existing \
                  directory, or name the project's root by an absolute path"
            .into(),
        source,
    })
}
