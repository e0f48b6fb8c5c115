//! What `doctor` asks of the store beyond `PRAGMA integrity_check`: text that is not UTF-8,
//! stored JSON that does not parse, rows the readers cannot decode, and dangling references.

use super::*;

/// Stored JSON columns, by table: each must parse as JSON wherever it is read. The turn journal's
/// `phases` and `data` are left to the journal's own check (`doctor`'s "turn journal").
pub(super) const JSON_COLUMNS: &[(&str, &str)] = &[
    ("goals", "success_criteria"),
    ("todos", "gate_scope"),
    ("runs", "payload"),
    ("ops", "detail"),
    ("extension_revisions", "manifest"),
    ("extension_revisions", "grants"),
    ("extension_revisions", "component_hashes"),
    ("monitors", "state"),
    ("goal_probes", "state"),
    ("store_meta", "retention_policy"),
];

/// References between rows that the schema does not enforce (only `todos.goal_id` is a foreign
/// key), as (what, query selecting the dangling row's key as text).
pub(super) const REFERENCE_CHECKS: &[(&str, &str)] = &[
    (
        "todo -> goal",
        "SELECT t.goal_id || '/' || t.id FROM todos t WHERE NOT EXISTS (SELECT 1 FROM goals g WHERE g.id = t.goal_id)",
    ),
    (
        "dependency -> todo",
        "SELECT d.goal_id || '/' || d.todo_id || ' -> ' || d.depends_on FROM todo_deps d \
         WHERE NOT EXISTS (SELECT 1 FROM todos t WHERE t.goal_id = d.goal_id AND t.id = d.todo_id) \
            OR NOT EXISTS (SELECT 1 FROM todos t WHERE t.goal_id = d.goal_id AND t.id = d.depends_on)",
    ),
    (
        "evidence -> todo",
        "SELECT 'evidence ' || e.id || ' (' || e.goal_id || '/' || e.todo_id || ')' FROM evidence e \
         WHERE NOT EXISTS (SELECT 1 FROM todos t WHERE t.goal_id = e.goal_id AND t.id = e.todo_id)",
    ),
    (
        "evidence -> run",
        "SELECT 'evidence ' || e.id || ' -> run ' || e.run_id FROM evidence e \
         WHERE e.run_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = e.run_id)",
    ),
    (
        "run -> goal",
        "SELECT r.id || ' -> goal ' || r.goal_id FROM runs r WHERE NOT EXISTS (SELECT 1 FROM goals g WHERE g.id = r.goal_id)",
    ),
    (
        "run -> todo",
        "SELECT r.id || ' -> todo ' || r.goal_id || '/' || r.todo_id FROM runs r WHERE r.todo_id IS NOT NULL \
         AND NOT EXISTS (SELECT 1 FROM todos t WHERE t.goal_id = r.goal_id AND t.id = r.todo_id)",
    ),
    (
        "reward -> run",
        "SELECT 'reward ' || w.id || ' -> run ' || w.run_id FROM rewards w WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = w.run_id)",
    ),
    (
        "quota policy -> goal",
        "SELECT q.goal_id FROM quota_policy q WHERE NOT EXISTS (SELECT 1 FROM goals g WHERE g.id = q.goal_id)",
    ),
    (
        "ledger -> goal",
        "SELECT l.effect_id || ' -> goal ' || l.goal_id FROM quota_ledger l WHERE NOT EXISTS (SELECT 1 FROM goals g WHERE g.id = l.goal_id)",
    ),
    (
        "turn -> goal",
        "SELECT u.turn_key || ' -> goal ' || u.goal_id FROM turns u WHERE NOT EXISTS (SELECT 1 FROM goals g WHERE g.id = u.goal_id)",
    ),
    (
        "turn -> todo",
        "SELECT u.turn_key || ' -> todo ' || u.goal_id || '/' || u.todo_id FROM turns u WHERE u.todo_id IS NOT NULL \
         AND NOT EXISTS (SELECT 1 FROM todos t WHERE t.goal_id = u.goal_id AND t.id = u.todo_id)",
    ),
    (
        "extension -> revision",
        "SELECT e.id || ' revision ' || e.active_revision FROM extensions e \
         WHERE NOT EXISTS (SELECT 1 FROM extension_revisions r WHERE r.id = e.id AND r.revision = e.active_revision)",
    ),
];

/// At most this many problems of one kind are listed by [`SqliteStore::content_problems`]; the
/// rest are counted.
pub(super) const PROBLEMS_LISTED: usize = 20;

impl SqliteStore {
    /// Checks the content `PRAGMA integrity_check` cannot see (for `doctor`; reads every row):
    /// text that is not UTF-8, stored JSON that does not parse, rows the readers cannot decode,
    /// and references to rows that do not exist. Each problem names its table and key.
    pub(super) fn content_problems(&self) -> Result<Vec<String>> {
        let mut problems = Vec::new();
        self.scan_rows(&mut problems)?;
        for (what, sql) in REFERENCE_CHECKS {
            let dangling: Vec<String> = self
                .conn
                .prepare(sql)
                .and_then(|mut stmt| {
                    stmt.query_map([], |r| {
                        Ok(match r.get_ref(0)? {
                            ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
                            other => format!("{:?}", other.data_type()),
                        })
                    })?
                    .collect()
                })
                .map_err(|e| map_err(&self.path, "checking references", e))?;
            list_problems(&mut problems, &dangling, |key| {
                format!("dangling reference {what}: {key}")
            });
        }
        // Every row through the decoders the commands use, so whatever `doctor` passes, the
        // commands can read (enum values, integer ranges, column types).
        let tx = self.begin_read()?;
        let mut decode = |what: &str, result: Result<()>| {
            if let Err(e) = result {
                problems.push(format!("{what}: {e}"));
            }
        };
        let goals = tx.goals();
        let goal_ids: Vec<String> = match &goals {
            Ok(goals) => goals.iter().map(|g| g.id.clone()).collect(),
            Err(_) => Vec::new(),
        };
        decode("goals", goals.map(drop));
        for goal in &goal_ids {
            decode("todos", tx.todos(goal).map(drop));
            decode("runs", tx.runs(goal, i64::MAX as usize, None).map(drop));
            decode(
                "evidence",
                tx.recent_evidence(goal, i64::MAX as usize).map(drop),
            );
            decode(
                "rewards",
                tx.recent_rewards(goal, i64::MAX as usize).map(drop),
            );
            decode(
                "quota ledger",
                tx.recent_ledger(goal, i64::MAX as usize).map(drop),
            );
            decode("quota policy", tx.quota_policy(goal).map(drop));
        }
        decode("operation log", tx.ops(None, i64::MAX as usize).map(drop));
        decode("extensions", tx.extensions().map(drop));
        drop(tx);
        Ok(problems)
    }

    /// Every text value of every table checked for UTF-8, and every stored JSON column parsed.
    pub(super) fn scan_rows(&self, problems: &mut Vec<String>) -> Result<()> {
        let err = |e| map_err(&self.path, "scanning rows", e);
        let tables: Vec<String> = self
            .conn
            .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
            .and_then(|mut stmt| stmt.query_map([], |r| r.get(0))?.collect())
            .map_err(err)?;
        for table in tables {
            // (name, primary-key position) of each column; the key names a damaged row.
            let columns: Vec<(String, i64)> = self
                .conn
                .prepare(&format!("PRAGMA table_info(\"{table}\")"))
                .and_then(|mut stmt| {
                    stmt.query_map([], |r| Ok((r.get(1)?, r.get(5)?)))?
                        .collect()
                })
                .map_err(err)?;
            let mut key: Vec<usize> = (0..columns.len()).filter(|&i| columns[i].1 > 0).collect();
            key.sort_by_key(|&i| columns[i].1);
            let json: Vec<bool> = columns
                .iter()
                .map(|(c, _)| JSON_COLUMNS.contains(&(table.as_str(), c.as_str())))
                .collect();
            let list = columns
                .iter()
                .map(|(c, _)| format!("\"{c}\""))
                .collect::<Vec<_>>()
                .join(", ");
            let mut stmt = self
                .conn
                .prepare(&format!("SELECT {list} FROM \"{table}\""))
                .map_err(err)?;
            let mut rows = stmt.query([]).map_err(err)?;
            let mut found = Vec::new();
            while let Some(row) = rows.next().map_err(err)? {
                for (idx, (column, _)) in columns.iter().enumerate() {
                    let ValueRef::Text(bytes) = row.get_ref(idx).map_err(err)? else {
                        continue;
                    };
                    let reason = match std::str::from_utf8(bytes) {
                        Err(e) => Some(format!("not UTF-8 ({e})")),
                        Ok(text) if json[idx] => serde_json::from_str::<serde_json::Value>(text)
                            .err()
                            .map(|e| format!("stored JSON does not parse ({e})")),
                        Ok(_) => None,
                    };
                    if let Some(reason) = reason {
                        let key_text: Vec<String> = key
                            .iter()
                            .map(|&k| match row.get_ref(k) {
                                Ok(ValueRef::Text(t)) => String::from_utf8_lossy(t).into_owned(),
                                Ok(ValueRef::Integer(i)) => i.to_string(),
                                _ => "?".to_string(),
                            })
                            .collect();
                        found.push(format!(
                            "table {table} row ({}) column {column}: {reason}",
                            key_text.join(", ")
                        ));
                    }
                }
            }
            list_problems(problems, &found, |p| p.to_string());
        }
        Ok(())
    }
}

/// Appends the first [`PROBLEMS_LISTED`] of `found`, formatted, and a count of the rest.
pub(super) fn list_problems(
    problems: &mut Vec<String>,
    found: &[String],
    format: impl Fn(&str) -> String,
) {
    for item in found.iter().take(PROBLEMS_LISTED) {
        problems.push(format(item));
    }
    if found.len() > PROBLEMS_LISTED {
        problems.push(format!(
            "... and {} more like the above",
            found.len() - PROBLEMS_LISTED
        ));
    }
}
