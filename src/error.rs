//! The one error type every LoopX operation returns.
//!
//! Each variant maps to exactly one process exit code (docs/cli.md, "Exit codes"), so the CLI never
//! has to guess how to classify a failure and scripts can branch on the code alone: 1 refused by
//! policy, 2 bad input, 3 not found, 4 conflict (claim, fence, lease), 5 corrupt state, 6 the
//! machine refused an I/O operation (disk full, read-only filesystem, permission denied). Messages
//! name the thing and the fix.

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
    /// The machine refused an I/O operation on `path`: the disk is full, the filesystem is
    /// read-only, permission is denied, or the device failed. Neither the request nor the state is
    /// at fault, so it is neither "refused" nor "corrupt": the operator fixes the machine and
    /// retries. `context` says what LoopX was doing to which path; the message ends with the OS's
    /// reason.
    #[error("{context}: {source}")]
    Io {
        path: PathBuf,
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// An unexpected failure that is not the caller's fault.
    #[error("{context}: {source}")]
    Internal {
        context: String,
        #[source]
        source: anyhow::Error,
    },
}

impl LoopxError {
    /// The process exit code for this error (docs/cli.md, "Exit codes").
    pub fn exit_code(&self) -> i32 {
        match self {
            LoopxError::Refused(_) => 1,
            LoopxError::BadInput(_) => 2,
            LoopxError::NotFound(_) => 3,
            LoopxError::Conflict(_) => 4,
            LoopxError::Corrupt { .. } => 5,
            LoopxError::Io { .. } => 6,
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
            LoopxError::Io { .. } => "io",
            LoopxError::Internal { .. } => "internal",
        }
    }

    /// An unexpected failure. An `std::io::Error` that the machine caused (see
    /// [`is_environmental`]) becomes [`LoopxError::Io`] instead, so every file write in the code
    /// base reports a full disk or a read-only mount with exit 6 without each call site having to
    /// classify it. The path is the one the context names (`"writing /x/y"`, the convention of
    /// every call site), or empty when it names none; the message keeps the whole context.
    pub fn internal(context: impl Into<String>, source: impl Into<anyhow::Error>) -> Self {
        let context = context.into();
        let source = source.into();
        match source.downcast::<std::io::Error>() {
            Ok(io) if is_environmental(&io) => LoopxError::Io {
                path: path_named_in(&context),
                context,
                source: io,
            },
            Ok(io) => LoopxError::Internal {
                context,
                source: io.into(),
            },
            Err(source) => LoopxError::Internal { context, source },
        }
    }

    /// An I/O failure on `path`: [`LoopxError::Io`] when the machine caused it, otherwise
    /// internal (a missing file, say, is the caller's to classify before calling this).
    pub fn io(path: impl Into<PathBuf>, context: impl Into<String>, err: std::io::Error) -> Self {
        let path = path.into();
        let context = context.into();
        if is_environmental(&err) {
            LoopxError::Io {
                path,
                context,
                source: err,
            }
        } else {
            LoopxError::Internal {
                context: format!("{context} ({})", path.display()),
                source: err.into(),
            }
        }
    }
}

/// Whether an I/O error is the machine's doing (full disk or quota, read-only filesystem,
/// permission, a failing device) rather than LoopX's or the caller's.
pub fn is_environmental(err: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    if matches!(
        err.kind(),
        ErrorKind::StorageFull
            | ErrorKind::ReadOnlyFilesystem
            | ErrorKind::PermissionDenied
            | ErrorKind::QuotaExceeded
            | ErrorKind::FileTooLarge
    ) {
        return true;
    }
    // The device itself failed or went away.
    matches!(err.raw_os_error(), Some(libc::EIO) | Some(libc::ENXIO))
}

/// The absolute path a context sentence names (`"writing /p/.loopx/registry.json"`), or an empty
/// path. Only used to fill [`LoopxError::Io`]'s `path` for call sites that put it in the text.
fn path_named_in(context: &str) -> PathBuf {
    context
        .split_whitespace()
        .find(|word| word.starts_with('/'))
        .map(PathBuf::from)
        .unwrap_or_default()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_the_machine_caused_are_exit_6_with_their_path() {
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let err = LoopxError::internal("writing /p/.loopx/registry.json", full);
        assert_eq!((err.exit_code(), err.kind()), (6, "io"));
        let LoopxError::Io { path, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(path, &PathBuf::from("/p/.loopx/registry.json"));
        assert!(err.to_string().contains("No space left on device"), "{err}");
        for errno in [
            libc::EROFS,
            libc::EACCES,
            libc::EPERM,
            libc::EIO,
            libc::EDQUOT,
        ] {
            let e = LoopxError::internal("x", std::io::Error::from_raw_os_error(errno));
            assert_eq!(e.exit_code(), 6, "errno {errno}");
        }
    }

    #[test]
    fn other_failures_stay_internal() {
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(LoopxError::internal("reading /x", missing).exit_code(), 1);
        let other = anyhow::anyhow!("not an I/O error");
        assert_eq!(LoopxError::internal("x", other).kind(), "internal");
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(LoopxError::io("/x", "reading /x", missing).exit_code(), 1);
    }
}
