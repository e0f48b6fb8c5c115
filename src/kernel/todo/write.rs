//! Writing one todo: what makes a new todo valid, who may write a claimed one, and evidence.
//!
//! Below both the todo commands (`super`) and the monitor logic (`kernel::monitor`), which opens
//! follow-up todos and records evidence under the same rules, so neither imports the other's
//! callers. The write rule lives in [`authorize_write`]: operators may write any todo; an agent
//! may write a claimed todo only as its holder with the current fence (or claim key).

use crate::error::{Param, Result, bad_input, conflict, msg, not_found};
use crate::ids::validate_token;
use crate::kernel::store::StoreTx;
use crate::kernel::{Actor, LeaseProof};
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

/// Splits a leading `[Pn]` priority tag off a title.
pub(super) fn split_priority_prefix(title: &str) -> (Option<Priority>, String) {
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

pub(crate) fn check_len(what: &str, text: &str, max: usize) -> Result<()> {
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
        (Some(c), Some(LeaseProof::Fence(f))) if *f < c.fence => Err(conflict(format!(
            "stale fence {f} for todo '{}': the current lease (fence {}) was granted after yours; claim it again",
            todo.id, c.fence
        ))),
        (Some(c), Some(LeaseProof::Fence(f))) if *f != c.fence => Err(conflict(format!(
            "fence {f} for todo '{}' was never granted (the current lease is fence {}); prove \
             the lease with the fence your claim returned",
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

/// A new todo's title and detail within their limits, checked without the store (so a command
/// that writes several things can refuse before it writes any).
pub(crate) fn check_new_todo_text(new: &NewTodo) -> Result<()> {
    let (_, title) = split_priority_prefix(&new.title);
    if title.is_empty() {
        return Err(bad_input(msg![
            "todo title is empty; pass ",
            Param::Title,
            " \"what to do\""
        ]));
    }
    check_len("todo title", &title, MAX_TITLE)?;
    check_len("todo detail", &new.detail, MAX_TEXT)
}

/// Inserts a todo after validating it against the goal. Shared by `todo add` and admission.
pub(crate) fn insert_new_todo(
    tx: &dyn StoreTx,
    goal_id: &str,
    new: NewTodo,
    now: i64,
) -> Result<Todo> {
    check_new_todo_text(&new)?;
    let (prefix_priority, title) = split_priority_prefix(&new.title);
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
