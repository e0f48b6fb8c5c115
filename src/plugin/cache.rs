//! The on-disk cache of precompiled components.
//!
//! Why this exists: compiling a component costs 100+ ms even for a small guest, loading its
//! precompiled form well under a millisecond. Install compiles once; every later load deserializes.
//! Layout: `.loopx/cache/components/<sha256(wasm)>-<engine key>.cwasm` plus a `.sha256` sidecar with
//! the digest of the `.cwasm` itself. The key covers the component bytes and the engine's
//! compatibility hash (wasmtime version, configuration, target), so a wasmtime upgrade simply misses
//! and recompiles. Deserialization is `unsafe` in wasmtime (a crafted artifact is code execution), so
//! artifacts are only ever read from this operator-owned directory, and the sidecar digest is checked
//! first: a modified artifact is reported as `Tampered`, never loaded.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::engine::compatibility_key;
use super::error::{PluginError, PluginResult};

/// Hex sha256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The component cache rooted at `.loopx/cache/components/`.
#[derive(Debug, Clone)]
pub struct ComponentCache {
    dir: PathBuf,
    engine_key: String,
}

impl ComponentCache {
    pub fn new(dir: impl Into<PathBuf>, engine: &Engine) -> ComponentCache {
        ComponentCache {
            dir: dir.into(),
            engine_key: compatibility_key(engine),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of the artifact for a component with this wasm digest.
    pub fn artifact_path(&self, wasm_sha256: &str) -> PathBuf {
        self.dir
            .join(format!("{wasm_sha256}-{}.cwasm", self.engine_key))
    }

    fn sidecar(path: &Path) -> PathBuf {
        path.with_extension("cwasm.sha256")
    }

    /// Compiles `wasm` (whose digest is `wasm_sha256`) into the cache unless already present.
    /// Returns whether a compile happened.
    pub fn ensure(
        &self,
        engine: &Engine,
        plugin: &str,
        wasm: &[u8],
        wasm_sha256: &str,
    ) -> PluginResult<bool> {
        let path = self.artifact_path(wasm_sha256);
        if path.is_file() && Self::sidecar(&path).is_file() {
            return Ok(false);
        }
        let compiled = engine
            .precompile_component(wasm)
            .map_err(|e| PluginError::Load {
                plugin: plugin.to_string(),
                detail: format!("compile failed: {e:#}"),
            })?;
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| PluginError::host(format!("creating {}", self.dir.display()), e))?;
        // Write to temporary names and rename, so a crash never leaves a half-written artifact that a
        // later load would trust.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &compiled)
            .map_err(|e| PluginError::host(format!("writing {}", tmp.display()), e))?;
        let side_tmp = Self::sidecar(&tmp);
        std::fs::write(&side_tmp, sha256_hex(&compiled))
            .map_err(|e| PluginError::host(format!("writing {}", side_tmp.display()), e))?;
        std::fs::rename(&side_tmp, Self::sidecar(&path))
            .map_err(|e| PluginError::host(format!("renaming into {}", self.dir.display()), e))?;
        std::fs::rename(&tmp, &path)
            .map_err(|e| PluginError::host(format!("renaming into {}", self.dir.display()), e))?;
        Ok(true)
    }

    /// Loads the artifact for `wasm_sha256`, verifying its sidecar digest. `Ok(None)` when absent.
    pub fn load(
        &self,
        engine: &Engine,
        plugin: &str,
        wasm_sha256: &str,
    ) -> PluginResult<Option<Component>> {
        let path = self.artifact_path(wasm_sha256);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(PluginError::host(format!("reading {}", path.display()), e)),
        };
        let expected = std::fs::read_to_string(Self::sidecar(&path))
            .unwrap_or_default()
            .trim()
            .to_string();
        let actual = sha256_hex(&bytes);
        if expected != actual {
            return Err(PluginError::Tampered {
                plugin: plugin.to_string(),
                path,
                expected,
                actual,
            });
        }
        // SAFETY: the bytes were produced by `precompile_component` of an engine with the same
        // compatibility key, written into the operator-owned cache directory, and their digest
        // matches the sidecar written alongside them at that time. wasmtime additionally rejects
        // artifacts from a different version or configuration.
        let component =
            unsafe { Component::deserialize(engine, &bytes) }.map_err(|e| PluginError::Load {
                plugin: plugin.to_string(),
                detail: format!("{path:?}: {e:#}"),
            })?;
        Ok(Some(component))
    }
}
