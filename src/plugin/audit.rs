//! The import audit: a component may only import what its kind allows and its grants justify.
//!
//! Why this exists: the linker provides all of WASI (Rust's `wasm32-wasip2` std needs much of it just
//! to start), so the only place to refuse authority a component *asks* for is by reading its real
//! import list before anything runs: at install first from the component's bytes (before any
//! compile, so a refusal costs none), then from the compiled component
//! (`Component::component_type().imports()`), and again at every load, so a component swapped on
//! disk or a grant edited in the registry cannot widen what runs.
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
//! | `wasi:io/{error,poll,streams}`, `wasi:cli/{environment,exit,stdin,stdout,stderr,terminal-*}` (std runtime) | yes (empty env/args, closed stdin, captured stdout/stderr) | yes (env = granted vars only) |
//! | `wasi:clocks/{monotonic-clock,wall-clock}`, `wasi:random/{random,insecure,insecure-seed}` | yes (deterministic) | yes |
//! | `wasi:filesystem/{types,preopens}`             | no         | only with at least one granted `fs.*`     |
//! | any other interface, even in these namespaces  | no         | no                                        |
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
    audit_names(names, plugin, kind, grants)
}

/// The same audit on the component's bytes, before anything is compiled: install runs it first, so
/// a component that asks for authority it cannot have is refused without paying for a compile.
/// The names are read from the component's top-level import sections (wasmparser, the parser
/// wasmtime uses); the audit of the compiled component ([`audit_imports`]) still follows and
/// remains the authority.
pub fn audit_wasm_imports(
    wasm: &[u8],
    plugin: &str,
    kind: Kind,
    grants: &[Grant],
) -> PluginResult<Vec<String>> {
    let names = component_import_names(wasm).map_err(|detail| PluginError::Load {
        plugin: plugin.to_string(),
        detail: format!("not a WebAssembly component: {detail}"),
    })?;
    audit_names(names, plugin, kind, grants)
}

/// The import names of the outermost component in `wasm`, as wasmtime reports them.
fn component_import_names(wasm: &[u8]) -> Result<Vec<String>, String> {
    use wasmparser::{Encoding, Parser, Payload};
    let mut names = Vec::new();
    // Nested modules and components each open with their own `Version` and close with an `End`;
    // only depth 1 is the component being installed.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(wasm) {
        match payload.map_err(|e| e.to_string())? {
            Payload::Version { encoding, .. } => {
                if depth == 0 && encoding != Encoding::Component {
                    return Err("a core module, not a component".into());
                }
                depth += 1;
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    let import = import.map_err(|e| e.to_string())?;
                    // A type import (`import "plugin-info" (type (eq ...))`, emitted for the world's
                    // own types) names a type, not an instance or function: it grants nothing, and
                    // wasmtime does not list it among a component's imports either.
                    if matches!(import.ty, wasmparser::ComponentTypeRef::Type(_)) {
                        continue;
                    }
                    let name = import.name;
                    names.push(match name.version_suffix {
                        Some(v) if !name.name.contains('@') => format!("{}@{v}", name.name),
                        _ => name.name.to_string(),
                    });
                }
            }
            _ => {}
        }
    }
    Ok(names)
}

fn audit_names(
    names: Vec<String>,
    plugin: &str,
    kind: Kind,
    grants: &[Grant],
) -> PluginResult<Vec<String>> {
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
    let Some((pkg, iface)) = path.split_once('/') else {
        return Err(deny("not an interface import"));
    };
    // Exactly the interfaces listed, never a whole namespace: a WASI release that adds an
    // interface to `wasi:cli` or `wasi:io` must not reach guests until someone has read what it
    // grants and listed it here.
    let listed = match pkg {
        "wasi:io" => STD_IO.contains(&iface),
        "wasi:cli" => STD_CLI.contains(&iface),
        "wasi:clocks" => STD_CLOCKS.contains(&iface),
        "wasi:random" => STD_RANDOM.contains(&iface),
        "wasi:filesystem" => FILESYSTEM.contains(&iface),
        "wasi:sockets" => {
            return Err(deny(
                "no LoopX permission grants network access (sockets are always denied)",
            ));
        }
        _ => return Err(deny("no LoopX permission grants this interface")),
    };
    if !listed {
        return Err(deny(
            "not an interface LoopX allows (only the WASI 0.2 interfaces listed in docs/plugin-host.md)",
        ));
    }
    if !version.is_some_and(|v| v.starts_with("0.2.")) {
        return Err(deny("only WASI 0.2 (preview 2) is linked"));
    }
    if pkg != "wasi:filesystem" {
        return Ok(());
    }
    match kind {
        Kind::Capability => Err(deny(
            "capabilities have no filesystem authority; move file access into a provider",
        )),
        Kind::Provider if has_fs => Ok(()),
        Kind::Provider => Err(deny(
            "the provider uses the filesystem but no fs.read:<name>=<dir> or fs.write:<name>=<dir> was granted",
        )),
    }
}

/// The WASI 0.2 interfaces Rust's `wasm32-wasip2` std imports, and nothing more (docs/plugin-host.md).
const STD_IO: &[&str] = &["error", "poll", "streams"];
const STD_CLI: &[&str] = &[
    "environment",
    "exit",
    "stdin",
    "stdout",
    "stderr",
    "terminal-input",
    "terminal-output",
    "terminal-stdin",
    "terminal-stdout",
    "terminal-stderr",
];
const STD_CLOCKS: &[&str] = &["monotonic-clock", "wall-clock"];
const STD_RANDOM: &[&str] = &["random", "insecure", "insecure-seed"];
/// Providers only, and only with an `fs.*` grant.
const FILESYSTEM: &[&str] = &["types", "preopens"];

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

    #[test]
    fn only_listed_interfaces_not_whole_namespaces() {
        for listed in [
            "wasi:io/streams@0.2.6",
            "wasi:cli/terminal-stdout@0.2.6",
            "wasi:clocks/wall-clock@0.2.6",
            "wasi:random/insecure-seed@0.2.6",
        ] {
            assert!(
                check_import(listed, "p", Kind::Capability, false).is_ok(),
                "{listed}"
            );
        }
        // Same namespaces, interfaces that are not on the list (a future or made-up one).
        for unlisted in [
            "wasi:cli/run@0.2.6",
            "wasi:io/anything@0.2.6",
            "wasi:clocks/timezone@0.2.6",
            "wasi:random/entropy-pool@0.2.6",
            "wasi:filesystem/mount@0.2.6",
        ] {
            let err = check_import(unlisted, "p", Kind::Provider, true).unwrap_err();
            assert_eq!(err.kind().as_str(), "import_not_granted", "{unlisted}");
        }
        // A versionless WASI import is not one of the linked 0.2 interfaces either.
        assert!(check_import("wasi:io/streams", "p", Kind::Capability, false).is_err());
    }
}
