//! `loopx inspect_registry [PATH]`: the registry inspection the library exposes
//! ([`crate::registry::inspect_registry`]), for the project's `.loopx/registry.json` or any file.
//! It prints the whole inspection, typed problems included, and exits 5 when there are problems
//! (the code of corrupt state), so a script can branch on the code and still read what is wrong.

use std::path::PathBuf;

use serde_json::json;

use super::Context;
use super::output::Output;
use crate::error::{LoopxError, Result};
use crate::registry::inspect_registry;

#[derive(Debug, clap::Args)]
pub struct InspectRegistryArgs {
    /// The registry file (default: the project's .loopx/registry.json).
    #[arg(value_name = "PATH", value_parser = super::flags::path)]
    pub path: Option<PathBuf>,
}

pub fn run(ctx: &Context, args: InspectRegistryArgs) -> Result<Output> {
    let path = match args.path {
        Some(p) => ctx.absolute(&p)?,
        None => ctx.paths()?.registry(),
    };
    let inspection = inspect_registry(&path);
    let corrupt_code = LoopxError::Corrupt {
        path: path.clone(),
        detail: String::new().into(),
    }
    .exit_code();
    let rows = inspection
        .goals
        .iter()
        .map(|g| vec![g.id.clone(), g.status.clone()])
        .collect();
    let problems: Vec<String> = inspection.problems.iter().map(|p| p.to_string()).collect();
    let mut out = Output::new(json!({"path": path, "inspection": inspection}))
        .heading(format!(
            "Registry {}: {}",
            path.display(),
            if inspection.ok {
                "ok".to_string()
            } else {
                format!("{} problem(s)", problems.len())
            }
        ))
        .fields([("goals", inspection.goal_count.to_string())])
        .table(&["goal", "status"], rows);
    if !problems.is_empty() {
        out = out.heading("Problems").list(problems);
        out.exit_code = corrupt_code;
    }
    Ok(out)
}
