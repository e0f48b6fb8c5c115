//! Goals: the layer-1 registry rows.

use super::*;

impl Db<'_> {
    pub(super) fn insert_goal(&self, goal: &Goal) -> Result<()> {
        self.conn
            .execute(
                &format!(
                    "INSERT INTO goals ({GOAL_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
                ),
                params![
                    goal.id,
                    goal.title,
                    goal.objective,
                    to_json(&goal.success_criteria),
                    goal.status.as_str(),
                    goal.project_dir,
                    goal.next_probe,
                    goal.created_at,
                    goal.updated_at
                ],
            )
            .map_err(self.err("inserting a goal"))?;
        Ok(())
    }

    pub(super) fn goal(&self, id: &str) -> Result<Option<Goal>> {
        self.query_opt(
            &format!("SELECT {GOAL_COLUMNS} FROM goals WHERE id = ?1"),
            [id],
            goal_from_row,
            "reading a goal",
        )
    }

    pub(super) fn goals(&self) -> Result<Vec<Goal>> {
        self.query_all(
            &format!("SELECT {GOAL_COLUMNS} FROM goals ORDER BY created_at, id"),
            [],
            goal_from_row,
            "listing goals",
        )
    }

    pub(super) fn update_goal(&self, goal: &Goal) -> Result<()> {
        self.conn
            .execute(
                "UPDATE goals SET title = ?2, objective = ?3, success_criteria = ?4, status = ?5, project_dir = ?6, \
                 next_probe = ?7, updated_at = ?8 WHERE id = ?1",
                params![
                    goal.id,
                    goal.title,
                    goal.objective,
                    to_json(&goal.success_criteria),
                    goal.status.as_str(),
                    goal.project_dir,
                    goal.next_probe,
                    goal.updated_at
                ],
            )
            .map_err(self.err("updating a goal"))?;
        Ok(())
    }

    pub(super) fn goal_ids_with_status(&self, status: GoalStatus) -> Result<Vec<String>> {
        self.query_all(
            "SELECT id FROM goals WHERE status = ?1 ORDER BY created_at, id",
            [status.as_str()],
            |r| r.get(0),
            "listing goals",
        )
    }
}
