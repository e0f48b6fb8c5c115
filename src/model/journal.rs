//! The turn journal's records: one row per agent turn, its status, its committed phases and how
//! it ended. Typed here, below both the store that keeps them and the driver that writes them, so
//! neither compares status strings.

use super::wire_enum;

wire_enum!(
    /// How a turn ended (docs/turn-protocol.md, "Result kinds"). Exactly one per settled turn.
    TurnResultKind {
        ValidatedProgress => "validated_progress",
        ValidatedCompletion => "validated_completion",
        RepairRequired => "repair_required",
        ReplanRequired => "replan_required",
        UserActionRequired => "user_action_required",
        Wait => "wait",
        HostFailure => "host_failure",
        ValidationFailed => "validation_failed",
        WritebackFailed => "writeback_failed",
        QuotaSpendFailed => "quota_spend_failed",
        TerminalCloseoutFailed => "terminal_closeout_failed",
    }
);

wire_enum!(
    /// The journaled phases, in order.
    Phase {
        HostExecute => "host_execute",
        TypedResult => "typed_result",
        Validation => "validation",
        DurableWriteback => "durable_writeback",
        QuotaSpend => "quota_spend",
        TerminalCloseout => "terminal_closeout",
    }
);

wire_enum!(
    /// Journal status of a turn.
    JournalStatus {
        InProgress => "in_progress",
        Committed => "committed",
        Stopped => "stopped",
        Failed => "failed",
    }
);

impl TurnResultKind {
    /// A failure kind: the turn did not deliver; nothing is spent.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            TurnResultKind::HostFailure
                | TurnResultKind::ValidationFailed
                | TurnResultKind::WritebackFailed
                | TurnResultKind::QuotaSpendFailed
                | TurnResultKind::TerminalCloseoutFailed
        )
    }

    /// Whether the turn spends one quota slot (after its writeback committed).
    pub fn spends(self) -> bool {
        matches!(
            self,
            TurnResultKind::ValidatedProgress
                | TurnResultKind::ValidatedCompletion
                | TurnResultKind::RepairRequired
                | TurnResultKind::ReplanRequired
        )
    }

    /// The journal status a turn of this kind settles with.
    pub fn journal_status(self) -> JournalStatus {
        if self.is_failure() {
            JournalStatus::Failed
        } else if matches!(
            self,
            TurnResultKind::UserActionRequired | TurnResultKind::Wait
        ) {
            JournalStatus::Stopped
        } else {
            JournalStatus::Committed
        }
    }

    /// The phase a failure kind is attributed to.
    pub fn failed_phase(self) -> Option<Phase> {
        match self {
            TurnResultKind::HostFailure => Some(Phase::HostExecute),
            TurnResultKind::ValidationFailed => Some(Phase::Validation),
            TurnResultKind::WritebackFailed => Some(Phase::DurableWriteback),
            TurnResultKind::QuotaSpendFailed => Some(Phase::QuotaSpend),
            TurnResultKind::TerminalCloseoutFailed => Some(Phase::TerminalCloseout),
            _ => None,
        }
    }
}

/// A durable journal row for one agent turn (see `crate::turn`), keyed by turn key.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct TurnRecord {
    pub turn_key: String,
    pub goal_id: String,
    pub agent_id: String,
    pub todo_id: Option<String>,
    pub status: JournalStatus,
    /// Phases committed so far, in order.
    pub phases: Vec<Phase>,
    /// Everything the driver needs to resume: request, host result, verdicts, result kind.
    pub data: serde_json::Value,
    pub created_at: i64,
    pub updated_at: i64,
    /// Set when the stored `data` (or `phases`) column did not decode; `data` then holds the
    /// stored text as a JSON string. One undecodable row must not fail every listing of the
    /// journal: the turn driver settles such a row as failed and `doctor` reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_error: Option<String>,
}

/// The journal keys [`compact_journal_data`] removes or empties, and why each buys nothing once a
/// turn has settled: `request` (kept as null) is the JSON the host read on stdin, rebuilt from the
/// todo and goal (its result-schema text is the same for every turn); `host` and the validator
/// hold the processes' stdout and stderr tails (the exit of each process stays in `compacted`);
/// `result`, `validation` and `writeback` are in the run's row (its summary) and payload (result,
/// validation, every verdict), and the evidence table; whether the delivery was validated and
/// each verdict stay in `compacted`; `host_argv` is in the run's payload; `cwd` and
/// `project_root` are the goal's project directory; the lease's `claim_key` and the spend's
/// `effect_id` are the turn key (`turn:<key>`), kept in the claim's operation-log row and the
/// ledger; `route_reason` is a sentence built from the todo's id, priority and title;
/// `timings_us` is a profile of the live turn. Keys whose value is null go too, and
/// `orphans_killed` when empty: the journal schema reads them as absent. Required keys keep
/// their type, emptied, so the data reads as the same journal schema.
pub const COMPACTED_KEYS: &[&str] = &[
    "request",
    "host",
    "result",
    "validation",
    "writeback",
    "host_argv",
    "cwd",
    "project_root",
    "claim.claim_key",
    "spend.effect_id",
    "route_reason",
    "timings_us",
];
/// A settled turn's journal `data` reduced to its summary (`loopx gc`): the result kind, phase and
/// failure, spend, lease, fence, run id and times an audit needs, with [`COMPACTED_KEYS`] removed
/// or emptied. A `compacted` key records how the host (unless it exited 0 on its own) and the
/// validator processes exited, whether the delivery was validated, and each admission verdict as
/// `[index, transition, accepted]` (the row's `compacted_at` says when). `turn_key` is the row's key: the claim key and effect id
/// are emptied only when they are the ones derived from it. Data that is not a JSON object, or is
/// already compacted, comes back unchanged.
pub fn compact_journal_data(data: &serde_json::Value, turn_key: &str) -> serde_json::Value {
    use serde_json::{Map, Value, json};
    let Value::Object(full) = data else {
        return data.clone();
    };
    if full.contains_key("compacted") {
        return data.clone();
    }
    let exit = |p: Option<&Value>| -> Value {
        let Some(Value::Object(o)) = p else {
            return Value::Null;
        };
        let kept: Map<String, Value> = [
            "exit_code",
            "signal",
            "timed_out",
            "interrupted",
            "spawn_error",
        ]
        .iter()
        .filter_map(|k| {
            o.get(*k)
                .filter(|v| !v.is_null() && **v != Value::Bool(false))
                .map(|v| (k.to_string(), v.clone()))
        })
        .collect();
        Value::Object(kept)
    };
    let mut compacted = Map::new();
    // A host that exited 0 on its own (the common case) is left unsaid.
    let host = exit(full.get("host"));
    if !host.is_null() && host != json!({"exit_code": 0}) {
        compacted.insert("host".into(), host);
    }
    let v = &full.get("validation").cloned().unwrap_or(Value::Null);
    let validated = (v["ran"] == true && v["passed"] == true) || v["completion_validated"] == true;
    compacted.insert("validated".into(), json!(validated));
    let validator = exit(full.get("validation").and_then(|v| v.get("validator")));
    if !validator.is_null() {
        compacted.insert("validator".into(), validator);
    }
    if let Some(Value::Object(w)) = full.get("writeback") {
        let verdicts: Vec<Value> = (w.get("verdicts").and_then(Value::as_array))
            .into_iter()
            .flatten()
            .map(|v| json!([v["index"], v["transition"], v["accepted"]]))
            .collect();
        compacted.insert("verdicts".into(), Value::Array(verdicts));
        if let Some(e) = w.get("error").filter(|e| !e.is_null()) {
            compacted.insert("writeback_error".into(), e.clone());
        }
    }
    let mut out = full.clone();
    for key in COMPACTED_KEYS {
        // Required keys keep their type, emptied; the others go.
        let emptied = match *key {
            "request" => Some(Value::Null),
            "host_argv" => Some(json!([])),
            "cwd" | "project_root" | "route_reason" => Some(json!("")),
            "claim.claim_key" => (full["claim"]["claim_key"] == turn_key).then(|| json!("")),
            "spend.effect_id" => (full["spend"]["effect_id"]
                == format!("turn:{turn_key}").as_str())
            .then(|| json!("")),
            _ => None,
        };
        let required = matches!(*key, "claim.claim_key" | "spend.effect_id");
        match (key.split_once('.'), emptied) {
            (None, Some(v)) => {
                if out.contains_key(*key) {
                    out.insert(key.to_string(), v);
                }
            }
            (None, None) => {
                out.remove(*key);
            }
            (Some((outer, inner)), v) => {
                if let Some(Value::Object(o)) = out.get_mut(outer)
                    && o.contains_key(inner)
                {
                    match v {
                        Some(v) => {
                            o.insert(inner.to_string(), v);
                        }
                        None if !required => {
                            o.remove(inner);
                        }
                        None => {}
                    }
                }
            }
        }
    }
    out.retain(|k, v| !v.is_null() || k == "request");
    if out.get("orphans_killed") == Some(&json!([])) {
        out.remove("orphans_killed");
    }
    out.insert("compacted".to_string(), Value::Object(compacted));
    Value::Object(out)
}
