//! Todos, their dependencies and their claims (a claim is columns of the todo's row, so a claim
//! and the todo it leases change in one statement).

use super::*;

/// The statuses of live (not finished) todos, spelled out so that a query on them is a few ranges
/// of a status index rather than a walk past every finished todo (`NOT IN` is not a range).
pub(super) const LIVE_STATUSES: &str = "('open', 'claimed', 'blocked', 'deferred')";

/// An agent's live claim, among the goal's claimed todos in `todos_by_expiry` (which holds only
/// those).
pub(super) const CLAIM_OF_AGENT: &str = "SELECT id FROM todos WHERE goal_id = ?1 AND claim_agent = ?2 \
     AND status = 'claimed' AND claim_expires_at > ?3 ORDER BY priority, seq LIMIT 1";

/// The capabilities the goal's live todos are bound to, through `todos_by_capability` (which
/// holds only todos with one).
pub(super) fn bound_capabilities_sql() -> String {
    format!(
        "SELECT DISTINCT capability FROM todos WHERE goal_id = ?1 \
         AND capability IS NOT NULL AND status IN {LIVE_STATUSES} ORDER BY capability"
    )
}

/// The ids of a goal's open user todos (gates), in listing order. Read by every `should-run` and
/// `claim`. Without statistics SQLite preferred scanning all of the goal's todos by primary key
/// and sorting them to the index that holds the few user todos, hence `INDEXED BY` (the cost of
/// both plans is in docs/benchmarks.md).
pub(super) const OPEN_USER_TODO_IDS: &str = "SELECT id FROM todos INDEXED BY todos_by_role_status \
     WHERE goal_id = ?1 AND role = 'user' AND status NOT IN ('completed', 'archived') \
     ORDER BY priority, seq";

/// How [`Db::visit_todos`] reads dependencies: the goal's whole map in one pass when it visits
/// every todo, or one index probe per todo when it visits a few (the map holds the goal's whole
/// history).
#[derive(Clone, Copy)]
pub(super) enum DepsLookup {
    WholeGoal,
    PerTodo,
}

/// The `seq` of a goal's next todo (`?1` is the goal): the `todos_by_seq` index's last entry.
pub(super) const NEXT_TODO_SEQ: &str =
    "SELECT COALESCE(MAX(seq), 0) + 1 FROM todos WHERE goal_id = ?1";

impl Db<'_> {
    pub(super) fn deps_of(&self, goal_id: &str, todo_id: &str) -> Result<Vec<String>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT depends_on FROM todo_deps WHERE goal_id = ?1 AND todo_id = ?2 ORDER BY depends_on")
            .map_err(self.err("reading dependencies"))?;
        let deps = stmt
            .query_map(params![goal_id, todo_id], |r| r.get(0))
            .and_then(|rows| rows.collect())
            .map_err(self.err("reading dependencies"))?;
        Ok(deps)
    }

    pub(super) fn with_deps(&self, mut todos: Vec<Todo>) -> Result<Vec<Todo>> {
        for todo in &mut todos {
            todo.depends_on = self.deps_of(&todo.goal_id, &todo.id)?;
        }
        Ok(todos)
    }

    /// The goal's todos whose ids `sql` selects (its first column), in that order, each then read
    /// in full by its key. Queries that pick a few todos select only ids because SQLite's cost
    /// of preparing a statement grows with its result columns, far more per column in the
    /// ordered queries with subqueries here than in a lookup by key (docs/benchmarks.md), and
    /// every process prepares afresh; an id-only query can also run from an index alone.
    pub(super) fn todos_by_selected_ids(
        &self,
        goal_id: &str,
        sql: &str,
        params: impl rusqlite::Params,
        context: &'static str,
    ) -> Result<Vec<Todo>> {
        let ids: Vec<String> = self
            .conn
            .prepare_cached(sql)
            .and_then(|mut stmt| stmt.query_map(params, |r| r.get(0))?.collect())
            .map_err(self.err(context))?;
        self.todos_by_id(goal_id, &ids)
    }

    /// The goal's todos `ids`, in that order, read in the same transaction that selected them.
    pub(super) fn todos_by_id(&self, goal_id: &str, ids: &[String]) -> Result<Vec<Todo>> {
        ids.iter()
            .map(|id| {
                self.todo(goal_id, id)?.ok_or_else(|| {
                    LoopxError::internal(
                        "reading selected todos",
                        anyhow::anyhow!("todo {goal_id}/{id} vanished within its transaction"),
                    )
                })
            })
            .collect()
    }

    /// Calls `visit` for each of a goal's todos matching `and_where` (SQL appended to
    /// `WHERE goal_id = ?1`), in key order, decoded one by one into the same `Todo`, with its
    /// dependencies (loaded in one pass, not one query per todo) and its listing-order key.
    /// Rows are read as stored: an `ORDER BY priority, seq` would copy every full row through
    /// SQLite's sorter, or, along an index, look each row up by its key; both cost more than
    /// letting the caller order the small keys.
    pub(super) fn visit_todos(
        &self,
        and_where: &str,
        params: impl rusqlite::Params,
        deps: DepsLookup,
        visit: &mut dyn FnMut(&Todo, TodoOrder) -> Result<()>,
    ) -> Result<()> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {TODO_COLUMNS}, seq FROM todos WHERE goal_id = ?1{and_where}"
            ))
            .map_err(self.err("listing todos"))?;
        let mut rows = stmt.query(params).map_err(self.err("listing todos"))?;
        let mut current: Option<Todo> = None;
        let mut goal_deps: Option<std::collections::HashMap<String, Vec<String>>> = None;
        while let Some(row) = rows.next().map_err(self.err("listing todos"))? {
            let todo = match current.as_mut() {
                Some(todo) => {
                    read_todo_located(row, todo).map_err(self.err("listing todos"))?;
                    todo
                }
                None => current.insert(todo_from_row(row).map_err(self.err("listing todos"))?),
            };
            todo.depends_on = match deps {
                DepsLookup::WholeGoal => {
                    let all = match &mut goal_deps {
                        Some(all) => all,
                        None => goal_deps.insert(self.goal_deps(&todo.goal_id)?),
                    };
                    all.remove(&todo.id).unwrap_or_default()
                }
                DepsLookup::PerTodo => self.deps_of(&todo.goal_id, &todo.id)?,
            };
            let seq = row
                .get(TODO_COLUMN_COUNT)
                .map_err(self.err("listing todos"))?;
            visit(todo, TodoOrder::new(todo.priority.rank(), seq))?;
        }
        Ok(())
    }

    /// Every dependency of a goal's todos, by todo id.
    pub(super) fn goal_deps(
        &self,
        goal_id: &str,
    ) -> Result<std::collections::HashMap<String, Vec<String>>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT todo_id, depends_on FROM todo_deps WHERE goal_id = ?1 ORDER BY todo_id, depends_on")
            .map_err(self.err("listing dependencies"))?;
        let rows = stmt
            .query_map([goal_id], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(self.err("listing dependencies"))?;
        let mut by_todo: std::collections::HashMap<String, Vec<String>> =
            std::collections::HashMap::new();
        for row in rows {
            let (todo_id, dep) = row.map_err(self.err("listing dependencies"))?;
            by_todo.entry(todo_id).or_default().push(dep);
        }
        Ok(by_todo)
    }

    pub(super) fn write_todo(&self, todo: &Todo, insert: bool) -> Result<()> {
        let gate_scope = todo.gate_scope.as_ref().map(to_json);
        let claim = todo.claim.as_ref();
        let values = params![
            todo.goal_id,
            todo.id,
            todo.role.as_str(),
            todo.kind.as_str(),
            todo.title,
            todo.detail,
            todo.priority.rank(),
            todo.status.as_str(),
            todo.capability,
            todo.lane,
            gate_scope,
            claim.map(|c| c.agent_id.clone()),
            claim.map(|c| c.fence),
            claim.map(|c| c.expires_at),
            claim.map(|c| c.idempotency_key.clone()),
            claim.map(|c| c.claimed_at),
            todo.last_fence,
            todo.status_reason,
            todo.created_at,
            todo.updated_at,
        ];
        if insert {
            let sql = format!(
                "INSERT INTO todos ({TODO_COLUMNS}, seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, \
                 ?14, ?15, ?16, ?17, ?18, ?19, ?20, ({NEXT_TODO_SEQ}))"
            );
            self.conn
                .prepare_cached(&sql)
                .and_then(|mut s| s.execute(values))
                .map_err(self.err("inserting a todo"))?;
            self.count_todos(&todo.goal_id, todo.role.as_str(), todo.status.as_str(), 1)?;
            let mut dep = self
                .conn
                .prepare_cached("INSERT OR IGNORE INTO todo_deps (goal_id, todo_id, depends_on) VALUES (?1, ?2, ?3)")
                .map_err(self.err("inserting dependencies"))?;
            for d in &todo.depends_on {
                dep.execute(params![todo.goal_id, todo.id, d])
                    .map_err(self.err("inserting dependencies"))?;
            }
        } else {
            let sql = "UPDATE todos SET role = ?3, kind = ?4, title = ?5, detail = ?6, priority = ?7, status = ?8, \
                 capability = ?9, lane = ?10, gate_scope = ?11, claim_agent = ?12, claim_fence = ?13, \
                 claim_expires_at = ?14, claim_key = ?15, claimed_at = ?16, last_fence = ?17, status_reason = ?18, \
                 created_at = ?19, updated_at = ?20, view_format = NULL, view_json = NULL, view_md = NULL, view_key = NULL \
                 WHERE goal_id = ?1 AND id = ?2";
            let before: Option<(String, String)> = self.query_opt(
                "SELECT role, status FROM todos WHERE goal_id = ?1 AND id = ?2",
                params![todo.goal_id, todo.id],
                |r| Ok((r.get(0)?, r.get(1)?)),
                "reading a todo's status",
            )?;
            self.conn
                .prepare_cached(sql)
                .and_then(|mut s| s.execute(values))
                .map_err(self.err("updating a todo"))?;
            let (role, status) = (todo.role.as_str(), todo.status.as_str());
            if let Some((old_role, old_status)) = before
                && (old_role != role || old_status != status)
            {
                self.count_todos(&todo.goal_id, &old_role, &old_status, -1)?;
                self.count_todos(&todo.goal_id, role, status, 1)?;
            }
        }
        Ok(())
    }

    /// Moves the goal's kept count of todos in (role, status) by `by`, in the transaction that
    /// writes the todo: [`Db::write_todo`] is the only writer of `todo_counts`.
    fn count_todos(&self, goal_id: &str, role: &str, status: &str, by: i64) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO todo_counts (goal_id, role, status, n) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (goal_id, role, status) DO UPDATE SET n = n + excluded.n",
            )
            .and_then(|mut s| s.execute(params![goal_id, role, status, by]))
            .map_err(self.err("counting todos"))?;
        Ok(())
    }

    pub(super) fn insert_todo(&self, todo: &Todo) -> Result<()> {
        self.write_todo(todo, true)
    }

    pub(super) fn update_todo(&self, todo: &Todo) -> Result<()> {
        self.write_todo(todo, false)
    }

    pub(super) fn todo(&self, goal_id: &str, todo_id: &str) -> Result<Option<Todo>> {
        let todo = self.query_opt(
            &format!("SELECT {TODO_COLUMNS} FROM todos WHERE goal_id = ?1 AND id = ?2"),
            params![goal_id, todo_id],
            todo_from_row,
            "reading a todo",
        )?;
        match todo {
            Some(t) => Ok(self.with_deps(vec![t])?.pop()),
            None => Ok(None),
        }
    }

    pub(super) fn todos(&self, goal_id: &str) -> Result<Vec<Todo>> {
        let mut rows = Vec::new();
        self.for_each_todo(goal_id, &mut |todo, order| {
            rows.push((order, todo.clone()));
            Ok(())
        })?;
        // Sort the keys, then move each todo once: todos are hundreds of bytes each.
        let mut keys: Vec<(TodoOrder, usize)> = rows
            .iter()
            .enumerate()
            .map(|(i, (order, _))| (*order, i))
            .collect();
        keys.sort_unstable();
        let mut slots: Vec<Option<Todo>> = rows.into_iter().map(|(_, t)| Some(t)).collect();
        Ok(keys
            .iter()
            .map(|&(_, i)| slots[i].take().expect("each index once"))
            .collect())
    }

    pub(super) fn for_each_todo(
        &self,
        goal_id: &str,
        visit: &mut dyn FnMut(&Todo, TodoOrder) -> Result<()>,
    ) -> Result<()> {
        self.visit_todos("", params![goal_id], DepsLookup::WholeGoal, visit)
    }

    pub(super) fn todo_count(&self, goal_id: &str) -> Result<i64> {
        self.query_one(
            "SELECT COUNT(*) FROM todos WHERE goal_id = ?1",
            [goal_id],
            |r| r.get(0),
            "counting todos",
        )
    }

    pub(super) fn ready_todos(&self, goal_id: &str, now: i64, limit: usize) -> Result<Vec<Todo>> {
        // Two simple queries, not one: each walks `todos_by_role_status` in priority order and
        // stops after `limit` todos whose dependencies are all completed (open ones, and claimed
        // ones whose lease expired), and the two short lists are merged here. A compound SELECT
        // costs twice as much to prepare, and a bound LIMIT makes SQLite re-prepare it; both are
        // paid by every process.
        let deps_met = "NOT EXISTS (SELECT 1 FROM todo_deps d WHERE d.goal_id = t.goal_id AND d.todo_id = t.id \
             AND NOT EXISTS (SELECT 1 FROM todos u WHERE u.goal_id = d.goal_id AND u.id = d.depends_on \
             AND u.status = 'completed'))";
        // Only the keys are selected (see `todos_by_selected_ids`); the winners are read in full.
        let open = format!(
            "SELECT id, priority, seq FROM todos t WHERE t.goal_id = ?1 AND t.role = 'agent' \
             AND t.status = 'open' AND {deps_met} ORDER BY t.priority, t.seq LIMIT {limit}"
        );
        let expired = format!(
            "SELECT id, priority, seq FROM todos t WHERE t.goal_id = ?1 AND t.role = 'agent' \
             AND t.status = 'claimed' AND t.claim_expires_at <= ?2 AND {deps_met} \
             ORDER BY t.priority, t.seq LIMIT {limit}"
        );
        let context = "selecting ready todos";
        let mut keys: Vec<(TodoOrder, String)> = Vec::new();
        for (sql, params) in [(&open, params![goal_id]), (&expired, params![goal_id, now])] {
            let mut stmt = self.conn.prepare_cached(sql).map_err(self.err(context))?;
            let rows = stmt
                .query_map(params, |r| {
                    Ok((TodoOrder::new(r.get(1)?, r.get(2)?), r.get(0)?))
                })
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .map_err(self.err(context))?;
            keys.extend(rows);
        }
        keys.sort_unstable();
        keys.truncate(limit);
        let ids: Vec<String> = keys.into_iter().map(|(_, id)| id).collect();
        self.todos_by_id(goal_id, &ids)
    }

    pub(super) fn claimed_by(
        &self,
        goal_id: &str,
        agent_id: &str,
        now: i64,
    ) -> Result<Option<Todo>> {
        Ok(self
            .todos_by_selected_ids(
                goal_id,
                CLAIM_OF_AGENT,
                params![goal_id, agent_id, now],
                "reading the agent's claim",
            )?
            .pop())
    }

    pub(super) fn open_user_todos(&self, goal_id: &str) -> Result<Vec<Todo>> {
        self.todos_by_selected_ids(
            goal_id,
            OPEN_USER_TODO_IDS,
            params![goal_id],
            "listing gates",
        )
    }

    pub(super) fn todos_in_status(
        &self,
        goal_id: &str,
        role: Role,
        statuses: &[TodoStatus],
        limit: usize,
    ) -> Result<Vec<Todo>> {
        // The statuses are the enum's own spellings, never outside text.
        let list = statuses
            .iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect::<Vec<_>>()
            .join(", ");
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.todos_by_selected_ids(
            goal_id,
            &format!(
                "SELECT id FROM todos INDEXED BY todos_by_role_status \
                 WHERE goal_id = ?1 AND role = ?2 AND status IN ({list}) ORDER BY priority, seq LIMIT ?3"
            ),
            params![goal_id, role.as_str(), limit],
            "listing todos by status",
        )
    }

    pub(super) fn todo_status_counts(&self, goal_id: &str) -> Result<Vec<(String, String, i64)>> {
        // Kept by triggers on `todos` (V6 in `migrations.rs`), so counting costs the same at
        // 100,000 completed todos as at none.
        self.query_all(
            "SELECT role, status, n FROM todo_counts WHERE goal_id = ?1 AND n > 0 ORDER BY role, status",
            [goal_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            "counting todos",
        )
    }

    pub(super) fn bound_capabilities(&self, goal_id: &str) -> Result<Vec<String>> {
        self.query_all(
            &bound_capabilities_sql(),
            [goal_id],
            |r| r.get(0),
            "listing capability bindings",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::store::Store;
    use crate::model::Priority;

    fn todo(id: &str, role: Role, status: TodoStatus) -> Todo {
        Todo {
            id: id.into(),
            goal_id: "g".into(),
            role,
            kind: TodoKind::Task,
            title: id.into(),
            detail: String::new(),
            priority: Priority::P2,
            status,
            depends_on: Vec::new(),
            capability: None,
            lane: None,
            gate_scope: None,
            claim: None,
            last_fence: 0,
            status_reason: None,
            created_at: 1,
            updated_at: 1,
        }
    }

    /// The counts the store keeps equal a count of the rows after inserts, status and role
    /// changes, and writes that leave both alone; the listing by status walks only the statuses
    /// asked for, in listing order.
    #[test]
    fn kept_counts_equal_counting_the_rows() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::create(&dir.path().join("loopx.db")).unwrap();
        let tx = store.begin_write().unwrap();
        tx.insert_goal(&super::super::tests::goal()).unwrap();
        let statuses = [
            TodoStatus::Open,
            TodoStatus::Claimed,
            TodoStatus::Blocked,
            TodoStatus::Completed,
        ];
        for i in 0..40 {
            let role = if i % 5 == 0 { Role::User } else { Role::Agent };
            tx.insert_todo(&todo(&format!("t{i}"), role, TodoStatus::Open))
                .unwrap();
        }
        for i in 0..40 {
            let mut t = tx.todo("g", &format!("t{i}")).unwrap().unwrap();
            t.status = statuses[i % statuses.len()];
            if i % 7 == 0 {
                t.role = Role::User;
            }
            t.title = format!("renamed {i}");
            tx.update_todo(&t).unwrap();
            if i % 3 == 0 {
                t.detail = "a write that keeps the status".into();
                tx.update_todo(&t).unwrap();
            }
        }
        tx.commit().unwrap();
        let db = Db::new(&store.conn, &store.path);
        let counted: Vec<(String, String, i64)> = db
            .query_all(
                "SELECT role, status, COUNT(*) FROM todos WHERE goal_id = 'g' \
                 GROUP BY role, status ORDER BY role, status",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                "counting",
            )
            .unwrap();
        assert_eq!(db.todo_status_counts("g").unwrap(), counted);
        assert!(counted.iter().any(|(_, s, _)| s == "completed"));
        let blocked = db
            .todos_in_status("g", Role::Agent, &[TodoStatus::Blocked], usize::MAX)
            .unwrap();
        assert!(!blocked.is_empty());
        assert!(
            blocked
                .iter()
                .all(|t| t.status == TodoStatus::Blocked && t.role == Role::Agent)
        );
        let first = db
            .todos_in_status(
                "g",
                Role::Agent,
                &[TodoStatus::Open, TodoStatus::Claimed],
                1,
            )
            .unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(
            first[0].id, "t1",
            "listing order: same priority, first created"
        );
    }
}
