//! The import audit: a component may only import what its kind allows and its grants justify.
//!
//! Why this exists: the linker provides all of WASI (Rust's `wasm32-wasip2` std needs much of it just
//! to start), so the only place to refuse authority a component *asks* for is by reading its real
//! import list (`Component::component_type().imports()`) before anything runs. The audit runs at
//! install and again at every load, so a component swapped on disk or a grant edited in the registry
//! cannot widen what runs.
//!
//! Mapping (measured on Rust 1.95 `wasm32-wasip2` guests: an std guest that touches no files imports
//! `wasi:cli/{environment,exit,stdin,stdout,stderr,terminal-*}` and `wasi:io/{error,poll,streams}`;
//! using `std::fs` adds `wasi:filesystem/{types,preopens}` and `wasi:clocks/wall-clock`; using
//! `std::net` adds `wasi:sockets/*` and `wasi:clocks/monotonic-clock`):
//!
//! | import                                         | capability | provider                                  |
//! |------------------------------------------------|------------|-------------------------------------------|
//! | `loopx:plugin/types`                           | yes        | yes                                       |
//! | `loopx:plugin/host`                            | yes        | no                                        |
//! | `loopx:plugin/logging`                         | no         | yes                                       |
//! | `wasi:io/*`, `wasi:cli/*` (std runtime)        | yes (empty env/args, closed stdin, captured stdout/stderr) | yes (env = granted vars only) |
//! | `wasi:clocks/*`, `wasi:random/*`               | yes (deterministic) | yes                              |
//! | `wasi:filesystem/*`                            | no         | only with at least one granted `fs.*`     |
//! | `wasi:sockets/*`, `wasi:http/*`, anything else | no         | no (no permission grants network in 0.1)  |

use wasmtime::Engine;
use wasmtime::component::Component;

use super::error::{PluginError, PluginResult};
use super::manifest::{Grant, HOST_API_VERSION, Kind, Permission, parse_version, version_string};

/// Checks every import of `component` (a `kind` plugin named `plugin`) against the table above.
pub fn audit_imports(
    engine: &Engine,
    component: &Component,
    plugin: &str,
    kind: Kind,
    grants: &[Grant],
) -> PluginResult<Vec<String>> {
    let ty = component.component_type();
    let names: Vec<String> = ty.imports(engine).map(|(n, _)| n.to_string()).collect();
    let has_fs = grants
        .iter()
        .any(|g| matches!(g.permission, Permission::FsRead(_) | Permission::FsWrite(_)));
    // Report every refused import at once, so the operator sees the whole gap in one attempt.
    let mut refused: Vec<String> = Vec::new();
    let mut reasons: Vec<String> = Vec::new();
    for name in &names {
        match check_import(name, plugin, kind, has_fs) {
            Ok(()) => {}
            Err(PluginError::ImportNotGranted { import, reason, .. }) => {
                refused.push(import);
                if !reasons.contains(&reason) {
                    reasons.push(reason);
                }
            }
            Err(other) => return Err(other),
        }
    }
    if !refused.is_empty() {
        return Err(PluginError::ImportNotGranted {
            plugin: plugin.to_string(),
            import: refused.join(", "),
            reason: reasons.join("; "),
        });
    }
    Ok(names)
}

fn check_import(name: &str, plugin: &str, kind: Kind, has_fs: bool) -> PluginResult<()> {
    let (path, version) = match name.split_once('@') {
        Some((p, v)) => (p, Some(v)),
        None => (name, None),
    };
    let deny = |reason: &str| PluginError::ImportNotGranted {
        plugin: plugin.to_string(),
        import: name.to_string(),
        reason: reason.to_string(),
    };
    if let Some(iface) = path.strip_prefix("loopx:plugin/") {
        let v = version.and_then(parse_version);
        let compatible = v.is_some_and(|v| v.0 == HOST_API_VERSION.0 && v.1 == HOST_API_VERSION.1);
        if !compatible {
            return Err(PluginError::ApiVersion {
                plugin: plugin.to_string(),
                found: name.to_string(),
                supported: version_string(),
            });
        }
        return match (iface, kind) {
            ("types", _) | ("host", Kind::Capability) | ("logging", Kind::Provider) => Ok(()),
            ("host", Kind::Provider) => Err(deny(
                "providers cannot call providers (loopx:plugin/host is for capabilities)",
            )),
            ("logging", Kind::Capability) => {
                Err(deny("capabilities log through loopx:plugin/host"))
            }
            _ => Err(deny("unknown loopx:plugin interface")),
        };
    }
    let Some((pkg, _iface)) = path.split_once('/') else {
        return Err(deny("not an interface import"));
    };
    match pkg {
        "wasi:io" | "wasi:cli" | "wasi:clocks" | "wasi:random" => {
            if version.is_some_and(|v| !v.starts_with("0.2.")) {
                return Err(deny("only WASI 0.2 (preview 2) is linked"));
            }
            Ok(())
        }
        "wasi:filesystem" => match kind {
            Kind::Capability => Err(deny(
                "capabilities have no filesystem authority; move file access into a provider",
            )),
            Kind::Provider if has_fs => Ok(()),
            Kind::Provider => Err(deny(
                "the provider uses the filesystem but no fs.read:<name>=<dir> or fs.write:<name>=<dir> was granted",
            )),
        },
        "wasi:sockets" => Err(deny(
            "no LoopX permission grants network access (sockets are always denied)",
        )),
        _ => Err(deny("no LoopX permission grants this interface")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping() {
        assert!(check_import("wasi:cli/environment@0.2.6", "p", Kind::Capability, false).is_ok());
        assert!(check_import("loopx:plugin/host@0.1.0", "p", Kind::Capability, false).is_ok());
        assert!(check_import("loopx:plugin/host@0.2.0", "p", Kind::Capability, false).is_err());
        assert!(check_import("wasi:filesystem/types@0.2.6", "p", Kind::Capability, true).is_err());
        assert!(check_import("wasi:filesystem/types@0.2.6", "p", Kind::Provider, false).is_err());
        assert!(check_import("wasi:filesystem/types@0.2.6", "p", Kind::Provider, true).is_ok());
        assert!(check_import("wasi:sockets/tcp@0.2.6", "p", Kind::Provider, true).is_err());
        assert!(check_import("wasi:http/types@0.2.6", "p", Kind::Provider, true).is_err());
    }
}
