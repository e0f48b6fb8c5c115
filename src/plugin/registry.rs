//! Installing, upgrading, rolling back, removing and loading extensions.
//!
//! Why this exists: it is the pipeline that turns a directory an author built into something the host
//! will run, and it refuses before anything runs: manifest and API range validated, grants checked
//! against declarations, every component hashed, compiled once into the cache, its real imports
//! audited against kind and grants, its exports type-checked against the world (`{World}Pre::new`).
//! Only then are the bytes copied into `.loopx/extensions/<id>/<revision>/` and the revision handed to
//! the kernel (`Kernel::record_extension_revision`), which checks the actor, records it with an
//! operation-log entry and rewrites the registry projection. Loading re-verifies the recorded sha256
//! of the installed bytes (a mismatch is `Tampered`) and re-audits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::json;
use wasmtime::Engine;

use crate::clock::now_ms;
use crate::error::{LoopxError, Result, conflict, not_found};
use crate::kernel::extension::{ExtensionChange, ExtensionRevision};
use crate::kernel::{Actor, Kernel};
use crate::model::ArtifactRecord;
use crate::model::ExtensionRecord;
use crate::paths::ProjectPaths;

use super::artifacts::read_artifact;
use super::audit::audit_wasm_imports;
use super::cache::{ComponentCache, sha256_hex};
use super::engine::engine;
use super::error::{PluginError, PluginResult};
use super::manifest::{Grant, Kind, Limits, MANIFEST_FILE, Manifest};
use super::sandbox::LoadedPlugin;

/// Where a project keeps installed components and compiled artifacts.
#[derive(Debug, Clone)]
pub struct PluginHost {
    engine: Engine,
    cache: ComponentCache,
    extensions_dir: PathBuf,
    /// Directories no `fs.*` grant may contain or lie inside: the project's `.loopx/` (database,
    /// projections, installed components) and the component cache.
    protected: Vec<PathBuf>,
}

/// One component of an install, as reported to the operator.
#[derive(Debug, Clone, Serialize)]
pub struct InstalledComponent {
    pub id: String,
    pub kind: Kind,
    pub sha256: String,
    pub bytes: usize,
    pub imports: Vec<String>,
    pub limits: Limits,
    pub uses: Vec<String>,
    /// Whether install compiled it (false when the registry already recorded an artifact for these
    /// bytes and this engine, and the cached file matched that record).
    pub compiled: bool,
    pub compile_ms: u64,
    /// sha256 of the precompiled artifact, recorded in the registry with the install.
    pub artifact_sha256: String,
}

/// Outcome of `install` / `upgrade`.
#[derive(Debug, Clone, Serialize)]
pub struct InstallReport {
    pub id: String,
    pub version: String,
    pub revision: i64,
    pub previous_revision: Option<i64>,
    pub install_dir: String,
    pub grants: Vec<String>,
    /// Grants added / dropped compared with the previous revision.
    pub grants_added: Vec<String>,
    pub grants_removed: Vec<String>,
    pub components: Vec<InstalledComponent>,
}

/// An extension validated, compiled and audited by [`PluginHost::prepare`], not yet recorded.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub manifest: Manifest,
    pub grants: Vec<Grant>,
    /// Each component's report and its bytes.
    pub components: Vec<(InstalledComponent, Vec<u8>)>,
    /// Artifacts this preparation compiled and wrote: deleted again if the install does not commit.
    pub written: Vec<PathBuf>,
}

/// Whether an install may replace an existing extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstallMode {
    /// Refuse when the id is already installed.
    Install,
    /// Require the id to be installed; record a new revision.
    Upgrade,
}

pub(crate) fn ext_not_found(id: &str) -> LoopxError {
    not_found(format!(
        "extension '{id}' is not installed; `loopx extension list` shows what is"
    ))
}

/// The manifest recorded with an installed revision.
pub fn record_manifest(rec: &ExtensionRecord) -> PluginResult<Manifest> {
    serde_json::from_value(rec.manifest.clone()).map_err(|e| {
        PluginError::manifest(&rec.id, format!("recorded manifest is unreadable: {e}"))
    })
}

/// The grants recorded with an installed revision.
pub fn record_grants(rec: &ExtensionRecord) -> PluginResult<Vec<Grant>> {
    rec.grants
        .iter()
        .map(|g| {
            Grant::parse(g, Path::new("/"), &rec.id).map_err(|e| match e {
                PluginError::BadRequest { detail } => PluginError::not_found(
                    format!("grant of extension {}", rec.id),
                    format!("{detail}; re-grant it with `loopx extension upgrade`"),
                ),
                other => other,
            })
        })
        .collect()
}

impl PluginHost {
    /// The host for the project at `paths`, using the process-wide engine.
    pub fn for_project(paths: &ProjectPaths) -> PluginHost {
        let mut host = PluginHost::new(paths.extensions_dir(), paths.component_cache_dir());
        host.protected.push(paths.state.clone());
        host
    }

    /// A host with explicit directories (benchmarks, tests).
    pub fn new(extensions_dir: PathBuf, cache_dir: PathBuf) -> PluginHost {
        let engine = engine().clone();
        let cache = ComponentCache::new(cache_dir.clone(), &engine);
        PluginHost {
            engine,
            cache,
            protected: vec![extensions_dir.clone(), cache_dir],
            extensions_dir,
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn cache(&self) -> &ComponentCache {
        &self.cache
    }

    /// Validates, hashes, compiles and audits every component of the extension in `dir` without
    /// recording anything. Returns the manifest, the parsed grants and per-component bytes + report.
    ///
    /// Each component is compiled here unless the registry already records an artifact for its
    /// digest and this engine and the file in the cache matches that record (a reinstall of the same
    /// bytes). Any other file under the artifact's name, planted or left over, is overwritten by the
    /// compile, never reused. When any component is refused, the artifacts this call wrote are
    /// deleted again, so a refused install leaves nothing behind.
    pub fn prepare(
        &self,
        kernel: &mut Kernel,
        dir: &Path,
        grants: &[String],
        cwd: &Path,
    ) -> PluginResult<Prepared> {
        let mut written: Vec<PathBuf> = Vec::new();
        let result = self.prepare_into(kernel, dir, grants, cwd, &mut written);
        match result {
            Ok(mut prepared) => {
                prepared.written = written;
                Ok(prepared)
            }
            Err(e) => {
                remove_artifacts(&written);
                Err(e)
            }
        }
    }

    fn prepare_into(
        &self,
        kernel: &mut Kernel,
        dir: &Path,
        grants: &[String],
        cwd: &Path,
        written: &mut Vec<PathBuf>,
    ) -> PluginResult<Prepared> {
        let manifest = Manifest::load(dir)?;
        let mut parsed = Vec::new();
        for g in grants {
            parsed.push(Grant::parse(g, cwd, &manifest.id)?);
        }
        parsed.sort();
        parsed.dedup();
        manifest.check_grants(&parsed)?;
        self.check_grant_dirs(&parsed)?;
        let mut out = Vec::new();
        for p in &manifest.provides {
            let label = format!("{}/{}", manifest.id, p.id);
            let path = if Path::new(&p.component).is_absolute() {
                PathBuf::from(&p.component)
            } else {
                dir.join(&p.component)
            };
            // Bounded, regular files only, hashed while read (`manifest::read_component_file`).
            if !path.exists() {
                return Err(PluginError::not_found(
                    format!("component {} of {label}", path.display()),
                    "build it first, e.g. `cargo build --release --target wasm32-wasip2`",
                ));
            }
            let file = super::manifest::read_component_file(&path).map_err(|why| {
                PluginError::manifest(
                    &manifest.id,
                    format!("{label}: component {} {why}", path.display()),
                )
            })?;
            let (wasm, sha) = (file.bytes, file.sha256);
            let comp_grants = if p.kind == Kind::Provider {
                parsed.clone()
            } else {
                Vec::new()
            };
            // The import audit first, on the bytes: a refused component costs no compile.
            audit_wasm_imports(&wasm, &label, p.kind, &comp_grants)?;
            let started = std::time::Instant::now();
            let (component, artifact_sha256, compiled) =
                match self.recorded_artifact(kernel, &label, &sha)? {
                    Some((component, digest)) => (component, digest, false),
                    None => {
                        let c = self.cache.compile(&self.engine, &label, &wasm, &sha)?;
                        written.push(c.path);
                        (c.component, c.artifact_sha256, true)
                    }
                };
            let compile_ms = started.elapsed().as_millis() as u64;
            let limits = Limits::resolve(p.kind, &p.limits, &label)?;
            let loaded = LoadedPlugin::new(
                &self.engine,
                &component,
                &label,
                p.kind,
                limits,
                comp_grants,
                p.uses.clone(),
            )?;
            out.push((
                InstalledComponent {
                    id: p.id.clone(),
                    kind: p.kind,
                    sha256: sha,
                    bytes: wasm.len(),
                    imports: loaded.imports.clone(),
                    limits,
                    uses: p.uses.clone(),
                    compiled,
                    compile_ms,
                    artifact_sha256,
                },
                wasm,
            ));
        }
        Ok(Prepared {
            manifest,
            grants: parsed,
            components: out,
            written: Vec::new(),
        })
    }

    /// The cached artifact for component `sha`, if the registry records one for this engine and the
    /// file matches it. A file that does not match is not an error here: install holds the verified
    /// component and recompiles over it (which is also how an operator repairs it).
    fn recorded_artifact(
        &self,
        kernel: &mut Kernel,
        label: &str,
        sha: &str,
    ) -> PluginResult<Option<(wasmtime::component::Component, String)>> {
        let key = self.cache.engine_key().to_string();
        let record = kernel
            .component_artifact(sha, &key)
            .map_err(|e| PluginError::host("reading the artifact registry", e))?;
        let Some(record) = record else {
            return Ok(None);
        };
        match self
            .cache
            .load_recorded(&self.engine, label, sha, &record.artifact_sha256)
        {
            Ok(Some(c)) => Ok(Some((c, record.artifact_sha256))),
            Ok(None) | Err(PluginError::Tampered { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Installs (or upgrades) the extension in `dir` with `grants`, as the operator (library
    /// callers and tests that stand for one).
    pub fn install(
        &self,
        kernel: &mut Kernel,
        dir: &Path,
        grants: &[String],
        cwd: &Path,
        mode: InstallMode,
    ) -> Result<InstallReport> {
        self.install_as(kernel, &Actor::Operator, dir, grants, cwd, mode)
    }

    /// Installs (or upgrades) the extension in `dir` with `grants` on behalf of `actor`. The
    /// kernel refuses anyone but an operator before anything is read or compiled, and records the
    /// revision (which checks again).
    pub fn install_as(
        &self,
        kernel: &mut Kernel,
        actor: &Actor,
        dir: &Path,
        grants: &[String],
        cwd: &Path,
        mode: InstallMode,
    ) -> Result<InstallReport> {
        let change = match mode {
            InstallMode::Install => ExtensionChange::Install,
            InstallMode::Upgrade => ExtensionChange::Upgrade,
        };
        kernel.authorize_extension_change(actor, change)?;
        let manifest = Manifest::load(dir)?;
        let existing = kernel.extension(&manifest.id)?;
        match (mode, &existing) {
            (InstallMode::Install, Some(rec)) => {
                return Err(conflict(format!(
                    "extension '{}' is already installed (version {}, revision {}); use `loopx extension upgrade {}`",
                    rec.id,
                    rec.version,
                    rec.revision,
                    dir.display()
                )));
            }
            (InstallMode::Upgrade, None) => return Err(ext_not_found(&manifest.id)),
            _ => {}
        }
        // An upgrade without --grant keeps the previous grants (those still declared).
        let grants: Vec<String> = match (&existing, grants.is_empty()) {
            (Some(prev), true) => {
                let declared = manifest.declared();
                record_grants(prev)?
                    .into_iter()
                    .filter(|g| declared.contains(&g.permission))
                    .map(|g| g.render())
                    .collect()
            }
            _ => grants.to_vec(),
        };
        let Prepared {
            manifest,
            grants: parsed,
            components,
            written,
        } = self.prepare(kernel, dir, &grants, cwd)?;
        // From here on, any failure deletes the artifacts just written: a refused install leaves
        // no artifact behind (an unrecorded one would never be loaded, but it is clutter that
        // `doctor` would have to explain).
        let revisions = match kernel.extension_revisions(&manifest.id) {
            Ok(r) => r,
            Err(e) => {
                remove_artifacts(&written);
                return Err(e);
            }
        };
        let revision = revisions.iter().map(|r| r.revision).max().unwrap_or(0) + 1;
        let install_dir = self
            .extensions_dir
            .join(&manifest.id)
            .join(revision.to_string());
        if let Err(e) = self.write_install_dir(dir, &install_dir, &components) {
            remove_artifacts(&written);
            return Err(e.into());
        }
        let rendered: Vec<String> = parsed.iter().map(Grant::render).collect();
        let prev_grants: Vec<String> = existing
            .as_ref()
            .map(|r| r.grants.clone())
            .unwrap_or_default();
        let hashes: BTreeMap<String, String> = components
            .iter()
            .map(|(c, _)| (c.id.clone(), c.sha256.clone()))
            .collect();
        let record = ExtensionRecord {
            id: manifest.id.clone(),
            version: manifest.version.clone(),
            enabled: true,
            manifest: serde_json::to_value(&manifest)
                .map_err(|e| LoopxError::internal("serializing a manifest", e))?,
            grants: rendered.clone(),
            install_dir: install_dir.display().to_string(),
            component_hashes: serde_json::to_value(&hashes)
                .map_err(|e| LoopxError::internal("serializing hashes", e))?,
            installed_at: now_ms(),
            revision,
        };
        let engine_key = self.cache.engine_key().to_string();
        let artifacts: Vec<ArtifactRecord> = components
            .iter()
            .map(|(c, _)| ArtifactRecord {
                component_sha256: c.sha256.clone(),
                engine_key: engine_key.clone(),
                artifact_sha256: c.artifact_sha256.clone(),
                recorded_at: record.installed_at,
            })
            .collect();
        let detail = json!({"id": record.id, "version": record.version, "revision": revision, "grants": rendered, "components": hashes, "artifacts": artifacts.iter().map(|a| &a.artifact_sha256).collect::<Vec<_>>(), "engine_key": engine_key});
        // The mode the operator asked for, not what the registry held when it was read: the
        // kernel checks it again in its transaction.
        let change = if existing.is_some() {
            ExtensionChange::Upgrade
        } else {
            ExtensionChange::Install
        };
        let revision_record = ExtensionRevision {
            record,
            artifacts,
            detail,
        };
        let committed = kernel.record_extension_revision(actor, change, &revision_record);
        if let Err(e) = committed {
            // Nothing recorded: the files of this revision are clutter no record points at. A
            // failed projection after the commit cannot tell here, so only a refused or failed
            // transaction (no row for this revision) removes them.
            if kernel
                .extension_revisions(&manifest.id)
                .map(|revs| !revs.iter().any(|r| r.revision == revision))
                .unwrap_or(true)
            {
                let _ = std::fs::remove_dir_all(&install_dir);
                remove_artifacts(&written);
            }
            return Err(e);
        }
        Ok(InstallReport {
            id: manifest.id.clone(),
            version: manifest.version.clone(),
            revision,
            previous_revision: existing.as_ref().map(|r| r.revision),
            install_dir: install_dir.display().to_string(),
            grants_added: rendered
                .iter()
                .filter(|g| !prev_grants.contains(g))
                .cloned()
                .collect(),
            grants_removed: prev_grants
                .iter()
                .filter(|g| !rendered.contains(g))
                .cloned()
                .collect(),
            grants: rendered,
            components: components.into_iter().map(|(c, _)| c).collect(),
        })
    }

    fn write_install_dir(
        &self,
        src: &Path,
        dest: &Path,
        components: &[(InstalledComponent, Vec<u8>)],
    ) -> PluginResult<()> {
        let parent = dest.parent().unwrap_or(dest);
        std::fs::create_dir_all(parent)
            .map_err(|e| PluginError::host(format!("creating {}", parent.display()), e))?;
        let staging = parent.join(format!(".staging-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging)
            .map_err(|e| PluginError::host(format!("creating {}", staging.display()), e))?;
        let io = |what: &str, e: std::io::Error| PluginError::host(what.to_string(), e);
        std::fs::copy(src.join(MANIFEST_FILE), staging.join(MANIFEST_FILE))
            .map_err(|e| io("copying extension.toml", e))?;
        for (c, wasm) in components {
            std::fs::write(staging.join(format!("{}.wasm", c.id)), wasm)
                .map_err(|e| io("writing a component", e))?;
        }
        if dest.exists() {
            // A leftover from an install whose registry write failed: never reused, replaced.
            std::fs::remove_dir_all(dest)
                .map_err(|e| io("replacing a stale install directory", e))?;
        }
        std::fs::rename(&staging, dest)
            .map_err(|e| io("moving the install directory into place", e))?;
        Ok(())
    }

    /// Loads component `provides_id` of the installed revision `rec`: the `.wasm` must match the
    /// sha256 the revision recorded, and its precompiled artifact the digest the registry recorded
    /// for that component and this engine (a mismatch is `Tampered`, exit 5, naming the file; the
    /// load is refused, never silently repaired, so `doctor` and the operator see the damage).
    /// When no artifact is recorded for this engine (a new wasmtime, a project installed before
    /// artifacts were recorded) or the recorded file is gone (the cache was cleared), the component
    /// is recompiled from the verified `.wasm` and the new digest recorded.
    pub fn load(
        &self,
        kernel: &mut Kernel,
        rec: &ExtensionRecord,
        provides_id: &str,
    ) -> PluginResult<LoadedPlugin> {
        let label = format!("{}/{}", rec.id, provides_id);
        let manifest = record_manifest(rec)?;
        let p = manifest.provides(provides_id).ok_or_else(|| {
            PluginError::not_found(
                format!("component {label}"),
                format!(
                    "extension {} provides: {}",
                    rec.id,
                    manifest
                        .provides
                        .iter()
                        .map(|p| p.id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })?;
        let expected = rec
            .component_hashes
            .get(provides_id)
            .and_then(|v| v.as_str())
            .ok_or_else(|| {
                PluginError::manifest(&rec.id, format!("no recorded hash for {provides_id}"))
            })?
            .to_string();
        let path = Path::new(&rec.install_dir).join(format!("{provides_id}.wasm"));
        let tampered = |found: String| PluginError::Tampered {
            plugin: label.clone(),
            path: path.clone(),
            expected: expected.clone(),
            found,
        };
        let wasm = match read_artifact(&path) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Err(tampered("is missing".to_string())),
            Err(reason) => return Err(tampered(format!("is {reason}"))),
        };
        let actual = sha256_hex(&wasm);
        if actual != expected {
            return Err(tampered(format!("has sha256 {actual}")));
        }
        let key = self.cache.engine_key().to_string();
        let record = kernel
            .component_artifact(&actual, &key)
            .map_err(|e| PluginError::host("reading the artifact registry", e))?;
        let cached = match &record {
            Some(r) => {
                self.cache
                    .load_recorded(&self.engine, &label, &actual, &r.artifact_sha256)?
            }
            None => None,
        };
        let component = match cached {
            Some(c) => c,
            None => self.recompile(kernel, &label, &wasm, &actual)?,
        };
        let limits = Limits::resolve(p.kind, &p.limits, &label)?;
        let grants = if p.kind == Kind::Provider {
            record_grants(rec)?
        } else {
            Vec::new()
        };
        // Again at every load: a grant recorded before this rule, or a granted directory since
        // replaced by a symlink into `.loopx/`, must not reach a preopen.
        self.check_grant_dirs(&grants)?;
        LoadedPlugin::new(
            &self.engine,
            &component,
            &label,
            p.kind,
            limits,
            grants,
            p.uses.clone(),
        )
        .map(|loaded| loaded.of_revision(rec.revision))
    }

    /// Refuses `fs.*` grants whose directory contains, or lies inside, `.loopx/` or the component
    /// cache. Both sides are canonicalized (symlinks resolved), so neither a symlinked grant nor a
    /// symlinked project escapes the comparison. A provider with such a grant could read the
    /// database and claim keys, or rewrite the components and compiled artifacts the host runs.
    pub fn check_grant_dirs(&self, grants: &[Grant]) -> PluginResult<()> {
        let protected: Vec<PathBuf> = self.protected.iter().map(|p| canonical_prefix(p)).collect();
        for g in grants {
            let Some(dir) = &g.host_path else { continue };
            let dir = canonical_prefix(dir);
            if let Some(what) = kernel_filesystem(&dir) {
                return Err(PluginError::BadRequest {
                    detail: format!(
                        "grant {} refused: {} is {what}, which exposes processes, devices or \
                         kernel state as files (a provider could read this process's \
                         environment or memory map through /proc/self); grant an ordinary \
                         directory holding only what the provider needs, with `--grant` on \
                         `extension install` or `upgrade`",
                        g.render(),
                        dir.display()
                    ),
                });
            }
            for p in &protected {
                let relation = if dir.starts_with(p) {
                    "lies inside"
                } else if p.starts_with(&dir) {
                    "contains"
                } else {
                    continue;
                };
                return Err(PluginError::BadRequest {
                    detail: format!(
                        "grant {} refused: {} {relation} LoopX's own state ({}), so a provider \
                         holding it could read or rewrite the database, installed components or \
                         compiled artifacts; grant a directory that neither contains nor lies \
                         inside {} (for example a subdirectory of the project holding only what the \
                         provider needs), with `--grant` on `extension install` or `upgrade`",
                        g.render(),
                        dir.display(),
                        p.display(),
                        p.display()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Compiles verified component bytes on a load that found no usable artifact, and records the
    /// new artifact's digest. If the record cannot be written (a read-only database), the artifact
    /// is deleted again and the in-memory component is still used: it came from verified bytes, and
    /// an unrecorded file would never be trusted anyway.
    fn recompile(
        &self,
        kernel: &mut Kernel,
        label: &str,
        wasm: &[u8],
        sha: &str,
    ) -> PluginResult<wasmtime::component::Component> {
        let compiled = self.cache.compile(&self.engine, label, wasm, sha)?;
        let record = ArtifactRecord {
            component_sha256: sha.to_string(),
            engine_key: self.cache.engine_key().to_string(),
            artifact_sha256: compiled.artifact_sha256.clone(),
            recorded_at: now_ms(),
        };
        let recorded = kernel.record_recompiled_artifact(label, &record);
        if recorded.is_err() {
            let _ = std::fs::remove_file(&compiled.path);
        }
        Ok(compiled.component)
    }

    /// Deletes the installed files of extension `id` (all revisions).
    pub fn remove_files(&self, id: &str) -> Result<()> {
        let dir = self.extensions_dir.join(id);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| LoopxError::internal(format!("removing {}", dir.display()), e))?;
        }
        Ok(())
    }
}

/// `path` with symlinks resolved: the canonical form of its longest existing ancestor followed by
/// the components that do not exist yet (the cache directory is created on first compile).
/// What kind of kernel filesystem `dir` (canonical) lies on, if it is one: the pseudo
/// filesystems that show processes and kernel state as files, and the device tree, whose
/// `devtmpfs` cannot be told from an ordinary `tmpfs` by its type and is named by its path.
fn kernel_filesystem(dir: &Path) -> Option<&'static str> {
    use std::os::unix::ffi::OsStrExt;
    if dir.starts_with("/dev") {
        return Some("the device tree (/dev)");
    }
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero `statfs` is a valid value of the plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a pointer to a `statfs` we own.
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } != 0 {
        // Nothing there yet: the grant's own checks report a missing directory.
        return None;
    }
    const KERNEL_FILESYSTEMS: [(libc::c_long, &str); 10] = [
        (libc::PROC_SUPER_MAGIC, "procfs"),
        (libc::SYSFS_MAGIC, "sysfs"),
        (libc::DEBUGFS_MAGIC, "debugfs"),
        (libc::TRACEFS_MAGIC, "tracefs"),
        (libc::SECURITYFS_MAGIC, "securityfs"),
        (libc::CGROUP_SUPER_MAGIC, "cgroupfs"),
        (libc::CGROUP2_SUPER_MAGIC, "cgroup2fs"),
        (libc::DEVPTS_SUPER_MAGIC, "devpts"),
        (libc::BPF_FS_MAGIC, "bpffs"),
        (libc::SELINUX_MAGIC, "selinuxfs"),
    ];
    KERNEL_FILESYSTEMS
        .iter()
        .find(|(magic, _)| st.f_type == *magic)
        .map(|(_, name)| *name)
}

fn canonical_prefix(path: &Path) -> PathBuf {
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    let mut cur = path.to_path_buf();
    loop {
        if let Ok(c) = cur.canonicalize() {
            return rest.iter().rev().fold(c, |acc, part| acc.join(part));
        }
        match (cur.file_name().map(|n| n.to_os_string()), cur.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                cur = parent.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// Deletes artifacts an install wrote but did not commit.
fn remove_artifacts(paths: &[PathBuf]) {
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

/// Splits `<extension>/<id>`.
pub fn split_name(name: &str) -> Result<(&str, &str)> {
    match name.split_once('/') {
        Some((e, i)) if super::manifest::is_token(e) && super::manifest::is_token(i) => Ok((e, i)),
        _ => Err(crate::error::bad_input(format!(
            "'{name}' is not <extension>/<id>; `loopx extension list` shows installed components"
        ))),
    }
}

/// Enables or disables an installed extension, as the operator (see
/// [`Kernel::set_extension_enabled`] for any other actor).
pub fn set_enabled(kernel: &mut Kernel, id: &str, enabled: bool) -> Result<ExtensionRecord> {
    kernel.set_extension_enabled(&Actor::Operator, id, enabled)
}

/// Re-activates the newest revision older than the active one, as the operator (see
/// [`Kernel::rollback_extension`]).
pub fn rollback(kernel: &mut Kernel, id: &str) -> Result<ExtensionRecord> {
    kernel.rollback_extension(&Actor::Operator, id)
}

/// Forgets an extension (every revision) as the operator and deletes its files.
pub fn remove(kernel: &mut Kernel, host: &PluginHost, id: &str) -> Result<ExtensionRecord> {
    remove_as(kernel, host, &Actor::Operator, id)
}

/// Forgets an extension (every revision) on behalf of `actor` (the kernel refuses anyone but an
/// operator) and, once that committed, deletes its files. Goal state is untouched: todos bound to
/// its capabilities keep their binding, and should-run reports `repair_required` for them.
pub fn remove_as(
    kernel: &mut Kernel,
    host: &PluginHost,
    actor: &Actor,
    id: &str,
) -> Result<ExtensionRecord> {
    let rec = kernel.remove_extension(actor, id)?;
    host.remove_files(id)?;
    Ok(rec)
}
