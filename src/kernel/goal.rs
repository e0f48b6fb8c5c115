//! Goal lifecycle (create, close, pause, resume), the stored `next_probe` note and the goal's
//! provider probe.
//!
//! Lifecycle changes are operator decisions: an agent inside a turn cannot close or pause the goal
//! it is working on. The `next_probe` note is text, shown and never executed; a goal's probe runs
//! only as a provider operation (`GoalProbe`), claimed before each run so overlapping heartbeats
//! never run one revision twice, its outcome recorded by digest as a monitor check's is.

use serde::Serialize;
use serde_json::json;

use super::monitor::{Observation, check_probe, classify, truncate};
use super::todo::NewTodo;
use super::todo::write::{check_new_todo_text, insert_new_todo};
use super::{Actor, Kernel, log_op, require_goal};
use crate::clock::now_ms;
use crate::error::{Param, Result, bad_input, conflict, msg, refused};
use crate::ids::{slug, validate_token};
use crate::model::monitor::GOAL_PROBE_OBSERVATION_BYTES;
use crate::model::{CheckResult, Goal, GoalProbe, GoalStatus, ProbeSpec, Todo};

/// What a caller supplies to create a goal.
#[derive(Debug, Clone, Default)]
pub struct NewGoal {
    pub id: Option<String>,
    pub title: String,
    pub objective: Option<String>,
    pub success_criteria: Vec<String>,
    pub project_dir: Option<String>,
}

/// Longest goal title accepted.
pub const MAX_TITLE: usize = 500;

/// The longest `next_probe`, in bytes.
pub const PROBE_TEXT_BYTES: usize = 4096;

/// Most success criteria one goal lists.
pub const MAX_SUCCESS_CRITERIA: usize = 100;

/// The goal's prose within the limits every stored text has: the objective as long as a todo's
/// detail, each success criterion and the project directory as long as a title or a path.
fn check_goal_text(new: &NewGoal) -> Result<()> {
    use super::todo::write::{MAX_TEXT, check_len};
    if let Some(objective) = &new.objective {
        check_len("goal objective", objective, MAX_TEXT)?;
    }
    if new.success_criteria.len() > MAX_SUCCESS_CRITERIA {
        return Err(bad_input(format!(
            "{} success criteria; the limit is {MAX_SUCCESS_CRITERIA}",
            new.success_criteria.len()
        )));
    }
    for criterion in &new.success_criteria {
        check_len("a success criterion", criterion, MAX_TITLE)?;
    }
    if let Some(dir) = &new.project_dir {
        check_len("the goal's project directory", dir, PROBE_TEXT_BYTES)?;
    }
    Ok(())
}

impl Kernel {
    pub fn create_goal(&mut self, actor: &Actor, new: NewGoal) -> Result<Goal> {
        self.create_goal_with_todos(actor, new, Vec::new())
            .map(|(goal, _)| goal)
    }

    /// Checks a goal and its first todos as [`Kernel::create_goal_with_todos`] would, without a
    /// store: `start-goal` refuses bad input before it initializes a project.
    pub fn check_new_goal(new: &NewGoal, first_todos: &[NewTodo]) -> Result<()> {
        let title = new.title.trim();
        if title.is_empty() {
            return Err(bad_input(msg![
                "goal title is empty; pass ",
                Param::Title,
                " \"what the goal should achieve\""
            ]));
        }
        if title.len() > MAX_TITLE {
            return Err(bad_input(format!(
                "goal title is {} bytes; the limit is {MAX_TITLE}",
                title.len()
            )));
        }
        if let Some(id) = &new.id {
            validate_token("goal id", id)?;
        }
        check_goal_text(new)?;
        first_todos.iter().try_for_each(check_new_todo_text)
    }

    /// Creates a goal and its first todos in one transaction: all of them or, refused, none.
    pub fn create_goal_with_todos(
        &mut self,
        actor: &Actor,
        new: NewGoal,
        first_todos: Vec<NewTodo>,
    ) -> Result<(Goal, Vec<Todo>)> {
        Kernel::check_new_goal(&new, &first_todos)?;
        let title = new.title.trim().to_string();
        let goal = self.write(|tx| {
            let id = match new.id {
                Some(id) => {
                    if tx.goal(&id)?.is_some() {
                        return Err(conflict(msg![
                            format!("goal '{id}' already exists; pick another "),
                            Param::Id
                        ]));
                    }
                    id
                }
                None => {
                    let base = slug(&title, 40);
                    let mut candidate = base.clone();
                    let mut n = 2;
                    while tx.goal(&candidate)?.is_some() {
                        candidate = format!("{base}-{n}");
                        n += 1;
                    }
                    candidate
                }
            };
            let now = now_ms();
            let goal = Goal {
                id,
                objective: new
                    .objective
                    .filter(|o| !o.trim().is_empty())
                    .unwrap_or_else(|| title.clone()),
                title,
                success_criteria: new.success_criteria,
                status: GoalStatus::Active,
                project_dir: new.project_dir,
                next_probe: None,
                created_at: now,
                updated_at: now,
            };
            tx.insert_goal(&goal)?;
            log_op(
                tx,
                Some(&goal.id),
                actor,
                "goal_create",
                json!({"title": goal.title}),
            )?;
            let mut todos = Vec::with_capacity(first_todos.len());
            for new in first_todos {
                let todo = insert_new_todo(tx, &goal.id, new, now)?;
                log_op(
                    tx,
                    Some(&goal.id),
                    actor,
                    "todo_add",
                    json!({"todo_id": todo.id, "kind": todo.kind}),
                )?;
                todos.push(todo);
            }
            Ok((goal, todos))
        })?;
        let registry = self.write_registry_projection();
        self.after_commit("writing registry.json", registry);
        let files = self.write_goal_projection(&goal.0.id);
        self.after_commit("writing the goal's state files", files);
        Ok(goal)
    }

    pub fn goals(&self) -> Result<Vec<Goal>> {
        self.read(|tx| tx.goals())
    }

    pub fn goal(&self, goal_id: &str) -> Result<Goal> {
        self.read(|tx| require_goal(tx, goal_id))
    }

    /// Moves a goal to `status`. Closing is final; pausing and resuming toggle.
    pub fn set_goal_status(
        &mut self,
        actor: &Actor,
        goal_id: &str,
        status: GoalStatus,
    ) -> Result<Goal> {
        actor.require_operator(&format!("change a goal's status to {status}"))?;
        let goal = self.write(|tx| {
            let mut goal = require_goal(tx, goal_id)?;
            match (goal.status, status) {
                (GoalStatus::Closed, s) if s != GoalStatus::Closed => {
                    return Err(crate::error::refused(format!(
                        "goal '{goal_id}' is closed; closed goals cannot be reopened. Create a new goal instead"
                    )));
                }
                (from, to) if from == to => return Ok(goal),
                _ => {}
            }
            goal.status = status;
            goal.updated_at = now_ms();
            tx.update_goal(&goal)?;
            log_op(tx, Some(goal_id), actor, "goal_status", json!({"status": status}))?;
            Ok(goal)
        })?;
        let registry = self.write_registry_projection();
        self.after_commit("writing registry.json", registry);
        Ok(goal)
    }

    /// Stores the goal's next-probe note (shown, never executed), or with `None` clears the note
    /// and the goal's provider probe together.
    pub fn set_probe(
        &mut self,
        actor: &Actor,
        goal_id: &str,
        probe: Option<String>,
    ) -> Result<Goal> {
        check_probe_text(probe.as_deref())?;
        let goal = self.write(|tx| {
            let mut goal = require_goal(tx, goal_id)?;
            let cleared_provider = probe.is_none() && tx.goal_probe(goal_id)?.is_some();
            if cleared_provider {
                tx.delete_goal_probe(goal_id)?;
            }
            goal.next_probe = probe;
            goal.updated_at = now_ms();
            tx.update_goal(&goal)?;
            log_op(
                tx,
                Some(goal_id),
                actor,
                "probe_set",
                json!({"next_probe": goal.next_probe, "provider_probe_cleared": cleared_provider}),
            )?;
            Ok(goal)
        })?;
        self.after_probe_change(goal_id);
        Ok(goal)
    }

    /// Sets the goal's provider probe (and, with `note`, its next-probe note) in one transaction.
    /// Each call is a new revision, which the heartbeat runs once; a probe whose provider,
    /// operation or target changed starts again from a baseline (its old digest described
    /// something else).
    pub fn set_provider_probe(
        &mut self,
        actor: &Actor,
        goal_id: &str,
        spec: ProbeSpec,
        note: Option<String>,
    ) -> Result<(Goal, GoalProbe)> {
        check_probe(&spec)?;
        check_probe_text(note.as_deref())?;
        let out = self.write(|tx| {
            let mut goal = super::require_unclosed_goal(tx, goal_id, "a new provider probe")?;
            let now = now_ms();
            let probe = match tx.goal_probe(goal_id)? {
                Some(mut old) if old.spec == spec => {
                    old.revision += 1;
                    old.updated_at = now;
                    old
                }
                old => GoalProbe {
                    goal_id: goal_id.to_string(),
                    spec,
                    revision: old.as_ref().map_or(1, |o| o.revision + 1),
                    ran_revision: old.as_ref().map_or(0, |o| o.ran_revision),
                    // Kept across a new spec, so a run claimed before the change is refused.
                    run_seq: old.as_ref().map_or(0, |o| o.run_seq),
                    runs: 0,
                    failures: 0,
                    last_result: None,
                    last_digest: None,
                    last_checked_at: None,
                    last_failure: None,
                    last_observation: None,
                    changed_at: None,
                    created_at: now,
                    updated_at: now,
                },
            };
            tx.upsert_goal_probe(&probe)?;
            if note.is_some() {
                goal.next_probe = note;
                goal.updated_at = now;
                tx.update_goal(&goal)?;
            }
            log_op(
                tx,
                Some(goal_id),
                actor,
                "probe_set",
                json!({
                    "next_probe": goal.next_probe,
                    "provider_probe": probe.spec,
                    "revision": probe.revision,
                }),
            )?;
            Ok((goal, probe))
        })?;
        self.after_probe_change(goal_id);
        Ok(out)
    }

    /// The goal's provider probe, if it has one.
    pub fn goal_probe(&self, goal_id: &str) -> Result<Option<GoalProbe>> {
        self.read(|tx| {
            require_goal(tx, goal_id)?;
            tx.goal_probe(goal_id)
        })
    }

    /// Claims a run of the goal's provider probe for `holder`, in one transaction: bumps
    /// `run_seq` and marks the current revision as run. With `pending_only` (the heartbeat) it
    /// claims nothing unless the current revision has not run yet, so of two overlapping
    /// heartbeats only the first runs it. Refused when the goal has no provider probe: its
    /// next-probe note, if any, is text that is never executed.
    pub fn claim_goal_probe(
        &mut self,
        goal_id: &str,
        holder: &str,
        pending_only: bool,
    ) -> Result<Option<GoalProbeTicket>> {
        validate_token("probe runner id", holder)?;
        if pending_only && !self.goal_probe(goal_id)?.is_some_and(|p| p.pending()) {
            // Most ticks: nothing to run, and no write lock taken to find that out.
            return Ok(None);
        }
        self.write(|tx| {
            let goal = require_goal(tx, goal_id)?;
            if goal.status == GoalStatus::Closed {
                if pending_only {
                    return Ok(None);
                }
                super::require_unclosed_goal(tx, goal_id, "a probe run")?;
            }
            let Some(mut probe) = tx.goal_probe(goal_id)? else {
                return Err(refused(match goal.next_probe {
                    Some(_) => format!(
                        "goal '{goal_id}' has a next-probe note, which is text LoopX never \
                         executes; set a provider probe for the goal (provider, operation and \
                         target) to run one"
                    ),
                    None => format!(
                        "goal '{goal_id}' has no provider probe; set one for the goal (provider, \
                         operation and target) to run it"
                    ),
                }));
            };
            if pending_only && !probe.pending() {
                return Ok(None);
            }
            probe.run_seq += 1;
            probe.ran_revision = probe.revision;
            probe.updated_at = now_ms();
            tx.upsert_goal_probe(&probe)?;
            let extension = probe.spec.provider.split('/').next().unwrap_or_default();
            let refusal = tx
                .extension(extension)?
                .and_then(|e| write_grant_refusal(&probe.spec.provider, &e.grants));
            log_op(
                tx,
                Some(goal_id),
                &Actor::Operator,
                "goal_probe_claim",
                json!({"run_seq": probe.run_seq, "revision": probe.revision, "holder": holder}),
            )?;
            Ok(Some(GoalProbeTicket {
                goal_id: goal_id.to_string(),
                run_seq: probe.run_seq,
                spec: probe.spec,
                refusal,
            }))
        })
    }

    /// Records the outcome of the claimed run `ticket` of the goal's provider probe in one
    /// transaction (result, digest, time, failure reason, and an operation-log row): the digest
    /// rule of monitor checks; a baseline or a change keeps the observation for the operator to
    /// read. A result of a run another claim superseded, or of a probe set to another spec since,
    /// is refused (conflict).
    pub fn record_goal_probe(
        &mut self,
        actor: &Actor,
        ticket: &GoalProbeTicket,
        observation: &Observation,
    ) -> Result<GoalProbeReport> {
        let (goal_id, run_seq) = (ticket.goal_id.as_str(), ticket.run_seq);
        let report = self.write(|tx| {
            require_goal(tx, goal_id)?;
            let mut probe = tx.goal_probe(goal_id)?.ok_or_else(|| {
                conflict(format!(
                    "the provider probe of goal '{goal_id}' was cleared while run {run_seq} ran; \
                     its result is not recorded"
                ))
            })?;
            if probe.run_seq != run_seq || probe.spec != ticket.spec {
                return Err(conflict(format!(
                    "run {run_seq} of the provider probe of goal '{goal_id}' was superseded by \
                     run {}; its result is not recorded",
                    probe.run_seq
                )));
            }
            let now = now_ms();
            probe.runs += 1;
            probe.last_checked_at = Some(now);
            probe.updated_at = now;
            let (result, digest) = match observation {
                Observation::Failed(reason) => {
                    probe.failures += 1;
                    probe.last_failure = Some(truncate(reason, 2000).to_string());
                    (CheckResult::Failed, None)
                }
                Observation::Value(text) => {
                    let (result, d) = classify(probe.last_digest.as_deref(), text);
                    probe.failures = 0;
                    probe.last_failure = None;
                    probe.last_digest = Some(d.clone());
                    if result != CheckResult::Unchanged {
                        probe.last_observation =
                            Some(truncate(text, GOAL_PROBE_OBSERVATION_BYTES).to_string());
                    }
                    if result == CheckResult::Changed {
                        probe.changed_at = Some(now);
                    }
                    (result, Some(d))
                }
            };
            probe.last_result = Some(result);
            tx.upsert_goal_probe(&probe)?;
            log_op(
                tx,
                Some(goal_id),
                actor,
                "goal_probe_run",
                json!({
                    "run_seq": run_seq,
                    "result": result,
                    "digest": digest,
                    "failure": probe.last_failure,
                }),
            )?;
            Ok(GoalProbeReport {
                probe,
                result,
                digest,
            })
        })?;
        let files = self.write_goal_projection(goal_id);
        self.after_commit("writing the goal's state files", files);
        Ok(report)
    }

    fn after_probe_change(&mut self, goal_id: &str) {
        let registry = self.write_registry_projection();
        self.after_commit("writing registry.json", registry);
        let files = self.write_goal_projection(goal_id);
        self.after_commit("writing the goal's state files", files);
    }
}

/// A claimed run of a goal's provider probe (see [`Kernel::claim_goal_probe`]): its result must
/// carry this `run_seq`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GoalProbeTicket {
    pub goal_id: String,
    pub run_seq: i64,
    pub spec: ProbeSpec,
    /// Why the provider must not run at all (it holds a write grant): recorded as the failure.
    pub refusal: Option<String>,
}

/// What recording a goal probe's run did.
#[derive(Debug, Clone, Serialize)]
pub struct GoalProbeReport {
    pub probe: GoalProbe,
    pub result: CheckResult,
    pub digest: Option<String>,
}

fn check_probe_text(text: Option<&str>) -> Result<()> {
    if let Some(p) = text
        && (p.trim().is_empty() || p.len() > PROBE_TEXT_BYTES)
    {
        return Err(bad_input(format!(
            "probe text is {} bytes; give 1..={PROBE_TEXT_BYTES} bytes of text, or clear the probe",
            p.len()
        )));
    }
    Ok(())
}

/// A goal's probe runs only read-only providers: the reason to refuse one whose extension the
/// operator granted write access to (`fs.write:<name>=<dir>`).
fn write_grant_refusal(provider: &str, grants: &[String]) -> Option<String> {
    let writes: Vec<&str> = grants
        .iter()
        .filter(|g| g.starts_with("fs.write:"))
        .map(|g| g.split('=').next().unwrap_or(g))
        .collect();
    (!writes.is_empty()).then(|| {
        format!(
            "provider {provider} is granted write access ({}); a goal's probe runs only \
             read-only providers",
            writes.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::write_grant_refusal;
    use crate::kernel::Actor;
    use crate::model::{ExtensionRecord, ProbeSpec};

    /// The claim names why a provider whose extension holds a write grant must not run (the
    /// runner records that as the failed outcome without calling it); a read-only one runs.
    #[test]
    fn a_claim_refuses_a_provider_granted_write_access() {
        let (_dir, mut k) = crate::kernel::test_project::with_goal_g();
        for (id, grant) in [
            ("rw", "fs.write:out=/tmp/out"),
            ("ro", "fs.read:in=/tmp/in"),
        ] {
            k.write(|tx| {
                tx.upsert_extension(&ExtensionRecord {
                    id: id.into(),
                    version: "1.0.0".into(),
                    enabled: true,
                    manifest: serde_json::json!({}),
                    grants: vec![grant.into()],
                    install_dir: "/nowhere".into(),
                    component_hashes: serde_json::json!({}),
                    installed_at: 1,
                    revision: 1,
                })
            })
            .unwrap();
        }
        let spec = |ext: &str| ProbeSpec {
            provider: format!("{ext}/p"),
            operation: "read".into(),
            target: "x".into(),
        };
        k.set_provider_probe(&Actor::Operator, "g", spec("rw"), None)
            .unwrap();
        let ticket = k.claim_goal_probe("g", "test", true).unwrap().unwrap();
        assert!(ticket.refusal.unwrap().contains("fs.write:out"));
        assert_eq!(k.claim_goal_probe("g", "test", true).unwrap(), None);
        k.set_provider_probe(&Actor::Operator, "g", spec("ro"), None)
            .unwrap();
        let ticket = k.claim_goal_probe("g", "test", true).unwrap().unwrap();
        assert_eq!(ticket.refusal, None);
        // The first run's result was superseded by the second claim.
        let stale = super::GoalProbeTicket {
            run_seq: ticket.run_seq - 1,
            ..ticket.clone()
        };
        let stale = k.record_goal_probe(
            &Actor::Operator,
            &stale,
            &super::Observation::Value("x".into()),
        );
        assert_eq!(stale.unwrap_err().exit_code(), 4);
        // A probe set to another spec while the run ran: that run observed something else.
        k.set_provider_probe(&Actor::Operator, "g", spec("rw"), None)
            .unwrap();
        let moved = k.record_goal_probe(
            &Actor::Operator,
            &ticket,
            &super::Observation::Value("x".into()),
        );
        assert_eq!(moved.unwrap_err().exit_code(), 4);
        assert_eq!(k.goal_probe("g").unwrap().unwrap().runs, 0);
    }

    #[test]
    fn a_provider_with_a_write_grant_is_refused_and_read_grants_pass() {
        let read = vec![
            "fs.read:workspace=/data".to_string(),
            "env:HOME".to_string(),
        ];
        assert_eq!(write_grant_refusal("x/y", &read), None);
        let write = vec![
            "fs.read:workspace=/data".to_string(),
            "fs.write:out=/tmp/out".to_string(),
        ];
        let why = write_grant_refusal("x/y", &write).unwrap();
        assert!(
            why.contains("fs.write:out") && !why.contains("/tmp/out"),
            "{why}"
        );
    }
}
