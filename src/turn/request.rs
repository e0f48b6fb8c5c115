//! What a turn is asked to do, and the checks made before anything is written.
//!
//! Why this exists: `turn run`, `loop` and the library take the same request, and each refuses a
//! bad one (argv limits, token syntax, the timeout range, the capability name) before it decides,
//! claims or journals anything. The checks are pure, so they live apart from the driver's I/O.

use super::isolation::IsolationMode;
use crate::error::{Result, bad_input};
use crate::ids::validate_token;
use crate::kernel::todo::check_capability_name;

/// Host budget when none is given.
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 1800;

pub const MAX_TIMEOUT_SECONDS: u64 = 24 * 3600;

/// The lease outlives the host budget by this much, so it cannot expire under a running host.
pub const LEASE_MARGIN_SECONDS: u64 = 300;

const MAX_ARGV_ITEMS: usize = 64;

const MAX_ARG_LEN: usize = 4096;

/// What to run: one turn of `agent_id` on `goal_id`.
#[derive(Debug, Clone)]
pub struct TurnRequest {
    pub goal_id: String,
    pub agent_id: String,
    /// A specific todo; default: the decision's selected todo.
    pub todo_id: Option<String>,
    /// The host argv (no shell).
    pub host_argv: Vec<String>,
    /// The validator argv (no shell); exit 0 = the result is proven.
    pub validate_argv: Option<Vec<String>>,
    pub timeout_seconds: u64,
    /// Without a validator, accept a host's `completed` claim as a completion.
    pub trust_host_completion: bool,
    /// Overrides the todo's capability.
    pub capability: Option<String>,
    /// Names the turn: a settled key replays its stored result; an in-progress key is resumed;
    /// an unused key is used for the new turn.
    pub turn_key: Option<String>,
    /// Whether the host and validator run in namespaces without `.loopx/`.
    pub isolation: IsolationMode,
}

impl TurnRequest {
    pub fn new(goal_id: &str, agent_id: &str, host_argv: Vec<String>) -> TurnRequest {
        TurnRequest {
            goal_id: goal_id.to_string(),
            agent_id: agent_id.to_string(),
            todo_id: None,
            host_argv,
            validate_argv: None,
            timeout_seconds: DEFAULT_TIMEOUT_SECONDS,
            trust_host_completion: false,
            capability: None,
            turn_key: None,
            isolation: IsolationMode::Auto,
        }
    }
}

fn check_argv(what: &str, argv: &[String]) -> Result<()> {
    if argv.is_empty() {
        return Err(bad_input(format!(
            "{what} is empty: name the program to run after `--`"
        )));
    }
    if argv.len() > MAX_ARGV_ITEMS {
        return Err(bad_input(format!(
            "{what} has {} items; the limit is {MAX_ARGV_ITEMS}",
            argv.len()
        )));
    }
    for a in argv {
        if a.len() > MAX_ARG_LEN || a.contains('\0') {
            return Err(bad_input(format!(
                "{what} items must be at most {MAX_ARG_LEN} bytes without NUL"
            )));
        }
    }
    if argv[0].is_empty() {
        return Err(bad_input(format!("{what}[0] is empty")));
    }
    Ok(())
}

/// Checks a turn request before anything is written.
pub fn check_request(req: &TurnRequest) -> Result<()> {
    validate_token("goal id", &req.goal_id)?;
    validate_token("agent id", &req.agent_id)?;
    if let Some(t) = &req.todo_id {
        validate_token("todo id", t)?;
    }
    if let Some(k) = &req.turn_key {
        validate_token("turn key", k)?;
    }
    check_argv("host argv", &req.host_argv)?;
    if let Some(v) = &req.validate_argv {
        check_argv("validator argv", v)?;
    }
    if req.timeout_seconds == 0 || req.timeout_seconds > MAX_TIMEOUT_SECONDS {
        return Err(bad_input(format!(
            "--timeout-seconds {} is out of range: use 1..={MAX_TIMEOUT_SECONDS}",
            req.timeout_seconds
        )));
    }
    if let Some(c) = &req.capability {
        check_capability_name(c)?;
    }
    Ok(())
}
