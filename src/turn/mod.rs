//! Bounded agent turns that survive any crash, and the loop around them (docs/turn-protocol.md).
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

pub use crate::model::{JournalStatus, Phase, TurnResultKind};
