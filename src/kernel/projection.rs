//! File projections of the canonical store: `registry.json`, `goals/<id>/state.json` + `STATE.md`,
//! and the immutable run reports `runs/<run-id>.json` + `.md`.
//!
//! Projections are for people and agents that read files; they are always re-creatable from the
//! database, whose commit is the only durability point of a command. They are written atomically
//! (temp file, rename) so a reader sees the old or the new content, but not fsynced: that would cost
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

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{Kernel, quota};
use crate::clock::{Rfc3339, now_ms, rfc3339};
use crate::error::{LoopxError, Result};
use crate::inert::{self, md_block, md_code, md_inline};
use crate::model::{Evidence, Goal, Role, Run, Todo, TodoStatus};
use crate::store::{ProjectedTodo, ProjectionCacheTx, StoreRead, TodoLines, TodoOrder};

pub const REGISTRY_SCHEMA: &str = "loopx.registry.v1";
pub const STATE_SCHEMA: &str = "loopx.goal_state.v1";
pub const RUN_SCHEMA: &str = "loopx.run.v1";

/// Fails with exit 5 when `path` exists, is not empty, and is not valid JSON.
pub fn check_json_projection(path: &Path) -> Result<()> {
    match std::fs::read(path) {
        Ok(bytes) if bytes.is_empty() => Ok(()),
        Ok(bytes) => serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).map(|_| ()).map_err(|e| LoopxError::Corrupt {
            path: path.to_path_buf(),
            detail: format!(
                "projection does not parse ({e}); it was left untouched. Move it aside and run `loopx refresh-state` \
                 to re-create it from the database"
            ),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LoopxError::internal(format!("reading {}", path.display()), e)),
    }
}

/// The check before a JSON projection is replaced: like [`check_json_projection`], but a file
/// that still matches the stamp of LoopX's own last write is accepted from one `stat`.
pub(crate) fn check_before_overwrite(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.len() == 0 => Ok(()),
        Ok(meta) if read_stamp(path).as_deref() == Some(stamp_of(&meta).as_str()) => Ok(()),
        _ => check_json_projection(path),
    }
}

fn stamp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("projection");
    path.with_file_name(format!(".{name}.stamp"))
}

/// Length, modification time and inode, each zero-padded to a fixed width (see [`write_stamp`]).
fn stamp_of(meta: &std::fs::Metadata) -> String {
    format!(
        "{:020} {:020}.{:09} {:020}",
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ino()
    )
}

fn read_stamp(path: &Path) -> Option<String> {
    std::fs::read_to_string(stamp_path(path)).ok()
}

/// Writes a JSON projection after checking the file it replaces, and stamps the result.
fn write_json_projection(
    path: &Path,
    fill: impl FnOnce(&mut ProjectionWriter) -> std::io::Result<()>,
) -> Result<()> {
    check_before_overwrite(path)?;
    write_atomic_with(path, fill)?;
    // Renaming keeps the inode and modification time: this is the stat of our write.
    let meta = std::fs::metadata(path)
        .map_err(|e| LoopxError::internal(format!("reading {}", path.display()), e))?;
    write_stamp(&stamp_path(path), stamp_of(&meta).as_bytes())
}

/// Overwrites the stamp file in place. A stamp left stale by a crash between the rename and this
/// write cannot match the new projection: it names the old inode, which was still alive when the
/// new file's inode was allocated. A torn stamp matches nothing. So the stamp is neither replaced
/// by a new file (every file created costs an inode allocation, which on ext4 without a journal
/// scans past every recently deleted inode) nor truncated: truncating a file to zero makes ext4
/// start writing it back on close (`auto_da_alloc`), and the next truncation waits for that write
/// (docs/benchmarks.md). Stamps have a fixed width, so the new one covers the old.
fn write_stamp(stamp_file: &Path, stamp: &[u8]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let stamp_err = |e| LoopxError::internal(format!("writing {}", stamp_file.display()), e);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(stamp_file)
        .map_err(stamp_err)?;
    file.write_all_at(stamp, 0).map_err(stamp_err)?;
    // Only a stamp longer than ours (damaged, or written by hand) needs cutting.
    if file.metadata().map_err(stamp_err)?.len() > stamp.len() as u64 {
        file.set_len(stamp.len() as u64).map_err(stamp_err)?;
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically (see [`with_temp_file`]), straight from the slice.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    with_temp_file(path, |mut file| file.write_all(bytes))
}

/// The buffered temp file a projection is streamed into; a concrete type, so serde's many small
/// writes inline into buffer copies.
type ProjectionWriter = BufWriter<File>;

/// Writes `path` atomically, `fill` streaming the content through a 64 KiB buffer.
fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut ProjectionWriter) -> std::io::Result<()>,
) -> Result<()> {
    with_temp_file(path, |file| {
        let mut w = BufWriter::with_capacity(64 << 10, file);
        fill(&mut w)?;
        w.into_inner().map_err(|e| e.into_error())?;
        Ok(())
    })
}

/// Writes `path` atomically: `write` fills a temp file in the same directory, which then takes
/// the target's place in one step, so a reader sees the old or the new file.
fn with_temp_file(path: &Path, write: impl FnOnce(File) -> std::io::Result<()>) -> Result<()> {
    let dir = path.parent().expect("projection paths have a parent");
    std::fs::create_dir_all(dir)
        .map_err(|e| LoopxError::internal(format!("creating {}", dir.display()), e))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("projection"),
        std::process::id()
    ));
    let result = (|| -> std::io::Result<()> {
        write(File::create(&tmp)?)?;
        replace(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        LoopxError::internal(format!("writing {}", path.display()), e)
    })
}

/// Puts `tmp` in `path`'s place. On Linux the two are exchanged (`renameat2` with
/// `RENAME_EXCHANGE`) and the old content, now at `tmp`, is unlinked. A plain rename over an
/// existing file makes ext4 allocate and start writing the new file at once (its `auto_da_alloc`
/// safeguard), and the next fsync of the database, a command later, then waits for that data
/// (docs/benchmarks.md has what both cost).
/// Where exchange is unsupported, or there is no old file, it is a plain rename.
fn replace(tmp: &Path, path: &Path) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
        let (from, to) = (c(tmp)?, c(path)?);
        // SAFETY: both arguments are valid NUL-terminated paths that outlive the call.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                from.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        if rc == 0 {
            return std::fs::remove_file(tmp);
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::ENOENT | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => {}
            _ => return Err(err),
        }
    }
    std::fs::rename(tmp, path)
}

/// Writes a file that must never change once written (run reports): refuses to replace a
/// non-empty one, and goes through a temp file so a reader never sees half a report.
fn write_once(path: &Path, bytes: &[u8]) -> Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
        return Err(LoopxError::Conflict(format!(
            "run report {} already exists; run reports are immutable",
            path.display()
        )));
    }
    write_atomic(path, bytes)
}

fn pretty(value: &Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(value).expect("projection values serialize");
    bytes.push(b'\n');
    bytes
}

/// The wire shape of a todo in projections and CLI output: one compact JSON object with its keys
/// in a fixed order, written by [`TodoView::write_json`]. Written by hand rather than derived:
/// `refresh-state` writes every todo of the goal on each tick, and serde's per-key escaping and
/// tiny buffer writes were a third of its cost at 1,000 todos.
pub struct TodoView<'a> {
    todo: &'a Todo,
    now: i64,
}

impl<'a> TodoView<'a> {
    pub fn new(todo: &'a Todo, now: i64) -> TodoView<'a> {
        TodoView { todo, now }
    }

    /// Appends the todo as one JSON object (no newline). `claim.live` is judged at `now`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let t = self.todo;
        out.extend_from_slice(b"{\"id\":");
        json_str(out, &t.id);
        out.extend_from_slice(b",\"role\":");
        json_str(out, t.role.as_str());
        out.extend_from_slice(b",\"kind\":");
        json_str(out, t.kind.as_str());
        out.extend_from_slice(b",\"title\":");
        json_str(out, &t.title);
        out.extend_from_slice(b",\"detail\":");
        json_str(out, &t.detail);
        out.extend_from_slice(b",\"priority\":");
        json_str(out, t.priority.as_str());
        out.extend_from_slice(b",\"status\":");
        json_str(out, t.status.as_str());
        out.extend_from_slice(b",\"depends_on\":[");
        for (i, dep) in t.depends_on.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json_str(out, dep);
        }
        out.extend_from_slice(b"],\"capability\":");
        json_opt_str(out, t.capability.as_deref());
        out.extend_from_slice(b",\"lane\":");
        json_opt_str(out, t.lane.as_deref());
        out.extend_from_slice(b",\"gate_scope\":");
        match &t.gate_scope {
            Some(scope) => serde_json::to_writer(&mut *out, scope).expect("gate scopes serialize"),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"claim\":");
        match &t.claim {
            Some(c) => {
                out.extend_from_slice(b"{\"agent_id\":");
                json_str(out, &c.agent_id);
                out.extend_from_slice(b",\"fence\":");
                json_int(out, c.fence);
                out.extend_from_slice(b",\"expires_at\":");
                json_time(out, c.expires_at);
                out.extend_from_slice(if c.is_live(self.now) {
                    b",\"live\":true}"
                } else {
                    b",\"live\":false}"
                });
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"status_reason\":");
        json_opt_str(out, t.status_reason.as_deref());
        out.extend_from_slice(b",\"created_at\":");
        json_time(out, t.created_at);
        out.extend_from_slice(b",\"updated_at\":");
        json_time(out, t.updated_at);
        out.push(b'}');
    }
}

/// A JSON string. Text that needs no escaping (almost all of it) is copied as is; anything else
/// goes through serde_json's escaper.
fn json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(&mut *out, s).expect("strings serialize");
    }
}

fn json_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => json_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

fn json_int(out: &mut Vec<u8>, n: i64) {
    serde_json::to_writer(&mut *out, &n).expect("integers serialize");
}

fn json_time(out: &mut Vec<u8>, ms: i64) {
    out.push(b'"');
    out.extend_from_slice(&Rfc3339(ms).render());
    out.push(b'"');
}

pub fn todo_json(todo: &Todo, now: i64) -> Value {
    let mut line = Vec::with_capacity(512);
    TodoView::new(todo, now).write_json(&mut line);
    serde_json::from_slice(&line).expect("todo views are valid JSON")
}

pub fn goal_json(goal: &Goal) -> Value {
    json!({
        "id": goal.id,
        "title": goal.title,
        "objective": goal.objective,
        "success_criteria": goal.success_criteria,
        "status": goal.status,
        "project_dir": goal.project_dir,
        "next_probe": goal.next_probe,
        "created_at": rfc3339(goal.created_at),
        "updated_at": rfc3339(goal.updated_at),
    })
}

/// The wire shape of one evidence item, serialized straight from the record: `state.json` carries
/// the goal's 50 most recent on every refresh. Keys are in alphabetical order, the order they had
/// as a `serde_json` object.
#[derive(serde::Serialize)]
pub struct EvidenceView<'a> {
    actor: &'a str,
    artifact_digest: Option<&'a str>,
    artifact_path: Option<&'a str>,
    created_at: Rfc3339,
    run_id: Option<&'a str>,
    text: &'a str,
    todo_id: &'a str,
}

pub fn evidence_json(e: &Evidence) -> EvidenceView<'_> {
    EvidenceView {
        actor: &e.actor,
        artifact_digest: e.artifact_digest.as_deref(),
        artifact_path: e.artifact_path.as_deref(),
        created_at: Rfc3339(e.created_at),
        run_id: e.run_id.as_deref(),
        text: &e.text,
        todo_id: &e.todo_id,
    }
}

pub fn run_json(run: &Run) -> Value {
    json!({
        "schema_version": RUN_SCHEMA,
        "run_id": run.id,
        "goal_id": run.goal_id,
        "agent_id": run.agent_id,
        "todo_id": run.todo_id,
        "classification": run.classification,
        "outcome": run.outcome,
        "summary": run.summary,
        "created_at": rfc3339(run.created_at),
        "payload": run.payload,
    })
}

fn run_markdown(run: &Run) -> String {
    let mut md = format!("# Run {}\n\n", run.id);
    md.push_str(&format!("- goal: {}\n", md_code(&run.goal_id)));
    if let Some(a) = &run.agent_id {
        md.push_str(&format!("- agent: {}\n", md_code(a)));
    }
    if let Some(t) = &run.todo_id {
        md.push_str(&format!("- todo: {}\n", md_code(t)));
    }
    md.push_str(&format!(
        "- classification: {}\n",
        md_inline(&run.classification)
    ));
    if let Some(o) = &run.outcome {
        md.push_str(&format!("- outcome: {}\n", md_inline(o)));
    }
    md.push_str(&format!("- created: {}\n\n", rfc3339(run.created_at)));
    md.push_str("## Summary\n\n");
    md.push_str(&if run.summary.is_empty() {
        "(none)".into()
    } else {
        md_block(&run.summary)
    });
    // JSON escapes C0 controls in strings but writes C1 and bidi controls as they are; inside
    // the fence they are made visible too. The exact payload is in the run's `.json` report. A
    // pretty-printed JSON line starts with indentation and a JSON token, never a backtick, so no
    // payload can close the fence early.
    let payload = serde_json::to_string_pretty(&run.payload).unwrap_or_default();
    md.push_str("\n\n## Payload\n\n```json\n");
    md.push_str(&inert::text(&payload));
    md.push_str("\n```\n");
    md
}

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
        Ok(GoalProjection {
            todos: RenderedTodos::read(tx, goal_id, now, cache_lines)?,
            evidence: tx.recent_evidence(goal_id, 50)?,
            quota: quota::view_in_tx(tx, goal_id, None, now)?,
            goal,
            now,
        })
    }

    /// Counts of the goal's todos per (role, status), as `StoreRead::todo_status_counts` gives them.
    pub(crate) fn todo_counts(&self) -> Vec<(String, String, i64)> {
        let mut counts = [[0i64; TodoStatus::ALL.len()]; Role::ALL.len()];
        for r in &self.todos.rows {
            counts[r.role as usize][r.status as usize] += 1;
        }
        let mut out = Vec::new();
        for (&role, per_status) in Role::ALL.iter().zip(&counts) {
            for (&status, &n) in TodoStatus::ALL.iter().zip(per_status) {
                if n > 0 {
                    out.push((role.as_str().to_owned(), status.as_str().to_owned(), n));
                }
            }
        }
        out.sort();
        out
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
        crate::store::for_each_projected_todo(tx, goal_id, TODO_LINES_FORMAT, &mut |todo| {
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
        })?;
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
/// of pretty-printing them, which mattered on every `refresh-state`.
fn write_state_json(
    w: &mut ProjectionWriter,
    now: i64,
    goal: &Goal,
    todos: &RenderedTodos,
    evidence: &[Evidence],
    quota: &quota::QuotaView,
) -> std::io::Result<()> {
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
    write!(w, "  \"quota\": ")?;
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
        write_json_projection(&self.paths().goal_state_json(&p.goal.id), |w| {
            write_state_json(w, p.now, &p.goal, &p.todos, &p.evidence, &p.quota)
        })?;
        write_atomic(
            &self.paths().goal_state_md(&p.goal.id),
            state_markdown(&p.goal, &p.todos, &p.evidence, &p.quota, p.now).as_bytes(),
        )
    }

    /// Writes the immutable report pair for a run.
    pub fn write_run_report(&self, run: &Run) -> Result<()> {
        write_once(
            &self.paths().run_json(&run.goal_id, &run.id),
            &pretty(&run_json(run)),
        )?;
        write_once(
            &self.paths().run_md(&run.goal_id, &run.id),
            run_markdown(run).as_bytes(),
        )
    }
}

/// A todo's line in STATE.md's lists (pieces pushed, not formatted: one line per todo per refresh).
fn todo_markdown(md: &mut String, t: &Todo, now: i64) {
    md.push_str(if t.status.is_terminal() {
        "- [x] ["
    } else {
        "- [ ] ["
    });
    md.push_str(t.priority.as_str());
    md.push_str("] ");
    inert::push_md_inline(md, &t.title);
    // Ids (this one and the dependencies) are path-safe tokens (`ids::validate_token`): there is
    // nothing in them to escape.
    md.push_str(" `");
    md.push_str(&t.id);
    md.push_str("` (");
    md.push_str(t.status.as_str());
    if let Some(c) = t.live_claim(now) {
        let _ = write!(
            md,
            ", claimed by {} fence {}",
            md_inline(&c.agent_id),
            c.fence
        );
    }
    for (i, dep) in t.depends_on.iter().enumerate() {
        md.push_str(if i == 0 { ", after " } else { ", " });
        md.push_str(dep);
    }
    md.push_str(")\n");
}

fn state_markdown(
    goal: &Goal,
    todos: &RenderedTodos,
    evidence: &[Evidence],
    quota: &quota::QuotaView,
    now: i64,
) -> String {
    let mut md = String::with_capacity(1024 + todos.md.len());
    let _ = write!(md, "# {}\n\n", md_inline(&goal.title));
    md.push_str(&format!("Goal `{}` is **{}**. Generated {} from the LoopX database; edits here are not read back.\n\n", goal.id, goal.status, rfc3339(now)));
    md.push_str("## Objective\n\n");
    md.push_str(&md_block(&goal.objective));
    md.push_str("\n\n");
    if !goal.success_criteria.is_empty() {
        md.push_str("## Success criteria\n\n");
        for c in &goal.success_criteria {
            md.push_str(&format!("- {}\n", md_inline(c)));
        }
        md.push('\n');
    }
    for (heading, role) in [
        ("User todos and gates", Role::User),
        ("Agent todos", Role::Agent),
    ] {
        md.push_str(&format!("## {heading}\n\n"));
        let before = md.len();
        for (_, _, line) in todos.in_order().filter(|(r, _, _)| *r == role) {
            md.push_str(line);
        }
        if md.len() == before {
            md.push_str("(none)\n");
        }
        md.push('\n');
    }
    md.push_str("## Quota\n\n");
    md.push_str(&format!(
        "{} of {} slots spent in the window ({}).\n\n",
        quota.spent_slots, quota.allowed_slots, quota.state
    ));
    if let Some(p) = &goal.next_probe {
        md.push_str(&format!(
            "## Next probe (stored, never executed)\n\n{}\n\n",
            md_code(p)
        ));
    }
    md.push_str("## Recent evidence\n\n");
    if evidence.is_empty() {
        md.push_str("(none)\n");
    }
    for e in evidence {
        md.push_str(&format!(
            "- `{}` {}: {}\n",
            e.todo_id,
            rfc3339(e.created_at),
            md_inline(&e.text)
        ));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Claim, GateScope, Priority, TodoKind, TodoStatus};

    #[test]
    fn write_stamp_is_rewritten_in_place_and_covers_a_longer_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let stamp = stamp_path(&path);
        std::fs::write(&stamp, [b'9'; 200]).unwrap();
        let stamp_inode = std::fs::metadata(&stamp).unwrap().ino();
        for content in [&b"{}"[..], b"{\"a\": 1}", b"[]"] {
            write_json_projection(&path, |w| w.write_all(content)).unwrap();
            let written = std::fs::metadata(&path).unwrap();
            assert_eq!(read_stamp(&path), Some(stamp_of(&written)));
            assert_eq!(std::fs::metadata(&stamp).unwrap().ino(), stamp_inode);
        }
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
