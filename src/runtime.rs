//! The library entry point for driving agent turns: `loopx::runtime::run_turn(&mut kernel, &req)`.
//!
//! This is the same driver `loopx turn run` uses (see [`crate::turn`] and `docs/turn-protocol.md`):
//! it recovers this agent's unsettled turns, decides, claims, runs the host, and settles every
//! phase in the journal.
//!
//! ```no_run
//! use loopx::Kernel;
//! use loopx::paths::ProjectPaths;
//! use loopx::runtime::{TurnRequest, run_turn};
//!
//! let mut kernel = Kernel::open(ProjectPaths::at(std::path::Path::new("."))).unwrap();
//! let req = TurnRequest::new("my-goal", "agent-1", vec!["./host.sh".to_string()]);
//! let outcome = run_turn(&mut kernel, &req).unwrap();
//! println!("{:?} {:?}", outcome.kind, outcome.turn_key);
//! ```

pub use crate::turn::loop_ctl::{LoopReport, LoopRequest, run_loop};
pub use crate::turn::{DEFAULT_TIMEOUT_SECONDS, TurnOutcome, TurnRequest};
pub use crate::turn::{JournalStatus, Phase, TurnResultKind};

use crate::Result;
use crate::kernel::Kernel;

/// Runs one bounded turn and settles it. See [`crate::turn::driver::run_turn`].
pub fn run_turn(kernel: &mut Kernel, req: &TurnRequest) -> Result<TurnOutcome> {
    crate::turn::driver::run_turn(kernel, req)
}

/// Settles unsettled turns whose driver is gone (all goals when `goal_id` is `None`).
pub fn recover(kernel: &mut Kernel, goal_id: Option<&str>) -> Result<Vec<TurnOutcome>> {
    crate::turn::recovery::recover(kernel, goal_id, None)
}
