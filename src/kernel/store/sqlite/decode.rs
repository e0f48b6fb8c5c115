//! Row decoding shared by every query: the column lists and the functions that turn a row into a
//! record, each failure located by table and key (see `errors::locate`).

use super::*;

pub(super) const TODO_COLUMNS: &str = "goal_id, id, role, kind, title, detail, priority, status, capability, lane, gate_scope, \
     claim_agent, claim_fence, claim_expires_at, claim_key, claimed_at, last_fence, status_reason, created_at, updated_at";
/// How many columns `TODO_COLUMNS` names; a query may select more after them.
pub(super) const TODO_COLUMN_COUNT: usize = 20;

/// A text column `idx` whose content does not decode.
pub(super) fn bad_text(
    idx: usize,
    e: impl std::error::Error + Send + Sync + 'static,
) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e))
}

pub(super) fn text_enum<T>(
    row: &Row,
    idx: usize,
    parse: fn(&str) -> Result<T>,
) -> rusqlite::Result<T> {
    // Borrowed, not a `String`: enum columns are read for every todo of every listing.
    let text = row.get_ref(idx)?.as_str()?;
    parse(text).map_err(|e| bad_text(idx, e))
}

pub(super) fn json_col<T: serde::de::DeserializeOwned>(
    row: &Row,
    idx: usize,
) -> rusqlite::Result<T> {
    let text: String = row.get(idx)?;
    serde_json::from_str(&text).map_err(|e| bad_text(idx, e))
}

pub(super) fn todo_from_row(row: &Row) -> rusqlite::Result<Todo> {
    let mut todo = Todo {
        id: String::new(),
        goal_id: String::new(),
        role: Role::Agent,
        kind: TodoKind::Task,
        title: String::new(),
        detail: String::new(),
        priority: Priority::P2,
        status: TodoStatus::Open,
        depends_on: Vec::new(),
        capability: None,
        lane: None,
        gate_scope: None,
        claim: None,
        last_fence: 0,
        status_reason: None,
        created_at: 0,
        updated_at: 0,
    };
    read_todo_located(row, &mut todo)?;
    Ok(todo)
}

/// [`read_todo_into`] naming the todo whose row does not decode.
pub(super) fn read_todo_located(row: &Row, todo: &mut Todo) -> rusqlite::Result<()> {
    locate(row, "todos", &[0, 1], || read_todo_into(row, todo))
}

/// Decodes a `{TODO_COLUMNS}` row into `todo`, reusing its strings' buffers, so a listing of every
/// todo can run through one `Todo` without allocating per row. Leaves `depends_on` alone.
pub(super) fn read_todo_into(row: &Row, todo: &mut Todo) -> rusqlite::Result<()> {
    fn text(row: &Row, idx: usize, dst: &mut String) -> rusqlite::Result<()> {
        dst.clear();
        dst.push_str(row.get_ref(idx)?.as_str()?);
        Ok(())
    }
    fn optional_text(row: &Row, idx: usize, dst: &mut Option<String>) -> rusqlite::Result<()> {
        match (row.get_ref(idx)?.as_str_or_null()?, dst.as_mut()) {
            (None, _) => *dst = None,
            (Some(value), Some(buf)) => {
                buf.clear();
                buf.push_str(value);
            }
            (Some(value), None) => *dst = Some(value.to_owned()),
        }
        Ok(())
    }
    text(row, 0, &mut todo.goal_id)?;
    text(row, 1, &mut todo.id)?;
    todo.role = text_enum(row, 2, Role::parse)?;
    todo.kind = text_enum(row, 3, TodoKind::parse)?;
    text(row, 4, &mut todo.title)?;
    text(row, 5, &mut todo.detail)?;
    let rank: i64 = row.get(6)?;
    todo.priority = Priority::from_rank(rank).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            6,
            rusqlite::types::Type::Integer,
            format!("priority rank {rank} is none of 0 (P0) to 4 (P4)").into(),
        )
    })?;
    todo.status = text_enum(row, 7, TodoStatus::parse)?;
    optional_text(row, 8, &mut todo.capability)?;
    optional_text(row, 9, &mut todo.lane)?;
    todo.gate_scope = match row.get_ref(10)?.as_str_or_null()? {
        Some(text) => Some(serde_json::from_str::<GateScope>(text).map_err(|e| bad_text(10, e))?),
        None => None,
    };
    todo.claim = match row.get_ref(11)?.as_str_or_null()? {
        Some(agent_id) => Some(Claim {
            agent_id: agent_id.to_owned(),
            fence: row.get(12)?,
            expires_at: row.get(13)?,
            idempotency_key: row.get(14)?,
            claimed_at: row.get(15)?,
        }),
        None => None,
    };
    todo.last_fence = row.get(16)?;
    optional_text(row, 17, &mut todo.status_reason)?;
    todo.created_at = row.get(18)?;
    todo.updated_at = row.get(19)?;
    Ok(())
}

pub(super) fn goal_from_row(row: &Row) -> rusqlite::Result<Goal> {
    locate(row, "goals", &[0], || {
        Ok(Goal {
            id: row.get(0)?,
            title: row.get(1)?,
            objective: row.get(2)?,
            success_criteria: json_col(row, 3)?,
            status: text_enum(row, 4, GoalStatus::parse)?,
            project_dir: row.get(5)?,
            next_probe: row.get(6)?,
            created_at: row.get(7)?,
            updated_at: row.get(8)?,
        })
    })
}

pub(super) const GOAL_COLUMNS: &str = "id, title, objective, success_criteria, status, project_dir, next_probe, created_at, updated_at";

pub(super) fn run_from_row(row: &Row) -> rusqlite::Result<Run> {
    locate(row, "runs", &[0], || {
        Ok(Run {
            id: row.get(0)?,
            goal_id: row.get(1)?,
            agent_id: row.get(2)?,
            todo_id: row.get(3)?,
            classification: row.get(4)?,
            outcome: row.get(5)?,
            summary: row.get(6)?,
            payload: json_col(row, 7)?,
            created_at: row.get(8)?,
        })
    })
}

pub(super) const RUN_COLUMNS: &str =
    "id, goal_id, agent_id, todo_id, classification, outcome, summary, payload, created_at";

pub(super) fn evidence_from_row(row: &Row) -> rusqlite::Result<Evidence> {
    locate(row, "evidence", &[0], || {
        Ok(Evidence {
            id: row.get(0)?,
            goal_id: row.get(1)?,
            todo_id: row.get(2)?,
            text: row.get(3)?,
            artifact_path: row.get(4)?,
            artifact_digest: row.get(5)?,
            run_id: row.get(6)?,
            actor: row.get(7)?,
            created_at: row.get(8)?,
        })
    })
}

pub(super) const EVIDENCE_COLUMNS: &str =
    "id, goal_id, todo_id, text, artifact_path, artifact_digest, run_id, actor, created_at";

pub(super) fn reward_from_row(row: &Row) -> rusqlite::Result<Reward> {
    locate(row, "rewards", &[0], || {
        Ok(Reward {
            id: row.get(0)?,
            goal_id: row.get(1)?,
            run_id: row.get(2)?,
            score: row.get(3)?,
            comment: row.get(4)?,
            actor: row.get(5)?,
            created_at: row.get(6)?,
        })
    })
}

pub(super) fn ledger_from_row(row: &Row) -> rusqlite::Result<LedgerEntry> {
    locate(row, "quota_ledger", &[0], || {
        Ok(LedgerEntry {
            effect_id: row.get(0)?,
            goal_id: row.get(1)?,
            agent_id: row.get(2)?,
            run_id: row.get(3)?,
            slots: row.get(4)?,
            kind: text_enum(row, 5, LedgerKind::parse)?,
            voids_effect_id: row.get(6)?,
            created_at: row.get(7)?,
        })
    })
}

pub(super) const LEDGER_COLUMNS: &str =
    "effect_id, goal_id, agent_id, run_id, slots, kind, voids_effect_id, created_at";

pub(super) fn artifact_from_row(row: &Row) -> rusqlite::Result<ArtifactRecord> {
    Ok(ArtifactRecord {
        component_sha256: row.get(0)?,
        engine_key: row.get(1)?,
        artifact_sha256: row.get(2)?,
        recorded_at: row.get(3)?,
    })
}

pub(super) fn extension_from_row(row: &Row) -> rusqlite::Result<ExtensionRecord> {
    locate(row, "extension_revisions", &[0, 1], || {
        Ok(ExtensionRecord {
            id: row.get(0)?,
            revision: row.get(1)?,
            version: row.get(2)?,
            manifest: json_col(row, 3)?,
            grants: json_col(row, 4)?,
            install_dir: row.get(5)?,
            component_hashes: json_col(row, 6)?,
            installed_at: row.get(7)?,
            enabled: row.get::<_, Option<bool>>(8)?.unwrap_or(false),
        })
    })
}

pub(super) fn turn_from_row(row: &Row) -> rusqlite::Result<TurnRecord> {
    // `phases` and `data` are decoded leniently: a row whose JSON cannot be read back (invalid
    // UTF-8, nesting beyond serde_json's reader limit, a damaged page) is returned with
    // `data_error` set instead of failing the whole query, so recovery, `turn list` and every
    // other agent's turn keep working while the driver settles that one row.
    let lenient = |idx: usize| -> rusqlite::Result<(String, Option<String>)> {
        match row.get_ref(idx)? {
            ValueRef::Text(bytes) => match std::str::from_utf8(bytes) {
                Ok(t) => Ok((t.to_string(), None)),
                Err(e) => Ok((
                    String::from_utf8_lossy(bytes).into_owned(),
                    Some(format!("not UTF-8: {e}")),
                )),
            },
            other => Ok((
                String::new(),
                Some(format!("stored as {:?}, not text", other.data_type())),
            )),
        }
    };
    let (phases_text, phases_err) = lenient(5)?;
    let (data_text, data_err) = lenient(6)?;
    let phases = match phases_err.map_or_else(
        || serde_json::from_str::<Vec<Phase>>(&phases_text).map_err(|e| e.to_string()),
        Err,
    ) {
        Ok(p) => Ok(p),
        Err(e) => Err(format!("phases: {e}")),
    };
    let data = match data_err.map_or_else(
        || serde_json::from_str::<serde_json::Value>(&data_text).map_err(|e| e.to_string()),
        Err,
    ) {
        Ok(d) => Ok(d),
        Err(e) => Err(format!("data: {e}")),
    };
    let status_text: String = row.get(4)?;
    let status = JournalStatus::parse(&status_text)
        .map_err(|_| format!("status: unknown journal status '{status_text}'"));
    let (phases, data, data_error) = match (phases, data, &status) {
        (Ok(p), Ok(d), Ok(_)) => (p, d, None),
        (p, d, _) => {
            let why: Vec<String> = [p.as_ref().err(), d.as_ref().err(), status.as_ref().err()]
                .into_iter()
                .flatten()
                .cloned()
                .collect();
            (
                p.unwrap_or_default(),
                serde_json::Value::String(data_text),
                Some(why.join("; ")),
            )
        }
    };
    Ok(TurnRecord {
        turn_key: row.get(0)?,
        goal_id: row.get(1)?,
        agent_id: row.get(2)?,
        todo_id: row.get(3)?,
        // A status nobody wrote is settled like any undecodable row: recovery sees it unsettled
        // and `data_error` says why.
        status: status.unwrap_or(JournalStatus::InProgress),
        phases,
        data,
        created_at: row.get(7)?,
        updated_at: row.get(8)?,
        data_error,
    })
}

pub(super) const TURN_COLUMNS: &str =
    "turn_key, goal_id, agent_id, todo_id, status, phases, data, created_at, updated_at";

pub(super) fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("kernel records always serialize")
}
