//! Todos and gates: add, update, complete, attach evidence, resolve gates.
//!
//! The write rule lives in [`authorize_write`] (`write.rs`): operators may write any todo; an
//! agent may write a claimed todo only as its holder with the current fence (or claim key). Gates
//! are todos of kind `user_gate`/`user_action` and only an operator resolves them.

pub(crate) mod write;

pub use write::{MAX_TEXT, MAX_TITLE, NewTodo, check_capability_name};
pub(crate) use write::{add_evidence, authorize_write, check_len, insert_new_todo};

use serde_json::json;

use super::{Actor, Kernel, log_op, require_goal, require_todo, require_unclosed_goal};
use crate::clock::now_ms;
use crate::error::{NextAction, Result, bad_input, conflict, msg, refused};
use crate::kernel::store::StoreTx;
use crate::model::{Evidence, Priority, Role, Todo, TodoStatus};

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
            require_unclosed_goal(tx, goal_id, "a new todo")?;
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
        if let Some(r) = &patch.reason {
            check_len("status reason", r, MAX_TEXT)?;
        }
        if patch.status == Some(TodoStatus::Claimed) {
            return Err(bad_input(
                "status 'claimed' is set by a claim, which grants the lease, not by update",
            ));
        }
        let replans = patch.title.is_some()
            || patch.detail.is_some()
            || patch.priority.is_some()
            || patch.status.is_some_and(|s| !s.is_terminal())
            || patch.until.is_some()
            || !patch.monitor.is_empty();
        self.write(|tx| {
            if replans {
                require_unclosed_goal(
                    tx,
                    goal_id,
                    "reopening or changing a todo (only completing, archiving and evidence remain)",
                )?;
            } else {
                require_goal(tx, goal_id)?;
            }
            let mut todo = require_todo(tx, goal_id, todo_id)?;
            // A completion repeated with the lease proof it was made with (an agent retrying a
            // command whose answer it lost) finds the lease ended by that completion, so the
            // proof can no longer be checked: the answer is the completion's, nothing changed,
            // and nothing is written (no evidence from a proof that cannot be verified).
            if patch.status == Some(TodoStatus::Completed)
                && todo.status == TodoStatus::Completed
                && todo.claim.is_none()
                && matches!(actor, Actor::Agent { proof: Some(_), .. })
            {
                return Ok(TodoChange {
                    todo,
                    changed: false,
                    evidence_id: None,
                });
            }
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
                // The same decision again is a retry; the other one would be a second, silently
                // ignored resolution, so it is refused: a resolution is final.
                let approved = todo.status == TodoStatus::Completed;
                if approved != approve {
                    return Err(conflict(format!(
                        "gate '{todo_id}' was already {}; a resolution is final: add a new gate \
                         to ask again",
                        if approved {
                            "approved"
                        } else {
                            "rejected (or archived)"
                        }
                    )));
                }
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
