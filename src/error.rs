//! The one error type every LoopX operation returns.
//!
//! Each variant maps to exactly one process exit code (docs/cli.md, "Exit codes"), so the CLI never
//! has to guess how to classify a failure and scripts can branch on the code alone: 1 refused by
//! policy, 2 bad input, 3 not found, 4 conflict (claim, fence, lease), 5 corrupt state, 6 the
//! machine refused an I/O operation (disk full, read-only filesystem, permission denied). Messages
//! name the thing and the fix.
//!
//! A message is text with typed pieces ([`Message`]): the request fields it names ([`Param`]) and
//! the actions that fix it ([`NextAction`]). Each front end renders those its own way (the CLI as
//! `--flags` and `loopx` commands), so the kernel never spells a command line and a caller can
//! read the remedy as data ([`LoopxError::message`]).

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

pub use crate::action::NextAction;

/// A failure of a LoopX command, classified by who must act on it.
#[derive(Debug, thiserror::Error)]
pub enum LoopxError {
    /// The request is well-formed but policy forbids it (an agent resolving a gate, a paused goal, ...).
    #[error("{0}")]
    Refused(Message),
    /// The request itself is malformed: a bad id, a missing flag, an out-of-range number.
    #[error("{0}")]
    BadInput(Message),
    /// The named goal, todo, run, extension or project does not exist.
    #[error("{0}")]
    NotFound(Message),
    /// Another writer holds what was asked for, or the caller's fence/lease is stale.
    #[error("{0}")]
    Conflict(Message),
    /// A file or the database is damaged. It is reported and never overwritten.
    #[error("corrupt state at {path}: {detail}")]
    Corrupt { path: PathBuf, detail: Message },
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

    /// The message of a refusal, bad input, missing thing, conflict or damage, with its typed
    /// pieces; `None` for I/O and internal failures, whose text is the OS's or the cause's.
    pub fn message(&self) -> Option<&Message> {
        match self {
            LoopxError::Refused(m)
            | LoopxError::BadInput(m)
            | LoopxError::NotFound(m)
            | LoopxError::Conflict(m) => Some(m),
            LoopxError::Corrupt { detail, .. } => Some(detail),
            LoopxError::Io { .. } | LoopxError::Internal { .. } => None,
        }
    }

    /// The typed failure this error was made from, when a layer above the error type made it
    /// (the plugin host's `PluginError`): callers downcast it instead of reading the message.
    pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.message().and_then(|m| m.cause.as_deref())
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

/// Whether an I/O error is the machine's doing rather than LoopX's or the caller's: a full disk
/// or quota, a read-only filesystem, permission, a failing device, the process out of
/// descriptors, or a path that is not the kind of file it must be (a file where a directory
/// belongs or the reverse, a name taken, a symlink loop, a name too long).
pub fn is_environmental(err: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    if matches!(
        err.kind(),
        ErrorKind::StorageFull
            | ErrorKind::ReadOnlyFilesystem
            | ErrorKind::PermissionDenied
            | ErrorKind::QuotaExceeded
            | ErrorKind::FileTooLarge
            | ErrorKind::NotADirectory
            | ErrorKind::IsADirectory
            | ErrorKind::AlreadyExists
            | ErrorKind::InvalidFilename
    ) {
        return true;
    }
    // The device failed or went away; the process or the system has no descriptor left.
    matches!(
        err.raw_os_error(),
        Some(libc::EIO | libc::ENXIO | libc::EMFILE | libc::ENFILE | libc::ELOOP)
    )
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

/// ` '<value>'` for a message about a value the caller gave, or its first `max` characters and
/// its length when longer: a refusal names the value without repeating 100 KB of it.
pub fn quoted_input(value: &str, max: usize) -> String {
    let n = value.chars().count();
    if n <= max {
        format!(" '{value}'")
    } else {
        let head: String = value.chars().take(max).collect();
        format!(" '{head}…' ({n} characters)")
    }
}

// Shorthand constructors used throughout the kernel; each takes a complete, actionable sentence
// (plain text, or a [`msg!`] with typed pieces).
pub fn refused(msg: impl Into<Message>) -> LoopxError {
    LoopxError::Refused(msg.into())
}
pub fn bad_input(msg: impl Into<Message>) -> LoopxError {
    LoopxError::BadInput(msg.into())
}
pub fn not_found(msg: impl Into<Message>) -> LoopxError {
    LoopxError::NotFound(msg.into())
}
pub fn conflict(msg: impl Into<Message>) -> LoopxError {
    LoopxError::Conflict(msg.into())
}

/// A request field a message names. The CLI renders it as its flag (`ttl_seconds` is
/// `--ttl-seconds`), a library or HTTP caller reads the field name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Param {
    AgentId,
    AllowedSlots,
    BlocksAgent,
    ClaimKey,
    Comment,
    Compute,
    EffectId,
    Every,
    Fence,
    GlobalGate,
    HistoryDays,
    Id,
    JournalFullDays,
    Kind,
    LiveWindowDays,
    MaxNoChange,
    OnChange,
    PerAgentCap,
    Probe,
    ReportFilesDays,
    Root,
    Score,
    SlotMinutes,
    Slots,
    Target,
    Title,
    TtlSeconds,
    Until,
    WatchOnly,
    WindowHours,
}

impl Param {
    pub const ALL: &'static [Param] = &[
        Param::AgentId,
        Param::AllowedSlots,
        Param::BlocksAgent,
        Param::ClaimKey,
        Param::Comment,
        Param::Compute,
        Param::EffectId,
        Param::Every,
        Param::Fence,
        Param::GlobalGate,
        Param::HistoryDays,
        Param::Id,
        Param::JournalFullDays,
        Param::Kind,
        Param::LiveWindowDays,
        Param::MaxNoChange,
        Param::OnChange,
        Param::PerAgentCap,
        Param::Probe,
        Param::ReportFilesDays,
        Param::Root,
        Param::Score,
        Param::SlotMinutes,
        Param::Slots,
        Param::Target,
        Param::Title,
        Param::TtlSeconds,
        Param::Until,
        Param::WatchOnly,
        Param::WindowHours,
    ];

    /// The field's name (snake case).
    pub fn name(self) -> &'static str {
        match self {
            Param::AgentId => "agent_id",
            Param::AllowedSlots => "allowed_slots",
            Param::BlocksAgent => "blocks_agent",
            Param::ClaimKey => "claim_key",
            Param::Comment => "comment",
            Param::Compute => "compute",
            Param::EffectId => "effect_id",
            Param::Every => "every",
            Param::Fence => "fence",
            Param::GlobalGate => "global_gate",
            Param::HistoryDays => "history_days",
            Param::Id => "id",
            Param::JournalFullDays => "journal_full_days",
            Param::Kind => "kind",
            Param::LiveWindowDays => "live_window_days",
            Param::MaxNoChange => "max_no_change",
            Param::OnChange => "on_change",
            Param::PerAgentCap => "per_agent_cap",
            Param::Probe => "probe",
            Param::ReportFilesDays => "report_files_days",
            Param::Root => "root",
            Param::Score => "score",
            Param::SlotMinutes => "slot_minutes",
            Param::Slots => "slots",
            Param::Target => "target",
            Param::Title => "title",
            Param::TtlSeconds => "ttl_seconds",
            Param::Until => "until",
            Param::WatchOnly => "watch_only",
            Param::WindowHours => "window_hours",
        }
    }
}

/// One piece of a [`Message`].
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    Param(Param),
    Action(NextAction),
}

impl From<String> for Part {
    fn from(text: String) -> Part {
        Part::Text(text)
    }
}
impl From<&str> for Part {
    fn from(text: &str) -> Part {
        Part::Text(text.to_string())
    }
}
impl From<Param> for Part {
    fn from(param: Param) -> Part {
        Part::Param(param)
    }
}
impl From<NextAction> for Part {
    fn from(action: NextAction) -> Part {
        Part::Action(action)
    }
}

/// An error's sentence: text with the fields it names and the actions that fix it as values.
/// `Display` renders fields by name and actions as operations (`goal.list()`); the CLI renders
/// them as flags and commands.
#[derive(Debug, Clone, Default)]
pub struct Message {
    parts: Vec<Part>,
    cause: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Message {
    pub fn from_parts(parts: Vec<Part>) -> Message {
        Message { parts, cause: None }
    }

    /// Keeps the typed failure the message describes, for [`LoopxError::cause`].
    pub fn with_cause(mut self, cause: impl std::error::Error + Send + Sync + 'static) -> Message {
        self.cause = Some(Arc::new(cause));
        self
    }

    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The actions the message names, in order.
    pub fn actions(&self) -> impl Iterator<Item = &NextAction> {
        self.parts.iter().filter_map(|p| match p {
            Part::Action(a) => Some(a),
            _ => None,
        })
    }
}

impl From<String> for Message {
    fn from(text: String) -> Message {
        Message::from_parts(vec![Part::Text(text)])
    }
}
impl From<&str> for Message {
    fn from(text: &str) -> Message {
        Message::from(text.to_string())
    }
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in &self.parts {
            match part {
                Part::Text(text) => f.write_str(text)?,
                Part::Param(param) => f.write_str(param.name())?,
                Part::Action(action) => write!(f, "`{}`", action.describe())?,
            }
        }
        Ok(())
    }
}

/// A [`Message`] from pieces: text (`&str`, `String`), [`Param`]s and [`NextAction`]s, e.g.
/// `msg![format!("unknown goal '{id}'; "), NextAction::ListGoals, " shows the goals"]`.
macro_rules! msg {
    ($($part:expr),+ $(,)?) => {
        $crate::error::Message::from_parts(vec![$($crate::error::Part::from($part)),+])
    };
}
pub(crate) use msg;

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
            libc::ENOTDIR,
            libc::EISDIR,
            libc::EEXIST,
            libc::ELOOP,
            libc::ENAMETOOLONG,
            libc::EMFILE,
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
