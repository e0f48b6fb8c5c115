//! The one error type every LoopX operation returns.
//!
//! Each variant maps to exactly one process exit code (DESIGN §7), so the CLI never has to guess how
//! to classify a failure and scripts can branch on the code alone: 1 refused by policy, 2 bad input,
//! 3 not found, 4 conflict (claim, fence, lease), 5 corrupt state. Messages name the thing and the fix.

use std::path::PathBuf;

/// A failure of a LoopX command, classified by who must act on it.
#[derive(Debug, thiserror::Error)]
pub enum LoopxError {
    /// The request is well-formed but policy forbids it (an agent resolving a gate, a paused goal, ...).
    #[error("{0}")]
    Refused(String),
    /// The request itself is malformed: a bad id, a missing flag, an out-of-range number.
    #[error("{0}")]
    BadInput(String),
    /// The named goal, todo, run, extension or project does not exist.
    #[error("{0}")]
    NotFound(String),
    /// Another writer holds what was asked for, or the caller's fence/lease is stale.
    #[error("{0}")]
    Conflict(String),
    /// A file or the database is damaged. It is reported and never overwritten.
    #[error("corrupt state at {path}: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    /// An unexpected I/O or SQLite failure that is not the caller's fault.
    #[error("{context}: {source}")]
    Internal {
        context: String,
        #[source]
        source: anyhow::Error,
    },
}

impl LoopxError {
    /// The process exit code for this error (DESIGN §7).
    pub fn exit_code(&self) -> i32 {
        match self {
            LoopxError::Refused(_) => 1,
            LoopxError::BadInput(_) => 2,
            LoopxError::NotFound(_) => 3,
            LoopxError::Conflict(_) => 4,
            LoopxError::Corrupt { .. } => 5,
            // Internal failures share the policy code: the command did not happen.
            LoopxError::Internal { .. } => 1,
        }
    }

    /// A stable machine-readable name for JSON output.
    pub fn kind(&self) -> &'static str {
        match self {
            LoopxError::Refused(_) => "refused",
            LoopxError::BadInput(_) => "bad_input",
            LoopxError::NotFound(_) => "not_found",
            LoopxError::Conflict(_) => "conflict",
            LoopxError::Corrupt { .. } => "corrupt",
            LoopxError::Internal { .. } => "internal",
        }
    }

    pub fn internal(context: impl Into<String>, source: impl Into<anyhow::Error>) -> Self {
        LoopxError::Internal {
            context: context.into(),
            source: source.into(),
        }
    }
}

pub type Result<T, E = LoopxError> = std::result::Result<T, E>;

/// Shorthand constructors used throughout the kernel; each takes a complete, actionable sentence.
pub fn refused(msg: impl Into<String>) -> LoopxError {
    LoopxError::Refused(msg.into())
}
pub fn bad_input(msg: impl Into<String>) -> LoopxError {
    LoopxError::BadInput(msg.into())
}
pub fn not_found(msg: impl Into<String>) -> LoopxError {
    LoopxError::NotFound(msg.into())
}
pub fn conflict(msg: impl Into<String>) -> LoopxError {
    LoopxError::Conflict(msg.into())
}
