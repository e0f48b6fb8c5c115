//! The wire shapes of goals, todos, evidence and runs, shared by the JSON projections and the
//! CLI's `--format json`: one definition, so a file and a command never disagree on a field.

use serde_json::{Value, json};

use super::RUN_SCHEMA;
use crate::clock::{Rfc3339, rfc3339};
use crate::model::{Evidence, Goal, Run, Todo};

pub(super) fn pretty(value: &Value) -> Vec<u8> {
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
pub(super) fn json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(&mut *out, s).expect("strings serialize");
    }
}

pub(super) fn json_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => json_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

pub(super) fn json_int(out: &mut Vec<u8>, n: i64) {
    serde_json::to_writer(&mut *out, &n).expect("integers serialize");
}

pub(super) fn json_time(out: &mut Vec<u8>, ms: i64) {
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

/// The wire shape of a goal's provider probe and its last outcome (`probe show`, `goal show`,
/// `state.json`): the observation is the exact text (JSON keeps it; text output shows it inert).
pub fn goal_probe_json(p: &crate::model::GoalProbe) -> Value {
    json!({
        "provider": p.spec.provider,
        "operation": p.spec.operation,
        "target": p.spec.target,
        "revision": p.revision,
        "pending": p.pending(),
        "runs": p.runs,
        "run_seq": p.run_seq,
        "failures": p.failures,
        "last_result": p.last_result,
        "last_digest": p.last_digest,
        "last_checked_at": p.last_checked_at.map(rfc3339),
        "last_failure": p.last_failure,
        "last_observation": p.last_observation,
        "changed_at": p.changed_at.map(rfc3339),
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

/// The wire shape of a monitor's schedule and check state (`todo show`/`list`, `state.json`).
pub fn monitor_json(m: &crate::model::Monitor, now: i64) -> Value {
    json!({
        "every_seconds": m.every_ms as f64 / 1000.0,
        "interval_seconds": m.interval_ms() as f64 / 1000.0,
        "backoff_factor": m.backoff_factor(),
        "next_due_at": rfc3339(m.next_due_at),
        "due": m.next_due_at <= now && !m.expired(now),
        "until": m.until_at.map(rfc3339),
        "target": m.target,
        "on_change": m.follow_up,
        "watch_only": m.follow_up == crate::model::MonitorFollowUp::None,
        "max_no_change": m.max_no_change,
        "probe": m.probe,
        "last_check_at": m.last_check_at.map(rfc3339),
        "last_result": m.last_result,
        "last_digest": m.last_digest,
        "no_change_count": m.no_change_count,
        "material_change": m.material_change,
        "checks": m.checks,
        "failures": m.failures,
        "last_failure": m.last_failure,
    })
}
