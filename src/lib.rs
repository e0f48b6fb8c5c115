//! LoopX: a local-first control plane for long-running AI agent work.
//!
//! The library holds all logic; the `loopx` binary is a thin CLI over it. Start at [`kernel::Kernel`]
//! (the only writer of durable state), [`store`] (the `Store` trait and its SQLite backend),
//! [`registry`] (read-only inspection of the registry projection), [`plugin`] (the WebAssembly host
//! for capabilities and providers) and [`turn`] (bounded agent turns with crash recovery).

pub mod action;
pub mod cli;
pub mod clock;
pub mod error;
pub mod ids;
pub mod inert;
pub mod kernel;
pub mod model;
pub mod paths;
pub mod plugin;
pub mod registry;
pub mod runtime;
pub mod state_file;
pub mod turn;

pub use error::{LoopxError, Result};
pub use kernel::Kernel;
