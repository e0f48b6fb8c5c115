//! Run log (layer 3) and run history with reward overlays (layer 4), plus `refresh-state` and
//! `summary_all`, which read across layers.
//!
//! A run row is written in the same transaction as the state it describes; its JSON and Markdown
//! reports are written once, after commit, and never changed. History is read newest-first through
//! an index, so its cost does not grow with the number of rows.

use serde::Serialize;
use serde_json::{Value, json};

use super::projection::GoalProjection;
use super::quota::{QuotaView, view_in_tx};
use super::{Actor, Kernel, log_op, require_goal, require_todo};
use crate::clock::now_ms;
use crate::error::{Param, Result, bad_input, msg};
use crate::ids::validate_token;
use crate::model::{Evidence, Goal, Reward, Run};

/// A `refresh-state` request: record a run for the goal and re-project its state files.
#[derive(Debug, Clone, Default)]
pub struct RefreshRequest {
    pub goal_id: String,
    pub agent_id: Option<String>,
    pub todo_id: Option<String>,
    pub classification: Option<String>,
    pub outcome: Option<String>,
    pub summary: Option<String>,
}

/// One history row: a run and the rewards laid over it.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryEntry {
    pub run: Run,
    pub rewards: Vec<Reward>,
}

/// One run as its report page shows it: the run, the rewards laid over it, and the evidence its
/// todo held when the run was recorded.
#[derive(Debug, Clone, Serialize)]
pub struct RunDetail {
    pub run: Run,
    pub rewards: Vec<Reward>,
    /// Evidence on the run's todo dated at or before the run, oldest first, at most
    /// [`RUN_EVIDENCE_LIMIT`] (the newest); empty for a run without a todo.
    pub evidence: Vec<Evidence>,
}

/// The most evidence rows a run's report carries: its todo's newest ones at the run's time.
pub const RUN_EVIDENCE_LIMIT: usize = 50;

/// Everything `summary_all` reports for a goal.
#[derive(Debug, Clone, Serialize)]
pub struct GoalSummary {
    pub goal: Goal,
    pub todo_counts: Value,
    pub run_count: i64,
    pub latest_run: Option<Run>,
    pub recent_evidence: Vec<Evidence>,
    pub recent_rewards: Vec<Reward>,
    pub quota: QuotaView,
}

fn counts_json(counts: &[(String, String, i64)]) -> Value {
    let mut out = serde_json::Map::new();
    for (role, status, n) in counts {
        let entry = out.entry(role.clone()).or_insert_with(|| json!({}));
        entry[status] = json!(n);
    }
    Value::Object(out)
}

/// Hands out the ids of the runs a write transaction records, each sorting after every run id
/// stored before it ([`crate::ids::ulid_after`]): history lists runs newest first by id, and
/// `quota spend-slot` charges the latest run by default, so ids must follow the order of commits,
/// not the clock's.
pub struct RunIds<'a> {
    tx: &'a dyn crate::kernel::store::StoreTx,
    /// The last id handed out, in case this transaction records more than one run.
    last: std::cell::RefCell<Option<String>>,
}

impl<'a> RunIds<'a> {
    pub(crate) fn new(tx: &'a dyn crate::kernel::store::StoreTx) -> RunIds<'a> {
        RunIds {
            tx,
            last: std::cell::RefCell::new(None),
        }
    }

    /// The id of the next run this transaction records.
    pub fn next(&self) -> Result<String> {
        let stored = self.tx.newest_run_id()?;
        let mut last = self.last.borrow_mut();
        let newest = std::cmp::max(stored, last.take());
        let id = crate::ids::ulid_after(newest.as_deref());
        *last = Some(id.clone());
        Ok(id)
    }
}

/// Inserts a run row and its operation-log entry inside the caller's transaction (the turn driver
/// records its run together with the journal phase that settles it).
pub(crate) fn record_run_in_tx(
    tx: &dyn crate::kernel::store::StoreTx,
    actor: &Actor,
    run: &Run,
) -> Result<()> {
    tx.insert_run(run)?;
    log_op(
        tx,
        Some(&run.goal_id),
        actor,
        "run_record",
        json!({"run_id": run.id}),
    )
}

impl Kernel {
    /// Records a run and rewrites the goal's projections. Returns the run.
    pub fn refresh_state(&mut self, actor: &Actor, req: &RefreshRequest) -> Result<Run> {
        if let Some(a) = &req.agent_id {
            validate_token("agent id", a)?;
        }
        let classification = req
            .classification
            .clone()
            .unwrap_or_else(|| "state_refresh".to_string());
        validate_token("classification", &classification)?;
        if let Some(o) = &req.outcome {
            validate_token("outcome", o)?;
        }
        let summary = req.summary.clone().unwrap_or_default();
        if summary.len() > 16 * 1024 {
            return Err(bad_input(format!(
                "summary is {} bytes; the limit is 16384",
                summary.len()
            )));
        }
        // A damaged state.json is reported before the run is recorded, so the command changes
        // nothing; the check is one `stat` when the file is LoopX's own last write.
        super::projection::check_before_overwrite(&self.paths().goal_state_json(&req.goal_id))?;
        let (run, mut projection) = self.write(|tx| {
            require_goal(tx, &req.goal_id)?;
            let now = now_ms();
            let todo = match &req.todo_id {
                Some(t) => Some(require_todo(tx, &req.goal_id, t)?),
                None => None,
            };
            let evidence = match &todo {
                Some(t) => tx.evidence_for(&req.goal_id, &t.id)?,
                None => Vec::new(),
            };
            let quota = view_in_tx(tx, &req.goal_id, req.agent_id.as_deref(), now)?;
            // The projection is read in this transaction: the files show exactly what this
            // command committed, the run's counts come from the same rows, and lines rendered
            // for changed todos are cached for the next refresh.
            let projection = GoalProjection::read(tx, &req.goal_id, now, tx.projection_cache_tx())?;
            let payload = json!({
                "todo_counts": counts_json(&projection.todo_counts()),
                "todo": todo.as_ref().map(|t| json!({"id": t.id, "title": t.title, "status": t.status})),
                "evidence": evidence.iter().map(super::projection::evidence_json).collect::<Vec<_>>(),
                "quota": quota.to_json(),
                "actor": actor.label(),
            });
            let summary = if summary.is_empty() {
                match &todo {
                    Some(t) => format!("{} is {}", t.id, t.status),
                    None => "state refreshed".to_string(),
                }
            } else {
                summary.clone()
            };
            let run = Run {
                id: RunIds::new(tx).next()?,
                goal_id: req.goal_id.clone(),
                agent_id: req.agent_id.clone(),
                todo_id: req.todo_id.clone(),
                classification: classification.clone(),
                outcome: req.outcome.clone(),
                summary,
                payload,
                created_at: now,
            };
            tx.insert_run(&run)?;
            log_op(tx, Some(&req.goal_id), actor, "run_record", json!({"run_id": run.id}))?;
            Ok((run, projection))
        })?;
        let report = self.write_run_report(&run);
        self.after_commit("writing the run report", report);
        if let Some(seq) = self.last_commit {
            projection.committed_as(seq);
        }
        let files = self.write_goal_files(&projection);
        self.after_commit("writing the goal's state files", files);
        Ok(run)
    }

    /// Re-creates every projection from the database (registry, goal states, missing run
    /// reports). Writes no rows.
    pub fn reproject_all(&mut self) -> Result<usize> {
        self.store.refuse_if_damaged()?;
        self.write_registry_projection()?;
        let goals = self.goals()?;
        let mut reports = 0;
        for goal in &goals {
            self.write_goal_projection(&goal.id)?;
            let mut before: Option<String> = None;
            loop {
                let page = self.read(|tx| tx.runs(&goal.id, 500, before.as_deref()))?;
                if page.is_empty() {
                    break;
                }
                for run in &page {
                    if self.restore_run_report(run)? {
                        reports += 1;
                    }
                }
                before = page.last().map(|r| r.id.clone());
            }
        }
        Ok(reports)
    }

    /// Newest-first history page with reward overlays.
    pub fn history(
        &self,
        goal_id: &str,
        limit: usize,
        before: Option<&str>,
    ) -> Result<Vec<HistoryEntry>> {
        if let Some(b) = before {
            validate_token("run id", b)?;
        }
        self.read(|tx| {
            require_goal(tx, goal_id)?;
            // A cursor names a run of this goal (runs are never deleted): any other id would
            // silently page from the newest run or past the oldest.
            if let Some(b) = before
                && tx.run(goal_id, b)?.is_none()
            {
                return Err(super::unknown_run(goal_id, b));
            }
            let runs = tx.runs(goal_id, limit.clamp(1, 1000), before)?;
            let ids: Vec<String> = runs.iter().map(|r| r.id.clone()).collect();
            let mut rewards = tx.rewards_for_runs(goal_id, &ids)?;
            Ok(runs
                .into_iter()
                .map(|run| {
                    let (mine, rest): (Vec<Reward>, Vec<Reward>) =
                        rewards.drain(..).partition(|r| r.run_id == run.id);
                    rewards = rest;
                    HistoryEntry { run, rewards: mine }
                })
                .collect())
        })
    }

    /// One run with its rewards and its todo's evidence up to the run, read in one snapshot;
    /// `None` when the goal has no such run.
    pub fn run_detail(&self, goal_id: &str, run_id: &str) -> Result<Option<RunDetail>> {
        validate_token("run id", run_id)?;
        self.read(|tx| {
            require_goal(tx, goal_id)?;
            let Some(run) = tx.run(goal_id, run_id)? else {
                return Ok(None);
            };
            let rewards = tx.rewards_for_runs(goal_id, std::slice::from_ref(&run.id))?;
            let mut evidence = match &run.todo_id {
                Some(todo_id) => tx.evidence_for(goal_id, todo_id)?,
                None => Vec::new(),
            };
            evidence.retain(|e| e.created_at <= run.created_at);
            let older = evidence.len().saturating_sub(RUN_EVIDENCE_LIMIT);
            evidence.drain(..older);
            Ok(Some(RunDetail {
                run,
                rewards,
                evidence,
            }))
        })
    }

    /// Lays a human reward over a run. Operators only: rewards are human judgments.
    pub fn add_reward(
        &mut self,
        actor: &Actor,
        goal_id: &str,
        run_id: &str,
        score: f64,
        comment: &str,
    ) -> Result<Reward> {
        actor.require_operator("add a reward")?;
        validate_token("run id", run_id)?;
        if !score.is_finite() || score.abs() > 1e6 {
            return Err(bad_input(msg![
                Param::Score,
                format!(" {score} must be a finite number within ±1000000")
            ]));
        }
        if comment.len() > 4096 {
            return Err(bad_input(msg![
                Param::Comment,
                format!(" is {} bytes; the limit is 4096", comment.len())
            ]));
        }
        self.write(|tx| {
            require_goal(tx, goal_id)?;
            if tx.run(goal_id, run_id)?.is_none() {
                return Err(super::unknown_run(goal_id, run_id));
            }
            let mut reward = Reward {
                id: 0,
                goal_id: goal_id.to_string(),
                run_id: run_id.to_string(),
                score,
                comment: comment.to_string(),
                actor: actor.label(),
                created_at: now_ms(),
            };
            reward.id = tx.insert_reward(&reward)?;
            log_op(
                tx,
                Some(goal_id),
                actor,
                "reward_add",
                json!({"run_id": run_id, "score": score}),
            )?;
            Ok(reward)
        })
    }

    pub fn summary(&self, goal_id: &str) -> Result<GoalSummary> {
        self.read(|tx| {
            let goal = require_goal(tx, goal_id)?;
            Ok(GoalSummary {
                todo_counts: counts_json(&tx.todo_status_counts(goal_id)?),
                run_count: tx.run_count(goal_id)?,
                latest_run: tx.runs(goal_id, 1, None)?.pop(),
                recent_evidence: tx.recent_evidence(goal_id, 20)?,
                recent_rewards: tx.recent_rewards(goal_id, 20)?,
                quota: view_in_tx(tx, goal_id, None, now_ms())?,
                goal,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::todo::{NewTodo, TodoPatch};

    fn evidence(k: &mut Kernel, text: &str) {
        let patch = TodoPatch {
            evidence: Some(text.into()),
            ..TodoPatch::default()
        };
        k.update_todo(&Actor::Operator, "g", "t1", patch).unwrap();
        // Evidence and runs are dated to the millisecond: the next write is a later one.
        std::thread::sleep(std::time::Duration::from_millis(3));
    }

    fn record(k: &mut Kernel, todo: Option<&str>) -> Run {
        let run = k
            .refresh_state(
                &Actor::Operator,
                &RefreshRequest {
                    goal_id: "g".into(),
                    todo_id: todo.map(str::to_string),
                    ..RefreshRequest::default()
                },
            )
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(3));
        run
    }

    /// A run's detail holds its own rewards (not another run's) and the evidence its todo held
    /// when it was recorded (not later evidence); a run without a todo has none, and an unknown
    /// run is `None`.
    #[test]
    fn a_runs_detail_holds_its_rewards_and_its_todos_evidence_up_to_the_run() {
        let (_dir, mut k) = crate::kernel::test_project::with_goal_g();
        let mut todo = NewTodo::task("Task");
        todo.id = Some("t1".into());
        k.add_todo(&Actor::Operator, "g", todo).unwrap();
        evidence(&mut k, "before the run");
        let run = record(&mut k, Some("t1"));
        evidence(&mut k, "after the run");
        let other = record(&mut k, None);
        k.add_reward(&Actor::Operator, "g", &run.id, 3.0, "good")
            .unwrap();
        k.add_reward(&Actor::Operator, "g", &other.id, -1.0, "other")
            .unwrap();
        let detail = k.run_detail("g", &run.id).unwrap().unwrap();
        assert_eq!(detail.run, run);
        let rewards: Vec<_> = detail
            .rewards
            .iter()
            .map(|r| (r.score, &*r.comment))
            .collect();
        assert_eq!(rewards, [(3.0, "good")]);
        let texts: Vec<_> = detail.evidence.iter().map(|e| &*e.text).collect();
        assert_eq!(texts, ["before the run"]);
        let detail = k.run_detail("g", &other.id).unwrap().unwrap();
        assert!(detail.evidence.is_empty());
        assert_eq!(detail.rewards.len(), 1);
        assert!(k.run_detail("g", "01NOPE").unwrap().is_none());
        assert_eq!(k.run_detail("nope", &run.id).unwrap_err().exit_code(), 3);
        assert_eq!(k.run_detail("g", "../x").unwrap_err().exit_code(), 2);
    }
}
