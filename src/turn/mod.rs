//! Bounded agent turns that survive any crash, and the loop around them (docs/turn-protocol.md).
//!
//! A turn is: decide → claim + journal (one transaction) → `host_execute → typed_result →
//! validation → durable_writeback → quota_spend → terminal_closeout`, each phase committed to the
//! turn journal (together with that phase's state effects) before the next starts. Because every
//! step is a function of the journal row, a turn interrupted anywhere is resumed by
//! [`recovery::recover`] after its last committed phase. The protocol is documented in
//! `docs/turn-protocol.md`.
//!
//! * [`driver`]: run one turn (replay, recover orphans, start, drive).
//! * [`request`]: the request and the checks made before anything is written.
//! * [`journal`]: the journal's typed `data` and the next phase it implies.
//! * `phases` (private): the phase loop; `commit` (private): one phase's commit through the
//!   kernel; `settle` (private): writeback and closeout.
//! * [`recovery`]: settling turns whose driver is gone; `lock` (private): who drives a turn.
//! * [`outcome`]: how a turn ended, and the read-only views (plan, inspect, list).
//! * `agent_side` (private): the sandbox, channel and environment of the host and validator.
//! * [`host`]: process groups, timeouts, capped output, stop signals.
//! * [`isolation`]: the namespaces that keep the host out of `.loopx/`.
//! * [`channel`]: the socket through which the host's `loopx` calls reach the driver.
//! * [`result`]: the request/result wire format and its limits.
//! * [`capability`]: the built-in default capability and WebAssembly dispatch.
//! * [`journal_repair`]: settling (and reporting) journal rows that cannot be decoded.
//! * [`loop_ctl`]: the pure loop controller and `loopx loop`.

mod agent_side;
pub mod capability;
pub mod channel;
mod commit;
pub mod driver;
pub mod host;
pub mod isolation;
pub mod journal;
pub mod journal_repair;
mod lock;
pub mod loop_ctl;
pub mod outcome;
mod phases;
pub mod probe_call;
pub mod recovery;
pub mod request;
pub mod result;
mod settle;

pub use driver::{PROJECTION_INTERVAL_MS, refresh_projection, run_turn};
pub use lock::CRASH_HOOK_ENV;
pub use loop_ctl::{Budget, LoopDisposition, LoopReport, LoopRequest, decide_loop, run_loop};
pub use outcome::{OUTCOME_SCHEMA, TurnOutcome, inspect, list_turns, plan, stored_outcome};
pub use recovery::recover;
pub use request::{DEFAULT_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS, TurnRequest, check_request};

pub use crate::model::{JournalStatus, Phase, TurnResultKind};
