//! Installing, upgrading, rolling back, removing and loading extensions.
//!
//! Why this exists: it is the pipeline that turns a directory an author built into something the host
//! will run, and it refuses before anything runs: manifest and API range validated, grants checked
//! against declarations, every component hashed, compiled once into the cache, its real imports
//! audited against kind and grants, its exports type-checked against the world (`{World}Pre::new`).
//! Only then are the bytes copied into `.loopx/extensions/<id>/<revision>/` and the revision recorded
//! in the registry through one kernel write transaction (with an operation-log entry). Loading
//! re-verifies the recorded sha256 of the installed bytes (a mismatch is `Tampered`) and re-audits.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use serde_json::json;
use wasmtime::Engine;

use crate::clock::now_ms;
use crate::error::{LoopxError, Result, conflict, not_found};
use crate::kernel::model::ExtensionRecord;
use crate::kernel::{Actor, Kernel, log_op};
use crate::paths::ProjectPaths;

use super::cache::{ComponentCache, sha256_hex};
use super::engine::engine;
use super::error::{PluginError, PluginResult};
use super::invoke::InvokeError;
use super::manifest::{Grant, Kind, Limits, MANIFEST_FILE, Manifest};
use super::sandbox::LoadedPlugin;

/// Where a project keeps installed components and compiled artifacts.
#[derive(Debug, Clone)]
pub struct PluginHost {
    engine: Engine,
    cache: ComponentCache,
    extensions_dir: PathBuf,
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
    /// Whether install compiled it (false when the cache already held it).
    pub compiled: bool,
    pub compile_ms: u64,
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
}

/// Whether an install may replace an existing extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstallMode {
    /// Refuse when the id is already installed.
    Install,
    /// Require the id to be installed; record a new revision.
    Upgrade,
}

fn ext_not_found(id: &str) -> LoopxError {
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
        PluginHost::new(paths.extensions_dir(), paths.component_cache_dir())
    }

    /// A host with explicit directories (benchmarks, tests).
    pub fn new(extensions_dir: PathBuf, cache_dir: PathBuf) -> PluginHost {
        let engine = engine().clone();
        let cache = ComponentCache::new(cache_dir, &engine);
        PluginHost {
            engine,
            cache,
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
    pub fn prepare(&self, dir: &Path, grants: &[String], cwd: &Path) -> PluginResult<Prepared> {
        let manifest = Manifest::load(dir)?;
        let mut parsed = Vec::new();
        for g in grants {
            parsed.push(Grant::parse(g, cwd, &manifest.id)?);
        }
        parsed.sort();
        parsed.dedup();
        manifest.check_grants(&parsed)?;
        let mut out = Vec::new();
        for p in &manifest.provides {
            let label = format!("{}/{}", manifest.id, p.id);
            let path = if Path::new(&p.component).is_absolute() {
                PathBuf::from(&p.component)
            } else {
                dir.join(&p.component)
            };
            let wasm = std::fs::read(&path).map_err(|e| {
                PluginError::not_found(
                    format!("component {} of {label} ({e})", path.display()),
                    "build it first, e.g. `cargo build --release --target wasm32-wasip2`",
                )
            })?;
            let sha = sha256_hex(&wasm);
            let started = std::time::Instant::now();
            let compiled = self.cache.ensure(&self.engine, &label, &wasm, &sha)?;
            let compile_ms = started.elapsed().as_millis() as u64;
            let component = self
                .cache
                .load(&self.engine, &label, &sha)?
                .ok_or_else(|| {
                    PluginError::host("loading a freshly compiled component", "artifact missing")
                })?;
            let limits = Limits::resolve(p.kind, &p.limits, &label)?;
            let comp_grants = if p.kind == Kind::Provider {
                parsed.clone()
            } else {
                Vec::new()
            };
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
                },
                wasm,
            ));
        }
        Ok(Prepared {
            manifest,
            grants: parsed,
            components: out,
        })
    }

    /// Installs (or upgrades) the extension in `dir` with the operator's `grants`.
    pub fn install(
        &self,
        kernel: &mut Kernel,
        dir: &Path,
        grants: &[String],
        cwd: &Path,
        mode: InstallMode,
    ) -> Result<InstallReport> {
        let manifest = Manifest::load(dir)?;
        let existing = kernel.read(|tx| tx.extension(&manifest.id))?;
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
        } = self.prepare(dir, &grants, cwd)?;
        let revisions = kernel.read(|tx| tx.extension_revisions(&manifest.id))?;
        let revision = revisions.iter().map(|r| r.revision).max().unwrap_or(0) + 1;
        let install_dir = self
            .extensions_dir
            .join(&manifest.id)
            .join(revision.to_string());
        self.write_install_dir(dir, &install_dir, &components)?;
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
        let op = if existing.is_some() {
            "extension_upgrade"
        } else {
            "extension_install"
        };
        let written = kernel.write(|tx| {
            tx.upsert_extension(&record)?;
            log_op(
                tx,
                None,
                &Actor::Operator,
                op,
                json!({"id": record.id, "version": record.version, "revision": revision, "grants": rendered, "components": hashes}),
            )
        });
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&install_dir);
            return Err(e);
        }
        kernel.write_registry_projection()?;
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

    /// Loads component `provides_id` of the installed revision `rec`, verifying its hash.
    pub fn load(&self, rec: &ExtensionRecord, provides_id: &str) -> PluginResult<LoadedPlugin> {
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
        let wasm = std::fs::read(&path).map_err(|e| PluginError::Tampered {
            plugin: label.clone(),
            path: path.clone(),
            expected: expected.clone(),
            actual: format!("unreadable ({e})"),
        })?;
        let actual = sha256_hex(&wasm);
        if actual != expected {
            return Err(PluginError::Tampered {
                plugin: label,
                path,
                expected,
                actual,
            });
        }
        let component = match self.cache.load(&self.engine, &label, &actual)? {
            Some(c) => c,
            None => {
                // Cache miss (cleared cache, new wasmtime): recompile from the verified bytes.
                self.cache.ensure(&self.engine, &label, &wasm, &actual)?;
                self.cache
                    .load(&self.engine, &label, &actual)?
                    .ok_or_else(|| {
                        PluginError::host("loading a recompiled component", "artifact missing")
                    })?
            }
        };
        let limits = Limits::resolve(p.kind, &p.limits, &label)?;
        let grants = if p.kind == Kind::Provider {
            record_grants(rec)?
        } else {
            Vec::new()
        };
        LoadedPlugin::new(
            &self.engine,
            &component,
            &label,
            p.kind,
            limits,
            grants,
            p.uses.clone(),
        )
    }

    /// Loads `<extension>/<id>` of kind `kind` from the registry: it must exist and be enabled.
    /// Errors keep their plugin error kind (`tampered`, `disabled`, ...).
    pub fn load_named(
        &self,
        kernel: &mut Kernel,
        name: &str,
        kind: Kind,
    ) -> std::result::Result<LoadedPlugin, InvokeError> {
        let (ext, id) = split_name(name)?;
        let rec = kernel
            .read(|tx| tx.extension(ext))?
            .ok_or_else(|| ext_not_found(ext))?;
        if !rec.enabled {
            return Err(PluginError::Disabled {
                plugin: name.to_string(),
                extension: ext.to_string(),
            }
            .into());
        }
        let manifest = record_manifest(&rec)?;
        match manifest.provides(id) {
            Some(p) if p.kind == kind => {}
            Some(p) => {
                return Err(PluginError::BadRequest {
                    detail: format!("{name} is a {}, not a {}", p.kind.as_str(), kind.as_str()),
                }
                .into());
            }
            None => {
                return Err(not_found(format!(
                    "extension '{ext}' provides no {} '{id}' (it provides: {})",
                    kind.as_str(),
                    manifest
                        .provides
                        .iter()
                        .map(|p| format!("{} {}", p.kind.as_str(), p.id))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
                .into());
            }
        }
        Ok(self.load(&rec, id)?)
    }

    /// Loads a capability and the declared providers it may call (missing or disabled providers are
    /// left out: calls to them return `unavailable`).
    pub fn load_capability(
        &self,
        kernel: &mut Kernel,
        name: &str,
    ) -> std::result::Result<(LoadedPlugin, HashMap<String, Arc<LoadedPlugin>>), InvokeError> {
        let cap = self.load_named(kernel, name, Kind::Capability)?;
        let mut providers = HashMap::new();
        for u in &cap.uses {
            match self.load_named(kernel, u, Kind::Provider) {
                Ok(p) => {
                    providers.insert(u.clone(), Arc::new(p));
                }
                // Missing or disabled providers are left out; calls to them return `unavailable`.
                Err(InvokeError {
                    error: LoopxError::NotFound(_),
                    ..
                })
                | Err(InvokeError {
                    plugin_kind: Some("disabled"),
                    ..
                }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok((cap, providers))
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

/// Splits `<extension>/<id>`.
pub fn split_name(name: &str) -> Result<(&str, &str)> {
    match name.split_once('/') {
        Some((e, i)) if super::manifest::is_token(e) && super::manifest::is_token(i) => Ok((e, i)),
        _ => Err(crate::error::bad_input(format!(
            "'{name}' is not <extension>/<id>; `loopx extension list` shows installed components"
        ))),
    }
}

/// Enables or disables an installed extension.
pub fn set_enabled(kernel: &mut Kernel, id: &str, enabled: bool) -> Result<ExtensionRecord> {
    kernel
        .write(|tx| {
            let rec = tx.extension(id)?.ok_or_else(|| ext_not_found(id))?;
            tx.set_extension_active(id, None, enabled)?;
            log_op(
                tx,
                None,
                &Actor::Operator,
                if enabled {
                    "extension_enable"
                } else {
                    "extension_disable"
                },
                json!({"id": id}),
            )?;
            Ok(ExtensionRecord { enabled, ..rec })
        })
        .and_then(|rec| {
            kernel.write_registry_projection()?;
            Ok(rec)
        })
}

/// Re-activates the newest revision older than the active one.
pub fn rollback(kernel: &mut Kernel, id: &str) -> Result<ExtensionRecord> {
    let rec = kernel.write(|tx| {
        let active = tx.extension(id)?.ok_or_else(|| ext_not_found(id))?;
        let revisions = tx.extension_revisions(id)?;
        let previous = revisions
            .iter()
            .filter(|r| r.revision < active.revision)
            .max_by_key(|r| r.revision)
            .ok_or_else(|| {
                crate::error::refused(format!(
                    "extension '{id}' has no revision older than {} to roll back to",
                    active.revision
                ))
            })?;
        if !Path::new(&previous.install_dir).is_dir() {
            return Err(LoopxError::Corrupt {
                path: PathBuf::from(&previous.install_dir),
                detail: format!(
                    "revision {} of '{id}' has no installed files",
                    previous.revision
                ),
            });
        }
        tx.set_extension_active(id, Some(previous.revision), active.enabled)?;
        log_op(
            tx,
            None,
            &Actor::Operator,
            "extension_rollback",
            json!({"id": id, "from": active.revision, "to": previous.revision}),
        )?;
        Ok(ExtensionRecord {
            enabled: active.enabled,
            ..previous.clone()
        })
    })?;
    kernel.write_registry_projection()?;
    Ok(rec)
}

/// Forgets an extension (every revision) and deletes its files. Goal state is untouched: todos
/// bound to its capabilities keep their binding, and should-run reports `repair_required` for them.
pub fn remove(kernel: &mut Kernel, host: &PluginHost, id: &str) -> Result<ExtensionRecord> {
    let rec = kernel.write(|tx| {
        let rec = tx.extension(id)?.ok_or_else(|| ext_not_found(id))?;
        tx.delete_extension(id)?;
        log_op(
            tx,
            None,
            &Actor::Operator,
            "extension_remove",
            json!({"id": id, "revision": rec.revision}),
        )?;
        Ok(rec)
    })?;
    kernel.write_registry_projection()?;
    host.remove_files(id)?;
    Ok(rec)
}
