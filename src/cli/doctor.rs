//! `loopx doctor`: check the project without changing it. Exit 5 when anything is damaged.

use serde_json::json;

use super::Context;
use super::output::Output;
use crate::error::{LoopxError, Result};
use crate::kernel::Kernel;
use crate::kernel::projection::check_json_projection;
use crate::registry::inspect_registry;
use crate::store::Backend;

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

    // A check the machine kept from running (read-only filesystem, permission, full disk) says
    // nothing about the state: it fails doctor with exit 6, never 5 (`io`).
    let mut io: Option<(String, LoopxError)> = None;
    let db = paths.db();
    match crate::store::open(Backend::default(), &db) {
        Err(e @ LoopxError::Io { .. }) => {
            record("database", false, e.to_string(), &db);
            io.get_or_insert(("database".to_string(), e));
        }
        // A file SQLite cannot read as a database was marked damaged by the open itself.
        Err(e) => record("database", false, e.to_string(), &db),
        Ok(store) => {
            let integrity = store.integrity_check();
            match &integrity {
                Ok(p) if p.is_empty() => record("database integrity", true, "ok".to_string(), &db),
                Ok(p) => {
                    // Damaged pages: writes refuse from now on (`.loopx/CORRUPT`), until a
                    // restored database checks healthy here again.
                    crate::store::mark_damaged(&db, &p.join("; "));
                    record("database integrity", false, p.join("; "), &db)
                }
                Err(e @ LoopxError::Io { .. }) => {
                    record("database integrity", false, e.to_string(), &db);
                }
                Err(e) => record("database integrity", false, e.to_string(), &db),
            }
            let pages_ok = matches!(&integrity, Ok(p) if p.is_empty());
            if let Err(e @ LoopxError::Io { .. }) = integrity {
                io.get_or_insert(("database integrity".to_string(), e));
            }
            let marker = crate::store::damage_marker(&db);
            if marker.exists() {
                match pages_ok {
                    true => match std::fs::remove_file(&marker) {
                        Ok(()) => record(
                            "damage marker",
                            true,
                            format!(
                                "{} removed: the database checks healthy again",
                                marker.display()
                            ),
                            &marker,
                        ),
                        Err(e) => {
                            let e = LoopxError::io(
                                &marker,
                                format!("removing {}", marker.display()),
                                e,
                            );
                            record("damage marker", false, e.to_string(), &marker);
                            io.get_or_insert(("damage marker".to_string(), e));
                        }
                    },
                    false => record(
                        "damage marker",
                        false,
                        format!("{} exists: writes are refused", marker.display()),
                        &marker,
                    ),
                }
            }
            match store.content_problems() {
                Ok(p) if p.is_empty() => record("database content", true, "ok".to_string(), &db),
                Ok(p) => record("database content", false, p.join("; "), &db),
                Err(e) => record("database content", false, e.to_string(), &db),
            }
            let mut kernel = Kernel::from_store(paths.clone(), store);
            match crate::turn::journal_repair::undecodable_turns(&mut kernel) {
                Ok(p) if p.is_empty() => {
                    record("turn journal", true, "ok".to_string(), &paths.db())
                }
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
                }
            }
            for c in crate::plugin::artifacts::verify_installed(
                &mut kernel,
                &paths.component_cache_dir(),
            ) {
                record(&c.check, c.ok, c.detail, &c.path);
            }
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
            ),
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
