//! `loopx doctor`: check the project without changing it. Exit 5 when anything is damaged.

use serde_json::json;

use super::Context;
use super::output::Output;
use crate::error::{LoopxError, Result};
use crate::kernel::doctor::check_database;
use crate::kernel::projection::check_json_projection;
use crate::registry::inspect_registry;

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {}

pub fn run(ctx: &Context, _args: DoctorArgs) -> Result<Output> {
    let paths = ctx.paths()?;
    let mut checks: Vec<(String, bool, String)> = Vec::new();
    let mut first_bad: Option<std::path::PathBuf> = None;
    let mut record = |name: &str, ok: bool, detail: String, path: &std::path::Path| {
        if !ok && first_bad.is_none() {
            first_bad = Some(path.to_path_buf());
        }
        checks.push((name.to_string(), ok, detail));
    };

    let registry = inspect_registry(paths.registry());
    let registry_missing = !paths.registry().exists();
    record(
        "registry.json",
        registry.ok || registry_missing,
        if registry_missing {
            "missing (run `loopx refresh-state` to re-create it)".to_string()
        } else if registry.ok {
            format!("{} goal(s)", registry.goal_count)
        } else {
            serde_json::to_string(&registry.problems).unwrap_or_default()
        },
        &paths.registry(),
    );

    let database = check_database(&paths);
    let io = database.io;
    for c in database.checks {
        record(&c.name, c.ok, c.detail, &c.path);
    }
    if let Some(mut kernel) = database.kernel {
        match crate::turn::journal_repair::undecodable_turns(&mut kernel) {
            Ok(p) if p.is_empty() => record("turn journal", true, "ok".to_string(), &paths.db()),
            Ok(p) => record("turn journal", false, p.join("; "), &paths.db()),
            Err(e) => record("turn journal", false, e.to_string(), &paths.db()),
        }
        match kernel.schema_version() {
            Ok(v) => record("schema version", true, v.to_string(), &paths.db()),
            Err(e) => record("schema version", false, e.to_string(), &paths.db()),
        }
        if let Ok(goals) = kernel.goals() {
            for goal in goals {
                let state = paths.goal_state_json(&goal.id);
                match check_json_projection(&state) {
                    Ok(()) => record(
                        &format!("goal {} state.json", goal.id),
                        true,
                        "ok".to_string(),
                        &state,
                    ),
                    Err(e) => record(
                        &format!("goal {} state.json", goal.id),
                        false,
                        e.to_string(),
                        &state,
                    ),
                }
                let md = paths.goal_state_md(&goal.id);
                let (ok, detail) = markdown_projection_check(&md);
                record(&format!("goal {} STATE.md", goal.id), ok, detail, &md);
            }
        }
        for c in
            crate::plugin::artifacts::verify_installed(&mut kernel, &paths.component_cache_dir())
        {
            record(&c.check, c.ok, c.detail, &c.path);
        }
    }

    let rows = checks
        .iter()
        .map(|(n, ok, d)| {
            vec![
                n.clone(),
                if *ok { "ok" } else { "FAIL" }.to_string(),
                d.clone(),
            ]
        })
        .collect();
    let failures: Vec<String> = checks
        .iter()
        .filter(|c| !c.1)
        .map(|c| format!("{}: {}", c.0, c.2))
        .collect();
    if let Some((check, err)) = io
        && checks.iter().all(|c| c.1 || c.0 == check)
    {
        return Err(err);
    }
    if let Some(path) = first_bad {
        return Err(LoopxError::Corrupt {
            path,
            detail: format!(
                "doctor found {} problem(s): {}",
                failures.len(),
                failures.join(" | ")
            )
            .into(),
        });
    }
    Ok(Output::new(json!({
        "healthy": true,
        "project": paths.project,
        "checks": checks.iter().map(|(n, ok, d)| json!({"check": n, "ok": ok, "detail": d})).collect::<Vec<_>>(),
    }))
    .heading(format!("LoopX project at {} is healthy", paths.project.display()))
    .table(&["check", "result", "detail"], rows))
}

/// A Markdown projection is either missing (the goal's next write makes it) or a file; anything
/// else in its place (a FIFO, a directory, a device) makes every write of the goal fail.
fn markdown_projection_check(path: &std::path::Path) -> (bool, String) {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (
            true,
            "missing; the goal's next write re-creates it".to_string(),
        ),
        Err(e) => (false, format!("{}: {e}", path.display())),
        Ok(meta) if meta.is_file() || meta.file_type().is_symlink() => (true, "ok".to_string()),
        Ok(_) => (
            false,
            format!(
                "{} is not a regular file; move it aside, and the next write of the goal puts \
                 the file back",
                path.display()
            ),
        ),
    }
}
