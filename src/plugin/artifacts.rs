//! Verifying installed components and precompiled artifacts against the registry, without wasmtime.
//!
//! Why this exists: `loopx doctor` runs in the kernel binary, which does not link the engine, and
//! must still say whether every file the plugin host would load is the one the registry recorded:
//! each active component's `.wasm` against its recorded sha256, and each `.cwasm` in the component
//! cache against the digest recorded when it was compiled (table `component_artifacts`). The load
//! path (`cache`, `registry`) uses the same bounded reader, so what doctor calls healthy is what a
//! load accepts.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::kernel::Kernel;

/// Largest component or artifact read for hashing. Real artifacts are a few MiB; the bound keeps a
/// planted special file or an enormous file from being read without end before its digest is
/// compared.
pub const MAX_ARTIFACT_BYTES: u64 = 512 << 20;

/// Hex sha256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Reads a component or artifact file: `Ok(None)` when absent, `Err(reason)` when it is not a
/// regular file (a symlink or a device planted under the expected name), larger than
/// [`MAX_ARTIFACT_BYTES`], or unreadable. Symlinks are refused so the digest is always of the file
/// at that path, inside `.loopx/`.
pub fn read_artifact(path: &Path) -> Result<Option<Vec<u8>>, String> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("unreadable ({e})")),
    };
    if !meta.file_type().is_file() {
        return Err("not a regular file".to_string());
    }
    if meta.len() > MAX_ARTIFACT_BYTES {
        return Err(format!(
            "{} bytes, over the {MAX_ARTIFACT_BYTES}-byte bound",
            meta.len()
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    crate::state_file::open_regular(path)
        .and_then(|(f, _)| f.take(MAX_ARTIFACT_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("unreadable ({e})"))?;
    if bytes.len() as u64 > MAX_ARTIFACT_BYTES {
        return Err(format!("over the {MAX_ARTIFACT_BYTES}-byte bound"));
    }
    Ok(Some(bytes))
}

/// One verified file, in `doctor`'s terms.
#[derive(Debug, Clone, PartialEq)]
pub struct FileCheck {
    pub check: String,
    pub ok: bool,
    pub detail: String,
    pub path: PathBuf,
}

/// Splits an artifact file name `<sha256(wasm)>-<engine key>.cwasm`.
fn artifact_name(name: &str) -> Option<(&str, &str)> {
    let stem = name.strip_suffix(".cwasm")?;
    let (sha, key) = stem.split_once('-')?;
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    (sha.len() == 64 && hex(sha) && !key.is_empty() && hex(key)).then_some((sha, key))
}

/// Verifies every active extension's component files against their recorded sha256 and every
/// artifact in `cache_dir` against its recorded digest. An artifact with no record is reported as
/// healthy but unused (the load path never deserializes it and replaces it by a recompile from the
/// verified component); one whose digest differs from its record is damage (a load refuses it).
pub fn verify_installed(kernel: &mut Kernel, cache_dir: &Path) -> Vec<FileCheck> {
    let mut out = Vec::new();
    let fail = |check: String, detail: String, path: PathBuf| FileCheck {
        check,
        ok: false,
        detail,
        path,
    };
    match kernel.extensions() {
        Err(e) => out.push(fail(
            "extensions".into(),
            e.to_string(),
            kernel.paths().db(),
        )),
        Ok(exts) => {
            for ext in exts {
                let Some(hashes) = ext.component_hashes.as_object() else {
                    continue;
                };
                for (id, expected) in hashes {
                    let expected = expected.as_str().unwrap_or_default();
                    let path = Path::new(&ext.install_dir).join(format!("{id}.wasm"));
                    let check = format!("component {}/{id}", ext.id);
                    let (ok, detail) = match read_artifact(&path) {
                        Ok(Some(bytes)) => {
                            let actual = sha256_hex(&bytes);
                            if actual == expected {
                                (true, format!("sha256 {actual} as recorded"))
                            } else {
                                (
                                    false,
                                    format!(
                                        "{} has sha256 {actual}, the registry records {expected}; reinstall the extension",
                                        path.display()
                                    ),
                                )
                            }
                        }
                        Ok(None) => (false, format!("{} is missing", path.display())),
                        Err(reason) => (false, format!("{}: {reason}", path.display())),
                    };
                    out.push(FileCheck {
                        check,
                        ok,
                        detail,
                        path,
                    });
                }
            }
        }
    }
    let mut files: Vec<PathBuf> = match std::fs::read_dir(cache_dir) {
        Ok(entries) => entries.flatten().map(|e| e.path()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            out.push(fail(
                "component cache".into(),
                format!("listing {}: {e}", cache_dir.display()),
                cache_dir.to_path_buf(),
            ));
            Vec::new()
        }
    };
    files.sort();
    for path in files {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some((sha, key)) = artifact_name(&name) else {
            continue;
        };
        let check = format!("artifact {name}");
        let record = match kernel.component_artifact(sha, key) {
            Ok(r) => r,
            Err(e) => {
                out.push(fail(check, e.to_string(), path));
                continue;
            }
        };
        let Some(record) = record else {
            out.push(FileCheck {
                check,
                ok: true,
                detail: "not recorded by any install: never loaded (safe to delete)".into(),
                path,
            });
            continue;
        };
        let (ok, detail) = match read_artifact(&path) {
            Ok(Some(bytes)) => {
                let actual = sha256_hex(&bytes);
                if actual == record.artifact_sha256 {
                    (true, format!("sha256 {actual} as recorded"))
                } else {
                    (
                        false,
                        format!(
                            "{} has sha256 {actual}, the registry records {}; loads refuse it (delete it to recompile from the verified component)",
                            path.display(),
                            record.artifact_sha256
                        ),
                    )
                }
            }
            Ok(None) => continue,
            Err(reason) => (false, format!("{}: {reason}", path.display())),
        };
        out.push(FileCheck {
            check,
            ok,
            detail,
            path,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifact_names() {
        let sha = "a".repeat(64);
        assert_eq!(
            artifact_name(&format!("{sha}-0123abcd.cwasm")),
            Some((sha.as_str(), "0123abcd"))
        );
        assert_eq!(artifact_name(&format!("{sha}-0123abcd.cwasm.sha256")), None);
        assert_eq!(artifact_name("x-1.cwasm"), None);
        assert_eq!(artifact_name(&format!(".{sha}.1.tmp")), None);
    }
}
