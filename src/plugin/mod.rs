//! The WebAssembly plugin host: capabilities and providers as sandboxed components.
//!
//! Why this exists: it is how the capability/provider split (docs/plugin-host.md) holds at run time
//! rather than by convention. A capability is a component of the `capability` world (`wit/`) that
//! can only return typed [`Transition`](crate::kernel::transition::Transition) proposals, which the
//! kernel then admits or refuses; a provider is a component of the `provider` world that returns
//! one bounded observation using only the WASI authority the operator granted.
//!
//! Modules, each small and single-purpose:
//! * [`manifest`]: `extension.toml`, permissions, grants, limits.
//! * [`audit`]: a component's real imports against its kind and grants.
//! * [`engine`]: the shared `Engine` and the epoch ticker thread.
//! * [`cache`]: precompiled components on disk, keyed by content and engine, each loaded only when
//!   it matches the digest the registry recorded for it.
//! * [`artifacts`]: verifying installed components and artifacts against the registry (`doctor`).
//! * [`sandbox`]: one call in a fresh limited store; the only place guests run.
//! * [`logs`]: captured, capped, sanitized guest output.
//! * [`error`]: the named error taxonomy and its mapping into `LoopxError`.
//! * [`invoke`]: capability → sandbox → kernel admission, and direct provider calls.
//! * [`registry`]: the install pipeline and loading one recorded revision's component; the
//!   kernel's extension methods record every change.
//! * [`loading`]: resolving `<extension>/<id>` (and a capability's providers) for an invocation.
//! * [`scaffold`]: `loopx extension new`.
//! * `bindings` (private): `bindgen!` output and conversions.
//!
//! See docs/plugin-host.md for limits, the permission model and the cache layout.

pub mod artifacts;
pub mod audit;
mod bindings;
pub mod cache;
pub mod engine;
pub mod error;
pub mod invoke;
pub mod loading;
pub mod logs;
pub mod manifest;
pub mod registry;
pub mod sandbox;
pub mod scaffold;
pub mod types;

pub use error::{PluginError, PluginResult};
pub use manifest::{Grant, Kind, Limits, Manifest, Permission};
pub use registry::{InstallMode, InstallReport, PluginHost};
pub use sandbox::{CallReport, LoadedPlugin};
pub use types::{
    CapabilityInput, Fact, GoalView, Observation, ObserveRequest, PluginInfo, ProviderCall,
    TodoView,
};
