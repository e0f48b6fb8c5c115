//! Goal lifecycle (create, close, pause, resume) and the stored `next_probe`.
//!
//! Lifecycle changes are operator decisions: an agent inside a turn cannot close or pause the goal
//! it is working on.

use serde_json::json;

use super::{Actor, Kernel, log_op, require_goal};
use crate::clock::now_ms;
use crate::error::{Param, Result, bad_input, conflict, msg};
use crate::ids::{slug, validate_token};
use crate::model::{Goal, GoalStatus};

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

impl Kernel {
    pub fn create_goal(&mut self, actor: &Actor, new: NewGoal) -> Result<Goal> {
        let title = new.title.trim().to_string();
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
            Ok(goal)
        })?;
        let registry = self.write_registry_projection();
        self.after_commit("writing registry.json", registry);
        let files = self.write_goal_projection(&goal.id);
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

    /// Stores (or clears, with `None`) the goal's next probe. It is shown, never executed.
    pub fn set_probe(
        &mut self,
        actor: &Actor,
        goal_id: &str,
        probe: Option<String>,
    ) -> Result<Goal> {
        if let Some(p) = &probe
            && (p.trim().is_empty() || p.len() > PROBE_TEXT_BYTES)
        {
            return Err(bad_input(format!(
                "probe text is {} bytes; give 1..={PROBE_TEXT_BYTES} bytes of text, or clear the probe",
                p.len()
            )));
        }
        let goal = self.write(|tx| {
            let mut goal = require_goal(tx, goal_id)?;
            goal.next_probe = probe;
            goal.updated_at = now_ms();
            tx.update_goal(&goal)?;
            log_op(
                tx,
                Some(goal_id),
                actor,
                "probe_set",
                json!({"next_probe": goal.next_probe}),
            )?;
            Ok(goal)
        })?;
        let registry = self.write_registry_projection();
        self.after_commit("writing registry.json", registry);
        Ok(goal)
    }
}
