//! The plugin host's error taxonomy.
//!
//! Why a separate enum: a sandbox failure must say *which* limit stopped *which* plugin, and callers
//! (tests, the turn driver, the CLI) branch on the kind. wasmtime reports limits three ways: `Trap`
//! codes (fuel, epoch, stack, guest faults), plain host-limit errors (memory growth refused by the
//! limiter, hostcall fuel exhausted when lifting a return value), and guest `result` error values.
//! `classify` folds all three into one named variant so no limit is misfiled as a "host error".
//!
//! Mapping into [`LoopxError`] (and so into exit codes) is documented in docs/plugin-host.md:
//! limit violations, guest errors, refusals and traps are `Refused` (exit 1); a bad manifest or a bad
//! request is `BadInput` (2); a missing extension or component is `NotFound` (3); a tampered or
//! unreadable installed component is `Corrupt` (5).

use std::path::PathBuf;

use crate::error::LoopxError;

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
        "plugin {plugin} is tampered: {path} has sha256 {actual}, the registry records {expected}; nothing was loaded. Reinstall the extension (`loopx extension upgrade DIR`), or delete a damaged .cwasm to have it recompiled from the verified component; `loopx doctor` lists every damaged file"
    )]
    Tampered {
        plugin: String,
        path: PathBuf,
        expected: String,
        actual: String,
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

impl PluginError {
    /// A stable machine-readable name of the variant, for JSON output and tests.
    pub fn kind(&self) -> &'static str {
        match self {
            PluginError::Deadline { .. } => "deadline",
            PluginError::FuelExhausted { .. } => "fuel_exhausted",
            PluginError::MemoryLimit { .. } => "memory_limit",
            PluginError::StackOverflow { .. } => "stack_overflow",
            PluginError::OutputTooLarge { .. } => "output_too_large",
            PluginError::TooManyItems { .. } => "too_many_items",
            PluginError::StringTooLong { .. } => "string_too_long",
            PluginError::InputTooLarge { .. } => "input_too_large",
            PluginError::Trap { .. } => "trap",
            PluginError::GuestError { .. } => "guest_error",
            PluginError::Tampered { .. } => "tampered",
            PluginError::ImportNotGranted { .. } => "import_not_granted",
            PluginError::NotDeclared { .. } => "not_declared",
            PluginError::CallBudget { .. } => "call_budget",
            PluginError::ApiVersion { .. } => "api_version",
            PluginError::Manifest { .. } => "manifest",
            PluginError::BadRequest { .. } => "bad_request",
            PluginError::NotFound { .. } => "not_found",
            PluginError::Disabled { .. } => "disabled",
            PluginError::Load { .. } => "load",
            PluginError::Host { .. } => "host",
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

impl From<PluginError> for LoopxError {
    fn from(e: PluginError) -> LoopxError {
        let msg = e.to_string();
        match e {
            PluginError::Manifest { .. }
            | PluginError::BadRequest { .. }
            | PluginError::ApiVersion { .. }
            | PluginError::InputTooLarge { .. } => LoopxError::BadInput(msg),
            PluginError::NotFound { .. } => LoopxError::NotFound(msg),
            PluginError::Tampered { path, .. } => LoopxError::Corrupt { path, detail: msg },
            PluginError::Host { .. } => LoopxError::internal("plugin host", anyhow::anyhow!(msg)),
            _ => LoopxError::Refused(msg),
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
    // Host-limit errors are not `Trap`s: recognise them by their (stable, tested) messages anywhere
    // in the error chain.
    let chain: Vec<String> = err.chain().map(|c| c.to_string()).collect();
    let any = |needle: &str| chain.iter().any(|m| m.contains(needle));
    if any("forcing trap when growing memory") || any("forcing trap when growing table") {
        return PluginError::MemoryLimit {
            plugin,
            limit_bytes: limits.memory_bytes,
        };
    }
    if any("too much data is being copied between the host and the guest") {
        return PluginError::OutputTooLarge {
            plugin,
            limit_bytes: limits.output_bytes,
        };
    }
    if any("write beyond capacity") {
        return PluginError::OutputTooLarge {
            plugin,
            limit_bytes: limits.output_bytes,
        };
    }
    PluginError::Trap {
        plugin,
        detail: chain.join(": "),
    }
}
