//! Bounded agent turns that survive any crash, and the loop around them (DESIGN §5).
//!
//! A turn is: decide → claim + journal (one transaction) → `host_execute → typed_result →
//! validation → durable_writeback → quota_spend → terminal_closeout`, each phase committed to the
//! turn journal (together with that phase's state effects) before the next starts. Because every
//! step is a function of the journal row, a turn interrupted anywhere is resumed by
//! [`driver::recover`] after its last committed phase. The protocol is documented in
//! `docs/turn-protocol.md`.
//!
//! * [`host`]: process groups, timeouts, capped output, stop signals.
//! * [`isolation`]: the namespaces that keep the host out of `.loopx/`.
//! * [`channel`]: the socket through which the host's `loopx` calls reach the driver.
//! * [`result`]: the request/result wire format and its limits.
//! * [`capability`]: the built-in default capability and WebAssembly dispatch.
//! * [`driver`]: plan, run, recover, inspect.
//! * [`journal_repair`]: settling (and reporting) journal rows that cannot be decoded.
//! * [`loop_ctl`]: the pure loop controller and `loopx loop`.

pub mod capability;
pub mod channel;
pub mod driver;
pub mod host;
pub mod isolation;
pub mod journal_repair;
pub mod loop_ctl;
pub mod result;

pub use driver::{TurnOutcome, TurnRequest, inspect, list_turns, plan, recover, run_turn};
pub use loop_ctl::{Budget, LoopDisposition, LoopReport, LoopRequest, decide_loop, run_loop};

use crate::kernel::model::wire_enum;

wire_enum!(
    /// How a turn ended (DESIGN §5). Exactly one per settled turn.
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
