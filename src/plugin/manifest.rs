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

/// Whether `s` can name an extension or a component: a path-safe token that starts with a letter
/// or digit, so it can be typed on a command line (`-x` would be read as a flag) and never looks
/// like a hidden file.
pub fn is_extension_id(s: &str) -> bool {
    is_token(s) && s.starts_with(|c: char| c.is_ascii_alphanumeric())
}

/// Parses a `major.minor.patch` version with the `semver` crate (strict SemVer 2.0: no spaces, no
/// missing parts, no leading zeros); pre-release/build suffixes are allowed and ignored here.
pub fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    semver::Version::parse(v)
        .ok()
        .map(|v| (v.major, v.minor, v.patch))
}

/// Whether the host's `loopx:plugin` version satisfies the manifest's `api` requirement, parsed by
/// `semver::VersionReq` (Cargo's syntax: `>=0.1, <0.2`, `^0.1`, `~0.1.0`, `=0.1.0`; a bare version
/// means `^`). `Err` names why the requirement is not understood.
pub fn api_supported(range: &str) -> Result<bool, String> {
    let req = semver::VersionReq::parse(range).map_err(|e| e.to_string())?;
    let (major, minor, patch) = HOST_API_VERSION;
    Ok(req.matches(&semver::Version::new(major, minor, patch)))
}

/// Largest `extension.toml` read, in bytes. Real manifests are well under 4 KiB; the bound keeps a
/// manifest that is a device or an enormous file from being read without end.
pub const MAX_MANIFEST_BYTES: u64 = 64 * 1024;
/// Largest component file read at install, in bytes. Release builds of real components are a few
/// MiB; debug builds with full DWARF stay well below this.
pub const MAX_COMPONENT_BYTES: u64 = 64 << 20;
/// The first bytes of every WebAssembly binary (module or component).
const WASM_MAGIC: &[u8; 4] = b"\0asm";

/// A file read for install: the bytes and their sha256, hashed while reading.
pub struct InstallFile {
    pub bytes: Vec<u8>,
    pub sha256: String,
}

/// Reads `path` for install only if it is a regular file (after following symlinks) of at most
/// `cap` bytes, hashing while reading. The file is opened without blocking (a FIFO planted under
/// the name cannot stall the install), the type and size are checked on the open descriptor (the
/// file cannot be swapped between check and read), and at most `cap + 1` bytes are ever read, so
/// `/dev/zero` or a file that grows while being read is refused at once instead of filling memory.
/// `Err` is a sentence about the file, never its content.
pub fn read_install_file(path: &Path, cap: u64) -> Result<InstallFile, String> {
    use sha2::Digest;
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("cannot be opened ({e})"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot be read ({e})"))?;
    if !meta.file_type().is_file() {
        return Err(format!(
            "is not a regular file ({}); only regular files are read",
            describe_type(&meta.file_type())
        ));
    }
    if meta.len() > cap {
        return Err(format!("is {} bytes; the limit is {cap}", meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    let mut hasher = sha2::Sha256::new();
    let mut reader = file.take(cap + 1);
    let mut chunk = [0u8; 64 * 1024];
    loop {
        let n = match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("cannot be read ({e})")),
        };
        if (bytes.len() + n) as u64 > cap {
            return Err(format!(
                "grew past the limit of {cap} bytes while being read"
            ));
        }
        hasher.update(&chunk[..n]);
        bytes.extend_from_slice(&chunk[..n]);
    }
    Ok(InstallFile {
        bytes,
        sha256: hex::encode(hasher.finalize()),
    })
}

/// Reads a component for install: [`read_install_file`] under [`MAX_COMPONENT_BYTES`], and the
/// bytes must be a WebAssembly binary. Text is refused before the engine sees it: the engine
/// would otherwise try it as WAT and quote the offending line of whatever file was named.
pub fn read_component_file(path: &Path) -> Result<InstallFile, String> {
    let f = read_install_file(path, MAX_COMPONENT_BYTES)?;
    if !f.bytes.starts_with(WASM_MAGIC) {
        return Err(
            "is not a WebAssembly binary (it does not start with \\0asm); name the built .wasm component"
                .to_string(),
        );
    }
    Ok(f)
}

fn describe_type(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a plain file"
    }
}

/// Words a manifest error may quote: the manifest's own vocabulary and TOML punctuation. Anything
/// else quoted by the TOML or serde error (a key, a value, a line) came from the file and is
/// replaced by `…`, so a file that is not a manifest never has its content printed.
const VOCABULARY: &[&str] = &[
    "id",
    "version",
    "api",
    "description",
    "permissions",
    "provides",
    "kind",
    "component",
    "uses",
    "limits",
    "fuel",
    "deadline_ms",
    "memory_mib",
    "output_kib",
    "max_provider_calls",
    "log_kib",
    "capability",
    "provider",
];

/// `message` with every quoted segment (between backticks or double quotes) that is not in
/// [`VOCABULARY`] or plain punctuation replaced by `…`.
fn redact(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(start) = rest.find(['`', '"']) {
        let quote = rest[start..].chars().next().expect("found above");
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let Some(len) = after.find(quote) else {
            out.push(quote);
            out.push('…');
            return out;
        };
        let inner = &after[..len];
        let safe = VOCABULARY.contains(&inner)
            || (inner.len() <= 3 && inner.chars().all(|c| c.is_ascii_punctuation()));
        out.push(quote);
        out.push_str(if safe { inner } else { "…" });
        out.push(quote);
        rest = &after[len + 1..];
    }
    out.push_str(rest);
    // A message may also end in the offending text unquoted; keep only its first line.
    out.lines().next().unwrap_or_default().to_string()
}

impl Manifest {
    /// Reads and validates `<dir>/extension.toml`: a regular file of at most
    /// [`MAX_MANIFEST_BYTES`], UTF-8 TOML.
    pub fn load(dir: &Path) -> PluginResult<Manifest> {
        let path = dir.join(MANIFEST_FILE);
        let origin = path.display().to_string();
        match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(PluginError::not_found(
                    origin,
                    "an extension directory must contain extension.toml (see docs/extension-authors.md)",
                ));
            }
            _ => {}
        }
        let file = read_install_file(&path, MAX_MANIFEST_BYTES)
            .map_err(|why| PluginError::manifest(&origin, format!("the manifest {why}")))?;
        let text = String::from_utf8(file.bytes).map_err(|_| {
            PluginError::manifest(&origin, "the manifest is not UTF-8 text, so it is not TOML")
        })?;
        Manifest::parse(&text, &origin)
    }

    /// Parses and validates manifest text; `origin` names it in errors. A parse error names the
    /// line and column and quotes none of the text (see [`redact`]).
    pub fn parse(text: &str, origin: &str) -> PluginResult<Manifest> {
        if text.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(PluginError::manifest(
                origin,
                format!(
                    "the manifest is {} bytes; the limit is {MAX_MANIFEST_BYTES}",
                    text.len()
                ),
            ));
        }
        let m: Manifest = toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|span| {
                    let before = &text[..span.start.min(text.len())];
                    let line = before.matches('\n').count() + 1;
                    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                    format!("line {line}, column {column}: ")
                })
                .unwrap_or_default();
            PluginError::manifest(origin, format!("{at}{}", redact(e.message())))
        })?;
        m.validate()?;
        Ok(m)
    }

    fn validate(&self) -> PluginResult<()> {
        let who = &self.id;
        if !is_extension_id(&self.id) {
            return Err(PluginError::manifest(
                who,
                "id must start with a letter or digit and be a path-safe token ([A-Za-z0-9._-], max 64)",
            ));
        }
        // Strict SemVer through the `semver` crate: "1", " 1 . 2 . 3 " and control characters are
        // refused. The text is not echoed: it can be anything the author's file held.
        if self.version.len() > 64 || semver::Version::parse(&self.version).is_err() {
            return Err(PluginError::manifest(
                who,
                "version is not a SemVer version (major.minor.patch, e.g. \"0.1.0\")",
            ));
        }
        if self.api.len() > 64 {
            return Err(PluginError::manifest(
                who,
                "api requirement is longer than 64 bytes",
            ));
        }
        match api_supported(&self.api) {
            Err(why) => {
                return Err(PluginError::manifest(
                    who,
                    format!(
                        "api requirement is not a SemVer requirement such as \">=0.1, <0.2\" ({why})"
                    ),
                ));
            }
            Ok(false) => {
                return Err(PluginError::ApiVersion {
                    plugin: who.clone(),
                    found: format!("api = \"{}\"", self.api),
                    supported: version_string(),
                });
            }
            Ok(true) => {}
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
            if !is_extension_id(&p.id) {
                return Err(PluginError::manifest(
                    who,
                    format!(
                        "provides id '{}' must start with a letter or digit and be a path-safe token",
                        p.id
                    ),
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
        // Only providers read through grants: a permission on an extension without one would be
        // recorded and shown as granted while nothing could ever use it.
        if !self.permissions.is_empty() && !self.provides.iter().any(|p| p.kind == Kind::Provider) {
            return Err(PluginError::manifest(
                who,
                "declares permissions but provides no provider: capabilities cannot hold \
                 permissions (they call providers, which read through grants); remove \
                 `permissions` or add the provider that needs them",
            ));
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
        assert_eq!(api_supported(">=0.1, <0.2"), Ok(true));
        assert_eq!(api_supported(">=0.2"), Ok(false));
        assert_eq!(api_supported("^0.1"), Ok(true));
        assert_eq!(api_supported("^0.2"), Ok(false));
        assert!(api_supported("nonsense").is_err());
        // The hand-written matcher this replaced computed `minor + 1` and overflowed here.
        assert_eq!(api_supported("^0.18446744073709551615"), Ok(false));
    }

    fn manifest_with(id: &str, version: &str, api: &str) -> String {
        format!(
            "id = \"{id}\"\nversion = \"{version}\"\napi = \"{api}\"\n[[provides]]\nkind = \"capability\"\nid = \"c\"\ncomponent = \"c.wasm\"\n"
        )
    }

    #[test]
    fn version_api_and_id_are_strict() {
        assert!(Manifest::parse(&manifest_with("x", "0.1.0", ">=0.1, <0.2"), "t").is_ok());
        for bad_version in [
            "1",
            " 1 . 2 . 3 ",
            "1.2",
            "01.2.3",
            "1.2.3\\u0000",
            "1.2.3\\n",
            "v1.2.3",
        ] {
            let text = manifest_with("x", bad_version, ">=0.1, <0.2");
            let err = Manifest::parse(&text, "t").unwrap_err();
            assert!(
                matches!(err, PluginError::Manifest { .. }),
                "{bad_version}: {err}"
            );
            assert!(err.to_string().contains("SemVer"), "{bad_version}: {err}");
        }
        for bad_api in ["^0.18446744073709551615.0.0", "nonsense", "0.1 || 0.2"] {
            let text = manifest_with("x", "0.1.0", bad_api);
            assert!(Manifest::parse(&text, "t").is_err(), "{bad_api}");
        }
        assert!(matches!(
            Manifest::parse(&manifest_with("x", "0.1.0", "^0.18446744073709551615"), "t"),
            Err(PluginError::ApiVersion { .. })
        ));
        for bad_id in ["-x", "_x", ".x", ""] {
            let text = manifest_with(bad_id, "0.1.0", ">=0.1, <0.2");
            assert!(Manifest::parse(&text, "t").is_err(), "{bad_id}");
        }
    }

    #[test]
    fn parse_errors_quote_nothing_from_the_file() {
        for text in [
            "root:x:0:0:root:/root:/bin/bash\n",
            "secret_key = \"hunter2\"\n",
            "id = 12345678\n",
            "[provides]\nkind = \"hunter2\"\n",
        ] {
            let err = Manifest::parse(text, "t").unwrap_err().to_string();
            for word in ["root:x", "hunter2", "secret_key", "12345678"] {
                assert!(!err.contains(word), "{text:?} -> {err}");
            }
            assert!(err.contains("line "), "{err}");
        }
        // The manifest's own vocabulary is still quoted, so an author can fix a typo.
        let err = Manifest::parse("idd = \"x\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("`version`"), "{err}");
    }

    #[test]
    fn permissions_need_a_provider() {
        let text = format!(
            "permissions = [\"fs.read:data\"]\n{}",
            manifest_with("caps", "0.1.0", "^0.1")
        );
        let err = Manifest::parse(&text, "t").unwrap_err();
        assert!(err.to_string().contains("provides no provider"), "{err}");
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
