//! `loopx provider call`: run a provider once with its granted permissions and print the
//! observation. Reads and writes no kernel state.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;

use super::Context;
use super::capability::{fail, read_input};
use super::output::Output;
use crate::error::{Result, bad_input};
use crate::plugin::ObserveRequest;
use crate::plugin::invoke::call_provider;
use crate::plugin::registry::PluginHost;

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum ProviderCommand {
    /// Call EXT/ID (`<extension>/<provider>`) with the request in FILE and print the observation.
    Call {
        /// `<extension>/<provider>`.
        name: String,
        /// JSON request: {"operation": "...", "target": "...", "params": {"k": "v"}} (`-` = stdin).
        #[arg(long, value_name = "FILE", value_parser = super::flags::path)]
        input: PathBuf,
    },
}

pub fn run(ctx: &Context, cmd: ProviderCommand) -> Result<Output> {
    match cmd {
        ProviderCommand::Call { name, input } => {
            let text = read_input(ctx, &input)?;
            let request: ObserveRequest = serde_json::from_str(&text).map_err(|e| {
                bad_input(format!(
                    "--input {} is not a provider request ({e}); expected {{\"operation\": \"read\", \"target\": \"path\", \"params\": {{}}}}",
                    input.display()
                ))
            })?;
            let mut kernel = ctx.kernel()?;
            let host = PluginHost::for_project(kernel.paths());
            let (obs, call) = call_provider(&mut kernel, &host, &name, &request).map_err(fail)?;
            let mut o = Output::new(json!({"observation": obs, "call": call}))
                .heading(format!("{}: {}", obs.source, obs.summary))
                .fields([
                    ("kind", obs.kind.clone()),
                    ("truncated", obs.truncated.to_string()),
                    ("elapsed", format!("{} µs", call.elapsed_us)),
                ]);
            if !obs.facts.is_empty() {
                o = o.table(
                    &["key", "value"],
                    obs.facts
                        .iter()
                        .map(|f| vec![f.key.clone(), f.value.clone()])
                        .collect(),
                );
            }
            if !obs.body.is_empty() {
                // Shown inert by the renderer (`crate::inert`), like every other block.
                o = o.para(obs.body.clone());
            }
            if !call.logs.is_empty() {
                o = o.heading("Plugin log").list(
                    call.logs
                        .iter()
                        .map(|l| format!("[{} {}] {}", l.plugin, l.stream, l.text))
                        .collect(),
                );
            }
            Ok(o)
        }
    }
}
