//! Todos and gates: add, update, complete, attach evidence, resolve gates.
//!
//! The write rule lives in [`authorize_write`]: operators may write any todo; an agent may write a
//! claimed todo only as its holder with the current fence (or claim key). Gates are todos of kind
//! `user_gate`/`user_action` and only an operator resolves them.

use serde_json::json;

use super::{Actor, Kernel, LeaseProof, log_op, require_goal, require_todo};
use crate::clock::now_ms;
use crate::error::{NextAction, Param, Result, bad_input, conflict, msg, not_found, refused};
use crate::ids::validate_token;
use crate::kernel::store::StoreTx;
use crate::model::{Evidence, GateScope, Priority, Role, Todo, TodoKind, TodoStatus};

pub const MAX_TITLE: usize = 500;
pub const MAX_TEXT: usize = 16 * 1024;

/// What a caller supplies to add a todo.
#[derive(Debug, Clone)]
pub struct NewTodo {
    pub id: Option<String>,
    pub title: String,
    pub detail: String,
    /// When absent, a leading `[P0]`..`[P4]` in the title sets it; else P2 (P0 for gates).
    pub priority: Option<Priority>,
    pub kind: TodoKind,
    pub depends_on: Vec<String>,
    pub capability: Option<String>,
    pub lane: Option<String>,
    pub gate_scope: Option<GateScope>,
}

impl NewTodo {
    pub fn task(title: impl Into<String>) -> NewTodo {
        NewTodo {
            id: None,
            title: title.into(),
            detail: String::new(),
            priority: None,
            kind: TodoKind::Task,
            depends_on: Vec::new(),
            capability: None,
            lane: None,
            gate_scope: None,
        }
    }
}

/// Changes requested by `todo update`.
#[derive(Debug, Clone, Default)]
pub struct TodoPatch {
    pub status: Option<TodoStatus>,
    pub title: Option<String>,
    pub detail: Option<String>,
    pub priority: Option<Priority>,
    pub evidence: Option<String>,
    pub reason: Option<String>,
    /// A monitor's end, or a deferred todo's resume time (see `monitor::apply_update_in_tx`).
    pub until: Option<i64>,
    /// Schedule changes of a monitor.
    pub monitor: super::monitor::MonitorPatch,
}

/// The result of a todo write.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TodoChange {
    pub todo: Todo,
    /// False when the write was an idempotent repeat (e.g. completing a completed todo).
    pub changed: bool,
    pub evidence_id: Option<i64>,
}

/// Splits a leading `[Pn]` priority tag off a title.
fn split_priority_prefix(title: &str) -> (Option<Priority>, String) {
    let t = title.trim();
    if t.len() >= 4
        && t.starts_with("[P")
        && t.as_bytes()[3] == b']'
        && let Ok(p) = Priority::parse(&t[1..3])
    {
        return (Some(p), t[4..].trim().to_string());
    }
    (None, t.to_string())
}

fn check_len(what: &str, text: &str, max: usize) -> Result<()> {
    if text.len() > max {
        return Err(bad_input(format!(
            "{what} is {} bytes; the limit is {max}",
            text.len()
        )));
    }
    Ok(())
}

/// Refuses an agent write to a todo claimed by someone else or with a stale proof.
pub(crate) fn authorize_write(todo: &Todo, actor: &Actor) -> Result<()> {
    let (agent_id, proof) = match actor {
        Actor::Operator => return Ok(()),
        Actor::Agent {
            agent_id, proof, ..
        } => (agent_id, proof),
        Actor::Capability {
            capability,
            agent_id,
        } => {
            return match (&todo.claim, agent_id) {
                (Some(c), Some(a)) if &c.agent_id == a => Ok(()),
                (Some(c), _) => Err(conflict(format!(
                    "todo '{}' is leased to agent '{}' (fence {}); capability '{capability}' acting for {} may not write it",
                    todo.id,
                    c.agent_id,
                    c.fence,
                    agent_id
                        .as_deref()
                        .map(|a| format!("agent '{a}'"))
                        .unwrap_or_else(|| "no agent".to_string())
                ))),
                (None, _) => Ok(()),
            };
        }
    };
    match (&todo.claim, proof) {
        (Some(c), _) if &c.agent_id != agent_id => Err(conflict(format!(
            "todo '{}' is claimed by agent '{}' (fence {}); agent '{agent_id}' may not write it",
            todo.id, c.agent_id, c.fence
        ))),
        (Some(c), None) => Err(conflict(msg![
            format!(
                "todo '{}' is claimed; agent '{agent_id}' must prove its lease with ",
                todo.id
            ),
            Param::Fence,
            format!(" {} or ", c.fence),
            Param::ClaimKey
        ])),
        (Some(c), Some(LeaseProof::Fence(f))) if *f != c.fence => Err(conflict(format!(
            "stale fence {f} for todo '{}': the current lease (fence {}) was granted after yours; claim it again",
            todo.id, c.fence
        ))),
        (Some(c), Some(LeaseProof::Key(k))) if *k != c.idempotency_key => Err(conflict(format!(
            "claim key '{k}' is not the current lease on todo '{}' (fence {}); claim it again",
            todo.id, c.fence
        ))),
        (Some(_), Some(_)) => Ok(()),
        (None, Some(_)) => Err(conflict(format!(
            "todo '{}' is not claimed (the lease was released or taken over and finished); your lease proof is stale",
            todo.id
        ))),
        (None, None) => Ok(()),
    }
}

fn refuse_gate_status_change(todo: &Todo) -> Result<()> {
    if todo.role == Role::User {
        return Err(refused(msg![
            format!(
                "todo '{}' is a {}; only an operator resolves it, with ",
                todo.id, todo.kind
            ),
            NextAction::ResolveGate {
                goal_id: todo.goal_id.clone(),
                todo_id: todo.id.clone(),
            }
        ]));
    }
    Ok(())
}

/// Inserts a todo after validating it against the goal. Shared by `todo add` and admission.
pub(crate) fn insert_new_todo(
    tx: &dyn StoreTx,
    goal_id: &str,
    new: NewTodo,
    now: i64,
) -> Result<Todo> {
    let (prefix_priority, title) = split_priority_prefix(&new.title);
    if title.is_empty() {
        return Err(bad_input(msg![
            "todo title is empty; pass ",
            Param::Title,
            " \"what to do\""
        ]));
    }
    check_len("todo title", &title, MAX_TITLE)?;
    check_len("todo detail", &new.detail, MAX_TEXT)?;
    let role = match new.kind {
        TodoKind::UserGate | TodoKind::UserAction => Role::User,
        TodoKind::Task | TodoKind::Monitor => Role::Agent,
    };
    match (new.kind, &new.gate_scope) {
        (TodoKind::UserGate, None) => {
            return Err(bad_input(msg![
                "a user_gate needs a scope: pass ",
                Param::BlocksAgent,
                " AGENT or ",
                Param::GlobalGate
            ]));
        }
        (TodoKind::UserGate, Some(GateScope::BlocksAgent { agent_id })) => {
            validate_token("agent id", agent_id)?
        }
        (TodoKind::UserGate, Some(GateScope::Global)) => {}
        (kind, Some(_)) => {
            return Err(bad_input(msg![
                Param::BlocksAgent,
                "/",
                Param::GlobalGate,
                " apply only to ",
                Param::Kind,
                format!(" user_gate, not {kind}")
            ]));
        }
        (_, None) => {}
    }
    if let Some(c) = &new.capability {
        check_capability_name(c)?;
    }
    if let Some(l) = &new.lane {
        validate_token("lane", l)?;
    }
    let id = match new.id {
        Some(id) => {
            validate_token("todo id", &id)?;
            if tx.todo(goal_id, &id)?.is_some() {
                return Err(conflict(format!(
                    "todo '{id}' already exists in goal '{goal_id}'"
                )));
            }
            id
        }
        None => {
            let mut n = tx.todo_count(goal_id)? + 1;
            loop {
                let candidate = format!("t{n}");
                if tx.todo(goal_id, &candidate)?.is_none() {
                    break candidate;
                }
                n += 1;
            }
        }
    };
    let mut depends_on = new.depends_on;
    depends_on.sort();
    depends_on.dedup();
    for dep in &depends_on {
        if dep == &id {
            return Err(bad_input(format!("todo '{id}' cannot depend on itself")));
        }
        validate_token("dependency id", dep)?;
        if tx.todo(goal_id, dep)?.is_none() {
            return Err(not_found(format!(
                "dependency '{dep}' is not a todo of goal '{goal_id}'; add it first"
            )));
        }
    }
    let default_priority = if role == Role::User {
        Priority::P0
    } else {
        Priority::P2
    };
    let todo = Todo {
        id,
        goal_id: goal_id.to_string(),
        role,
        kind: new.kind,
        title,
        detail: new.detail,
        priority: new.priority.or(prefix_priority).unwrap_or(default_priority),
        status: TodoStatus::Open,
        depends_on,
        capability: new.capability,
        lane: new.lane,
        gate_scope: new.gate_scope,
        claim: None,
        last_fence: 0,
        status_reason: None,
        created_at: now,
        updated_at: now,
    };
    tx.insert_todo(&todo)?;
    Ok(todo)
}

/// Capability names are `builtin:<name>` (today `builtin:default`) or `<extension>/<capability>`,
/// each part a path-safe token. Exactly those two forms: a bare `no-slash` names no extension, so
/// the decision could never find it installed and would hold every agent on the goal in
/// `repair_required`.
pub fn check_capability_name(name: &str) -> Result<()> {
    let token = |part: &str| validate_token("capability", part).is_ok();
    let ok = name.len() <= 120
        && match (name.strip_prefix("builtin:"), name.split_once('/')) {
            (Some(rest), None) => token(rest),
            (None, Some((ext, cap))) => token(ext) && token(cap) && !name.contains(':'),
            _ => false,
        };
    if ok {
        Ok(())
    } else if name.len() > 120 {
        Err(bad_input(format!(
            "invalid capability name of {} bytes: use <extension>/<capability> or builtin:default (at most 120 bytes)",
            name.len()
        )))
    } else {
        Err(bad_input(format!(
            "invalid capability '{name}': use <extension>/<capability> (e.g. issue-fix/issue-fix) or builtin:default"
        )))
    }
}

pub(crate) fn add_evidence(
    tx: &dyn StoreTx,
    todo: &Todo,
    actor: &Actor,
    text: &str,
    artifact: Option<(String, Option<String>)>,
    run_id: Option<&str>,
    now: i64,
) -> Result<i64> {
    if text.trim().is_empty() {
        return Err(bad_input(
            "evidence text is empty; say what was done and how it was checked",
        ));
    }
    check_len("evidence", text, MAX_TEXT)?;
    let (artifact_path, artifact_digest) = match artifact {
        Some((p, d)) => (Some(p), d),
        None => (None, None),
    };
    tx.insert_evidence(&Evidence {
        id: 0,
        goal_id: todo.goal_id.clone(),
        todo_id: todo.id.clone(),
        text: text.to_string(),
        artifact_path,
        artifact_digest,
        run_id: run_id.map(str::to_string),
        actor: actor.label(),
        created_at: now,
    })
}

/// Marks `todo` completed (clearing its claim) and records evidence; shared with admission.
pub(crate) fn complete_in_tx(
    tx: &dyn StoreTx,
    mut todo: Todo,
    actor: &Actor,
    evidence: Option<&str>,
    now: i64,
) -> Result<TodoChange> {
    if todo.status == TodoStatus::Completed {
        return Ok(TodoChange {
            todo,
            changed: false,
            evidence_id: None,
        });
    }
    if todo.status == TodoStatus::Archived {
        return Err(refused(format!(
            "todo '{}' is archived; it cannot be completed",
            todo.id
        )));
    }
    super::monitor::refuse_completion(tx, &todo)?;
    let evidence_id = match evidence {
        Some(text) => Some(add_evidence(tx, &todo, actor, text, None, None, now)?),
        None => None,
    };
    todo.status = TodoStatus::Completed;
    todo.claim = None;
    todo.updated_at = now;
    tx.update_todo(&todo)?;
    log_op(
        tx,
        Some(&todo.goal_id),
        actor,
        "todo_complete",
        json!({"todo_id": todo.id}),
    )?;
    Ok(TodoChange {
        todo,
        changed: true,
        evidence_id,
    })
}

impl Kernel {
    pub fn add_todo(&mut self, actor: &Actor, goal_id: &str, new: NewTodo) -> Result<Todo> {
        self.write(|tx| {
            require_goal(tx, goal_id)?;
            let todo = insert_new_todo(tx, goal_id, new, now_ms())?;
            log_op(
                tx,
                Some(goal_id),
                actor,
                "todo_add",
                json!({"todo_id": todo.id, "kind": todo.kind}),
            )?;
            Ok(todo)
        })
    }

    pub fn todos(&self, goal_id: &str) -> Result<Vec<Todo>> {
        self.read(|tx| {
            require_goal(tx, goal_id)?;
            tx.todos(goal_id)
        })
    }

    pub fn todo(&self, goal_id: &str, todo_id: &str) -> Result<(Todo, Vec<Evidence>)> {
        self.read(|tx| {
            require_goal(tx, goal_id)?;
            let todo = require_todo(tx, goal_id, todo_id)?;
            let evidence = tx.evidence_for(goal_id, todo_id)?;
            Ok((todo, evidence))
        })
    }

    /// `todo update`: status, text fields and evidence in one write.
    pub fn update_todo(
        &mut self,
        actor: &Actor,
        goal_id: &str,
        todo_id: &str,
        patch: TodoPatch,
    ) -> Result<TodoChange> {
        if let Some(t) = &patch.title {
            check_len("todo title", t, MAX_TITLE)?;
        }
        if let Some(d) = &patch.detail {
            check_len("todo detail", d, MAX_TEXT)?;
        }
        if patch.status == Some(TodoStatus::Claimed) {
            return Err(bad_input(
                "status 'claimed' is set by a claim, which grants the lease, not by update",
            ));
        }
        self.write(|tx| {
            require_goal(tx, goal_id)?;
            let mut todo = require_todo(tx, goal_id, todo_id)?;
            authorize_write(&todo, actor)?;
            let now = now_ms();
            if patch.status.is_some() {
                if !matches!(actor, Actor::Operator) {
                    refuse_gate_status_change(&todo)?;
                } else if todo.role == Role::User && patch.status == Some(TodoStatus::Completed) {
                    return Err(bad_input(msg![
                        format!("todo '{todo_id}' is a {}; resolve it with ", todo.kind),
                        NextAction::ResolveGate {
                            goal_id: goal_id.to_string(),
                            todo_id: todo_id.to_string(),
                        }
                    ]));
                }
            }
            if patch.status == Some(TodoStatus::Completed) {
                let mut change = complete_in_tx(tx, todo, actor, patch.evidence.as_deref(), now)?;
                if !change.changed
                    && let Some(text) = &patch.evidence
                {
                    change.evidence_id = Some(add_evidence(tx, &change.todo, actor, text, None, None, now)?);
                }
                return Ok(change);
            }
            let before = todo.clone();
            if let Some(t) = &patch.title {
                let t = t.trim();
                if t.is_empty() {
                    return Err(bad_input("todo title cannot be empty"));
                }
                todo.title = t.to_string();
            }
            if let Some(d) = &patch.detail {
                todo.detail = d.clone();
            }
            if let Some(p) = patch.priority {
                todo.priority = p;
            }
            if let Some(s) = patch.status {
                if todo.status.is_terminal() && s != todo.status {
                    return Err(refused(format!(
                        "todo '{todo_id}' is {}; terminal todos do not reopen. Add a new todo instead",
                        todo.status
                    )));
                }
                todo.status = s;
                // Leaving `claimed` ends the lease: the work is no longer in progress.
                todo.claim = None;
                todo.status_reason = patch.reason.clone();
            }
            let evidence_id = match &patch.evidence {
                Some(text) => Some(add_evidence(tx, &todo, actor, text, None, None, now)?),
                None => None,
            };
            let scheduled = super::monitor::apply_update_in_tx(
                tx,
                &todo,
                todo.status != before.status,
                patch.until,
                &patch.monitor,
                now,
            )?;
            let changed = todo != before || evidence_id.is_some() || scheduled;
            if todo != before {
                todo.updated_at = now;
                tx.update_todo(&todo)?;
            }
            if changed {
                log_op(tx, Some(goal_id), actor, "todo_update", json!({"todo_id": todo_id, "status": todo.status}))?;
            }
            Ok(TodoChange { todo, changed, evidence_id })
        })
    }

    /// `todo complete`: terminal and idempotent.
    pub fn complete_todo(
        &mut self,
        actor: &Actor,
        goal_id: &str,
        todo_id: &str,
        evidence: Option<&str>,
    ) -> Result<TodoChange> {
        self.update_todo(
            actor,
            goal_id,
            todo_id,
            TodoPatch {
                status: Some(TodoStatus::Completed),
                evidence: evidence.map(str::to_string),
                ..Default::default()
            },
        )
    }

    /// Open user todos (gates and user actions) of a goal.
    pub fn gates(&self, goal_id: &str) -> Result<Vec<Todo>> {
        self.read(|tx| {
            require_goal(tx, goal_id)?;
            tx.open_user_todos(goal_id)
        })
    }

    /// Resolves a gate or user action. Operators only: never an agent in a turn, never a capability.
    pub fn resolve_gate(
        &mut self,
        actor: &Actor,
        goal_id: &str,
        todo_id: &str,
        approve: bool,
        comment: Option<&str>,
    ) -> Result<TodoChange> {
        actor.require_operator("resolve a gate")?;
        self.write(|tx| {
            require_goal(tx, goal_id)?;
            let mut todo = require_todo(tx, goal_id, todo_id)?;
            if todo.role != Role::User {
                return Err(bad_input(msg![
                    format!("todo '{todo_id}' is an agent {} not a gate; ", todo.kind),
                    NextAction::ListGates {
                        goal_id: goal_id.to_string()
                    },
                    " shows the gates"
                ]));
            }
            if todo.status.is_terminal() {
                return Ok(TodoChange {
                    todo,
                    changed: false,
                    evidence_id: None,
                });
            }
            let now = now_ms();
            let decision = if approve { "approved" } else { "rejected" };
            let text = match comment {
                Some(c) if !c.trim().is_empty() => format!("operator {decision}: {c}"),
                _ => format!("operator {decision}"),
            };
            let evidence_id = add_evidence(tx, &todo, actor, &text, None, None, now)?;
            // A rejected gate is archived: dependency on it is never met, so gated work stays held.
            todo.status = if approve {
                TodoStatus::Completed
            } else {
                TodoStatus::Archived
            };
            todo.status_reason = Some(decision.to_string());
            todo.updated_at = now;
            tx.update_todo(&todo)?;
            log_op(
                tx,
                Some(goal_id),
                actor,
                "gate_resolve",
                json!({"todo_id": todo_id, "decision": decision}),
            )?;
            Ok(TodoChange {
                todo,
                changed: true,
                evidence_id: Some(evidence_id),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_prefix() {
        assert_eq!(
            split_priority_prefix("[P0] Fix it"),
            (Some(Priority::P0), "Fix it".to_string())
        );
        assert_eq!(
            split_priority_prefix("[P9] x"),
            (None, "[P9] x".to_string())
        );
        assert_eq!(split_priority_prefix("plain"), (None, "plain".to_string()));
    }
}
