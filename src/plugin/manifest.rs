//! `extension.toml`: what an extension declares, what an operator grants, and the limits a component
//! runs under.
//!
//! Why this exists: install, load and every call derive their authority from two inputs only, the
//! manifest's declared permissions and the operator's grants. Parsing and validating both in one place
//! (unknown keys refused, ids path-safe, requested limits within host maxima, grants ⊆ declarations)
//! means no later stage has to re-check shape; they only intersect sets.
//!
//! Permission grammar (documented in docs/plugin-host.md):
//!
//! | declared (manifest)  | granted (`--grant`)            | effect for a provider                          |
//! |----------------------|--------------------------------|------------------------------------------------|
//! | `fs.read:<name>`     | `fs.read:<name>=<host dir>`    | `<host dir>` preopened read-only at `/<name>`  |
//! | `fs.write:<name>`    | `fs.write:<name>=<host dir>`   | `<host dir>` preopened read-write at `/<name>` |
//! | `env:<VAR>`          | `env:<VAR>`                    | `VAR` passed with the host's value at call time |
//!
//! Capabilities can hold no permission at all.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{PluginError, PluginResult};

/// The `loopx:plugin` version this host implements.
pub const HOST_API_VERSION: (u64, u64, u64) = (0, 1, 0);
/// The manifest file name inside an extension directory.
pub const MANIFEST_FILE: &str = "extension.toml";

/// Host-wide ceilings on what a manifest may request.
pub mod max {
    pub const FUEL: u64 = 20_000_000_000;
    pub const DEADLINE_MS: u64 = 60_000;
    pub const MEMORY_MIB: u64 = 1024;
    pub const OUTPUT_KIB: u64 = 16 * 1024;
    pub const PROVIDER_CALLS: u32 = 64;
    pub const LOG_KIB: u64 = 1024;
}

/// Kind of a `[[provides]]` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Capability,
    Provider,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Capability => "capability",
            Kind::Provider => "provider",
        }
    }
}

/// Requested limits of one component (all optional; defaults per kind).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestedLimits {
    /// Fuel units per call (roughly wasm instructions).
    pub fuel: Option<u64>,
    /// Wall-clock deadline per call, milliseconds.
    pub deadline_ms: Option<u64>,
    /// Linear memory ceiling, MiB.
    pub memory_mib: Option<u64>,
    /// Cap on bytes lifted from the guest per call (hostcall fuel), KiB.
    pub output_kib: Option<u64>,
    /// Capabilities: provider calls per `propose`.
    pub max_provider_calls: Option<u32>,
    /// Captured log bytes per call, KiB.
    pub log_kib: Option<u64>,
}

/// Effective limits of one component.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub fuel: u64,
    pub deadline_ms: u64,
    pub memory_bytes: u64,
    pub output_bytes: usize,
    pub max_provider_calls: u32,
    pub log_bytes: usize,
}

impl Limits {
    /// Default limits for a kind.
    pub fn defaults(kind: Kind) -> Limits {
        match kind {
            Kind::Capability => Limits {
                fuel: 500_000_000,
                deadline_ms: 2_000,
                memory_bytes: 64 << 20,
                output_bytes: 1 << 20,
                max_provider_calls: 8,
                log_bytes: 64 << 10,
            },
            Kind::Provider => Limits {
                fuel: 2_000_000_000,
                deadline_ms: 5_000,
                memory_bytes: 64 << 20,
                output_bytes: 1 << 20,
                max_provider_calls: 0,
                log_bytes: 64 << 10,
            },
        }
    }

    /// Applies requested limits over the defaults, refusing values above the host maxima or zero.
    pub fn resolve(kind: Kind, req: &RequestedLimits, who: &str) -> PluginResult<Limits> {
        let mut l = Limits::defaults(kind);
        fn check(who: &str, name: &str, v: u64, ceiling: u64) -> PluginResult<u64> {
            if v == 0 || v > ceiling {
                return Err(PluginError::manifest(
                    who,
                    format!("limit {name} = {v} is outside 1..={ceiling} (the host maximum)"),
                ));
            }
            Ok(v)
        }
        if let Some(v) = req.fuel {
            l.fuel = check(who, "fuel", v, max::FUEL)?;
        }
        if let Some(v) = req.deadline_ms {
            l.deadline_ms = check(who, "deadline_ms", v, max::DEADLINE_MS)?;
        }
        if let Some(v) = req.memory_mib {
            l.memory_bytes = check(who, "memory_mib", v, max::MEMORY_MIB)? << 20;
        }
        if let Some(v) = req.output_kib {
            l.output_bytes = (check(who, "output_kib", v, max::OUTPUT_KIB)? << 10) as usize;
        }
        if let Some(v) = req.log_kib {
            l.log_bytes = (check(who, "log_kib", v, max::LOG_KIB)? << 10) as usize;
        }
        if let Some(v) = req.max_provider_calls {
            if kind == Kind::Provider {
                return Err(PluginError::manifest(
                    who,
                    "max_provider_calls applies to capabilities only",
                ));
            }
            if v > max::PROVIDER_CALLS {
                return Err(PluginError::manifest(
                    who,
                    format!(
                        "limit max_provider_calls = {v} is above the host maximum {}",
                        max::PROVIDER_CALLS
                    ),
                ));
            }
            l.max_provider_calls = v;
        }
        Ok(l)
    }
}

/// One component an extension provides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provides {
    pub kind: Kind,
    /// Path-safe id, unique within the extension. Referenced as `<extension>/<id>`.
    pub id: String,
    /// The built `.wasm` component, relative to the extension directory (or absolute).
    pub component: String,
    #[serde(default)]
    pub description: String,
    /// Capabilities only: providers this capability may call, as `<extension>/<provider>`.
    #[serde(default)]
    pub uses: Vec<String>,
    #[serde(default)]
    pub limits: RequestedLimits,
}

/// A parsed `extension.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub id: String,
    pub version: String,
    /// Range of `loopx:plugin` versions the extension works with, e.g. `">=0.1, <0.2"`.
    pub api: String,
    #[serde(default)]
    pub description: String,
    /// Permissions the extension's providers may be granted (see the module docs).
    #[serde(default)]
    pub permissions: Vec<String>,
    pub provides: Vec<Provides>,
}

/// A declared permission.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Permission {
    FsRead(String),
    FsWrite(String),
    Env(String),
}

impl Permission {
    pub fn parse(text: &str, who: &str) -> PluginResult<Permission> {
        let bad = |why: &str| {
            PluginError::manifest(
                who,
                format!(
                    "permission '{text}' {why}; expected fs.read:<name>, fs.write:<name> or env:<VAR>"
                ),
            )
        };
        let (scheme, name) = text.split_once(':').ok_or_else(|| bad("has no scheme"))?;
        match scheme {
            "fs.read" | "fs.write" => {
                if !is_token(name) {
                    return Err(bad("has a directory name that is not a path-safe token"));
                }
                Ok(if scheme == "fs.read" {
                    Permission::FsRead(name.to_string())
                } else {
                    Permission::FsWrite(name.to_string())
                })
            }
            "env" => {
                if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(bad("names an invalid environment variable"));
                }
                Ok(Permission::Env(name.to_string()))
            }
            _ => Err(bad("has an unknown scheme")),
        }
    }

    pub fn render(&self) -> String {
        match self {
            Permission::FsRead(n) => format!("fs.read:{n}"),
            Permission::FsWrite(n) => format!("fs.write:{n}"),
            Permission::Env(v) => format!("env:{v}"),
        }
    }
}

/// An operator grant: a declared permission plus, for directories, the host path it maps to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Grant {
    pub permission: Permission,
    /// Absolute host directory for `fs.*` grants.
    pub host_path: Option<PathBuf>,
}

impl Grant {
    /// Parses `fs.read:<name>=<dir>`, `fs.write:<name>=<dir>` or `env:<VAR>`. Relative directories are
    /// resolved against `cwd` and must exist.
    pub fn parse(text: &str, cwd: &Path, who: &str) -> PluginResult<Grant> {
        let (perm_text, path) = match text.split_once('=') {
            Some((p, d)) => (p, Some(d)),
            None => (text, None),
        };
        let permission = Permission::parse(perm_text, who)?;
        let host_path = match (&permission, path) {
            (Permission::FsRead(_) | Permission::FsWrite(_), Some(d)) if !d.is_empty() => {
                let p = if Path::new(d).is_absolute() {
                    PathBuf::from(d)
                } else {
                    cwd.join(d)
                };
                let p = p.canonicalize().map_err(|e| PluginError::BadRequest {
                    detail: format!(
                        "grant '{text}': directory {} is not accessible: {e}",
                        p.display()
                    ),
                })?;
                if !p.is_dir() {
                    return Err(PluginError::BadRequest {
                        detail: format!("grant '{text}': {} is not a directory", p.display()),
                    });
                }
                Some(p)
            }
            (Permission::FsRead(_) | Permission::FsWrite(_), _) => {
                return Err(PluginError::BadRequest {
                    detail: format!("grant '{text}' needs a directory: use {perm_text}=<host dir>"),
                });
            }
            (Permission::Env(_), Some(_)) => {
                return Err(PluginError::BadRequest {
                    detail: format!(
                        "grant '{text}': env grants take no value; the host's value is passed at call time"
                    ),
                });
            }
            (Permission::Env(_), None) => None,
        };
        Ok(Grant {
            permission,
            host_path,
        })
    }

    pub fn render(&self) -> String {
        match &self.host_path {
            Some(p) => format!("{}={}", self.permission.render(), p.display()),
            None => self.permission.render(),
        }
    }
}

/// Whether `s` is a path-safe token: non-empty, `[A-Za-z0-9._-]`, not starting with `.`.
pub fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

/// Parses a `major.minor.patch` version (pre-release/build suffixes ignored).
pub fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.split(['-', '+']).next()?;
    let mut it = core.split('.');
    let a = it.next()?.trim().parse().ok()?;
    let b = it
        .next()
        .map(|x| x.trim().parse().ok())
        .unwrap_or(Some(0))?;
    let c = it
        .next()
        .map(|x| x.trim().parse().ok())
        .unwrap_or(Some(0))?;
    if it.next().is_some() {
        return None;
    }
    Some((a, b, c))
}

/// Whether `version` satisfies a comma-separated range of `>=`, `>`, `<=`, `<`, `=` comparators
/// (a bare version means `=`; `^x.y` means `>=x.y, <x.(y+1)` below 1.0 and `<(x+1)` above).
pub fn range_matches(range: &str, version: (u64, u64, u64)) -> Option<bool> {
    let mut ok = true;
    let mut any = false;
    for part in range.split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        any = true;
        let (op, rest) = ["<=", ">=", "<", ">", "=", "^"]
            .iter()
            .find_map(|op| part.strip_prefix(op).map(|r| (*op, r.trim())))
            .unwrap_or(("=", part));
        let v = parse_version(rest)?;
        let hit = match op {
            "<=" => version <= v,
            ">=" => version >= v,
            "<" => version < v,
            ">" => version > v,
            "^" => {
                let upper = if v.0 == 0 {
                    (0, v.1 + 1, 0)
                } else {
                    (v.0 + 1, 0, 0)
                };
                version >= v && version < upper
            }
            _ => version == v,
        };
        ok &= hit;
    }
    any.then_some(ok)
}

impl Manifest {
    /// Reads and validates `<dir>/extension.toml`.
    pub fn load(dir: &Path) -> PluginResult<Manifest> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                PluginError::not_found(
                    format!("{}", path.display()),
                    "an extension directory must contain extension.toml (see docs/extension-authors.md)",
                )
            } else {
                PluginError::host(format!("reading {}", path.display()), e)
            }
        })?;
        Manifest::parse(&text, &path.display().to_string())
    }

    /// Parses and validates manifest text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> PluginResult<Manifest> {
        let m: Manifest = toml::from_str(text)
            .map_err(|e| PluginError::manifest(origin, e.message().to_string()))?;
        m.validate()?;
        Ok(m)
    }

    fn validate(&self) -> PluginResult<()> {
        let who = &self.id;
        if !is_token(&self.id) {
            return Err(PluginError::manifest(
                who,
                "id must be a path-safe token ([A-Za-z0-9._-], max 64)",
            ));
        }
        if parse_version(&self.version).is_none() {
            return Err(PluginError::manifest(
                who,
                format!("version '{}' is not major.minor.patch", self.version),
            ));
        }
        match range_matches(&self.api, HOST_API_VERSION) {
            None => {
                return Err(PluginError::manifest(
                    who,
                    format!("api range '{}' is not understood", self.api),
                ));
            }
            Some(false) => {
                return Err(PluginError::ApiVersion {
                    plugin: who.clone(),
                    found: format!("api = \"{}\"", self.api),
                    supported: version_string(),
                });
            }
            Some(true) => {}
        }
        let mut seen = BTreeMap::new();
        for p in &self.permissions {
            let perm = Permission::parse(p, who)?;
            if seen.insert(perm.render(), ()).is_some() {
                return Err(PluginError::manifest(
                    who,
                    format!("permission '{p}' is listed twice"),
                ));
            }
        }
        if self.provides.is_empty() {
            return Err(PluginError::manifest(
                who,
                "[[provides]] is empty: an extension must provide a component",
            ));
        }
        let mut ids = BTreeMap::new();
        for p in &self.provides {
            let label = format!("{}/{}", self.id, p.id);
            if !is_token(&p.id) {
                return Err(PluginError::manifest(
                    who,
                    format!("provides id '{}' is not a path-safe token", p.id),
                ));
            }
            if ids.insert(p.id.clone(), ()).is_some() {
                return Err(PluginError::manifest(
                    who,
                    format!("provides id '{}' is listed twice", p.id),
                ));
            }
            if p.component.trim().is_empty() {
                return Err(PluginError::manifest(
                    who,
                    format!("{label}: component path is empty"),
                ));
            }
            Limits::resolve(p.kind, &p.limits, &label)?;
            if p.kind == Kind::Provider && !p.uses.is_empty() {
                return Err(PluginError::manifest(
                    who,
                    format!("{label}: only capabilities may declare `uses`"),
                ));
            }
            for u in &p.uses {
                let ok = u
                    .split_once('/')
                    .is_some_and(|(e, i)| is_token(e) && is_token(i));
                if !ok {
                    return Err(PluginError::manifest(
                        who,
                        format!("{label}: uses entry '{u}' must be <extension>/<provider>"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Declared permissions, parsed.
    pub fn declared(&self) -> Vec<Permission> {
        self.permissions
            .iter()
            .filter_map(|p| Permission::parse(p, &self.id).ok())
            .collect()
    }

    /// The `[[provides]]` entry with this id.
    pub fn provides(&self, id: &str) -> Option<&Provides> {
        self.provides.iter().find(|p| p.id == id)
    }

    /// Checks operator grants against the declared permissions: every grant must be declared.
    pub fn check_grants(&self, grants: &[Grant]) -> PluginResult<()> {
        let declared = self.declared();
        for g in grants {
            if !declared.contains(&g.permission) {
                return Err(PluginError::BadRequest {
                    detail: format!(
                        "extension {} does not declare permission '{}' (declared: {}); a grant must match a declaration",
                        self.id,
                        g.permission.render(),
                        if self.permissions.is_empty() {
                            "none".to_string()
                        } else {
                            self.permissions.join(", ")
                        }
                    ),
                });
            }
        }
        let mut names = BTreeMap::new();
        for g in grants {
            if let Permission::FsRead(n) | Permission::FsWrite(n) = &g.permission
                && names.insert(n.clone(), ()).is_some()
            {
                return Err(PluginError::BadRequest {
                    detail: format!(
                        "directory '{n}' is granted twice; grant it once (fs.write implies read)"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// `0.1.0` style rendering of [`HOST_API_VERSION`].
pub fn version_string() -> String {
    let (a, b, c) = HOST_API_VERSION;
    format!("{a}.{b}.{c}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(range_matches(">=0.1, <0.2", (0, 1, 0)), Some(true));
        assert_eq!(range_matches(">=0.2", (0, 1, 0)), Some(false));
        assert_eq!(range_matches("^0.1", (0, 1, 5)), Some(true));
        assert_eq!(range_matches("^0.1", (0, 2, 0)), Some(false));
        assert_eq!(range_matches("nonsense", (0, 1, 0)), None);
    }

    #[test]
    fn permissions_parse() {
        assert_eq!(
            Permission::parse("fs.read:repo", "x").unwrap(),
            Permission::FsRead("repo".into())
        );
        assert_eq!(
            Permission::parse("env:HOME", "x").unwrap(),
            Permission::Env("HOME".into())
        );
        assert!(Permission::parse("net:any", "x").is_err());
        assert!(Permission::parse("fs.read:../up", "x").is_err());
    }

    #[test]
    fn manifest_rejects_unknown_keys_and_bad_limits() {
        let bad = r#"id = "x"
version = "0.1.0"
api = ">=0.1, <0.2"
surprise = 1
[[provides]]
kind = "capability"
id = "c"
component = "c.wasm"
"#;
        assert!(Manifest::parse(bad, "t").is_err());
        let big = r#"id = "x"
version = "0.1.0"
api = ">=0.1, <0.2"
[[provides]]
kind = "capability"
id = "c"
component = "c.wasm"
limits = { fuel = 99999999999999 }
"#;
        assert!(matches!(
            Manifest::parse(big, "t"),
            Err(PluginError::Manifest { .. })
        ));
    }
}
