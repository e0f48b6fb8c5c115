//! Claims as leases with a fence token: claim, renew, release, takeover after expiry.
//!
//! One model only (the reference's soft claim plus hard lease was a split brain). A grant bumps the
//! todo's fence, which never decreases, so any later write can be checked against the current
//! holder ([`super::todo::authorize_write`]). Everything happens in one `BEGIN IMMEDIATE`
//! transaction, so sixteen simultaneous claimers serialize and exactly one wins.

use serde::Serialize;
use serde_json::json;

use super::todo::{TodoChange, authorize_write};
use super::{Actor, Kernel, LeaseProof, log_op, require_goal, require_todo};
use crate::clock::now_ms;
use crate::error::{NextAction, Param, Result, bad_input, conflict, msg, not_found, refused};
use crate::ids::{new_ulid, validate_token};
use crate::kernel::store::StoreTx;
use crate::model::{Claim, GoalStatus, Role, Todo, TodoKind, TodoStatus};

pub const DEFAULT_TTL_SECONDS: u64 = 30 * 60;
pub const MAX_TTL_SECONDS: u64 = 24 * 60 * 60;

#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub goal_id: String,
    /// A specific todo, or `None` for the highest-priority ready one.
    pub todo_id: Option<String>,
    pub agent_id: String,
    pub ttl_seconds: u64,
    /// Names this claim; repeating a claim with the same key returns the same lease.
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClaimGrant {
    pub todo: Todo,
    pub claim: Claim,
    /// True when this repeated an earlier identical claim (nothing new was granted).
    pub replayed: bool,
    /// The previous holder whose expired lease this grant took over.
    pub took_over_from: Option<String>,
}

fn check_ttl(ttl: u64) -> Result<()> {
    if ttl == 0 || ttl > MAX_TTL_SECONDS {
        return Err(bad_input(msg![
            Param::TtlSeconds,
            format!(" {ttl} is out of range: use 1..={MAX_TTL_SECONDS}")
        ]));
    }
    Ok(())
}

/// Refuses when an open gate blocks `agent_id` on this goal.
pub(crate) fn check_not_gated(tx: &dyn StoreTx, goal_id: &str, agent_id: &str) -> Result<()> {
    if let Some(gate) = tx
        .open_user_todos(goal_id)?
        .into_iter()
        .find(|g| g.gate_blocks(agent_id))
    {
        return Err(refused(msg![
            format!(
                "gate '{}' (\"{}\") blocks agent '{agent_id}' on goal '{goal_id}'; an operator \
                 must resolve it with ",
                gate.id, gate.title
            ),
            NextAction::ResolveGate {
                goal_id: goal_id.to_string(),
                todo_id: gate.id.clone(),
            }
        ]));
    }
    Ok(())
}

fn grant(
    tx: &dyn StoreTx,
    mut todo: Todo,
    req: &ClaimRequest,
    key: String,
    now: i64,
) -> Result<ClaimGrant> {
    let took_over_from = todo.claim.as_ref().map(|c| c.agent_id.clone());
    let fence = todo.last_fence + 1;
    let claim = Claim {
        agent_id: req.agent_id.clone(),
        fence,
        expires_at: now + (req.ttl_seconds as i64) * 1000,
        idempotency_key: key,
        claimed_at: now,
    };
    todo.last_fence = fence;
    todo.claim = Some(claim.clone());
    todo.status = TodoStatus::Claimed;
    todo.updated_at = now;
    tx.update_todo(&todo)?;
    let actor = Actor::Agent {
        agent_id: req.agent_id.clone(),
        proof: None,
        turn_key: None,
    };
    log_op(
        tx,
        Some(&req.goal_id),
        &actor,
        if took_over_from.is_some() {
            "claim_takeover"
        } else {
            "claim"
        },
        json!({"todo_id": todo.id, "fence": fence, "took_over_from": took_over_from}),
    )?;
    Ok(ClaimGrant {
        todo,
        claim,
        replayed: false,
        took_over_from,
    })
}

/// Decides a claim on one specific todo inside the caller's transaction.
fn claim_specific(
    tx: &dyn StoreTx,
    req: &ClaimRequest,
    todo: Todo,
    now: i64,
) -> Result<ClaimGrant> {
    if todo.role == Role::User {
        return Err(bad_input(format!(
            "todo '{}' is a {}; gates are resolved by an operator, not claimed",
            todo.id, todo.kind
        )));
    }
    if let Some(c) = todo.live_claim(now) {
        if c.agent_id == req.agent_id
            && req
                .idempotency_key
                .as_ref()
                .is_none_or(|k| *k == c.idempotency_key)
        {
            let claim = c.clone();
            return Ok(ClaimGrant {
                todo,
                claim,
                replayed: true,
                took_over_from: None,
            });
        }
        return Err(conflict(format!(
            "todo '{}' is claimed by agent '{}' (fence {}) until {}; pick another todo or wait for the lease to expire",
            todo.id,
            c.agent_id,
            c.fence,
            crate::clock::rfc3339(c.expires_at)
        )));
    }
    match todo.status {
        TodoStatus::Open | TodoStatus::Claimed => {}
        other => {
            return Err(refused(format!(
                "todo '{}' is {other}; only open todos can be claimed",
                todo.id
            )));
        }
    }
    if todo.kind == TodoKind::Monitor
        && let Some(m) = tx.monitor(&req.goal_id, &todo.id)?
    {
        super::monitor::refuse_if_ended(&todo.id, &m, now)?;
    }
    for dep in &todo.depends_on {
        let d = tx.todo(&req.goal_id, dep)?;
        if d.as_ref().is_none_or(|d| d.status != TodoStatus::Completed) {
            return Err(refused(format!(
                "todo '{}' is not ready: it depends on '{dep}', which is {}",
                todo.id,
                d.map(|d| d.status.to_string())
                    .unwrap_or_else(|| "missing".to_string())
            )));
        }
    }
    let key = req.idempotency_key.clone().unwrap_or_else(new_ulid);
    grant(tx, todo, req, key, now)
}

/// Decides and grants a claim inside the caller's transaction (shared by [`Kernel::claim`] and the
/// turn driver, which claims and journals its turn in one transaction).
pub(crate) fn claim_in_tx(tx: &dyn StoreTx, req: &ClaimRequest, now: i64) -> Result<ClaimGrant> {
    validate_token("agent id", &req.agent_id)?;
    check_ttl(req.ttl_seconds)?;
    if let Some(k) = &req.idempotency_key {
        validate_token("idempotency key", k)?;
    }
    let goal = require_goal(tx, &req.goal_id)?;
    if goal.status != GoalStatus::Active {
        return Err(refused(msg![
            format!(
                "goal '{}' is {}; only active goals hand out work (",
                goal.id, goal.status
            ),
            NextAction::ResumeGoal {
                goal_id: goal.id.clone()
            },
            ")"
        ]));
    }
    check_not_gated(tx, &req.goal_id, &req.agent_id)?;
    match &req.todo_id {
        Some(todo_id) => {
            let todo = require_todo(tx, &req.goal_id, todo_id)?;
            claim_specific(tx, req, todo, now)
        }
        None => {
            if let Some(held) = tx.claimed_by(&req.goal_id, &req.agent_id, now)? {
                let claim = held
                    .claim
                    .clone()
                    .expect("claimed_by returns claimed todos");
                if req
                    .idempotency_key
                    .as_ref()
                    .is_none_or(|k| *k == claim.idempotency_key)
                {
                    return Ok(ClaimGrant {
                        todo: held,
                        claim,
                        replayed: true,
                        took_over_from: None,
                    });
                }
            }
            let Some(todo) = super::decision::next_claimable(tx, &req.goal_id, now)? else {
                return Err(not_found(msg![
                    format!(
                        "no ready todo in goal '{}' for agent '{}': every open todo is claimed, \
                         waiting on a dependency, a monitor not yet due, or done (",
                        req.goal_id, req.agent_id
                    ),
                    NextAction::ListTodos {
                        goal_id: req.goal_id.clone()
                    },
                    ")"
                ]));
            };
            let key = req.idempotency_key.clone().unwrap_or_else(new_ulid);
            grant(tx, todo, req, key, now)
        }
    }
}

/// Gives a claimed todo back (status `open`) inside the caller's transaction. The holder with its
/// proof, or an operator; a todo without a claim is returned unchanged.
pub(crate) fn release_in_tx(
    tx: &dyn StoreTx,
    actor: &Actor,
    goal_id: &str,
    todo_id: &str,
    now: i64,
) -> Result<TodoChange> {
    require_goal(tx, goal_id)?;
    let mut todo = require_todo(tx, goal_id, todo_id)?;
    // Nothing to release (already released, never claimed, or finished): a retry succeeds, and
    // says it changed nothing.
    if todo.claim.is_none() {
        return Ok(TodoChange {
            todo,
            changed: false,
            evidence_id: None,
        });
    }
    authorize_write(&todo, actor)?;
    let fence = todo.claim.as_ref().map(|c| c.fence);
    todo.claim = None;
    todo.status = TodoStatus::Open;
    todo.updated_at = now;
    tx.update_todo(&todo)?;
    log_op(
        tx,
        Some(goal_id),
        actor,
        "claim_release",
        json!({"todo_id": todo_id, "fence": fence}),
    )?;
    Ok(TodoChange {
        todo,
        changed: true,
        evidence_id: None,
    })
}

impl Kernel {
    /// Claims a todo (or the best ready one) for an agent.
    pub fn claim(&mut self, req: &ClaimRequest) -> Result<ClaimGrant> {
        validate_token("agent id", &req.agent_id)?;
        check_ttl(req.ttl_seconds)?;
        if let Some(k) = &req.idempotency_key {
            validate_token("idempotency key", k)?;
        }
        self.write(|tx| claim_in_tx(tx, req, now_ms()))
    }

    /// Extends the holder's lease. The fence is unchanged.
    pub fn renew(
        &mut self,
        actor: &Actor,
        goal_id: &str,
        todo_id: &str,
        ttl_seconds: u64,
    ) -> Result<ClaimGrant> {
        check_ttl(ttl_seconds)?;
        let Actor::Agent { .. } = actor else {
            return Err(bad_input(msg![
                "renew needs the holder: pass ",
                Param::AgentId,
                " and ",
                Param::Fence,
                " (or ",
                Param::ClaimKey,
                ")"
            ]));
        };
        self.write(|tx| {
            require_goal(tx, goal_id)?;
            let mut todo = require_todo(tx, goal_id, todo_id)?;
            if todo.claim.is_none() {
                return Err(conflict(format!(
                    "todo '{todo_id}' is not claimed; claim it first"
                )));
            }
            authorize_write(&todo, actor)?;
            let now = now_ms();
            let claim = todo.claim.as_mut().expect("checked above");
            claim.expires_at = now + ttl_seconds as i64 * 1000;
            let claim = claim.clone();
            todo.updated_at = now;
            tx.update_todo(&todo)?;
            log_op(
                tx,
                Some(goal_id),
                actor,
                "claim_renew",
                json!({"todo_id": todo_id, "fence": claim.fence}),
            )?;
            Ok(ClaimGrant {
                todo,
                claim,
                replayed: false,
                took_over_from: None,
            })
        })
    }

    /// Gives a claimed todo back (status `open`). The holder with its proof, or an operator.
    pub fn release(&mut self, actor: &Actor, goal_id: &str, todo_id: &str) -> Result<TodoChange> {
        if let Actor::Agent { proof: None, .. } = actor {
            return Err(bad_input(msg![
                "release needs the holder's proof: pass ",
                Param::Fence,
                " or ",
                Param::ClaimKey
            ]));
        }
        self.write(|tx| release_in_tx(tx, actor, goal_id, todo_id, now_ms()))
    }
}

/// Builds the actor for an agent write from its flags.
pub fn agent_actor(
    agent_id: &str,
    fence: Option<i64>,
    claim_key: Option<String>,
    turn_key: Option<String>,
) -> Actor {
    let proof = match (fence, claim_key) {
        (Some(f), _) => Some(LeaseProof::Fence(f)),
        (None, Some(k)) => Some(LeaseProof::Key(k)),
        (None, None) => None,
    };
    Actor::Agent {
        agent_id: agent_id.to_string(),
        proof,
        turn_key,
    }
}
