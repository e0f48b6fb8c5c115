//! The status / attention queue (layer 5): who must act next, derived on read, never stored.
//!
//! Operator items (gates, repairs, paused goals) come first because nothing moves until a person
//! acts; then agent work that is ready; then goals that are merely waiting.

use serde::Serialize;

use super::decision::{InstalledCapabilities, is_agent_work_now, missing_capabilities};
use super::quota::{QuotaState, QuotaView, view_in_tx};
use super::{Kernel, require_goal};
use crate::clock::now_ms;
use crate::error::Result;
use crate::kernel::store::StoreRead;
use crate::model::{Goal, GoalStatus, Role, Todo, TodoKind, TodoStatus, wire_enum};

wire_enum!(
    /// Who must act on an attention item.
    Who { Operator => "operator", Agent => "agent" }
);

wire_enum!(
    /// What an attention item asks for.
    AttentionKind {
        /// An open user gate: an operator decides.
        Gate => "gate",
        /// An open user action: something for the operator to read or do.
        UserAction => "user_action",
        /// An agent reported it cannot proceed on a todo.
        Blocked => "blocked",
        /// Open todos are bound to capabilities that are not installed and enabled.
        Repair => "repair",
        /// The goal is paused.
        Resume => "resume",
        /// Compute quota is 0.
        Quota => "quota",
        /// No open todos: add the next ones or close the goal.
        Replan => "replan",
        /// Agent work is ready.
        Work => "work",
    }
);

/// One entry of the attention queue.
#[derive(Debug, Clone, Serialize)]
pub struct AttentionItem {
    pub goal_id: String,
    pub who: Who,
    pub kind: AttentionKind,
    pub todo_id: Option<String>,
    pub title: String,
    pub reason: String,
    /// Sort key: lower is more urgent.
    #[serde(skip)]
    rank: (u8, i64),
}

/// Per-goal overview shown under the queue.
#[derive(Debug, Clone, Serialize)]
pub struct GoalStatusView {
    pub goal: Goal,
    pub first_user_todo: Option<Todo>,
    pub top_agent_todo: Option<Todo>,
    pub ready_count: usize,
    pub quota: QuotaView,
    pub latest_run_id: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StatusReport {
    pub attention: Vec<AttentionItem>,
    pub goals: Vec<GoalStatusView>,
}

fn item(
    goal: &str,
    who: Who,
    kind: AttentionKind,
    todo: Option<&Todo>,
    title: String,
    reason: String,
    rank: (u8, i64),
) -> AttentionItem {
    AttentionItem {
        goal_id: goal.to_string(),
        who,
        kind,
        todo_id: todo.map(|t| t.id.clone()),
        title,
        reason,
        rank,
    }
}

/// Every status a todo can still leave.
const NOT_TERMINAL: [TodoStatus; 4] = [
    TodoStatus::Open,
    TodoStatus::Claimed,
    TodoStatus::Blocked,
    TodoStatus::Deferred,
];

fn goal_status(
    tx: &dyn StoreRead,
    goal: Goal,
    installed: &mut InstalledCapabilities,
    now: i64,
    queue: &mut Vec<AttentionItem>,
) -> Result<GoalStatusView> {
    let gid = goal.id.clone();
    let quota = view_in_tx(tx, &gid, None, now)?;
    let user = tx.open_user_todos(&gid)?;
    let mut ready = Vec::new();
    for todo in tx.ready_todos(&gid, now, 50)? {
        if is_agent_work_now(tx, &todo, now)? {
            ready.push(todo);
        }
    }
    let latest_run_id = tx.latest_run_id(&gid, None)?;
    let ready_count = ready.len();
    if goal.status == GoalStatus::Paused {
        queue.push(item(
            &gid,
            Who::Operator,
            AttentionKind::Resume,
            None,
            goal.title.clone(),
            "goal is paused".into(),
            (2, 0),
        ));
    }
    if goal.status == GoalStatus::Active {
        for t in &user {
            let (kind, rank) = if t.kind == TodoKind::UserGate {
                (AttentionKind::Gate, 0)
            } else {
                (AttentionKind::UserAction, 3)
            };
            let scope = match &t.gate_scope {
                Some(crate::model::GateScope::BlocksAgent { agent_id }) => {
                    format!("blocks agent '{agent_id}'")
                }
                Some(crate::model::GateScope::Global) => "blocks every agent".into(),
                None => "informs the operator".into(),
            };
            queue.push(item(
                &gid,
                Who::Operator,
                kind,
                Some(t),
                t.title.clone(),
                scope,
                (rank, t.priority.rank()),
            ));
        }
        let missing = missing_capabilities(tx, &gid, installed)?;
        if !missing.is_empty() {
            queue.push(item(
                &gid,
                Who::Operator,
                AttentionKind::Repair,
                None,
                "install or enable capabilities".into(),
                missing.join(", "),
                (1, 0),
            ));
        }
        if quota.state == QuotaState::Paused {
            queue.push(item(
                &gid,
                Who::Operator,
                AttentionKind::Quota,
                None,
                quota.policy.why_no_slots().unwrap_or_default(),
                "automatic turns are paused".into(),
                (2, 1),
            ));
        }
        let counts = tx.todo_status_counts(&gid)?;
        if counts.iter().any(|(role, status, n)| {
            role == Role::Agent.as_str() && status == TodoStatus::Blocked.as_str() && *n > 0
        }) {
            // A blocked todo waits for a person: an agent reported it cannot proceed.
            for t in &tx.todos_in_status(&gid, Role::Agent, &[TodoStatus::Blocked], usize::MAX)? {
                queue.push(item(
                    &gid,
                    Who::Operator,
                    AttentionKind::Blocked,
                    Some(t),
                    t.title.clone(),
                    t.status_reason.clone().unwrap_or_else(|| "blocked".into()),
                    (1, t.priority.rank()),
                ));
            }
        }
        if let Some(t) = ready.first() {
            let reason = if quota.state == QuotaState::Eligible {
                format!("{} ready todo(s)", ready_count)
            } else {
                format!("{} ready todo(s), quota {}", ready_count, quota.state)
            };
            queue.push(item(
                &gid,
                Who::Agent,
                AttentionKind::Work,
                Some(t),
                t.title.clone(),
                reason,
                (4, t.priority.rank()),
            ));
        } else {
            let pending = counts.iter().any(|(role, status, n)| {
                role == Role::Agent.as_str()
                    && *n > 0
                    && TodoStatus::parse(status).is_ok_and(|s| !s.is_terminal())
            });
            if !pending && user.is_empty() {
                queue.push(item(
                    &gid,
                    Who::Operator,
                    AttentionKind::Replan,
                    None,
                    goal.title.clone(),
                    "no open todos: add the next ones or close the goal".into(),
                    (3, 9),
                ));
            }
        }
    }
    let top_agent_todo = match ready.into_iter().next() {
        Some(t) => Some(t),
        None => tx
            .todos_in_status(&gid, Role::Agent, &NOT_TERMINAL, 1)?
            .into_iter()
            .next(),
    };
    Ok(GoalStatusView {
        first_user_todo: user.into_iter().next(),
        top_agent_todo,
        ready_count,
        quota,
        latest_run_id,
        goal,
    })
}

impl Kernel {
    /// The attention queue for one goal or every goal that is not closed.
    pub fn status(&self, goal_id: Option<&str>) -> Result<StatusReport> {
        self.read(|tx| {
            let now = now_ms();
            let mut installed = InstalledCapabilities::default();
            let goals = match goal_id {
                Some(g) => vec![require_goal(tx, g)?],
                None => tx
                    .goals()?
                    .into_iter()
                    .filter(|g| g.status != GoalStatus::Closed)
                    .collect(),
            };
            let mut attention = Vec::new();
            let mut views = Vec::new();
            for goal in goals {
                views.push(goal_status(tx, goal, &mut installed, now, &mut attention)?);
            }
            attention.sort_by_key(|i| i.rank);
            Ok(StatusReport {
                attention,
                goals: views,
            })
        })
    }
}
