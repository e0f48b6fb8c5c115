//! The on-disk cache of precompiled components.
//!
//! Why this exists: compiling a component costs 100+ ms even for a small guest, loading its
//! precompiled form well under a millisecond. Install compiles once; every later load deserializes.
//! Layout: `.loopx/cache/components/<sha256(wasm)>-<engine key>.cwasm`. The name covers the
//! component bytes and the engine's compatibility hash (wasmtime version, configuration, target), so
//! a wasmtime upgrade simply misses and recompiles.
//!
//! Deserialization is `unsafe` in wasmtime: a crafted artifact is native code execution. A digest
//! stored next to the artifact would only prove the artifact matches itself (anyone who can swap the
//! `.cwasm` can swap its companion), so the cache trusts nothing on disk. The digest of every
//! artifact is recorded in the registry (table `component_artifacts`, keyed by component digest and
//! engine key) by the install, or recompile from a verified component, that produced it, and
//! [`ComponentCache::load_recorded`] deserializes only bytes that hash to that record. The bytes
//! hashed are the bytes deserialized (read once into memory), so nothing can change between check
//! and use.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::Engine;
use wasmtime::component::Component;

use super::artifacts::read_artifact;
use super::engine::compatibility_key;
use super::error::{PluginError, PluginResult};

pub use super::artifacts::sha256_hex;

/// The component cache rooted at `.loopx/cache/components/`.
#[derive(Debug, Clone)]
pub struct ComponentCache {
    dir: PathBuf,
    engine_key: String,
    /// Compiles this cache (and its clones) ran: how `extension install`'s tests prove that a
    /// refused component cost no compile.
    compiles: Arc<AtomicU64>,
}

/// An artifact this process just compiled from verified component bytes.
pub struct Compiled {
    /// Deserialized from the in-memory bytes `precompile_component` returned, not from the file.
    pub component: Component,
    /// The digest to record in the registry.
    pub artifact_sha256: String,
    /// Where the artifact was written.
    pub path: PathBuf,
}

impl ComponentCache {
    pub fn new(dir: impl Into<PathBuf>, engine: &Engine) -> ComponentCache {
        ComponentCache {
            dir: dir.into(),
            engine_key: compatibility_key(engine),
            compiles: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The engine fingerprint artifacts of this cache are compiled for (recorded with each digest).
    pub fn engine_key(&self) -> &str {
        &self.engine_key
    }

    /// How many components this cache has compiled.
    pub fn compiles(&self) -> u64 {
        self.compiles.load(Ordering::Relaxed)
    }

    /// Path of the artifact for a component with this wasm digest.
    pub fn artifact_path(&self, wasm_sha256: &str) -> PathBuf {
        self.dir
            .join(format!("{wasm_sha256}-{}.cwasm", self.engine_key))
    }

    /// Compiles `wasm` (whose digest the caller has verified to be `wasm_sha256`) and writes the
    /// artifact, replacing whatever file had its name: a file this call did not produce is never
    /// trusted, so it is never kept either. The artifact is synced before returning because the
    /// caller then records its digest in the database; a torn file after a crash would otherwise
    /// be refused as tampered instead of simply recompiled.
    pub fn compile(
        &self,
        engine: &Engine,
        plugin: &str,
        wasm: &[u8],
        wasm_sha256: &str,
    ) -> PluginResult<Compiled> {
        self.compiles.fetch_add(1, Ordering::Relaxed);
        let bytes = engine
            .precompile_component(wasm)
            .map_err(|e| PluginError::Load {
                plugin: plugin.to_string(),
                detail: format!("compile failed: {e:#}"),
            })?;
        let path = self.artifact_path(wasm_sha256);
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| PluginError::host(format!("creating {}", self.dir.display()), e))?;
        // A temporary name unique to this process and thread, renamed into place, so a concurrent
        // reader sees the old file or the whole new one.
        let tmp = self.dir.join(format!(
            ".{wasm_sha256}.{}.{:?}.tmp",
            std::process::id(),
            std::thread::current().id()
        ));
        let written = crate::state_file::create_fresh(&tmp)
            .and_then(|mut f| {
                f.write_all(&bytes)?;
                f.sync_all()
            })
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(PluginError::host(format!("writing {}", path.display()), e));
        }
        // SAFETY: `bytes` is what `precompile_component` of this very engine returned a moment ago
        // in this process; it never left memory before this call.
        let component =
            unsafe { Component::deserialize(engine, &bytes) }.map_err(|e| PluginError::Load {
                plugin: plugin.to_string(),
                detail: format!("{}: {e:#}", path.display()),
            })?;
        Ok(Compiled {
            component,
            artifact_sha256: sha256_hex(&bytes),
            path,
        })
    }

    /// Loads the artifact for `wasm_sha256` if and only if its bytes hash to `recorded` (the digest
    /// the registry holds for this component and engine). `Ok(None)` when there is no such file;
    /// `Tampered` naming the file when it is not a regular file or its digest differs.
    pub fn load_recorded(
        &self,
        engine: &Engine,
        plugin: &str,
        wasm_sha256: &str,
        recorded: &str,
    ) -> PluginResult<Option<Component>> {
        let path = self.artifact_path(wasm_sha256);
        let bytes = match read_artifact(&path) {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(None),
            Err(reason) => {
                return Err(PluginError::Tampered {
                    plugin: plugin.to_string(),
                    path,
                    expected: recorded.to_string(),
                    found: format!("is {reason}"),
                });
            }
        };
        let actual = sha256_hex(&bytes);
        if actual != recorded {
            return Err(PluginError::Tampered {
                plugin: plugin.to_string(),
                path,
                expected: recorded.to_string(),
                found: format!("has sha256 {actual}"),
            });
        }
        // SAFETY: these exact bytes (read once into memory, hashed, and deserialized from the same
        // buffer) hash to the digest the registry recorded when this process or an earlier install
        // compiled them from a component whose own digest was verified; wasmtime additionally
        // rejects artifacts from a different version or configuration.
        let component =
            unsafe { Component::deserialize(engine, &bytes) }.map_err(|e| PluginError::Load {
                plugin: plugin.to_string(),
                detail: format!("{}: {e:#}", path.display()),
            })?;
        Ok(Some(component))
    }
}
