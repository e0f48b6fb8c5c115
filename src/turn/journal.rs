//! The journal's `data`: everything a turn needs to be resumed, and the next phase it implies.
//!
//! Why this exists: the journal row is the whole truth about a turn. Its typed form is shared by
//! the driver that writes it, recovery that resumes from it, the repair of rows that cannot be
//! decoded, and the outcome read back from it; and `next_phase` is a pure function of it, so
//! the same state machine runs a fresh turn and finishes an interrupted one.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::host::ProcessOutcome;
use super::isolation::Isolation;
use super::result::HostResult;
use super::{Phase, TurnResultKind};
use crate::error::{LoopxError, Result};
use crate::kernel::transition::{Transition, Verdict};
use crate::model::{TodoStatus, TurnRecord};
use crate::plugin::error::PluginErrorKind;

pub const JOURNAL_SCHEMA: &str = "loopx.turn_journal.v1";

/// The lease the turn holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimInfo {
    pub fence: i64,
    pub claim_key: String,
    pub expires_at: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidationRecord {
    /// A validator process ran.
    pub ran: bool,
    pub passed: bool,
    /// The host claimed `completed` and the claim stands (validator passed, or trusted).
    pub completion_validated: bool,
    pub detail: String,
    pub validator: Option<ProcessOutcome>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WritebackRecord {
    pub capability: String,
    pub proposals: Vec<Transition>,
    pub verdicts: Vec<Verdict>,
    pub accepted: usize,
    pub refused: usize,
    pub error: Option<String>,
    /// Which sandbox limit or fault stopped the capability, when one did (`fuel_exhausted`,
    /// `deadline`, `memory_limit`, `trap`, `guest_error`, ...): a value to branch on, beside the
    /// message in `error`. Absent from journal rows written before it existed.
    #[serde(default)]
    pub plugin_failure: Option<PluginErrorKind>,
    pub todo_status_after: Option<TodoStatus>,
    /// The plugin host's call report (WebAssembly capabilities only).
    pub call: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpendRecord {
    pub effect_id: String,
    pub slots: i64,
    pub idempotent_replay: bool,
}

/// Everything the driver needs to resume a turn; stored as the journal row's `data`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalData {
    pub schema_version: String,
    /// The request JSON the host received on stdin, less its constant `result_schema`.
    pub request: Value,
    pub host_argv: Vec<String>,
    pub validate_argv: Option<Vec<String>>,
    pub timeout_ms: u64,
    pub trust_host_completion: bool,
    pub capability: String,
    pub cwd: String,
    pub project_root: String,
    pub claim: ClaimInfo,
    pub route_reason: String,
    pub host: Option<ProcessOutcome>,
    pub result: Option<HostResult>,
    pub result_error: Option<String>,
    pub validation: Option<ValidationRecord>,
    pub writeback: Option<WritebackRecord>,
    pub spend: Option<SpendRecord>,
    /// `released`, `cleared` (completion or block cleared it), `not_held` (taken over after
    /// expiry), or `not_released: <why>`.
    pub lease: Option<String>,
    pub kind: Option<TurnResultKind>,
    pub failed_phase: Option<Phase>,
    pub failure: Option<String>,
    pub run_id: Option<String>,
    /// Set when a process other than the original driver finished the turn.
    pub recovered: bool,
    /// Processes of this turn that recovery found still running and killed.
    #[serde(default)]
    pub orphans_killed: Vec<i32>,
    /// Microseconds each step spent before its commit (work and transaction body; the commit's
    /// own fsync is not included): `start` (decide + claim), then one entry per phase.
    #[serde(default)]
    pub timings_us: std::collections::BTreeMap<String, u64>,
    pub driver_pid: u32,
    pub started_at: i64,
    pub settled_at: Option<i64>,
    /// How the host and validator run: in namespaces without `.loopx/`, or not isolated. A
    /// validator that recovery runs later runs the same way (or not at all).
    #[serde(default)]
    pub isolation: Isolation,
}

pub(crate) fn journal_data(rec: &TurnRecord) -> Result<JournalData> {
    serde_json::from_value(rec.data.clone()).map_err(|e| LoopxError::Corrupt {
        path: PathBuf::from(format!("turns/{}", rec.turn_key)),
        detail: format!("journal data does not parse: {e}").into(),
    })
}

/// The phase to run next, from the journal alone.
pub(crate) fn next_phase(rec: &TurnRecord, data: &JournalData) -> Phase {
    let failed = data.kind.is_some_and(TurnResultKind::is_failure);
    match rec.phases.last().copied() {
        None => Phase::HostExecute,
        Some(Phase::HostExecute) => Phase::TypedResult,
        Some(Phase::TypedResult) if failed => Phase::TerminalCloseout,
        Some(Phase::TypedResult) => Phase::Validation,
        Some(Phase::Validation) if failed => Phase::TerminalCloseout,
        Some(Phase::Validation) => Phase::DurableWriteback,
        Some(Phase::DurableWriteback) if data.kind.is_some_and(TurnResultKind::spends) => {
            Phase::QuotaSpend
        }
        Some(Phase::DurableWriteback | Phase::QuotaSpend | Phase::TerminalCloseout) => {
            Phase::TerminalCloseout
        }
    }
}
