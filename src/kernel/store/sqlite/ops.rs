//! The operation log: one row appended by every committed kernel mutation. Its rows are never
//! deleted: the commit counter (`Db::commit_seq`) and the change watcher count them by rowid.

use super::*;

impl Db<'_> {
    pub(super) fn append_op(&self, op: &OpRecord) -> Result<()> {
        self.conn
            .prepare_cached("INSERT INTO ops (id, goal_id, actor, kind, detail, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
            .and_then(|mut s| {
                s.execute(params![op.id, op.goal_id, op.actor, op.kind, to_json(&op.detail), op.created_at])
            })
            .map_err(self.err("appending to the operation log"))?;
        Ok(())
    }

    pub(super) fn ops(&self, goal_id: Option<&str>, limit: usize) -> Result<Vec<OpRecord>> {
        self.query_all(
            "SELECT id, goal_id, actor, kind, detail, created_at FROM ops WHERE (?1 IS NULL OR goal_id = ?1) \
             ORDER BY id DESC LIMIT ?2",
            params![goal_id, limit as i64],
            |r| {
                locate(r, "ops", &[0], || {
                    Ok(OpRecord {
                        id: r.get(0)?,
                        goal_id: r.get(1)?,
                        actor: r.get(2)?,
                        kind: r.get(3)?,
                        detail: json_col(r, 4)?,
                        created_at: r.get(5)?,
                    })
                })
            },
            "reading the operation log",
        )
    }
}
