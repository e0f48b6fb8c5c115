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
