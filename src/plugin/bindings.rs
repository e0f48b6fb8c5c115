//! Generated component bindings, kept private, and their conversions to plain Rust types.
//!
//! Why this exists: `bindgen!` output is shaped by the WIT (its own `Priority`, `Transition`,
//! `PluginError`...). Everything outside this module speaks the kernel's types (`Transition`,
//! `Priority`, `TodoKind`) or the plain structs in `types`, so a WIT revision changes this file only,
//! and the one-to-one mapping of the WIT `transition` variant onto the kernel's `Transition` is
//! written down (and exhaustively matched) exactly once.

use crate::kernel::transition::Transition;
use crate::model::{Priority, TodoKind, TodoStatus};

use super::types::{Fact, GoalView, Observation, ObserveRequest, PluginInfo, TodoView};

pub(crate) mod cap {
    wasmtime::component::bindgen!({ world: "capability", path: "wit" });
}

pub(crate) mod prov {
    wasmtime::component::bindgen!({
        world: "provider",
        path: "wit",
        with: { "loopx:plugin/types": super::cap::loopx::plugin::types },
    });
}

pub(crate) use cap::loopx::plugin::types as wit;

pub(crate) fn priority_to_wit(p: Priority) -> wit::Priority {
    match p {
        Priority::P0 => wit::Priority::P0,
        Priority::P1 => wit::Priority::P1,
        Priority::P2 => wit::Priority::P2,
        Priority::P3 => wit::Priority::P3,
        Priority::P4 => wit::Priority::P4,
    }
}

fn priority_from_wit(p: wit::Priority) -> Priority {
    match p {
        wit::Priority::P0 => Priority::P0,
        wit::Priority::P1 => Priority::P1,
        wit::Priority::P2 => Priority::P2,
        wit::Priority::P3 => Priority::P3,
        wit::Priority::P4 => Priority::P4,
    }
}

fn kind_to_wit(k: TodoKind) -> wit::TodoKind {
    match k {
        TodoKind::Task => wit::TodoKind::Task,
        TodoKind::Monitor => wit::TodoKind::Monitor,
        TodoKind::UserGate => wit::TodoKind::UserGate,
        TodoKind::UserAction => wit::TodoKind::UserAction,
    }
}

fn kind_from_wit(k: wit::TodoKind) -> TodoKind {
    match k {
        wit::TodoKind::Task => TodoKind::Task,
        wit::TodoKind::Monitor => TodoKind::Monitor,
        wit::TodoKind::UserGate => TodoKind::UserGate,
        wit::TodoKind::UserAction => TodoKind::UserAction,
    }
}

fn status_to_wit(s: TodoStatus) -> wit::TodoStatus {
    match s {
        TodoStatus::Open => wit::TodoStatus::Open,
        TodoStatus::Claimed => wit::TodoStatus::Claimed,
        TodoStatus::Blocked => wit::TodoStatus::Blocked,
        TodoStatus::Deferred => wit::TodoStatus::Deferred,
        TodoStatus::Completed => wit::TodoStatus::Completed,
        TodoStatus::Archived => wit::TodoStatus::Archived,
    }
}

/// The one mapping of the WIT `transition` variant onto the kernel's `Transition`.
pub(crate) fn transition_from_wit(t: wit::Transition) -> Transition {
    match t {
        wit::Transition::AddTodo(a) => Transition::AddTodo {
            id: a.id,
            title: a.title,
            detail: a.detail,
            priority: priority_from_wit(a.priority),
            kind: kind_from_wit(a.kind),
            lane: a.lane,
            depends_on: a.depends_on,
            capability: a.capability,
        },
        wit::Transition::AttachEvidence(e) => Transition::AttachEvidence {
            todo_id: e.todo_id,
            text: e.text,
            artifact_path: e.artifact_path,
            artifact_digest: e.artifact_digest,
        },
        wit::Transition::CompleteTodo(c) => Transition::CompleteTodo {
            todo_id: c.todo_id,
            evidence: c.evidence,
        },
        wit::Transition::BlockTodo(r) => Transition::BlockTodo {
            todo_id: r.todo_id,
            reason: r.reason,
        },
        wit::Transition::DeferTodo(r) => Transition::DeferTodo {
            todo_id: r.todo_id,
            reason: r.reason,
        },
        wit::Transition::OpenUserGate(g) => Transition::OpenUserGate {
            title: g.title,
            detail: g.detail,
            blocking: g.blocking,
            blocks_agent: g.blocks_agent,
        },
        wit::Transition::RequestReplan(reason) => Transition::RequestReplan { reason },
        wit::Transition::ScheduleWake(w) => Transition::ScheduleWake {
            after_seconds: w.after_seconds,
            reason: w.reason,
        },
        wit::Transition::NoChange(reason) => Transition::NoChange { reason },
    }
}

pub(crate) fn goal_to_wit(g: &GoalView) -> wit::GoalSnapshot {
    wit::GoalSnapshot {
        goal_id: g.goal_id.clone(),
        title: g.title.clone(),
        objective: g.objective.clone(),
        success_criteria: g.success_criteria.clone(),
        todos: g.todos.iter().map(todo_to_wit).collect(),
    }
}

fn todo_to_wit(t: &TodoView) -> wit::TodoView {
    wit::TodoView {
        id: t.id.clone(),
        title: t.title.clone(),
        detail: t.detail.clone(),
        status: status_to_wit(t.status),
        priority: priority_to_wit(t.priority),
        kind: kind_to_wit(t.kind),
        lane: t.lane.clone(),
        depends_on: t.depends_on.clone(),
        claim_holder: t.claim_holder.clone(),
        capability: t.capability.clone(),
    }
}

pub(crate) fn request_to_wit(r: &ObserveRequest) -> wit::ObserveRequest {
    wit::ObserveRequest {
        operation: r.operation.clone(),
        target: r.target.clone(),
        params: r
            .params
            .iter()
            .map(|(k, v)| wit::Fact {
                key: k.clone(),
                value: v.clone(),
            })
            .collect(),
    }
}

pub(crate) fn request_from_wit(r: wit::ObserveRequest) -> ObserveRequest {
    ObserveRequest {
        operation: r.operation,
        target: r.target,
        params: r.params.into_iter().map(|f| (f.key, f.value)).collect(),
    }
}

pub(crate) fn observation_from_wit(o: wit::Observation) -> Observation {
    Observation {
        source: o.source,
        kind: o.kind,
        summary: o.summary,
        facts: o
            .facts
            .into_iter()
            .map(|f| Fact {
                key: f.key,
                value: f.value,
            })
            .collect(),
        body: o.body,
        truncated: o.truncated,
    }
}

pub(crate) fn observation_to_wit(o: &Observation) -> wit::Observation {
    wit::Observation {
        source: o.source.clone(),
        kind: o.kind.clone(),
        summary: o.summary.clone(),
        facts: o
            .facts
            .iter()
            .map(|f| wit::Fact {
                key: f.key.clone(),
                value: f.value.clone(),
            })
            .collect(),
        body: o.body.clone(),
        truncated: o.truncated,
    }
}

pub(crate) fn info_from_wit(i: wit::PluginInfo) -> PluginInfo {
    PluginInfo {
        name: i.name,
        version: i.version,
        description: i.description,
        operations: i.operations,
    }
}

pub(crate) fn wit_error_text(e: &wit::PluginError) -> String {
    match e {
        wit::PluginError::InvalidInput(m) => format!("invalid-input: {m}"),
        wit::PluginError::Denied(m) => format!("denied: {m}"),
        wit::PluginError::Unavailable(m) => format!("unavailable: {m}"),
        wit::PluginError::Failed(m) => format!("failed: {m}"),
    }
}
