//! `fs-observe`: a LoopX provider that reads files inside directories the operator granted.
//!
//! Every grant `fs.read:<name>=<host dir>` appears to this guest as the preopened directory `/<name>`;
//! the host (not this code) is what keeps reads inside it. Operations:
//!
//! * `read <path>`: the file's text, cut at `max-bytes` (default 16 KiB).
//! * `list <dir>`: the directory's entry names (at most 500).
//! * `test-results <path>`: parses test output (`test NAME ... FAILED|ok`, `FAIL NAME`, `PASS NAME`,
//!   `not ok N - NAME`, `ok N - NAME`) into `failing-test` / `passing-test` facts and counts.
//! * `metric <path>`: parses `key = value` / `key: value` lines into facts.
//!
//! Parameter `root` picks the grant (default `workspace`). Paths are relative to that root.

wit_bindgen::generate!({ world: "provider", path: "../../wit" });

use loopx::plugin::logging::log;
use loopx::plugin::types::{Fact, LogLevel};

const DEFAULT_MAX_BYTES: usize = 16 * 1024;
const MAX_FACTS: usize = 200;
const MAX_ENTRIES: usize = 500;

struct FsObserve;

fn param<'a>(req: &'a ObserveRequest, key: &str) -> Option<&'a str> {
    req.params
        .iter()
        .find(|f| f.key == key)
        .map(|f| f.value.as_str())
}

fn resolve(req: &ObserveRequest) -> Result<String, PluginError> {
    let root = param(req, "root").unwrap_or("workspace");
    if root.is_empty() || root.contains('/') || root.contains("..") {
        return Err(PluginError::InvalidInput(format!("bad root '{root}'")));
    }
    let target = req.target.trim_start_matches('/');
    Ok(if target.is_empty() {
        format!("/{root}")
    } else {
        format!("/{root}/{target}")
    })
}

fn read_bounded(path: &str, max: usize) -> Result<(String, bool), PluginError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| io_error(path, e))?;
    let mut buf = Vec::with_capacity(max.min(64 * 1024));
    file.take(max as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| io_error(path, e))?;
    let truncated = buf.len() > max;
    buf.truncate(max);
    Ok((String::from_utf8_lossy(&buf).into_owned(), truncated))
}

fn io_error(path: &str, e: std::io::Error) -> PluginError {
    match e.kind() {
        std::io::ErrorKind::NotFound => PluginError::Unavailable(format!("{path}: not found")),
        std::io::ErrorKind::PermissionDenied => PluginError::Denied(format!("{path}: {e}")),
        _ => PluginError::Failed(format!("{path}: {e}")),
    }
}

fn fact(key: &str, value: impl Into<String>) -> Fact {
    Fact {
        key: key.into(),
        value: value.into(),
    }
}

/// Recognises one line of test output, returning (passed, name).
fn parse_test_line(line: &str) -> Option<(bool, String)> {
    let line = line.trim();
    if let Some(rest) = line.strip_prefix("test ") {
        let (name, outcome) = rest.rsplit_once(" ... ")?;
        return match outcome.trim() {
            "ok" => Some((true, name.trim().to_string())),
            "FAILED" => Some((false, name.trim().to_string())),
            _ => None,
        };
    }
    if let Some(name) = line.strip_prefix("FAIL ") {
        return Some((false, name.trim().to_string()));
    }
    if let Some(name) = line.strip_prefix("PASS ") {
        return Some((true, name.trim().to_string()));
    }
    if let Some(rest) = line.strip_prefix("not ok ") {
        let name = rest.split_once(" - ").map(|(_, n)| n).unwrap_or(rest);
        return Some((false, name.trim().to_string()));
    }
    if let Some(rest) = line.strip_prefix("ok ") {
        let name = rest.split_once(" - ").map(|(_, n)| n)?;
        return Some((true, name.trim().to_string()));
    }
    None
}

impl Guest for FsObserve {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "fs".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "bounded reads of files in operator-granted directories".into(),
            operations: vec![
                "read".into(),
                "list".into(),
                "test-results".into(),
                "metric".into(),
            ],
        }
    }

    fn observe(req: ObserveRequest) -> Result<Observation, PluginError> {
        let path = resolve(&req)?;
        let max = param(&req, "max-bytes")
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_MAX_BYTES);
        log(LogLevel::Debug, &format!("{} {path}", req.operation));
        match req.operation.as_str() {
            "read" => {
                let (body, truncated) = read_bounded(&path, max)?;
                Ok(Observation {
                    source: String::new(),
                    kind: "file".into(),
                    summary: format!(
                        "{} ({} bytes{})",
                        req.target,
                        body.len(),
                        if truncated { ", truncated" } else { "" }
                    ),
                    facts: vec![
                        fact("path", req.target.clone()),
                        fact("bytes", body.len().to_string()),
                    ],
                    body,
                    truncated,
                })
            }
            "list" => {
                let rd = std::fs::read_dir(&path).map_err(|e| io_error(&path, e))?;
                let mut names: Vec<String> = rd
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect();
                names.sort();
                let truncated = names.len() > MAX_ENTRIES;
                names.truncate(MAX_ENTRIES);
                Ok(Observation {
                    source: String::new(),
                    kind: "listing".into(),
                    summary: format!("{} entries in {}", names.len(), req.target),
                    facts: names.iter().map(|n| fact("entry", n.clone())).collect(),
                    body: names.join("\n"),
                    truncated,
                })
            }
            "test-results" => {
                let (body, cut) = read_bounded(&path, max.max(64 * 1024))?;
                let (mut passed, mut failed) = (0usize, 0usize);
                let mut facts = vec![fact("path", req.target.clone())];
                let mut truncated = cut;
                for (ok, name) in body.lines().filter_map(parse_test_line) {
                    if ok {
                        passed += 1
                    } else {
                        failed += 1
                    }
                    if facts.len() < MAX_FACTS {
                        facts.push(fact(if ok { "passing-test" } else { "failing-test" }, name));
                    } else {
                        truncated = true;
                    }
                }
                facts.push(fact("passed", passed.to_string()));
                facts.push(fact("failed", failed.to_string()));
                let excerpt: String = body
                    .lines()
                    .filter(|l| {
                        l.contains("FAIL") || l.contains("panicked") || l.contains("not ok")
                    })
                    .take(40)
                    .collect::<Vec<_>>()
                    .join("\n");
                Ok(Observation {
                    source: String::new(),
                    kind: "test-results".into(),
                    summary: format!("{failed} failing, {passed} passing in {}", req.target),
                    facts,
                    body: excerpt,
                    truncated,
                })
            }
            "metric" => {
                let (body, truncated) = read_bounded(&path, max)?;
                let facts: Vec<Fact> = body
                    .lines()
                    .filter(|l| !l.trim_start().starts_with('#'))
                    .filter_map(|l| l.split_once('=').or_else(|| l.split_once(':')))
                    .map(|(k, v)| fact(k.trim(), v.trim()))
                    .filter(|f| !f.key.is_empty())
                    .take(MAX_FACTS)
                    .collect();
                Ok(Observation {
                    source: String::new(),
                    kind: "metric".into(),
                    summary: format!("{} metrics from {}", facts.len(), req.target),
                    facts,
                    body,
                    truncated,
                })
            }
            other => Err(PluginError::InvalidInput(format!(
                "unknown operation '{other}': expected read, list, test-results or metric"
            ))),
        }
    }
}

export!(FsObserve);
