//! The plugin host's error taxonomy.
//!
//! Why a separate enum: a sandbox failure must say *which* limit stopped *which* plugin, and callers
//! (tests, the turn driver, the CLI) branch on the kind. wasmtime reports limits three ways: `Trap`
//! codes (fuel, epoch, stack, guest faults), plain host-limit errors (memory growth refused by the
//! limiter, hostcall fuel exhausted when lifting a return value), and guest `result` error values.
//! `classify` folds all three into one named variant so no limit is misfiled as a "host error":
//! traps by downcast, the plain errors by their text in one function (`host_limit_from_messages`,
//! which says which wasmtime version's wording it relies on). From then on the kind travels as a
//! value ([`PluginErrorKind`]); nothing parses it back out of a message.
//!
//! Mapping into [`LoopxError`] (and so into exit codes) is documented in docs/plugin-host.md:
//! limit violations, guest errors, refusals and traps are `Refused` (exit 1); a bad manifest or a bad
//! request is `BadInput` (2); a missing extension or component is `NotFound` (3); a tampered or
//! unreadable installed component is `Corrupt` (5).

use std::path::PathBuf;

use crate::error::{LoopxError, Message};

/// Result type of the plugin host.
pub type PluginResult<T> = std::result::Result<T, PluginError>;

/// A failure of a plugin operation. Every variant names the plugin (`<extension>/<id>`, or the
/// extension id at install time) and, for limits, the limit that was hit.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The wall-clock deadline (epoch interruption) expired.
    #[error("plugin {plugin} exceeded its deadline of {limit_ms} ms and was stopped")]
    Deadline { plugin: String, limit_ms: u64 },
    /// The fuel budget ran out.
    #[error("plugin {plugin} ran out of fuel (limit {limit} units) and was stopped")]
    FuelExhausted { plugin: String, limit: u64 },
    /// The guest tried to grow memory (or a table) past its limit.
    #[error("plugin {plugin} tried to grow memory past its limit of {limit_bytes} bytes")]
    MemoryLimit { plugin: String, limit_bytes: u64 },
    /// The guest exhausted its wasm stack.
    #[error("plugin {plugin} overflowed its wasm stack (limit {limit_bytes} bytes)")]
    StackOverflow { plugin: String, limit_bytes: usize },
    /// The guest tried to hand the host more bytes than the lift cap (hostcall fuel) allows.
    #[error("plugin {plugin} returned more than its output limit of {limit_bytes} bytes")]
    OutputTooLarge { plugin: String, limit_bytes: usize },
    /// The guest returned more items than allowed (proposals, facts).
    #[error("plugin {plugin} returned {count} {what}, more than the limit of {limit}")]
    TooManyItems {
        plugin: String,
        what: &'static str,
        count: usize,
        limit: usize,
    },
    /// One returned string field is longer than allowed.
    #[error(
        "plugin {plugin} returned a {field} of {len} bytes, more than the limit of {limit} bytes"
    )]
    StringTooLong {
        plugin: String,
        field: String,
        len: usize,
        limit: usize,
    },
    /// The host refused to send an input larger than its cap.
    #[error("input for plugin {plugin} is {len} bytes, more than the limit of {limit} bytes")]
    InputTooLarge {
        plugin: String,
        len: usize,
        limit: usize,
    },
    /// The guest trapped for another reason (panic → `unreachable`, out-of-bounds, ...).
    #[error("plugin {plugin} trapped: {detail}")]
    Trap { plugin: String, detail: String },
    /// The guest returned an error value.
    #[error("plugin {plugin} reported an error: {detail}")]
    GuestError { plugin: String, detail: String },
    /// The installed component or its compiled artifact no longer matches the recorded hash.
    #[error(
        "plugin {plugin} is tampered: {path} {found}, but the registry records sha256 {expected}; nothing was loaded. Reinstall the extension (`loopx extension upgrade DIR`), or delete a damaged .cwasm to have it recompiled from the verified component; `loopx doctor` lists every damaged file"
    )]
    Tampered {
        plugin: String,
        path: PathBuf,
        expected: String,
        /// What is there instead: `has sha256 <hex>`, `is missing`, `is not a regular file`, ...
        found: String,
    },
    /// The component imports something the operator did not grant (or no permission can grant).
    #[error("plugin {plugin} imports {import}, which is not granted: {reason}")]
    ImportNotGranted {
        plugin: String,
        import: String,
        reason: String,
    },
    /// A capability called a provider it did not declare in `uses`.
    #[error("plugin {plugin} called provider {provider}, which it does not declare in `uses`")]
    NotDeclared { plugin: String, provider: String },
    /// A capability exceeded its provider-call budget.
    #[error("plugin {plugin} exceeded its limit of {limit} provider calls")]
    CallBudget { plugin: String, limit: u32 },
    /// The component was built against an incompatible `loopx:plugin` version.
    #[error("plugin {plugin} targets {found}, but this host implements loopx:plugin {supported}")]
    ApiVersion {
        plugin: String,
        found: String,
        supported: String,
    },
    /// The extension manifest (or a grant) is invalid.
    #[error("extension {plugin}: invalid manifest: {detail}")]
    Manifest { plugin: String, detail: String },
    /// A request (operator input) is invalid.
    #[error("{detail}")]
    BadRequest { detail: String },
    /// The named extension, capability, provider or file does not exist.
    #[error("{what} not found{hint}")]
    NotFound { what: String, hint: String },
    /// The extension or component is disabled.
    #[error("plugin {plugin} is disabled; run `loopx extension enable {extension}`")]
    Disabled { plugin: String, extension: String },
    /// A component failed to compile, link or instantiate (not a limit, not the guest's output).
    #[error("plugin {plugin} could not be loaded: {detail}")]
    Load { plugin: String, detail: String },
    /// I/O or another host-side failure.
    #[error("plugin host: {context}: {detail}")]
    Host { context: String, detail: String },
}

crate::model::wire_enum!(
    /// What kind of failure a [`PluginError`] is, as a value callers branch on (the turn driver
    /// and the registry leave a disabled provider out, tests check which limit stopped a guest)
    /// and with a stable spelling for JSON output and logs.
    PluginErrorKind {
        Deadline => "deadline",
        FuelExhausted => "fuel_exhausted",
        MemoryLimit => "memory_limit",
        StackOverflow => "stack_overflow",
        OutputTooLarge => "output_too_large",
        TooManyItems => "too_many_items",
        StringTooLong => "string_too_long",
        InputTooLarge => "input_too_large",
        Trap => "trap",
        GuestError => "guest_error",
        Tampered => "tampered",
        ImportNotGranted => "import_not_granted",
        NotDeclared => "not_declared",
        CallBudget => "call_budget",
        ApiVersion => "api_version",
        Manifest => "manifest",
        BadRequest => "bad_request",
        NotFound => "not_found",
        Disabled => "disabled",
        Load => "load",
        Host => "host",
    }
);

impl PluginError {
    /// The kind of failure, carried as a value: no caller reads it back out of the message.
    pub fn kind(&self) -> PluginErrorKind {
        match self {
            PluginError::Deadline { .. } => PluginErrorKind::Deadline,
            PluginError::FuelExhausted { .. } => PluginErrorKind::FuelExhausted,
            PluginError::MemoryLimit { .. } => PluginErrorKind::MemoryLimit,
            PluginError::StackOverflow { .. } => PluginErrorKind::StackOverflow,
            PluginError::OutputTooLarge { .. } => PluginErrorKind::OutputTooLarge,
            PluginError::TooManyItems { .. } => PluginErrorKind::TooManyItems,
            PluginError::StringTooLong { .. } => PluginErrorKind::StringTooLong,
            PluginError::InputTooLarge { .. } => PluginErrorKind::InputTooLarge,
            PluginError::Trap { .. } => PluginErrorKind::Trap,
            PluginError::GuestError { .. } => PluginErrorKind::GuestError,
            PluginError::Tampered { .. } => PluginErrorKind::Tampered,
            PluginError::ImportNotGranted { .. } => PluginErrorKind::ImportNotGranted,
            PluginError::NotDeclared { .. } => PluginErrorKind::NotDeclared,
            PluginError::CallBudget { .. } => PluginErrorKind::CallBudget,
            PluginError::ApiVersion { .. } => PluginErrorKind::ApiVersion,
            PluginError::Manifest { .. } => PluginErrorKind::Manifest,
            PluginError::BadRequest { .. } => PluginErrorKind::BadRequest,
            PluginError::NotFound { .. } => PluginErrorKind::NotFound,
            PluginError::Disabled { .. } => PluginErrorKind::Disabled,
            PluginError::Load { .. } => PluginErrorKind::Load,
            PluginError::Host { .. } => PluginErrorKind::Host,
        }
    }

    pub(crate) fn host(context: impl Into<String>, err: impl std::fmt::Display) -> PluginError {
        PluginError::Host {
            context: context.into(),
            detail: err.to_string(),
        }
    }

    pub(crate) fn not_found(what: impl Into<String>, hint: impl Into<String>) -> PluginError {
        let hint = hint.into();
        PluginError::NotFound {
            what: what.into(),
            hint: if hint.is_empty() {
                hint
            } else {
                format!("; {hint}")
            },
        }
    }

    pub(crate) fn manifest(plugin: impl Into<String>, detail: impl Into<String>) -> PluginError {
        PluginError::Manifest {
            plugin: plugin.into(),
            detail: detail.into(),
        }
    }
}

/// The `PluginError` travels along as the error's cause ([`LoopxError::cause`]), so a caller
/// (the CLI's JSON error, a test) reads the failure's kind as a value.
impl From<PluginError> for LoopxError {
    fn from(e: PluginError) -> LoopxError {
        let text = e.to_string();
        match e {
            PluginError::Host { .. } => LoopxError::internal("plugin host", anyhow::anyhow!(text)),
            PluginError::Tampered { ref path, .. } => LoopxError::Corrupt {
                path: path.clone(),
                detail: Message::from(text).with_cause(e),
            },
            PluginError::Manifest { .. }
            | PluginError::BadRequest { .. }
            | PluginError::ApiVersion { .. }
            | PluginError::InputTooLarge { .. } => {
                LoopxError::BadInput(Message::from(text).with_cause(e))
            }
            PluginError::NotFound { .. } => LoopxError::NotFound(Message::from(text).with_cause(e)),
            _ => LoopxError::Refused(Message::from(text).with_cause(e)),
        }
    }
}

/// What the sandbox was configured with for the call being classified.
pub(crate) struct CallLimits {
    pub fuel: u64,
    pub deadline_ms: u64,
    pub memory_bytes: u64,
    pub stack_bytes: usize,
    pub output_bytes: usize,
}

/// Folds a wasmtime error from a guest call into a named [`PluginError`].
pub(crate) fn classify(plugin: &str, limits: &CallLimits, err: wasmtime::Error) -> PluginError {
    let plugin = plugin.to_string();
    if let Some(trap) = err.downcast_ref::<wasmtime::Trap>() {
        return match trap {
            wasmtime::Trap::OutOfFuel => PluginError::FuelExhausted {
                plugin,
                limit: limits.fuel,
            },
            wasmtime::Trap::Interrupt => PluginError::Deadline {
                plugin,
                limit_ms: limits.deadline_ms,
            },
            wasmtime::Trap::StackOverflow => PluginError::StackOverflow {
                plugin,
                limit_bytes: limits.stack_bytes,
            },
            other => PluginError::Trap {
                plugin,
                detail: format!("{other} (the guest's stderr is in the plugin log)"),
            },
        };
    }
    let chain: Vec<String> = err.chain().map(|c| c.to_string()).collect();
    match host_limit_from_messages(&chain) {
        Some(HostLimit::Memory) => PluginError::MemoryLimit {
            plugin,
            limit_bytes: limits.memory_bytes,
        },
        Some(HostLimit::Output) => PluginError::OutputTooLarge {
            plugin,
            limit_bytes: limits.output_bytes,
        },
        None => PluginError::Trap {
            plugin,
            detail: chain.join(": "),
        },
    }
}

/// A host-side limit that wasmtime reports as a plain error rather than a [`wasmtime::Trap`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HostLimit {
    /// The store's limiter refused to grow a memory or table (`trap_on_grow_failure`).
    Memory,
    /// The guest handed the host more than the hostcall fuel or the output pipe allows.
    Output,
}

/// Recognises the host-limit errors that carry no type to downcast to, by their messages anywhere
/// in the error chain. The only place LoopX reads an error's text to decide what it is.
///
/// It relies on the messages of wasmtime and wasmtime-wasi 48.0.8 (pinned with `=` in
/// Cargo.toml, so an upgrade is a deliberate edit that comes through here):
/// - `StoreLimits::memory_growing`/`table_growing` (`runtime/limits.rs`) bail with "forcing trap
///   when growing memory/table to ..." when `trap_on_grow_failure` is set;
/// - component lifting (`runtime/component/func/options.rs`) fails with "too much data is being
///   copied between the host and the guest" when hostcall fuel runs out;
/// - wasmtime-wasi's `MemoryOutputPipe` (`p2/pipe.rs`) fails with "write beyond capacity of
///   MemoryOutputPipe" when its buffer is full. The host captures guest output in its own
///   buffer today (`plugin::logs`), so no path produces this one; it stays so that wiring such a
///   pipe in cannot file its overflow as a trap.
///
/// tests/it/sandbox_limits.rs produces the memory-growth and lifting errors from a real guest
/// (`memory_limit`, `output_too_large`), so a wasmtime that words them differently fails there
/// rather than silently filing a limit as a trap.
fn host_limit_from_messages(chain: &[String]) -> Option<HostLimit> {
    let any = |needle: &str| chain.iter().any(|m| m.contains(needle));
    if any("forcing trap when growing memory") || any("forcing trap when growing table") {
        Some(HostLimit::Memory)
    } else if any("too much data is being copied between the host and the guest")
        || any("write beyond capacity")
    {
        Some(HostLimit::Output)
    } else {
        None
    }
}
