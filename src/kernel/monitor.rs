//! Scheduled monitors: adding and changing them, claiming a due check, recording a check's
//! observation, and the sweep that ends monitors past `--until` and resumes deferred todos.
//!
//! A check keeps only the digest of its observation: the same digest as the last check is a quiet
//! check (counted, no evidence row), a different one is a material change (one evidence row and
//! the monitor's declared follow-up, in the same transaction). Quiet checks back off the cadence
//! ([`Monitor::backoff_factor`]). A check never completes the monitor; it ends when `--until`
//! passes (the sweep archives it) or an operator archives it. Overlapping heartbeats never run one
//! due check twice: [`Kernel::claim_check`] moves the due time forward and bumps `check_seq` in
//! the transaction that claims it, so a second claimer finds the monitor not due, and a result
//! carrying a superseded `check_seq` is refused. The schedule view the decision reads
//! ([`schedule_in_tx`]) is a pure read of the same rows.

use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::todo::write::{MAX_TEXT, NewTodo, add_evidence, check_len, insert_new_todo};
use super::{Actor, Kernel, log_op, require_goal, require_todo, require_unclosed_goal};
use crate::clock::now_ms;
use crate::error::{Message, Param, Part, Result, bad_input, conflict, msg, refused};
use crate::ids::validate_token;
use crate::kernel::store::{ActiveMonitor, StoreRead, StoreTx};
use crate::model::monitor::{DEFAULT_MAX_NO_CHANGE, MAX_EVERY_MS, MIN_EVERY_MS};

/// The fields that only a monitor's schedule takes (`until` also ends a deferral).
const SCHEDULE_FIELDS: [Param; 7] = [
    Param::Every,
    Param::Until,
    Param::Target,
    Param::OnChange,
    Param::WatchOnly,
    Param::MaxNoChange,
    Param::Probe,
];

/// `prefix` + "every, until, ... and probe" + `suffix`, the fields as values.
fn schedule_fields_message(prefix: String, fields: &[Param], suffix: &str) -> Message {
    let mut parts = vec![Part::from(prefix)];
    for (i, field) in fields.iter().enumerate() {
        if i > 0 {
            parts.push(Part::from(if i + 1 == fields.len() {
                " and "
            } else {
                ", "
            }));
        }
        parts.push(Part::from(*field));
    }
    parts.push(Part::from(suffix));
    Message::from_parts(parts)
}
use crate::model::{
    CheckResult, GoalStatus, Monitor, MonitorFollowUp, Priority, ProbeSpec, Todo, TodoKind,
    TodoStatus,
};

/// Most quiet checks `--max-no-change` may allow before backoff.
pub const MAX_NO_CHANGE_LIMIT: i64 = 10_000;
/// Longest observation a check records (its digest covers all of it; evidence keeps this much).
pub const MAX_OBSERVATION: usize = MAX_TEXT;

/// The schedule a new monitor gets (`todo add --kind monitor`).
#[derive(Debug, Clone, PartialEq)]
pub struct MonitorSpec {
    pub every_ms: i64,
    pub until_at: Option<i64>,
    pub target: Option<String>,
    pub follow_up: MonitorFollowUp,
    pub max_no_change: i64,
    pub probe: Option<ProbeSpec>,
}

impl MonitorSpec {
    pub fn every(every_ms: i64) -> MonitorSpec {
        MonitorSpec {
            every_ms,
            until_at: None,
            target: None,
            follow_up: MonitorFollowUp::OpenTodo,
            max_no_change: DEFAULT_MAX_NO_CHANGE,
            probe: None,
        }
    }
}

/// Schedule changes requested by `todo update` on a monitor (absent fields stay).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MonitorPatch {
    pub every_ms: Option<i64>,
    pub until_at: Option<i64>,
    pub target: Option<String>,
    pub follow_up: Option<MonitorFollowUp>,
    pub max_no_change: Option<i64>,
    pub probe: Option<ProbeSpec>,
}

impl MonitorPatch {
    pub fn is_empty(&self) -> bool {
        self == &MonitorPatch::default()
    }
}

/// What a check observed.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// The observed value, compared by digest with the last check's.
    Value(String),
    /// No observation: why the check failed (provider failure, timeout, disabled).
    Failed(String),
}

/// A claimed check (see [`Kernel::claim_check`]): the result must carry this `check_seq`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckTicket {
    pub goal_id: String,
    pub todo_id: String,
    pub check_seq: i64,
    pub probe: Option<ProbeSpec>,
}

/// What recording a check did.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub monitor: Monitor,
    pub result: CheckResult,
    pub digest: Option<String>,
    /// The one evidence row a material change recorded.
    pub evidence_id: Option<i64>,
    /// The todo a material change opened (`open_todo` and `replan` follow-ups).
    pub follow_up_todo: Option<String>,
}

/// What a sweep changed.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SweepReport {
    /// Monitors archived because their `--until` passed.
    pub ended_monitors: Vec<String>,
    /// Deferred todos whose resume time came, now open again.
    pub resumed_todos: Vec<String>,
}

impl SweepReport {
    pub fn is_empty(&self) -> bool {
        self.ended_monitors.is_empty() && self.resumed_todos.is_empty()
    }
}

/// The monitors part of a decision at one instant (a pure read).
#[derive(Debug, Clone, Default)]
pub struct ScheduleView {
    /// The due monitor checked first: earliest due time, unclaimed, not past `--until`.
    pub due: Option<ActiveMonitor>,
    /// The earliest due time after `now` of a monitor not past `--until`.
    pub next_due_at: Option<i64>,
    /// Monitors whose todo is not terminal (past `--until` included, until the sweep ends them).
    pub active: i64,
}

/// The sha256 of an observation, hex.
pub fn digest(observation: &str) -> String {
    hex::encode(Sha256::digest(observation.as_bytes()))
}

/// What an observation is next to the last one's digest, and its own digest: the one rule monitor
/// checks and goal probes share (`baseline` without a last digest, `unchanged` for the same one,
/// `changed` otherwise).
pub fn classify(last_digest: Option<&str>, observation: &str) -> (CheckResult, String) {
    let d = digest(observation);
    let result = match last_digest {
        None => CheckResult::Baseline,
        Some(last) if last == d => CheckResult::Unchanged,
        Some(_) => CheckResult::Changed,
    };
    (result, d)
}

/// Whether a monitor whose todo has `status` may have a check run: open, or claimed (the claim
/// itself is judged apart). A blocked monitor waits for its repair and a deferred one for its
/// resume time; a check scheduled for either would be handed to an agent whose claim is then
/// refused, stopping every turn on the goal.
fn checkable(status: TodoStatus) -> bool {
    matches!(status, TodoStatus::Open | TodoStatus::Claimed)
}

/// Reads the goal's monitor schedule at `now`. Visits monitors by stored due time and stops once
/// no later one can be due earlier than the best found (a monitor's due time is never before its
/// stored one), so a goal with many quiet monitors reads a few rows.
pub(crate) fn schedule_in_tx(tx: &dyn StoreRead, goal_id: &str, now: i64) -> Result<ScheduleView> {
    let active = tx.active_monitor_count(goal_id)?;
    let mut view = ScheduleView {
        active,
        ..ScheduleView::default()
    };
    if active == 0 {
        return Ok(view);
    }
    let mut best_due: Option<i64> = None;
    tx.visit_active_monitors(goal_id, &mut |m| {
        // Later rows are stored due no earlier than this one, and due no earlier than stored.
        let stored = m.monitor.next_due_at;
        if stored > now && view.next_due_at.is_some_and(|n| stored >= n) {
            return Ok(false);
        }
        if m.monitor.expired(now) || !checkable(m.todo_status) {
            return Ok(true);
        }
        let claimed =
            m.todo_status == TodoStatus::Claimed && m.claim_expires_at.is_some_and(|e| e > now);
        let due = m.due_at();
        if due <= now {
            if !claimed && best_due.is_none_or(|b| due < b) {
                best_due = Some(due);
                view.due = Some(m.clone());
            }
        } else if view.next_due_at.is_none_or(|n| due < n) {
            view.next_due_at = Some(due);
        }
        Ok(true)
    })?;
    Ok(view)
}

fn check_spec(spec: &MonitorSpec, now: i64) -> Result<()> {
    if !(MIN_EVERY_MS..=MAX_EVERY_MS).contains(&spec.every_ms) {
        return Err(bad_input(msg![
            "a monitor's cadence (",
            Param::Every,
            if spec.every_ms > MAX_EVERY_MS {
                // A duration too long to represent arrives saturated: its number means nothing.
                ") must be between 1s and 30d (got more than 30d)".to_string()
            } else {
                format!(") must be between 1s and 30d (got {} ms)", spec.every_ms)
            }
        ]));
    }
    if let Some(until) = spec.until_at
        && until <= now
    {
        return Err(bad_input(msg![
            Param::Until,
            format!(
                " {} is not in the future; pass a later time",
                crate::clock::rfc3339(until)
            )
        ]));
    }
    if !(0..=MAX_NO_CHANGE_LIMIT).contains(&spec.max_no_change) {
        return Err(bad_input(msg![
            Param::MaxNoChange,
            format!(" must be between 0 and {MAX_NO_CHANGE_LIMIT}")
        ]));
    }
    if let Some(t) = &spec.target
        && (t.trim().is_empty() || t.len() > 500)
    {
        return Err(bad_input(msg![
            "a monitor's ",
            Param::Target,
            " must be 1 to 500 bytes"
        ]));
    }
    if let Some(p) = &spec.probe {
        check_probe(p)?;
    }
    Ok(())
}

/// A probe names `<extension>/<provider>`, an operation token and a target of at most 4 KiB.
pub fn check_probe(p: &ProbeSpec) -> Result<()> {
    let ok = p.provider.split_once('/').is_some_and(|(e, v)| {
        validate_token("extension", e).is_ok() && validate_token("provider", v).is_ok()
    });
    if !ok {
        return Err(bad_input(format!(
            "invalid probe provider '{}': use <extension>/<provider>, e.g. fs-observe/fs-observe",
            crate::inert::line(&p.provider)
        )));
    }
    validate_token("probe operation", &p.operation)?;
    if p.target.is_empty() || p.target.len() > 4096 {
        return Err(bad_input("the probe target must be 1 to 4096 bytes"));
    }
    Ok(())
}

/// Refuses to complete a scheduled monitor (shared with `todo update` and admission's
/// completions): a check never completes it; it ends at `--until` or when an operator archives it.
pub(crate) fn refuse_completion(tx: &dyn StoreRead, todo: &Todo) -> Result<()> {
    if todo.kind == TodoKind::Monitor && tx.monitor(&todo.goal_id, &todo.id)?.is_some() {
        return Err(refused(format!(
            "todo '{}' of goal '{}' is a scheduled monitor; a check never completes it. Record a \
             check of it (todo check), or archive it (todo update, status archived)",
            todo.id, todo.goal_id
        )));
    }
    Ok(())
}

/// Applies `patch` to the monitor of `todo` (inside `todo update`'s transaction).
pub(crate) fn apply_patch_in_tx(
    tx: &dyn StoreTx,
    todo: &Todo,
    patch: &MonitorPatch,
    now: i64,
) -> Result<Option<Monitor>> {
    if patch.is_empty() {
        return Ok(None);
    }
    let Some(mut m) = tx.monitor(&todo.goal_id, &todo.id)? else {
        return Err(bad_input(schedule_fields_message(
            format!("todo '{}' is not a scheduled monitor; ", todo.id),
            &SCHEDULE_FIELDS[..1]
                .iter()
                .chain(&SCHEDULE_FIELDS[2..])
                .copied()
                .collect::<Vec<_>>(),
            " apply to monitors (add one of kind monitor with a cadence)",
        )));
    };
    let mut spec = MonitorSpec {
        every_ms: patch.every_ms.unwrap_or(m.every_ms),
        until_at: patch.until_at.or(m.until_at),
        target: patch.target.clone().or(m.target.clone()),
        follow_up: patch.follow_up.unwrap_or(m.follow_up),
        max_no_change: patch.max_no_change.unwrap_or(m.max_no_change),
        probe: patch.probe.clone().or(m.probe.clone()),
    };
    check_spec(&spec, now)?;
    if spec.every_ms != m.every_ms
        && let Some(last) = m.last_check_at
    {
        // A new cadence counts from the last check. A monitor never checked keeps its first
        // check (the baseline) where it is: due at once from its creation.
        m.next_due_at = last.saturating_add(spec.every_ms);
    }
    m.every_ms = spec.every_ms;
    m.until_at = spec.until_at;
    m.target = spec.target.take();
    m.follow_up = spec.follow_up;
    m.max_no_change = spec.max_no_change;
    m.probe = spec.probe.take();
    m.updated_at = now;
    tx.upsert_monitor(&m)?;
    Ok(Some(m))
}

/// Records `observation` as a check of the monitor `todo` at `now` (see the module docs).
fn record_in_tx(
    tx: &dyn StoreTx,
    actor: &Actor,
    todo: &Todo,
    mut m: Monitor,
    observation: &Observation,
    now: i64,
) -> Result<CheckReport> {
    m.checks += 1;
    m.last_check_at = Some(now);
    m.checked_fence = todo.last_fence;
    m.updated_at = now;
    let mut report_digest = None;
    let mut evidence_id = None;
    let mut follow_up_todo = None;
    let result = match observation {
        Observation::Failed(reason) => {
            m.failures += 1;
            m.last_failure = Some(truncate(reason, 2000).to_string());
            m.last_result = Some(CheckResult::Failed);
            // Retried on the base cadence; the quiet count and the digest stay as they were.
            m.next_due_at = now + m.every_ms;
            CheckResult::Failed
        }
        Observation::Value(text) => {
            let (result, d) = classify(m.last_digest.as_deref(), text);
            match result {
                CheckResult::Unchanged => m.no_change_count += 1,
                _ => m.no_change_count = 0,
            }
            m.material_change = result == CheckResult::Changed;
            m.failures = 0;
            m.last_failure = None;
            m.last_result = Some(result);
            m.last_digest = Some(d.clone());
            m.next_due_at = now + m.interval_ms();
            if result == CheckResult::Changed {
                let text = format!(
                    "monitor '{}' saw a material change{}: {}",
                    todo.id,
                    m.target
                        .as_deref()
                        .map(|t| format!(" on {t}"))
                        .unwrap_or_default(),
                    truncate(text, MAX_TEXT - 600)
                );
                evidence_id = Some(add_evidence(
                    tx,
                    todo,
                    actor,
                    &text,
                    Some((format!("monitor:{}", todo.id), Some(d.clone()))),
                    None,
                    now,
                )?);
                follow_up_todo = open_follow_up(tx, todo, &m, &text, now)?;
            }
            report_digest = Some(d);
            result
        }
    };
    tx.upsert_monitor(&m)?;
    log_op(
        tx,
        Some(&todo.goal_id),
        actor,
        "monitor_check",
        json!({
            "todo_id": todo.id,
            "result": result,
            "check_seq": m.check_seq,
            "follow_up_todo": follow_up_todo,
        }),
    )?;
    Ok(CheckReport {
        monitor: m,
        result,
        digest: report_digest,
        evidence_id,
        follow_up_todo,
    })
}

/// Why a turn on a monitor recorded a failed check: it settled without an observation.
pub const NO_TURN_OBSERVATION: &str = "the turn reported no observation";

/// The check a turn on scheduled monitor `todo_id` reports as its result's `monitor_observation`,
/// recorded inside the transaction that settles the turn's writeback, by the rules of
/// [`Kernel::record_check`] (the same [`record_in_tx`]). A turn whose result carries none and that
/// recorded no check itself during the turn (no `todo check` since the lease was granted) records
/// a failed check ([`NO_TURN_OBSERVATION`]). Nothing is recorded for a todo that is not a
/// scheduled monitor, one that ended, or one whose lease another agent holds now.
pub(crate) fn record_turn_check_in_tx(
    tx: &dyn StoreTx,
    actor: &Actor,
    goal_id: &str,
    todo_id: &str,
    agent_id: &str,
    observation: Option<&str>,
    now: i64,
) -> Result<Option<CheckReport>> {
    let Some(todo) = tx.todo(goal_id, todo_id)? else {
        return Ok(None);
    };
    let Some(mut m) = tx.monitor(goal_id, todo_id)? else {
        return Ok(None);
    };
    let taken_over = todo.claim.as_ref().is_some_and(|c| c.agent_id != agent_id);
    if todo.status.is_terminal() || m.expired(now) || taken_over {
        return Ok(None);
    }
    let observation = match observation {
        Some(text) => Observation::Value(text.to_string()),
        None if m.checked_fence >= todo.last_fence => return Ok(None),
        None => Observation::Failed(NO_TURN_OBSERVATION.to_string()),
    };
    m.check_seq += 1;
    record_in_tx(tx, actor, &todo, m, &observation, now).map(Some)
}

/// The follow-up a material change declares: an agent todo to act on it, or one (at P0) to
/// replan the goal; none for `--watch-only`.
fn open_follow_up(
    tx: &dyn StoreTx,
    todo: &Todo,
    m: &Monitor,
    evidence: &str,
    now: i64,
) -> Result<Option<String>> {
    let (title, priority) = match m.follow_up {
        MonitorFollowUp::None => return Ok(None),
        MonitorFollowUp::OpenTodo => (
            format!("Act on the change seen by monitor {}", todo.id),
            Priority::P1,
        ),
        MonitorFollowUp::Replan => (
            format!("Replan the goal: monitor {} saw a material change", todo.id),
            Priority::P0,
        ),
    };
    let mut new = NewTodo::task(title);
    new.priority = Some(priority);
    new.detail = evidence.to_string();
    let added = insert_new_todo(tx, &todo.goal_id, new, now)?;
    Ok(Some(added.id))
}

/// `text` cut to at most `max` bytes at a character boundary.
pub(crate) fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Refuses work on a monitor whose `--until` has passed (a check, a claim): it is ended, and
/// only waits for the next heartbeat to archive it.
pub(crate) fn refuse_if_ended(todo_id: &str, m: &Monitor, now: i64) -> Result<()> {
    if m.expired(now) {
        return Err(refused(format!(
            "monitor '{todo_id}' ended at {} (its until); the next heartbeat archives it",
            crate::clock::rfc3339(m.until_at.unwrap_or(now))
        )));
    }
    Ok(())
}

/// Archives `todo` because its monitor's `--until` passed.
fn end_monitor(tx: &dyn StoreTx, mut todo: Todo, now: i64) -> Result<Todo> {
    todo.status = TodoStatus::Archived;
    todo.claim = None;
    todo.status_reason = Some("monitor ended: its until passed".to_string());
    todo.updated_at = now;
    tx.update_todo(&todo)?;
    Ok(todo)
}

fn require_monitor(tx: &dyn StoreRead, goal_id: &str, todo_id: &str) -> Result<(Todo, Monitor)> {
    require_goal(tx, goal_id)?;
    let todo = require_todo(tx, goal_id, todo_id)?;
    let m = tx.monitor(goal_id, todo_id)?.ok_or_else(|| {
        bad_input(format!(
            "todo '{todo_id}' of goal '{goal_id}' is not a scheduled monitor; add one of kind monitor with a cadence (every)"
        ))
    })?;
    Ok((todo, m))
}

impl Kernel {
    /// `todo add --kind monitor --every ...`: the todo and its schedule in one transaction. The
    /// first check is due at once (it records the baseline).
    pub fn add_monitor(
        &mut self,
        actor: &Actor,
        goal_id: &str,
        new: NewTodo,
        spec: MonitorSpec,
    ) -> Result<(Todo, Monitor)> {
        if new.kind != TodoKind::Monitor {
            return Err(bad_input(schedule_fields_message(
                String::new(),
                &SCHEDULE_FIELDS,
                " apply to a todo of kind monitor",
            )));
        }
        self.write(|tx| {
            let now = now_ms();
            require_unclosed_goal(tx, goal_id, "a new todo")?;
            check_spec(&spec, now)?;
            let todo = insert_new_todo(tx, goal_id, new, now)?;
            let m = Monitor {
                goal_id: goal_id.to_string(),
                todo_id: todo.id.clone(),
                every_ms: spec.every_ms,
                until_at: spec.until_at,
                target: spec.target,
                follow_up: spec.follow_up,
                max_no_change: spec.max_no_change,
                probe: spec.probe,
                next_due_at: now,
                last_check_at: None,
                last_digest: None,
                last_result: None,
                no_change_count: 0,
                material_change: false,
                checks: 0,
                failures: 0,
                last_failure: None,
                check_seq: 0,
                checked_fence: 0,
                created_at: now,
                updated_at: now,
            };
            tx.upsert_monitor(&m)?;
            log_op(
                tx,
                Some(goal_id),
                actor,
                "todo_add",
                json!({"todo_id": todo.id, "kind": todo.kind, "every_ms": m.every_ms}),
            )?;
            Ok((todo, m))
        })
    }

    /// The schedule of a monitor todo, if it has one.
    pub fn monitor(&self, goal_id: &str, todo_id: &str) -> Result<Option<Monitor>> {
        self.read(|tx| {
            require_goal(tx, goal_id)?;
            tx.monitor(goal_id, todo_id)
        })
    }

    /// Every monitor of a goal, by todo id.
    pub fn monitors(&self, goal_id: &str) -> Result<Vec<Monitor>> {
        self.read(|tx| {
            require_goal(tx, goal_id)?;
            tx.monitors(goal_id)
        })
    }

    /// A deferred todo's resume time, if it has one.
    pub fn deferral(&self, goal_id: &str, todo_id: &str) -> Result<Option<i64>> {
        self.read(|tx| Ok(tx.deferral(goal_id, todo_id)?.map(|d| d.until_at)))
    }

    /// Records a check's observation: by an agent in a turn on the monitor (holding its lease),
    /// an operator, or the heartbeat with the `ticket` of the check it claimed.
    pub fn record_check(
        &mut self,
        actor: &Actor,
        goal_id: &str,
        todo_id: &str,
        observation: &Observation,
        ticket: Option<i64>,
    ) -> Result<CheckReport> {
        if let Observation::Failed(reason) = observation
            && reason.trim().is_empty()
        {
            return Err(bad_input(
                "a failed check needs its reason: what could not be observed, and why",
            ));
        }
        if let Observation::Failed(reason) = observation {
            check_len("the failed check's reason", reason, MAX_TEXT)?;
        }
        if let Observation::Value(text) = observation
            && text.len() > MAX_OBSERVATION
        {
            return Err(bad_input(format!(
                "the observation is {} bytes; the limit is {MAX_OBSERVATION} (record a digest or a summary)",
                text.len()
            )));
        }
        self.write(|tx| {
            let now = now_ms();
            require_unclosed_goal(tx, goal_id, "a monitor check")?;
            let (todo, mut m) = require_monitor(tx, goal_id, todo_id)?;
            super::todo::write::authorize_write(&todo, actor)?;
            if todo.status.is_terminal() {
                return Err(refused(format!(
                    "monitor '{todo_id}' is {}; it records no more checks",
                    todo.status
                )));
            }
            refuse_if_ended(todo_id, &m, now)?;
            match ticket {
                Some(seq) if seq != m.check_seq => {
                    return Err(conflict(format!(
                        "check {seq} of monitor '{todo_id}' was superseded by check {}; its result is not recorded",
                        m.check_seq
                    )));
                }
                Some(_) => {}
                None => m.check_seq += 1,
            }
            record_in_tx(tx, actor, &todo, m, observation, now)
        })
    }

    /// Claims the due check of monitor `todo_id` for `holder`: in one transaction, refuses unless
    /// it is due, unclaimed and not past `--until`, then moves its due time one cadence on (a
    /// holder that dies is retried then) and bumps `check_seq`. `None` when not due (another
    /// heartbeat claimed it first).
    pub fn claim_check(
        &mut self,
        goal_id: &str,
        todo_id: &str,
        holder: &str,
    ) -> Result<Option<CheckTicket>> {
        validate_token("heartbeat id", holder)?;
        self.write(|tx| {
            let now = now_ms();
            let goal = require_goal(tx, goal_id)?;
            let (todo, mut m) = require_monitor(tx, goal_id, todo_id)?;
            let live_claim = todo.live_claim(now).is_some();
            if goal.status != GoalStatus::Active
                || !checkable(todo.status)
                || m.expired(now)
                || live_claim
                || m.due_at(todo.last_fence, todo.updated_at) > now
            {
                return Ok(None);
            }
            m.check_seq += 1;
            m.next_due_at = now + m.every_ms;
            m.checked_fence = todo.last_fence;
            m.updated_at = now;
            tx.upsert_monitor(&m)?;
            log_op(
                tx,
                Some(goal_id),
                &Actor::Operator,
                "monitor_check_claim",
                json!({"todo_id": todo_id, "check_seq": m.check_seq, "holder": holder}),
            )?;
            Ok(Some(CheckTicket {
                goal_id: goal_id.to_string(),
                todo_id: todo_id.to_string(),
                check_seq: m.check_seq,
                probe: m.probe,
            }))
        })
    }

    /// The goal's schedule at this instant (a pure read).
    pub fn schedule(&self, goal_id: &str) -> Result<ScheduleView> {
        self.read(|tx| {
            require_goal(tx, goal_id)?;
            schedule_in_tx(tx, goal_id, now_ms())
        })
    }

    /// Provider-backed monitors of the goal that are due now, earliest first; none while the
    /// goal is paused or closed.
    pub fn due_probe_monitors(&self, goal_id: &str) -> Result<Vec<Monitor>> {
        self.read(|tx| {
            let now = now_ms();
            let mut out = Vec::new();
            if require_goal(tx, goal_id)?.status != GoalStatus::Active {
                return Ok(out);
            }
            tx.visit_active_monitors(goal_id, &mut |m| {
                if m.monitor.next_due_at > now {
                    return Ok(false);
                }
                if m.monitor.probe.is_some()
                    && !m.monitor.expired(now)
                    && checkable(m.todo_status)
                    && m.due_at() <= now
                {
                    out.push(m.monitor.clone());
                }
                Ok(true)
            })?;
            Ok(out)
        })
    }

    /// Ends monitors past their `--until` and reopens deferred todos whose time came, in one
    /// transaction with one operation-log row; takes no write lock when there is nothing to do.
    pub fn sweep_schedule(&mut self, goal_id: &str) -> Result<SweepReport> {
        let pending = self.read(|tx| {
            require_goal(tx, goal_id)?;
            sweep_candidates(tx, goal_id, now_ms())
        })?;
        if pending.is_empty() {
            return Ok(pending);
        }
        self.write(|tx| {
            let now = now_ms();
            let found = sweep_candidates(tx, goal_id, now)?;
            for id in &found.ended_monitors {
                end_monitor(tx, require_todo(tx, goal_id, id)?, now)?;
            }
            for id in &found.resumed_todos {
                let mut todo = require_todo(tx, goal_id, id)?;
                todo.status = TodoStatus::Open;
                todo.status_reason = None;
                todo.updated_at = now;
                tx.update_todo(&todo)?;
                tx.set_deferral(goal_id, id, None)?;
            }
            if !found.is_empty() {
                log_op(
                    tx,
                    Some(goal_id),
                    &Actor::Operator,
                    "schedule_sweep",
                    json!({"ended_monitors": found.ended_monitors, "resumed_todos": found.resumed_todos}),
                )?;
            }
            Ok(found)
        })
    }
}

fn sweep_candidates(tx: &dyn StoreRead, goal_id: &str, now: i64) -> Result<SweepReport> {
    let mut out = SweepReport::default();
    tx.visit_active_monitors(goal_id, &mut |m| {
        if m.monitor.expired(now) {
            out.ended_monitors.push(m.monitor.todo_id.clone());
        }
        Ok(true)
    })?;
    for d in tx.next_deferrals(goal_id, 1000)? {
        if d.until_at > now {
            break;
        }
        out.resumed_todos.push(d.todo_id);
    }
    Ok(out)
}

/// The schedule half of `todo update` (inside its transaction, after the todo's own changes):
/// on a deferred todo (a monitor too) `--until` sets when it resumes; otherwise it ends a
/// monitor; the monitor flags change the schedule; a todo leaving `deferred` loses its resume
/// time. Returns whether it changed anything.
pub(crate) fn apply_update_in_tx(
    tx: &dyn StoreTx,
    todo: &Todo,
    status_changed: bool,
    until_at: Option<i64>,
    patch: &MonitorPatch,
    now: i64,
) -> Result<bool> {
    if until_at.is_none() && patch.is_empty() && !status_changed {
        return Ok(false);
    }
    let scheduled =
        todo.kind == TodoKind::Monitor && tx.monitor(&todo.goal_id, &todo.id)?.is_some();
    let deferred = todo.status == TodoStatus::Deferred;
    let mut patch = patch.clone();
    if scheduled && !deferred {
        patch.until_at = patch.until_at.or(until_at);
    }
    let mut changed = if scheduled || !patch.is_empty() {
        apply_patch_in_tx(tx, todo, &patch, now)?.is_some()
    } else {
        false
    };
    match until_at {
        Some(at) if deferred => {
            if at <= now {
                return Err(bad_input(msg![
                    Param::Until,
                    format!(
                        " {} is not in the future; pass a later time",
                        crate::clock::rfc3339(at)
                    )
                ]));
            }
            tx.set_deferral(&todo.goal_id, &todo.id, Some(at))?;
            changed = true;
        }
        Some(_) if scheduled => {}
        Some(_) => {
            return Err(bad_input(msg![
                Param::Until,
                format!(
                    " applies to a monitor (when it ends) or a deferred todo (when it resumes); \
                     todo '{}' is {}: set its status to deferred with it",
                    todo.id, todo.status
                )
            ]));
        }
        None if status_changed && !deferred && tx.deferral(&todo.goal_id, &todo.id)?.is_some() => {
            tx.set_deferral(&todo.goal_id, &todo.id, None)?;
            changed = true;
        }
        None => {}
    }
    Ok(changed)
}
