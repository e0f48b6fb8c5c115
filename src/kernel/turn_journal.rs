//! The turn journal's writes: starting a turn and committing each of its phases.
//!
//! Why this exists: a turn's durable steps (the claim and the journal row at start; admission and
//! the run row with `durable_writeback`; the spend with `quota_spend`; the lease release with
//! `terminal_closeout`) are kernel writes like any other, so they are kernel methods: each checks
//! that the actor is the turn's own agent, applies one typed effect, compares-and-swaps the
//! journal row against the phases the caller last saw (two recoverers can never both apply a
//! phase), and appends one operation-log entry. The turn driver (`src/turn/`) keeps what is not
//! durable state: running processes, parsing results, and the shape of the journal's `data`,
//! which it builds in the closures these methods call inside their transaction.

use serde_json::{Value, json};

use super::admission::admit_in_tx;
use super::claim::{ClaimRequest, claim_in_tx, release_in_tx};
use super::decision::{Decision, TurnRoute, WAIT_FOR_TURN_SECONDS, decide_in_tx};
use super::quota::{SpendReceipt, SpendRequest, spend_in_tx};
use super::run::{RunIds, record_run_in_tx};
use super::transition::{AdmissionReport, ProposalSource, Transition};
use super::{Actor, Kernel, LeaseProof, log_op, require_goal};
use crate::clock::now_ms;
use crate::error::{LoopxError, Result, conflict, not_found, refused};
use crate::model::{Claim, Goal, JournalStatus, Phase, Run, Todo, TodoStatus, TurnRecord};

/// What [`Kernel::start_turn`] starts: one turn of `agent_id` on `goal_id` under `turn_key`.
#[derive(Debug, Clone)]
pub struct StartTurn {
    pub turn_key: String,
    pub goal_id: String,
    pub agent_id: String,
    /// A specific todo; default: the decision's selected todo. A given todo also starts on a
    /// `wait` route while quota is eligible (the claim then decides).
    pub todo_id: Option<String>,
    /// Lease length: the host budget plus a margin, so it cannot expire under a running host.
    pub ttl_seconds: u64,
}

/// What the start transaction decided and granted, for the driver to build the journal's `data`
/// from (inside the same transaction).
pub struct TurnGrant<'a> {
    pub decision: &'a Decision,
    pub goal: &'a Goal,
    pub todo: &'a Todo,
    pub claim: &'a Claim,
}

/// How [`Kernel::start_turn`] ended.
#[derive(Debug)]
pub enum TurnStart {
    /// The todo is claimed and the journal row (status `in_progress`, no phases) committed.
    Started(TurnRecord),
    /// Nothing was written: the route is not one a turn runs on, or a live turn already works
    /// the lease (route `wait`, `working_turn` set).
    NotReady(Box<Decision>),
}

/// Which lease a closeout releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseHeld {
    /// The lease this turn was granted: this agent with this fence.
    Fence(i64),
    /// Whatever lease this agent holds, if claimed no later than this instant (ms): for a row
    /// whose recorded fence cannot be read back, a lease claimed later belongs to later work.
    ClaimedBy(i64),
}

/// The state effect a phase commits together with its journal update.
#[derive(Debug, Clone)]
pub enum PhaseEffect {
    /// Only the journal changes (`host_execute`, `typed_result`, `validation`, a writeback whose
    /// capability failed).
    JournalOnly,
    /// Admit a capability's proposals for the turn's agent (`durable_writeback`).
    Admit {
        source: ProposalSource,
        proposals: Vec<Transition>,
        /// The result's `monitor_observation`: on a scheduled monitor, recorded as its check in
        /// the same transaction (`monitor::record_turn_check_in_tx`).
        monitor_observation: Option<String>,
    },
    /// Spend one slot under the turn's effect id `turn:<turn key>` (`quota_spend`).
    Spend,
    /// Release the lease if this turn still holds it (`terminal_closeout`).
    Release(LeaseHeld),
}

/// What a lease release found.
#[derive(Debug)]
pub enum LeaseOutcome {
    /// The todo no longer exists.
    TodoGone,
    /// No lease: completion or a block already cleared it.
    Cleared,
    /// Someone else's lease now (taken over, or claimed after this turn); left alone.
    NotHeld(Claim),
    /// This turn's lease, released.
    Released(Claim),
    /// This turn's lease, but the release was refused (the error says why); kept until it expires.
    Refused(LoopxError),
}

/// What the effect did, handed to the driver's journal update.
#[derive(Debug)]
pub enum EffectOutcome {
    None,
    Admitted {
        report: AdmissionReport,
        /// The turn's todo after admission.
        todo_status_after: Option<TodoStatus>,
    },
    /// A refused spend is a value (the turn settles as `quota_spend_failed`); an internal or
    /// corrupt-store error fails the commit instead. Boxed: a receipt carries two quota views.
    Spent(std::result::Result<Box<SpendReceipt>, LoopxError>),
    Lease(LeaseOutcome),
}

/// The journal update of one phase, built by the driver from the effect's outcome.
#[derive(Debug)]
pub struct PhaseWrite {
    /// The journal's new `data`.
    pub data: Value,
    /// The turn's final status; set by `terminal_closeout` and only by it.
    pub settle: Option<JournalStatus>,
    /// The turn's run row, when this phase records it.
    pub run: Option<Run>,
}

/// The turn's own agent, or a refusal: a turn's writes are made by the agent it runs for, inside
/// that turn, whoever started the process (the operator's `turn recover` settles a turn as its
/// agent).
fn require_turn_agent<'a>(actor: &'a Actor, agent_id: &str, turn_key: &str) -> Result<&'a str> {
    match actor {
        Actor::Agent {
            agent_id: a,
            turn_key: Some(k),
            ..
        } if a == agent_id && k == turn_key => Ok(a),
        other => Err(refused(format!(
            "turn '{turn_key}' writes as its agent '{agent_id}' inside that turn; {} cannot",
            other.label()
        ))),
    }
}

fn internal_error(e: &LoopxError) -> bool {
    matches!(e, LoopxError::Internal { .. } | LoopxError::Corrupt { .. })
}

impl Kernel {
    /// The journal row of a turn, if any.
    pub fn turn(&self, turn_key: &str) -> Result<Option<TurnRecord>> {
        self.read(|tx| tx.turn(turn_key))
    }

    /// Every unsettled (`in_progress`) turn, of one goal when given.
    pub fn unsettled_turns(&self, goal_id: Option<&str>) -> Result<Vec<TurnRecord>> {
        self.read(|tx| tx.unsettled_turns(goal_id))
    }

    /// The newest `limit` turns of the journal, optionally of one goal (which must exist) and
    /// one status, newest first.
    pub fn recent_turns(
        &self,
        goal_id: Option<&str>,
        status: Option<JournalStatus>,
        limit: usize,
    ) -> Result<Vec<TurnRecord>> {
        self.read(|tx| {
            if let Some(goal_id) = goal_id {
                require_goal(tx, goal_id)?;
            }
            tx.recent_turns(goal_id, status.map(JournalStatus::as_str), limit)
        })
    }

    /// One run row of a goal, if it exists.
    pub fn run(&self, goal_id: &str, run_id: &str) -> Result<Option<Run>> {
        self.read(|tx| tx.run(goal_id, run_id))
    }

    /// Decides again and, when the route lets a turn run, claims the todo and inserts the
    /// journal row (`in_progress`, no phases) in one transaction, with one operation-log entry.
    /// `journal` builds the row's `data` from what was granted. Two agents deciding at the same
    /// moment serialize here, so they never claim the same todo; a todo an unsettled turn works
    /// is never started again (one live turn per lease).
    pub fn start_turn(
        &mut self,
        actor: &Actor,
        start: &StartTurn,
        journal: impl FnOnce(&TurnGrant) -> Result<Value>,
    ) -> Result<TurnStart> {
        require_turn_agent(actor, &start.agent_id, &start.turn_key)?;
        self.write(|tx| {
            let now = now_ms();
            let turn_key = &start.turn_key;
            if tx.turn(turn_key)?.is_some() {
                return Err(conflict(format!(
                    "turn key '{turn_key}' was just used by another process; retry to replay it"
                )));
            }
            let d = decide_in_tx(tx, &start.goal_id, &start.agent_id, now)?;
            let todo_id = match (&start.todo_id, d.route) {
                (Some(t), TurnRoute::ReadyForHost) => t.clone(),
                (Some(t), TurnRoute::Wait) if d.quota.state == super::quota::QuotaState::Eligible => t.clone(),
                (None, TurnRoute::ReadyForHost) => d
                    .selected_todo
                    .as_ref()
                    .map(|s| s.todo.id.clone())
                    .expect("ready routes select a todo"),
                _ => return Ok(TurnStart::NotReady(Box::new(d))),
            };
            // Checked inside the transaction that would start the turn, so two overlapping turns
            // of one agent cannot both pass it: the second never runs its host on the same fence.
            if let Some((working, _)) = tx.unsettled_turn_on(&start.goal_id, &todo_id)? {
                let mut d = d;
                d.route = TurnRoute::Wait;
                d.reason = format!(
                    "todo '{todo_id}' is being worked by turn '{working}'; one turn works a lease at a time"
                );
                d.scheduler_action = super::decision::SchedulerAction::WaitForTurn;
                d.next_check_after_seconds = WAIT_FOR_TURN_SECONDS;
                d.working_turn = Some(working);
                return Ok(TurnStart::NotReady(Box::new(d)));
            }
            // An agent that already holds the todo keeps its claim key; a fresh claim is keyed by
            // the turn.
            let held = d
                .selected_todo
                .as_ref()
                .is_some_and(|s| {
                    s.selected_by == super::decision::SelectedBy::CurrentClaim
                        && s.todo.id == todo_id
                });
            let creq = ClaimRequest {
                goal_id: start.goal_id.clone(),
                todo_id: Some(todo_id.clone()),
                agent_id: start.agent_id.clone(),
                ttl_seconds: start.ttl_seconds,
                idempotency_key: if held { None } else { Some(turn_key.clone()) },
            };
            let grant = claim_in_tx(tx, &creq, now)?;
            let goal = require_goal(tx, &start.goal_id)?;
            let data = journal(&TurnGrant {
                decision: &d,
                goal: &goal,
                todo: &grant.todo,
                claim: &grant.claim,
            })?;
            let rec = TurnRecord {
                turn_key: turn_key.clone(),
                goal_id: start.goal_id.clone(),
                agent_id: start.agent_id.clone(),
                todo_id: Some(todo_id.clone()),
                status: JournalStatus::InProgress,
                phases: Vec::new(),
                data,
                created_at: now,
                updated_at: now,
                data_error: None,
            };
            tx.upsert_turn(&rec)?;
            log_op(
                tx,
                Some(&start.goal_id),
                actor,
                "turn_start",
                json!({"turn_key": turn_key, "todo_id": todo_id, "fence": grant.claim.fence}),
            )?;
            Ok(TurnStart::Started(rec))
        })
    }

    /// Commits `phase` of turn `turn_key` in one transaction: checks the row is still
    /// `in_progress` with exactly `expected_phases` (else a conflict: another process advanced
    /// it, and nothing is applied twice), applies `effect`, lets `journal` build the update from
    /// the effect's outcome, records the run row it returns, appends the phase (settling the
    /// status on `terminal_closeout`) and one operation-log entry. Returns the stored row.
    pub fn commit_turn_phase(
        &mut self,
        actor: &Actor,
        turn_key: &str,
        expected_phases: &[Phase],
        phase: Phase,
        effect: PhaseEffect,
        journal: impl FnOnce(EffectOutcome, i64, &RunIds<'_>) -> Result<PhaseWrite>,
    ) -> Result<TurnRecord> {
        self.write(|tx| {
            let now = now_ms();
            let current = tx.turn(turn_key)?.ok_or_else(|| {
                not_found(format!("turn '{turn_key}' vanished from the journal"))
            })?;
            let agent_id = require_turn_agent(actor, &current.agent_id, turn_key)?;
            if current.status != JournalStatus::InProgress || current.phases != expected_phases {
                return Err(conflict(format!(
                    "turn '{turn_key}' was advanced by another process (now {} after [{}]); nothing was applied twice",
                    current.status,
                    current
                        .phases
                        .iter()
                        .map(|p| p.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            let goal_id = current.goal_id.as_str();
            let todo_id = current.todo_id.clone().unwrap_or_default();
            let outcome = match effect {
                PhaseEffect::JournalOnly => EffectOutcome::None,
                PhaseEffect::Admit {
                    source,
                    proposals,
                    monitor_observation,
                } => {
                    if source.goal_id != goal_id
                        || source.agent_id.as_deref() != Some(agent_id)
                        || source.turn_key.as_deref() != Some(turn_key)
                    {
                        return Err(refused(format!(
                            "turn '{turn_key}' admits proposals only for its own goal, agent and turn"
                        )));
                    }
                    let report = admit_in_tx(tx, &source, &proposals, false, now)?;
                    super::monitor::record_turn_check_in_tx(
                        tx,
                        actor,
                        goal_id,
                        &todo_id,
                        agent_id,
                        monitor_observation.as_deref(),
                        now,
                    )?;
                    let todo_status_after = tx.todo(goal_id, &todo_id)?.map(|t| t.status);
                    EffectOutcome::Admitted {
                        report,
                        todo_status_after,
                    }
                }
                PhaseEffect::Spend => {
                    let req = SpendRequest {
                        goal_id: goal_id.to_string(),
                        agent_id: Some(agent_id.to_string()),
                        slots: 1,
                        effect_id: Some(format!("turn:{turn_key}")),
                    };
                    match spend_in_tx(tx, actor, &req, now) {
                        Err(e) if internal_error(&e) => return Err(e),
                        spent => EffectOutcome::Spent(spent.map(Box::new)),
                    }
                }
                PhaseEffect::Release(held) => {
                    let lease = match tx.todo(goal_id, &todo_id)? {
                        None => LeaseOutcome::TodoGone,
                        Some(t) => match t.claim {
                            None => LeaseOutcome::Cleared,
                            Some(c) => {
                                let ours = c.agent_id == agent_id
                                    && match held {
                                        LeaseHeld::Fence(f) => c.fence == f,
                                        LeaseHeld::ClaimedBy(at) => c.claimed_at <= at,
                                    };
                                if !ours {
                                    LeaseOutcome::NotHeld(c)
                                } else {
                                    let holder = Actor::Agent {
                                        agent_id: agent_id.to_string(),
                                        proof: Some(LeaseProof::Fence(c.fence)),
                                        turn_key: Some(turn_key.to_string()),
                                    };
                                    match release_in_tx(tx, &holder, goal_id, &todo_id, now) {
                                        Ok(_) => LeaseOutcome::Released(c),
                                        Err(e) if internal_error(&e) => return Err(e),
                                        Err(e) => LeaseOutcome::Refused(e),
                                    }
                                }
                            }
                        },
                    };
                    EffectOutcome::Lease(lease)
                }
            };
            let write = journal(outcome, now, &RunIds::new(tx))?;
            let settles = phase == Phase::TerminalCloseout;
            match write.settle {
                Some(JournalStatus::InProgress) | None if settles => {
                    return Err(LoopxError::internal(
                        "committing a turn phase",
                        anyhow::anyhow!("terminal_closeout must settle turn '{turn_key}'"),
                    ));
                }
                Some(_) if !settles => {
                    return Err(LoopxError::internal(
                        "committing a turn phase",
                        anyhow::anyhow!("only terminal_closeout settles turn '{turn_key}'"),
                    ));
                }
                _ => {}
            }
            if let Some(run) = &write.run {
                if run.goal_id != goal_id {
                    return Err(refused(format!(
                        "turn '{turn_key}' records runs only in its goal '{goal_id}'"
                    )));
                }
                record_run_in_tx(tx, actor, run)?;
            }
            let mut next = current.clone();
            next.phases.push(phase);
            if let Some(status) = write.settle {
                next.status = status;
            }
            next.data = write.data;
            next.data_error = None;
            next.updated_at = now;
            tx.upsert_turn(&next)?;
            log_op(
                tx,
                Some(goal_id),
                actor,
                "turn_phase",
                json!({"turn_key": turn_key, "phase": phase, "status": next.status}),
            )?;
            Ok(next)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::todo::NewTodo;
    use crate::model::TurnResultKind;

    fn agent(turn_key: &str) -> Actor {
        Actor::Agent {
            agent_id: "a1".into(),
            proof: None,
            turn_key: Some(turn_key.into()),
        }
    }

    /// A project with goal `g` and one ready todo `t1`.
    fn project() -> (tempfile::TempDir, Kernel) {
        let (dir, mut k) = crate::kernel::test_project::with_goal_g();
        let mut todo = NewTodo::task("do it");
        todo.id = Some("t1".into());
        k.add_todo(&Actor::Operator, "g", todo).unwrap();
        (dir, k)
    }

    /// Every operation-log entry of goal `g`, of `kind`.
    fn ops_of(k: &Kernel, kind: &str) -> Vec<crate::kernel::store::OpRecord> {
        k.read(|tx| tx.ops(Some("g"), 10_000))
            .unwrap()
            .into_iter()
            .filter(|o| o.kind == kind)
            .collect()
    }

    fn all_ops(k: &Kernel) -> usize {
        k.read(|tx| tx.ops(None, 10_000)).unwrap().len()
    }

    fn start(k: &mut Kernel, key: &str) -> TurnRecord {
        let start = StartTurn {
            turn_key: key.into(),
            goal_id: "g".into(),
            agent_id: "a1".into(),
            todo_id: None,
            ttl_seconds: 600,
        };
        match k
            .start_turn(&agent(key), &start, |_| Ok(json!({"n": 0})))
            .unwrap()
        {
            TurnStart::Started(rec) => rec,
            TurnStart::NotReady(d) => panic!("not started: {}", d.reason),
        }
    }

    /// The journal update every phase of this test writes: the phase's index, settling only on
    /// closeout.
    fn write(phase: Phase, n: usize) -> PhaseWrite {
        PhaseWrite {
            data: json!({ "n": n }),
            settle: (phase == Phase::TerminalCloseout)
                .then(|| TurnResultKind::ValidatedProgress.journal_status()),
            run: None,
        }
    }

    /// docs/state-model.md: every write appends one operation-log entry. The start and each of
    /// the six phase commits, including the three whose only effect is the journal row, append
    /// exactly one turn entry each, beside the entries of their state effects (claim, spend,
    /// release).
    #[test]
    fn start_and_every_phase_commit_append_one_operation_log_entry() {
        let (_dir, mut k) = project();
        let rec = start(&mut k, "turn-1");
        assert_eq!(rec.todo_id.as_deref(), Some("t1"));
        assert_eq!(ops_of(&k, "turn_start").len(), 1);
        assert_eq!(
            ops_of(&k, "claim").len(),
            1,
            "the claim is logged with the start"
        );
        let fence = k
            .read(|tx| tx.todo("g", "t1"))
            .unwrap()
            .and_then(|t| t.claim)
            .map(|c| c.fence)
            .expect("the start claimed t1");
        let phases = [
            (Phase::HostExecute, PhaseEffect::JournalOnly),
            (Phase::TypedResult, PhaseEffect::JournalOnly),
            (Phase::Validation, PhaseEffect::JournalOnly),
            (
                Phase::DurableWriteback,
                PhaseEffect::Admit {
                    source: ProposalSource {
                        goal_id: "g".into(),
                        agent_id: Some("a1".into()),
                        capability: "builtin:default".into(),
                        turn_key: Some("turn-1".into()),
                        revision: None,
                    },
                    proposals: Vec::new(),
                    monitor_observation: None,
                },
            ),
            (Phase::QuotaSpend, PhaseEffect::Spend),
            (
                Phase::TerminalCloseout,
                PhaseEffect::Release(LeaseHeld::Fence(fence)),
            ),
        ];
        let mut expected: Vec<Phase> = Vec::new();
        for (n, (phase, effect)) in phases.into_iter().enumerate() {
            let before: Vec<String> = ops_of(&k, "turn_phase").into_iter().map(|o| o.id).collect();
            let stored = k
                .commit_turn_phase(
                    &agent("turn-1"),
                    "turn-1",
                    &expected,
                    phase,
                    effect,
                    |_, _, _| Ok(write(phase, n)),
                )
                .unwrap();
            expected.push(phase);
            assert_eq!(stored.phases, expected);
            let logged = ops_of(&k, "turn_phase");
            assert_eq!(
                logged.len(),
                before.len() + 1,
                "{phase} appended one turn_phase entry"
            );
            // Ids of one millisecond are not ordered, so the new entry is the one not seen before.
            let last = logged.iter().find(|o| !before.contains(&o.id)).unwrap();
            assert_eq!(last.detail["phase"], json!(phase), "{phase}");
            assert_eq!(last.detail["turn_key"], "turn-1");
            assert_eq!(last.actor, "agent:a1");
        }
        assert_eq!(ops_of(&k, "quota_spend").len(), 1);
        assert_eq!(ops_of(&k, "claim_release").len(), 1);
        let rec = k.turn("turn-1").unwrap().unwrap();
        assert_eq!(rec.status, JournalStatus::Committed);
        assert_eq!(rec.data, json!({"n": 5}));
    }

    /// The compare-and-swap: a commit that expects other phases than the row has applies nothing
    /// and logs nothing; and only the turn's own agent, inside that turn, writes it.
    #[test]
    fn stale_phases_and_other_actors_write_nothing() {
        let (_dir, mut k) = project();
        start(&mut k, "turn-1");
        let before = all_ops(&k);
        let stale = k
            .commit_turn_phase(
                &agent("turn-1"),
                "turn-1",
                &[Phase::HostExecute],
                Phase::TypedResult,
                PhaseEffect::JournalOnly,
                |_, _, _| Ok(write(Phase::TypedResult, 1)),
            )
            .unwrap_err();
        assert_eq!(stale.exit_code(), 4, "{stale}");
        let others = [
            Actor::Operator,
            agent("turn-2"),
            Actor::Agent {
                agent_id: "a2".into(),
                proof: None,
                turn_key: Some("turn-1".into()),
            },
            Actor::Capability {
                capability: "x/y".into(),
                agent_id: Some("a1".into()),
            },
        ];
        for actor in &others {
            let err = k
                .commit_turn_phase(
                    actor,
                    "turn-1",
                    &[],
                    Phase::HostExecute,
                    PhaseEffect::JournalOnly,
                    |_, _, _| Ok(write(Phase::HostExecute, 1)),
                )
                .unwrap_err();
            assert_eq!(err.exit_code(), 1, "{actor:?}: {err}");
            let start = StartTurn {
                turn_key: "turn-9".into(),
                goal_id: "g".into(),
                agent_id: "a1".into(),
                todo_id: None,
                ttl_seconds: 600,
            };
            let err = k.start_turn(actor, &start, |_| Ok(json!({}))).unwrap_err();
            assert_eq!(err.exit_code(), 1, "{actor:?}: {err}");
        }
        assert_eq!(all_ops(&k), before, "refused commits logged something");
        let rec = k.turn("turn-1").unwrap().unwrap();
        assert!(rec.phases.is_empty());
        assert!(k.turn("turn-9").unwrap().is_none());
    }
}
