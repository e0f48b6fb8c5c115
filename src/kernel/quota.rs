//! Compute quota (layer 6): policy per goal and a spend/void ledger keyed by effect id.
//!
//! Spent slots are derived from the ledger over the rolling window, so a retried spend (same effect
//! id) cannot count twice: the insert is a no-op on the primary key and the command reports an
//! idempotent replay. The store keeps the window's net as an aggregate written in the same
//! transaction as each ledger row ([`move_window`]), so checking the quota costs the same after a
//! million spends as after ten.

use std::ops::RangeInclusive;

use serde::Serialize;
use serde_json::{Value, json};

use super::{Actor, Kernel, log_op, require_goal};
use crate::clock::now_ms;
use crate::error::{NextAction, Param, Result, bad_input, msg, not_found};
use crate::ids::validate_token;
use crate::model::{LedgerEntry, LedgerKind, QuotaPolicy, wire_enum};

/// `allowed_slots` and `per_agent_cap`: 0 pauses automatic turns.
pub const SLOT_COUNT: RangeInclusive<i128> = 0..=1_000_000;
/// `compute`: share of the window; 0 pauses automatic turns.
pub const COMPUTE: RangeInclusive<f64> = 0.0..=1000.0;
/// `window_hours`: at least 36 seconds.
pub const WINDOW_HOURS: RangeInclusive<f64> = 0.01..=10_000.0;
/// `slot_minutes`: at least 6 seconds, so a window never holds more slots than an `i64` counts
/// (`1e-300` once meant 2^63 slots, quota off).
pub const SLOT_MINUTES: RangeInclusive<f64> = 0.1..=10_000.0;

wire_enum!(
    /// Whether the quota lets an agent start a turn now, and if not, which limit stops it.
    QuotaState {
        /// Slots remain in the window (and under the agent's cap).
        Eligible => "eligible",
        /// The window's slots are used up (spent or held by running turns).
        Throttled => "throttled",
        /// This agent used up its per-agent cap; others may still run.
        AgentCapped => "agent_capped",
        /// Compute 0 (or no slots at all): automatic turns are off until an operator sets a quota.
        Paused => "paused",
    }
);

/// The quota situation of a goal (and optionally one agent) right now.
#[derive(Debug, Clone, Serialize)]
pub struct QuotaView {
    pub allowed_slots: i64,
    pub spent_slots: i64,
    /// Slots held by running turns that have not spent yet (each turn reserves one when it
    /// starts and turns it into a spend, or gives it back, when it settles).
    pub reserved_slots: i64,
    pub remaining_slots: i64,
    pub agent_spent_slots: Option<i64>,
    pub agent_reserved_slots: Option<i64>,
    pub per_agent_cap: Option<i64>,
    pub state: QuotaState,
    pub policy: QuotaPolicy,
}

impl QuotaView {
    /// `reserved` is `(the goal's, the agent's)` slots held by running turns; they count
    /// against both limits exactly like spent ones.
    pub fn new(
        policy: &QuotaPolicy,
        spent: i64,
        agent_spent: Option<i64>,
        reserved: (i64, i64),
    ) -> QuotaView {
        let allowed = policy.allowed_slots();
        let (reserved, agent_reserved) = reserved;
        let agent_reserved = agent_spent.map(|_| agent_reserved);
        let state = if policy.compute <= 0.0 && policy.allowed_slots.is_none() || allowed <= 0 {
            QuotaState::Paused
        } else if spent + reserved >= allowed {
            QuotaState::Throttled
        } else if let (Some(cap), Some(a), Some(r)) =
            (policy.per_agent_cap, agent_spent, agent_reserved)
            && a + r >= cap
        {
            QuotaState::AgentCapped
        } else {
            QuotaState::Eligible
        };
        QuotaView {
            allowed_slots: allowed,
            spent_slots: spent,
            reserved_slots: reserved,
            remaining_slots: (allowed - spent - reserved).max(0),
            agent_spent_slots: agent_spent,
            agent_reserved_slots: agent_reserved,
            per_agent_cap: policy.per_agent_cap,
            state,
            policy: policy.clone(),
        }
    }

    /// The goal's view without an agent's figures, as `view_in_tx` reads it with no agent:
    /// the goal's spent and reserved slots do not depend on which agent asked.
    pub fn goal_view(&self) -> QuotaView {
        QuotaView::new(
            &self.policy,
            self.spent_slots,
            None,
            (self.reserved_slots, 0),
        )
    }

    pub fn to_json(&self) -> Value {
        json!({
            "allowed_slots": self.allowed_slots,
            "spent_slots": self.spent_slots,
            "reserved_slots": self.reserved_slots,
            "remaining_slots": self.remaining_slots,
            "agent_spent_slots": self.agent_spent_slots,
            "agent_reserved_slots": self.agent_reserved_slots,
            "per_agent_cap": self.per_agent_cap,
            "state": self.state,
            "policy": self.policy,
        })
    }
}

/// How many equal spans of time `quota show` splits the rolling window into for its spend
/// series: half-hours of the default day-long window, and an answer that stays small.
pub const SPEND_SERIES_BUCKETS: usize = 48;

/// A goal's net spend over its current rolling window, in [`SPEND_SERIES_BUCKETS`] equal spans
/// of time, oldest first: what the dashboard plots against the limit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpendSeries {
    /// The window's start (ms): the first bucket starts here.
    pub from: i64,
    /// The millisecond after now: the last bucket ends here (exclusive), so a spend made at the
    /// moment of the read is in it.
    pub to: i64,
    /// Net slots (spends minus voids) of the ledger rows dated in each bucket.
    pub net_slots: Vec<i64>,
}

impl SpendSeries {
    pub fn to_json(&self) -> Value {
        let buckets = self.net_slots.len().max(1) as f64;
        json!({
            "window_start": crate::clock::rfc3339(self.from),
            "window_end": crate::clock::rfc3339(self.to),
            // To the millisecond: the span is the window plus the millisecond of now, split.
            "bucket_seconds": ((self.to - self.from) as f64 / buckets).round() / 1000.0,
            "net_slots": self.net_slots,
        })
    }
}

/// The goal's [`SpendSeries`] at `now`, over the window its policy sets.
pub(crate) fn spend_series_in_tx(
    tx: &dyn crate::kernel::store::StoreRead,
    goal_id: &str,
    now: i64,
) -> Result<SpendSeries> {
    let policy = tx.quota_policy(goal_id)?.unwrap_or_default();
    let (from, to) = (now - policy.window_ms(), now + 1);
    let mut net_slots = tx.spend_series(goal_id, from, to, SPEND_SERIES_BUCKETS)?;
    // Rows dated after this read (spent while the clock was ahead, before it was set back)
    // count in the window's total; the last span shows them, so the spans still sum to it.
    if let Some(last) = net_slots.last_mut() {
        *last += tx
            .spend_series(goal_id, to, i64::MAX, 1)?
            .iter()
            .sum::<i64>();
    }
    Ok(SpendSeries {
        from,
        to,
        net_slots,
    })
}

/// Changes to a goal's policy; unset fields keep their value.
#[derive(Debug, Clone, Default)]
pub struct PolicyPatch {
    pub compute: Option<f64>,
    pub window_hours: Option<f64>,
    pub slot_minutes: Option<f64>,
    pub allowed_slots: Option<i64>,
    pub per_agent_cap: Option<i64>,
    pub clear_allowed_slots: bool,
    pub clear_per_agent_cap: bool,
}

/// A spend request.
#[derive(Debug, Clone)]
pub struct SpendRequest {
    pub goal_id: String,
    pub agent_id: Option<String>,
    pub slots: i64,
    /// Idempotency key; defaults to `run:<latest run of the goal (for the agent)>`.
    pub effect_id: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SpendReceipt {
    pub entry: LedgerEntry,
    /// True when this effect id was already spent; nothing new was written.
    pub idempotent_replay: bool,
    pub before: QuotaView,
    pub after: QuotaView,
}

pub(crate) fn view_in_tx(
    tx: &dyn crate::kernel::store::StoreRead,
    goal_id: &str,
    agent_id: Option<&str>,
    now: i64,
) -> Result<QuotaView> {
    let policy = tx.quota_policy(goal_id)?.unwrap_or_default();
    let since = now - policy.window_ms();
    let spent = tx.spent_since(goal_id, since, None)?;
    let agent_spent = match agent_id {
        Some(a) => Some(tx.spent_since(goal_id, since, Some(a))?),
        None => None,
    };
    let reserved = tx.reserved_slots(goal_id, agent_id)?;
    Ok(QuotaView::new(&policy, spent, agent_spent, reserved))
}

/// Moves the store's count of the goal's window (and `agent_id`'s) up to the window's start at
/// `now`, inside a write that is about to read it: the rows that left the window since the last
/// move are taken off once, here, instead of by every later read.
pub(crate) fn move_window(
    tx: &dyn crate::kernel::store::StoreTx,
    goal_id: &str,
    agent_id: Option<&str>,
    now: i64,
) -> Result<()> {
    let policy = tx.quota_policy(goal_id)?.unwrap_or_default();
    tx.move_quota_window(goal_id, agent_id, now - policy.window_ms())
}

fn check_effect_id(effect_id: &str) -> Result<()> {
    let ok = !effect_id.is_empty()
        && effect_id.len() <= 200
        && effect_id.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'/' | b'@')
        });
    if ok {
        Ok(())
    } else {
        Err(bad_input(format!(
            "invalid effect id '{effect_id}': use 1-200 letters, digits and . _ - : / @"
        )))
    }
}

fn check_spend_request(req: &SpendRequest) -> Result<()> {
    if req.slots < 1 || req.slots > 10_000 {
        return Err(bad_input(msg![
            Param::Slots,
            format!(" {} is out of range: use 1..=10000", req.slots)
        ]));
    }
    if let Some(a) = &req.agent_id {
        validate_token("agent id", a)?;
    }
    if let Some(e) = &req.effect_id {
        check_effect_id(e)?;
    }
    Ok(())
}

/// Records a spend inside the caller's transaction, once per effect id (shared by
/// [`Kernel::spend`] and the turn driver, which spends in the same transaction as its journal
/// phase). Validates like `Kernel::spend`.
pub(crate) fn spend_in_tx(
    tx: &dyn crate::kernel::store::StoreTx,
    actor: &Actor,
    req: &SpendRequest,
    now: i64,
) -> Result<SpendReceipt> {
    check_spend_request(req)?;
    require_goal(tx, &req.goal_id)?;
    let (effect_id, run_id) = match &req.effect_id {
        Some(e) => (e.clone(), None),
        None => {
            let run_id = tx
                .latest_run_id(&req.goal_id, req.agent_id.as_deref())?
                .ok_or_else(|| {
                    not_found(msg![
                        format!(
                            "no run to spend for in goal '{}'{}: run ",
                            req.goal_id,
                            req.agent_id
                                .as_ref()
                                .map(|a| format!(" by agent '{a}'"))
                                .unwrap_or_default()
                        ),
                        NextAction::RecordRun {
                            goal_id: req.goal_id.clone()
                        },
                        " after the work, or pass ",
                        Param::EffectId
                    ])
                })?;
            (format!("run:{run_id}"), Some(run_id))
        }
    };
    move_window(tx, &req.goal_id, req.agent_id.as_deref(), now)?;
    let before = view_in_tx(tx, &req.goal_id, req.agent_id.as_deref(), now)?;
    if let Some(existing) = tx.ledger_entry(&effect_id)? {
        if existing.goal_id != req.goal_id {
            return Err(crate::error::conflict(format!(
                "effect id '{effect_id}' was already used by goal '{}'",
                existing.goal_id
            )));
        }
        return Ok(SpendReceipt {
            entry: existing,
            idempotent_replay: true,
            after: before.clone(),
            before,
        });
    }
    let entry = LedgerEntry {
        effect_id: effect_id.clone(),
        goal_id: req.goal_id.clone(),
        agent_id: req.agent_id.clone(),
        run_id,
        slots: req.slots,
        kind: LedgerKind::Spend,
        voids_effect_id: None,
        created_at: now,
    };
    tx.insert_ledger(&entry)?;
    log_op(
        tx,
        Some(&req.goal_id),
        actor,
        "quota_spend",
        json!({"effect_id": effect_id, "slots": req.slots}),
    )?;
    let after = view_in_tx(tx, &req.goal_id, req.agent_id.as_deref(), now)?;
    Ok(SpendReceipt {
        entry,
        idempotent_replay: false,
        before,
        after,
    })
}

/// What `quota show` reads in one snapshot at one `now`: the view, the newest ledger rows and the
/// window's spend series (which therefore sums to the view's spent slots).
#[derive(Debug, Clone)]
pub struct QuotaReport {
    pub view: QuotaView,
    /// The newest [`QuotaReport::LEDGER_ROWS`] ledger rows, newest first.
    pub recent_ledger: Vec<LedgerEntry>,
    pub spend_series: SpendSeries,
}

impl QuotaReport {
    pub const LEDGER_ROWS: usize = 20;
}

impl Kernel {
    /// The goal's quota as `agent_id` (or the goal as a whole) sees it now.
    pub fn quota(&self, goal_id: &str, agent_id: Option<&str>) -> Result<QuotaReport> {
        // Checked as `should-run` checks it: an id no agent can have is bad input, not a view.
        if let Some(agent) = agent_id {
            crate::ids::validate_token("agent id", agent)?;
        }
        self.read(|tx| {
            require_goal(tx, goal_id)?;
            let now = now_ms();
            Ok(QuotaReport {
                view: view_in_tx(tx, goal_id, agent_id, now)?,
                recent_ledger: tx.recent_ledger(goal_id, QuotaReport::LEDGER_ROWS)?,
                spend_series: spend_series_in_tx(tx, goal_id, now)?,
            })
        })
    }

    /// Sets policy fields. Operators only: an agent cannot raise its own budget.
    pub fn set_quota(
        &mut self,
        actor: &Actor,
        goal_id: &str,
        patch: PolicyPatch,
    ) -> Result<QuotaView> {
        actor.require_operator("set quota policy")?;
        for (param, v, range) in [
            (Param::Compute, patch.compute, &COMPUTE),
            (Param::WindowHours, patch.window_hours, &WINDOW_HOURS),
            (Param::SlotMinutes, patch.slot_minutes, &SLOT_MINUTES),
        ] {
            if let Some(v) = v
                && !range.contains(&v)
            {
                return Err(bad_input(msg![
                    param,
                    format!(
                        " is out of range; the valid range is {}..={}",
                        range.start(),
                        range.end()
                    )
                ]));
            }
        }
        for (param, v) in [
            (Param::AllowedSlots, patch.allowed_slots),
            (Param::PerAgentCap, patch.per_agent_cap),
        ] {
            if let Some(v) = v
                && !SLOT_COUNT.contains(&i128::from(v))
            {
                return Err(bad_input(msg![
                    param,
                    format!(
                        " is out of range; the valid range is {}..={}",
                        SLOT_COUNT.start(),
                        SLOT_COUNT.end()
                    )
                ]));
            }
        }
        let now = now_ms();
        let view = self.write(|tx| {
            require_goal(tx, goal_id)?;
            let mut p = tx.quota_policy(goal_id)?.unwrap_or_default();
            if let Some(v) = patch.compute {
                p.compute = v;
            }
            if let Some(v) = patch.window_hours {
                p.window_hours = v;
            }
            if let Some(v) = patch.slot_minutes {
                p.slot_minutes = v;
            }
            if patch.clear_allowed_slots {
                p.allowed_slots = None;
            }
            if let Some(v) = patch.allowed_slots {
                p.allowed_slots = Some(v);
            }
            if patch.clear_per_agent_cap {
                p.per_agent_cap = None;
            }
            if let Some(v) = patch.per_agent_cap {
                p.per_agent_cap = Some(v);
            }
            // Compute 0 or 0 allowed slots pause the goal on purpose; a window too short for one
            // slot would pause it without anyone having asked.
            if p.compute > 0.0 && p.allowed_slots.is_none() && p.allowed_slots() == 0 {
                return Err(bad_input(msg![
                    format!(
                        "this quota would give the goal no slot: {}; set ",
                        p.why_no_slots().unwrap_or_default()
                    ),
                    Param::SlotMinutes,
                    format!(
                        " to at most {} minutes, or a longer ",
                        p.compute * p.window_hours * 60.0
                    ),
                    Param::WindowHours,
                    " (to pause the goal, set ",
                    Param::Compute,
                    " to 0)"
                ]));
            }
            tx.set_quota_policy(goal_id, &p)?;
            move_window(tx, goal_id, None, now)?;
            log_op(tx, Some(goal_id), actor, "quota_set", json!(p))?;
            view_in_tx(tx, goal_id, None, now)
        })?;
        self.reproject_quota(goal_id, &view, now);
        Ok(view)
    }

    /// Records compute spent, once per effect id, and rewrites the goal's projections (their
    /// quota section shows the spend) after the commit, like every write they show.
    pub fn spend(&mut self, actor: &Actor, req: &SpendRequest) -> Result<SpendReceipt> {
        check_spend_request(req)?;
        let now = now_ms();
        let receipt = self.write(|tx| spend_in_tx(tx, actor, req, now))?;
        if !receipt.idempotent_replay {
            self.reproject_quota(&req.goal_id, &receipt.after.goal_view(), now);
        }
        Ok(receipt)
    }

    /// Cancels an earlier spend (operators only). Idempotent per voided effect id.
    pub fn void_spend(
        &mut self,
        actor: &Actor,
        goal_id: &str,
        effect_id: &str,
    ) -> Result<SpendReceipt> {
        actor.require_operator("void a quota spend")?;
        check_effect_id(effect_id)?;
        let now = now_ms();
        let receipt = self.write(|tx| {
            require_goal(tx, goal_id)?;
            let spend = tx
                .ledger_entry(effect_id)?
                .filter(|e| e.goal_id == goal_id && e.kind == LedgerKind::Spend)
                .ok_or_else(|| {
                    not_found(format!(
                        "no spend with effect id '{effect_id}' in goal '{goal_id}'"
                    ))
                })?;
            let void_id = format!("void:{effect_id}");
            let before = view_in_tx(tx, goal_id, None, now)?;
            if let Some(existing) = tx.ledger_entry(&void_id)? {
                return Ok(SpendReceipt {
                    entry: existing,
                    idempotent_replay: true,
                    after: before.clone(),
                    before,
                });
            }
            let entry = LedgerEntry {
                effect_id: void_id,
                goal_id: goal_id.to_string(),
                agent_id: spend.agent_id.clone(),
                run_id: spend.run_id.clone(),
                slots: -spend.slots,
                kind: LedgerKind::Void,
                voids_effect_id: Some(effect_id.to_string()),
                // Dated like the spend it cancels, so it leaves the window together with it.
                created_at: spend.created_at,
            };
            tx.insert_ledger(&entry)?;
            log_op(
                tx,
                Some(goal_id),
                actor,
                "quota_void",
                json!({"effect_id": effect_id}),
            )?;
            let after = view_in_tx(tx, goal_id, None, now)?;
            Ok(SpendReceipt {
                entry,
                idempotent_replay: false,
                before,
                after,
            })
        })?;
        if !receipt.idempotent_replay {
            self.reproject_quota(goal_id, &receipt.after.goal_view(), now);
        }
        Ok(receipt)
    }

    /// Rewrites the goal's projections after a committed quota change: their quota section
    /// shows it, like every other write they show. `view` is the goal's quota as the change's
    /// transaction left it, read at `now`.
    fn reproject_quota(&mut self, goal_id: &str, view: &QuotaView, now: i64) {
        let files = self.refresh_goal_quota(goal_id, view, now);
        self.after_commit("writing the goal's state files", files);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel holds its own ranges: a library caller cannot turn quota off with a slot of
    /// 1e-300 minutes any more than the CLI can.
    #[test]
    fn policy_values_outside_their_ranges_are_refused_by_the_kernel() {
        let (_dir, mut k) = crate::kernel::test_project::with_goal_g();
        let before = k.quota("g", None).unwrap().view;
        let bad = [
            PolicyPatch {
                slot_minutes: Some(1e-300),
                ..PolicyPatch::default()
            },
            PolicyPatch {
                window_hours: Some(f64::NAN),
                ..PolicyPatch::default()
            },
            PolicyPatch {
                compute: Some(f64::INFINITY),
                ..PolicyPatch::default()
            },
            PolicyPatch {
                allowed_slots: Some(-1),
                ..PolicyPatch::default()
            },
            PolicyPatch {
                per_agent_cap: Some(i64::MAX),
                ..PolicyPatch::default()
            },
        ];
        for patch in bad {
            let err = k
                .set_quota(&Actor::Operator, "g", patch.clone())
                .unwrap_err();
            assert_eq!(err.exit_code(), 2, "{patch:?}: {err}");
            assert!(err.to_string().contains("valid range"), "{err}");
        }
        assert_eq!(
            k.quota("g", None).unwrap().view.allowed_slots,
            before.allowed_slots
        );
        k.set_quota(
            &Actor::Operator,
            "g",
            PolicyPatch {
                slot_minutes: Some(0.1),
                ..PolicyPatch::default()
            },
        )
        .unwrap();
    }

    /// A spend's view seen without its agent is the goal's view as a read with no agent gives
    /// it (what the state files show), even when the agent's cap decides the agent's state.
    #[test]
    fn a_spend_view_without_its_agent_is_the_goal_view() {
        let (_dir, mut k) = crate::kernel::test_project::with_goal_g();
        k.set_quota(
            &Actor::Operator,
            "g",
            PolicyPatch {
                per_agent_cap: Some(2),
                ..PolicyPatch::default()
            },
        )
        .unwrap();
        let receipt = k
            .spend(
                &Actor::Operator,
                &SpendRequest {
                    goal_id: "g".into(),
                    agent_id: Some("a".into()),
                    slots: 2,
                    effect_id: Some("e".into()),
                },
            )
            .unwrap();
        assert_eq!(receipt.after.state, QuotaState::AgentCapped);
        let goal = k.quota("g", None).unwrap().view;
        assert_eq!(goal.state, QuotaState::Eligible);
        assert_eq!(receipt.after.goal_view().to_json(), goal.to_json());
    }

    /// `quota show`'s series covers the policy's window in 48 buckets ending now, holds a spend
    /// made just before in its last bucket, nets a void against its spend, and sums to the
    /// view's spent slots read in the same snapshot; a window set shorter moves its start.
    #[test]
    fn the_spend_series_covers_the_window_and_sums_to_the_spent_slots() {
        let (_dir, mut k) = crate::kernel::test_project::with_goal_g();
        for (effect, slots) in [("e1", 2), ("e2", 3)] {
            k.spend(
                &Actor::Operator,
                &SpendRequest {
                    goal_id: "g".into(),
                    agent_id: Some("a".into()),
                    slots,
                    effect_id: Some(effect.into()),
                },
            )
            .unwrap();
        }
        k.void_spend(&Actor::Operator, "g", "e1").unwrap();
        let QuotaReport {
            view,
            spend_series: series,
            ..
        } = k.quota("g", None).unwrap();
        assert_eq!(series.net_slots.len(), SPEND_SERIES_BUCKETS);
        let window = QuotaPolicy::default().window_ms();
        assert_eq!(series.to - series.from, window + 1);
        assert_eq!(series.net_slots.iter().sum::<i64>(), view.spent_slots);
        assert_eq!(view.spent_slots, 3);
        assert_eq!(series.net_slots[SPEND_SERIES_BUCKETS - 1], 3);
        assert!(
            series.net_slots[..SPEND_SERIES_BUCKETS - 1]
                .iter()
                .all(|&n| n == 0)
        );
        let json = series.to_json();
        assert_eq!(
            json["net_slots"].as_array().unwrap().len(),
            SPEND_SERIES_BUCKETS
        );
        assert_eq!(json["bucket_seconds"], 1800.0);
        k.set_quota(
            &Actor::Operator,
            "g",
            PolicyPatch {
                window_hours: Some(1.0),
                ..PolicyPatch::default()
            },
        )
        .unwrap();
        let series = k.quota("g", None).unwrap().spend_series;
        assert_eq!(series.to - series.from, 3_600_000 + 1);
    }
}
