//! File projections of the canonical store: `registry.json`, `goals/<id>/state.json` + `STATE.md`,
//! and the immutable run reports `runs/<run-id>.json` + `.md`.
//!
//! Projections are for people and agents that read files; they are always re-creatable from the
//! database, whose commit is the only durability point of a command. They are written atomically
//! (into the previous generation kept as a spare, or a temp file, then exchanged into place) so a
//! reader sees the old or the new content, but not fsynced: that would cost
//! an fsync per file on every tick for data the database already holds. After a power cut a
//! just-renamed file can come back empty; an empty projection is therefore treated as missing and
//! re-created. A non-empty projection that no longer parses is reported as corrupt instead of being
//! overwritten: someone may have edited it by hand, and silently replacing it would lose that.
//!
//! Parsing a goal's `state.json` before every rewrite would cost as much as rendering it
//! (docs/benchmarks.md), so each JSON projection gets a write stamp beside it (`.<name>.stamp`:
//! length, modification time, inode of the file as written). A file whose `stat` still matches its
//! stamp is byte for byte what LoopX wrote, hence valid; any other file is parsed in full. `doctor`
//! always parses in full.
//!
//! The Markdown files show text agents and plugins wrote (titles, objectives, evidence, run
//! summaries), so every such value goes through [`crate::inert`]: nothing in them can drive a
//! terminal that `cat`s the file, nor open Markdown structure that hides text when it is rendered.
//! The JSON files keep the exact text.

use std::io::Write;

use serde_json::{Value, json};

mod files;
mod markdown;
mod place;
mod quota_refresh;
#[cfg(target_os = "linux")]
mod spare;
mod wire;

pub(crate) use files::check_before_overwrite;
use files::{
    PendingFile, ProjectionWriter, replace_json_projection, stamp_of, write_atomic_stat,
    write_json_projection, write_once,
};
pub use files::{check_json_projection, write_atomic};
use markdown::{run_markdown, state_markdown, todo_markdown};
pub use wire::goal_probe_json;
pub use wire::monitor_json;
use wire::pretty;
pub use wire::{EvidenceView, TodoView, evidence_json, goal_json, run_json, todo_json};

use super::{Kernel, quota};
use crate::clock::{Rfc3339, now_ms, rfc3339};
use crate::error::{LoopxError, Result};
use crate::kernel::store::{
    CommitSeq, ProjectedTodo, ProjectionCacheTx, StoreRead, TodoLines, TodoOrder,
};
use crate::model::{Evidence, Goal, Role, Run, TodoStatus};

pub const REGISTRY_SCHEMA: &str = "loopx.registry.v1";
pub const STATE_SCHEMA: &str = "loopx.goal_state.v1";
pub const RUN_SCHEMA: &str = "loopx.run.v1";
pub const ARCHIVE_SCHEMA: &str = "loopx.goal_archive.v1";

/// The format of the todo lines cached in the store (`ProjectionCacheTx::cache_projected_todo`). Bump it
/// whenever [`TodoView::write_json`] or [`todo_markdown`] changes what they write: lines cached
/// in another format are then rendered afresh. (3: Markdown values made inert.)
const TODO_LINES_FORMAT: i64 = 3;

/// Everything a goal's `state.json` and `STATE.md` show, read in one snapshot: `refresh-state`
/// reads it inside its write transaction (so the files show exactly what it committed, and it can
/// cache lines it had to render), other writers in a read snapshot.
pub(crate) struct GoalProjection {
    goal: Goal,
    todos: RenderedTodos,
    evidence: Vec<Evidence>,
    quota: quota::QuotaView,
    now: i64,
    window: LiveWindow,
    /// Every todo of the goal counted per (role, status), older work included.
    counts: Vec<(String, String, i64)>,
    /// The goal's monitors whose todo is not terminal, by due time.
    monitors: Vec<crate::model::Monitor>,
    /// The goal's provider probe, if it has one.
    goal_probe: Option<crate::model::GoalProbe>,
    /// The store's commit counter the files will be current as of.
    seq: CommitSeq,
}

/// The projections' live window: finished todos last written before `finished_since` are left
/// out of `state.json` and `STATE.md` and only counted here; they stay in the database (`todo
/// show`) and in the goal's monthly archive (`archive/<YYYY-MM>.json`). Runs are not listed in
/// the state files at all (`history` pages them).
#[derive(Debug, Clone)]
pub(crate) struct LiveWindow {
    pub(crate) days: i64,
    pub(crate) finished_since: i64,
    /// (role, status, count) of the finished todos older than the window.
    pub(crate) older_todos: Vec<(String, String, i64)>,
}

impl LiveWindow {
    /// The window the policy sets at `now`.
    fn at(tx: &dyn StoreRead, now: i64) -> Result<(i64, i64)> {
        let policy = tx
            .retention()
            .retention_policy()?
            .unwrap_or(crate::kernel::store::RetentionPolicy::DEFAULT);
        let days = policy.live_window_days;
        Ok((days, now.saturating_sub(days.saturating_mul(86_400_000))))
    }

    /// The counts of older work: the goal's counts (kept by the store, whatever the history)
    /// less the finished todos the window shows, so nothing walks the todos outside it.
    fn new(
        days: i64,
        finished_since: i64,
        totals: &[(String, String, i64)],
        shown: &RenderedTodos,
    ) -> LiveWindow {
        let mut live = [[0i64; TodoStatus::ALL.len()]; Role::ALL.len()];
        for r in &shown.rows {
            live[r.role as usize][r.status as usize] += 1;
        }
        let older_todos = totals
            .iter()
            .filter_map(|(role, status, n)| {
                let (r, st) = (Role::parse(role).ok()?, TodoStatus::parse(status).ok()?);
                let older = n - live[r as usize][st as usize];
                (st.is_terminal() && older > 0).then(|| (role.clone(), status.clone(), older))
            })
            .collect();
        LiveWindow {
            days,
            finished_since,
            older_todos,
        }
    }

    fn to_json(&self) -> Value {
        let mut todos = serde_json::Map::new();
        for (role, status, n) in &self.older_todos {
            let entry = todos.entry(role.clone()).or_insert_with(|| json!({}));
            entry[status] = json!(n);
        }
        json!({
            "days": self.days,
            "finished_since": Rfc3339(self.finished_since),
            "older_todos": todos,
            "archive_dir": "archive/",
        })
    }
}

impl GoalProjection {
    /// Reads the goal and renders its todos. With `cache_lines` (a write transaction's cache),
    /// the lines rendered for todos that had none cached are stored for the next refresh.
    pub(crate) fn read(
        tx: &dyn StoreRead,
        goal_id: &str,
        now: i64,
        cache_lines: Option<&dyn ProjectionCacheTx>,
    ) -> Result<GoalProjection> {
        let goal = super::require_goal(tx, goal_id)?;
        let (days, finished_since) = LiveWindow::at(tx, now)?;
        let todos = RenderedTodos::read(tx, goal_id, now, finished_since, cache_lines)?;
        let counts = tx.todo_status_counts(goal_id)?;
        let mut monitors = Vec::new();
        // Counting is a far smaller statement to prepare than listing, and most goals have none.
        if tx.active_monitor_count(goal_id)? > 0 {
            tx.visit_active_monitors(goal_id, &mut |m| {
                monitors.push(m.monitor.clone());
                Ok(true)
            })?;
        }
        let goal_probe = tx.goal_probe(goal_id)?;
        Ok(GoalProjection {
            seq: tx.commit_seq()?,
            goal_probe,
            monitors,
            window: LiveWindow::new(days, finished_since, &counts, &todos),
            todos,
            counts,
            evidence: tx.recent_evidence(goal_id, 50)?,
            quota: quota::view_in_tx(tx, goal_id, None, now)?,
            goal,
            now,
        })
    }

    /// Marks a projection read inside a write transaction as current as of that transaction's
    /// commit, `seq`.
    pub(crate) fn committed_as(&mut self, seq: CommitSeq) {
        self.seq = seq;
    }

    /// Counts of the goal's todos per (role, status), as `StoreRead::todo_status_counts` gives them.
    pub(crate) fn todo_counts(&self) -> Vec<(String, String, i64)> {
        self.counts.clone()
    }
}

/// Every todo of a goal as its compact `state.json` line and its STATE.md line, in the order the
/// store gave them, with the key that puts them in listing order. Rows stream out of the store
/// (lines cached there are copied; other todos are decoded into one reused `Todo` and rendered)
/// and only their keys are sorted: at 1,000 todos, decoding, copying and rendering every todo was
/// most of `refresh-state`.
struct RenderedTodos {
    json: Vec<u8>,
    md: String,
    rows: Vec<RenderedTodo>,
    /// Indices into `rows` in listing order.
    listing: Vec<u32>,
}

struct RenderedTodo {
    order: TodoOrder,
    role: Role,
    status: TodoStatus,
    json: std::ops::Range<usize>,
    md: std::ops::Range<usize>,
}

impl RenderedTodos {
    fn read(
        tx: &dyn StoreRead,
        goal_id: &str,
        now: i64,
        finished_since: i64,
        cache_lines: Option<&dyn ProjectionCacheTx>,
    ) -> Result<RenderedTodos> {
        let mut out = RenderedTodos {
            json: Vec::with_capacity(64 << 10),
            md: String::with_capacity(16 << 10),
            rows: Vec::new(),
            listing: Vec::new(),
        };
        // (todo id, index into rows) of lines rendered here that may be cached: written after
        // the scan, not while its cursor is open on the same table.
        let mut to_cache: Vec<(String, usize)> = Vec::new();
        crate::kernel::store::for_each_live_projected_todo(
            tx,
            goal_id,
            TODO_LINES_FORMAT,
            finished_since,
            &mut |todo| {
                let (json_start, md_start) = (out.json.len(), out.md.len());
                let (order, role, status) = match todo {
                    ProjectedTodo::Cached(lines) => {
                        out.json.extend_from_slice(lines.json.as_bytes());
                        out.md.push_str(lines.md);
                        (lines.order, lines.role, lines.status)
                    }
                    ProjectedTodo::Uncached(todo, order) => {
                        TodoView::new(todo, now).write_json(&mut out.json);
                        todo_markdown(&mut out.md, todo, now);
                        if cache_lines.is_some() && todo.claim.is_none() {
                            to_cache.push((todo.id.clone(), out.rows.len()));
                        }
                        (order, todo.role, todo.status)
                    }
                };
                out.rows.push(RenderedTodo {
                    order,
                    role,
                    status,
                    json: json_start..out.json.len(),
                    md: md_start..out.md.len(),
                });
                Ok(())
            },
        )?;
        for (todo_id, i) in to_cache {
            let Some(cache) = cache_lines else { break };
            let row = &out.rows[i];
            let lines = TodoLines {
                order: row.order,
                role: row.role,
                status: row.status,
                json: std::str::from_utf8(&out.json[row.json.clone()]).expect("JSON is UTF-8"),
                md: &out.md[row.md.clone()],
            };
            cache.cache_projected_todo(goal_id, &todo_id, TODO_LINES_FORMAT, &lines)?;
        }
        let mut keys: Vec<(TodoOrder, u32)> = (out.rows.iter().enumerate())
            .map(|(i, r)| (r.order, i as u32))
            .collect();
        keys.sort_unstable();
        out.listing = keys.into_iter().map(|(_, i)| i).collect();
        Ok(out)
    }

    /// (role, state.json line, STATE.md line) in listing order.
    fn in_order(&self) -> impl Iterator<Item = (Role, &[u8], &str)> {
        self.listing.iter().map(|&i| {
            let r = &self.rows[i as usize];
            (r.role, &self.json[r.json.clone()], &self.md[r.md.clone()])
        })
    }
}

/// Writes `goals/<id>/state.json`. The file is line-oriented JSON: one top-level key per line and
/// one todo per line (compact), so `grep '"id":"t42"'` finds a todo and a diff between two
/// refreshes shows exactly the todos that changed; rendering 1,000 todos this way also costs half
/// of pretty-printing them, which mattered on every `refresh-state`. Returns where the quota
/// fields start: they come last, so a spend can rewrite them alone (`quota_refresh`).
fn write_state_json(w: &mut ProjectionWriter, p: &GoalProjection) -> std::io::Result<u64> {
    let GoalProjection {
        now,
        goal,
        todos,
        evidence,
        quota,
        window,
        monitors,
        goal_probe,
        ..
    } = p;
    let now = *now;
    fn field(
        w: &mut ProjectionWriter,
        key: &str,
        value: &impl serde::Serialize,
    ) -> std::io::Result<()> {
        write!(w, "  \"{key}\": ")?;
        serde_json::to_writer(&mut *w, value)?;
        w.write_all(b",\n")
    }
    w.write_all(b"{\n")?;
    field(w, "schema_version", &STATE_SCHEMA)?;
    field(w, "generated_at", &Rfc3339(now))?;
    field(w, "goal", &goal_json(goal))?;
    w.write_all(b"  \"todos\": [")?;
    for (i, (_, line, _)) in todos.in_order().enumerate() {
        w.write_all(if i == 0 { b"\n    " } else { b",\n    " })?;
        w.write_all(line)?;
    }
    w.write_all(if todos.rows.is_empty() {
        b"],\n"
    } else {
        b"\n  ],\n"
    })?;
    let evidence: Vec<EvidenceView> = evidence.iter().map(evidence_json).collect();
    field(w, "recent_evidence", &evidence)?;
    if !monitors.is_empty() {
        // Only where there are monitors: other goals' files keep the shape they had.
        let list: Vec<Value> = monitors
            .iter()
            .map(|m| {
                let mut v = monitor_json(m, now);
                v["todo_id"] = json!(m.todo_id);
                v
            })
            .collect();
        field(w, "monitors", &list)?;
    }
    if let Some(probe) = goal_probe {
        // Only where the goal has a provider probe, as with monitors.
        field(w, "goal_probe", &wire::goal_probe_json(probe))?;
    }
    field(w, "live_window", &window.to_json())?;
    let quota_at = std::io::Seek::stream_position(w)?;
    write_quota_tail(w, quota, now)?;
    Ok(quota_at)
}

/// The end of `state.json` from its quota fields on: the quota and the time it was read at,
/// which is the file's `generated_at` unless a later spend rewrote only this part.
fn write_quota_tail(w: &mut impl Write, quota: &quota::QuotaView, now: i64) -> std::io::Result<()> {
    write!(w, "  \"quota_as_of\": ")?;
    serde_json::to_writer(&mut *w, &Rfc3339(now))?;
    write!(w, ",\n  \"quota\": ")?;
    serde_json::to_writer(&mut *w, &quota.to_json())?;
    w.write_all(b"\n}\n")
}

impl Kernel {
    /// Rewrites `.loopx/registry.json` from the database.
    pub fn write_registry_projection(&mut self) -> Result<()> {
        let path = self.paths().registry();
        let (goals, extensions) = self.read(|tx| Ok((tx.goals()?, tx.extensions()?)))?;
        let value = json!({
            "schema_version": REGISTRY_SCHEMA,
            "generated_at": rfc3339(now_ms()),
            "goals": goals.iter().map(|g| json!({
                "id": g.id,
                "title": g.title,
                "status": g.status,
                "objective": g.objective,
                "project_dir": g.project_dir,
                "next_probe": g.next_probe,
                "state_file": format!("goals/{}/state.json", g.id),
            })).collect::<Vec<_>>(),
            "extensions": extensions.iter().map(|e| json!({
                "id": e.id,
                "version": e.version,
                "revision": e.revision,
                "enabled": e.enabled,
                "provides": e.manifest.get("provides").cloned().unwrap_or(Value::Null),
            })).collect::<Vec<_>>(),
        });
        let bytes = pretty(&value);
        write_json_projection(&path, |w| w.write_all(&bytes))
    }

    /// Rewrites `goals/<id>/state.json` and `STATE.md` from the database (one read snapshot).
    pub fn write_goal_projection(&mut self, goal_id: &str) -> Result<()> {
        let now = now_ms();
        let projection = self.read(|tx| GoalProjection::read(tx, goal_id, now, None))?;
        self.write_goal_files(&projection)
    }

    /// Writes `state.json` (after checking the file it replaces) and `STATE.md`.
    pub(crate) fn write_goal_files(&self, p: &GoalProjection) -> Result<()> {
        let json_path = self.paths().goal_state_json(&p.goal.id);
        let mut json_quota_at = 0;
        let json_meta = replace_json_projection(&json_path, |w| {
            json_quota_at = write_state_json(w, p)?;
            Ok(())
        })?;
        let (mut md, md_quota) = state_markdown(
            &p.goal,
            &p.todos,
            &p.evidence,
            &p.quota,
            &p.window,
            &p.monitors,
            p.now,
        );
        if let Some(probe) = &p.goal_probe {
            markdown::goal_probe_markdown(&mut md, probe);
        }
        let md_meta = write_atomic_stat(&self.paths().goal_state_md(&p.goal.id), md.as_bytes())?;
        quota_refresh::StateStamp {
            json: stamp_of(&json_meta),
            md: stamp_of(&md_meta),
            seq: p.seq,
            json_quota_at,
            md_quota: md_quota.start as u64..md_quota.end as u64,
        }
        .write(&json_path)?;
        // One `stat` when the month that last left the live window is archived already.
        self.write_goal_archives_before(&p.goal.id, p.window.finished_since)
    }

    /// Writes the immutable report pair for a run, unless `gc` has retired the report files of
    /// the run's month (`runs/<YYYY-MM>.retired`): its report is then rendered from the database
    /// on demand ([`Kernel::run_report`]), and re-creating projections does not bring the files
    /// back.
    pub fn write_run_report(&self, run: &Run) -> Result<()> {
        let month = crate::clock::month_label(run.created_at);
        if self.paths().retired_reports(&run.goal_id, &month).exists() {
            return Ok(());
        }
        write_once(
            &self.paths().run_json(&run.goal_id, &run.id),
            &pretty(&run_json(run)),
        )?;
        write_once(
            &self.paths().run_md(&run.goal_id, &run.id),
            run_markdown(run).as_bytes(),
        )
    }

    /// Writes whichever of a run's two report files is missing or empty (a process killed
    /// between the two writes, or before its data reached the disk), leaving a present one as it
    /// is; `true` when it wrote one. A retired month is left alone, as by [`write_run_report`].
    ///
    /// [`write_run_report`]: Kernel::write_run_report
    pub(crate) fn restore_run_report(&self, run: &Run) -> Result<bool> {
        let month = crate::clock::month_label(run.created_at);
        let mark = self.paths().retired_reports(&run.goal_id, &month);
        if mark.exists() {
            return Ok(false);
        }
        let mut written = Vec::new();
        for (path, render) in [
            (
                self.paths().run_json(&run.goal_id, &run.id),
                (|run| pretty(&run_json(run))) as fn(&Run) -> Vec<u8>,
            ),
            (self.paths().run_md(&run.goal_id, &run.id), |run| {
                run_markdown(run).into_bytes()
            }),
        ] {
            match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.len() > 0 || !meta.is_file() => continue,
                Ok(_) => {
                    std::fs::remove_file(&path).map_err(|e| {
                        LoopxError::io(&path, format!("removing {}", path.display()), e)
                    })?;
                }
                Err(_) => {}
            }
            write_once(&path, &render(run))?;
            written.push(path);
        }
        withdraw_if_retired(&mark, &written)
    }
}

impl Kernel {
    /// A run's JSON report, by id: the report file when it is on disk, otherwise rendered from
    /// the database in the same shape (the file of a month `loopx gc` retired, or one never
    /// written). Any actor may read it.
    pub fn run_report(
        &self,
        goal_id: &str,
        run_id: &str,
    ) -> Result<(Value, Option<std::path::PathBuf>)> {
        crate::ids::validate_token("run id", run_id)?;
        let run = self.read(|tx| {
            super::require_goal(tx, goal_id)?;
            tx.run(goal_id, run_id)
        })?;
        let Some(run) = run else {
            return Err(super::unknown_run(goal_id, run_id));
        };
        let path = self.paths().run_json(goal_id, run_id);
        match crate::state_file::read_bounded(&path, crate::state_file::MAX_PROJECTION_BYTES) {
            Ok(bytes) if !bytes.is_empty() => {
                let value = serde_json::from_slice(&bytes).map_err(|e| {
                    crate::error::LoopxError::Corrupt {
                    path: path.clone(),
                    detail: format!(
                        "run report does not parse ({e}); it was left untouched. Move it aside: \
                         the report is then rendered from the database"
                    )
                    .into(),
                }
                })?;
                Ok((value, Some(path)))
            }
            _ => Ok((run_json(&run), None)),
        }
    }
}

impl Kernel {
    /// Writes the monthly archive of every month that ended before `finished_since` and has
    /// none yet: `archive/<YYYY-MM>.json` and `.md` list the todos that finished and the runs
    /// recorded in the month. Written once each; a month already archived costs one `stat`.
    pub(crate) fn write_goal_archives_before(
        &self,
        goal_id: &str,
        finished_since: i64,
    ) -> Result<()> {
        use crate::clock::{complete_months, month_bounds, month_label};
        let (this_month, _) = month_bounds(finished_since);
        let (last_start, _) = month_bounds(this_month - 1);
        let dir = self.paths().goal_archive_dir(goal_id);
        let archive_json = |start: i64| dir.join(format!("{}.json", month_label(start)));
        if archive_json(last_start).exists() {
            return Ok(());
        }
        let oldest = self.read(|tx| {
            let r = tx.retention();
            Ok(
                match (
                    r.oldest_finished_todo_at(goal_id)?,
                    r.oldest_run_at(goal_id)?,
                ) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                },
            )
        })?;
        let Some(oldest) = oldest else { return Ok(()) };
        for (start, end) in complete_months(oldest, finished_since) {
            if archive_json(start).exists() {
                continue;
            }
            let month = month_label(start);
            let mut md = PendingFile::create(&dir.join(format!("{month}.md")))?;
            let mut json = PendingFile::create(&archive_json(start))?;
            self.read(|tx| {
                let goal = super::require_goal(tx, goal_id)?;
                md.write(markdown::archive_markdown_head(&goal, &month).as_bytes())?;
                let mut head = Vec::with_capacity(256);
                write!(
                    head,
                    "{{\n  \"schema_version\": \"{ARCHIVE_SCHEMA}\",\n  \"goal_id\": {},\n  \"month\": \"{month}\",\n  \"todos\": [",
                    serde_json::to_string(&goal.id).expect("ids serialize")
                )
                .expect("writing to a vector");
                json.write(&head)?;
                // One buffer each, reused for every todo and run.
                let (mut line, mut bytes) = (String::new(), Vec::new());
                let mut todos = 0;
                tx.retention()
                    .visit_todos_finished_between(goal_id, start, end, &mut |t| {
                        line.clear();
                        todo_markdown(&mut line, t, end);
                        md.write(line.as_bytes())?;
                        bytes.clear();
                        bytes.extend_from_slice(if todos == 0 { b"\n    " } else { b",\n    " });
                        TodoView::new(t, end).write_json(&mut bytes);
                        todos += 1;
                        json.write(&bytes)
                    })?;
                md.write(markdown::archive_markdown_runs_heading(todos).as_bytes())?;
                json.write(if todos == 0 { b"],\n  \"runs\": [" } else { b"\n  ],\n  \"runs\": [" })?;
                let mut runs = 0;
                tx.retention()
                    .visit_runs_created_between(goal_id, start, end, &mut |r| {
                        line.clear();
                        markdown::archive_run_markdown(&mut line, r);
                        md.write(line.as_bytes())?;
                        bytes.clear();
                        bytes.extend_from_slice(if runs == 0 { b"\n    " } else { b",\n    " });
                        serde_json::to_writer(
                            &mut bytes,
                            &json!({
                                "run_id": r.id, "agent_id": r.agent_id, "todo_id": r.todo_id,
                                "classification": r.classification, "outcome": r.outcome,
                                "summary": r.summary, "created_at": Rfc3339(r.created_at),
                            }),
                        )
                        .expect("runs serialize");
                        runs += 1;
                        json.write(&bytes)
                    })?;
                md.write(markdown::archive_markdown_tail(runs).as_bytes())?;
                json.write(if runs == 0 { b"]\n}\n" } else { b"\n  ]\n}\n" })
            })?;
            // The Markdown first: the JSON file is the mark that the month is archived.
            md.commit_once().or_else(ignore_existing)?;
            json.commit_once().or_else(ignore_existing)?;
        }
        Ok(())
    }
}

/// Takes back report files just written for a month that `gc` retired meanwhile; whether any
/// written file stays. `gc` writes the month's mark and then removes its files, so a file
/// written after its removals is seen here by the mark, and one written before them is removed
/// by `gc`: either way the retired month keeps no file.
fn withdraw_if_retired(mark: &std::path::Path, written: &[std::path::PathBuf]) -> Result<bool> {
    if written.is_empty() || !mark.exists() {
        return Ok(!written.is_empty());
    }
    for path in written {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(LoopxError::io(
                    path,
                    format!("removing {}", path.display()),
                    e,
                ));
            }
        }
    }
    Ok(false)
}

/// A monthly archive another process wrote meanwhile is the same month's record: not an error.
fn ignore_existing(e: crate::error::LoopxError) -> Result<()> {
    match e {
        crate::error::LoopxError::Conflict(_) => Ok(()),
        e => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Claim, GateScope, Priority, Todo, TodoKind, TodoStatus};

    /// The race with `gc`: its mark appeared after the restore looked for it, and the files the
    /// restore wrote are taken back; without a mark they stay.
    #[test]
    fn reports_written_into_a_month_retired_meanwhile_are_taken_back() {
        let dir = tempfile::tempdir().unwrap();
        let mark = dir.path().join("2026-01.retired");
        let files = [dir.path().join("r.json"), dir.path().join("r.md")];
        for f in &files {
            std::fs::write(f, "report").unwrap();
        }
        assert!(withdraw_if_retired(&mark, &files).unwrap());
        assert!(files.iter().all(|f| f.exists()));
        std::fs::write(&mark, "{}").unwrap();
        assert!(!withdraw_if_retired(&mark, &files).unwrap());
        assert!(files.iter().all(|f| !f.exists()));
        // gc removed one of them first: nothing to take back is not an error.
        std::fs::write(&files[0], "report").unwrap();
        assert!(!withdraw_if_retired(&mark, &files).unwrap());
        assert!(!withdraw_if_retired(&mark, &[]).unwrap());
    }

    fn todo() -> Todo {
        Todo {
            id: "t1".into(),
            goal_id: "g".into(),
            role: Role::User,
            kind: TodoKind::UserGate,
            title: "quote \" backslash \\ newline \n tab \t bell \u{7} é ✓".into(),
            detail: String::new(),
            priority: Priority::P1,
            status: TodoStatus::Claimed,
            depends_on: vec!["t0".into(), "t\"x".into()],
            capability: Some("cap.read".into()),
            lane: None,
            gate_scope: Some(GateScope::BlocksAgent {
                agent_id: "a1".into(),
            }),
            claim: Some(Claim {
                agent_id: "a1".into(),
                fence: 7,
                expires_at: 2_000,
                idempotency_key: "k".into(),
                claimed_at: 1_000,
            }),
            last_fence: 7,
            status_reason: Some("waiting".into()),
            created_at: 0,
            updated_at: 951_782_400_000,
        }
    }

    fn line(todo: &Todo, now: i64) -> String {
        let mut out = Vec::new();
        TodoView::new(todo, now).write_json(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn todo_line_is_json_with_every_field_in_a_fixed_order() {
        let t = todo();
        let text = line(&t, 1_500);
        let v: Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(v["id"], "t1");
        assert_eq!(v["role"], "user");
        assert_eq!(v["kind"], "user_gate");
        assert_eq!(v["title"], t.title.as_str(), "escaped text round-trips");
        assert_eq!(v["detail"], "");
        assert_eq!(v["priority"], "P1");
        assert_eq!(v["status"], "claimed");
        assert_eq!(v["depends_on"], json!(["t0", "t\"x"]));
        assert_eq!(v["capability"], "cap.read");
        assert_eq!(v["lane"], Value::Null);
        assert_eq!(
            v["gate_scope"],
            json!({"scope": "blocks_agent", "agent_id": "a1"})
        );
        assert_eq!(
            v["claim"],
            json!({"agent_id": "a1", "fence": 7, "expires_at": "1970-01-01T00:00:02.000Z", "live": true})
        );
        assert_eq!(v["status_reason"], "waiting");
        assert_eq!(v["created_at"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["updated_at"], "2000-02-29T00:00:00.000Z");
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 15, "no field missing or extra: {keys:?}");
        let positions: Vec<usize> = [
            "\"id\"",
            "\"role\"",
            "\"kind\"",
            "\"title\"",
            "\"detail\"",
            "\"priority\"",
            "\"status\"",
            "\"depends_on\"",
            "\"capability\"",
            "\"lane\"",
            "\"gate_scope\"",
            "\"claim\"",
            "\"status_reason\"",
            "\"created_at\"",
            "\"updated_at\"",
        ]
        .iter()
        .map(|k| {
            text.find(&format!("{k}:"))
                .unwrap_or_else(|| panic!("{k} in {text}"))
        })
        .collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert!(!text.contains('\n'), "one line: {text}");
    }

    #[test]
    fn claim_liveness_is_judged_at_render_time() {
        let mut t = todo();
        assert!(line(&t, 2_000).contains("\"live\":false"));
        t.claim = None;
        assert!(line(&t, 0).contains("\"claim\":null"));
        assert_eq!(todo_json(&t, 0)["claim"], Value::Null);
    }
}
