//! `loopx extension new|install|list|inspect|enable|disable|upgrade|rollback|remove`.
//!
//! Operators manage the WebAssembly extensions of a project here. Every check (manifest, API range,
//! hashes, import audit against grants, precompile) lives in `plugin::registry`, and who may change
//! extensions (operators only: all but `new`, `list` and `inspect` change them) in the kernel's
//! extension methods; this file turns flags into calls and describes the result.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;

use super::Context;
use super::output::Output;
use crate::error::Result;
use crate::kernel::Actor;
use crate::model::ExtensionRecord;
use crate::plugin::registry::{self, InstallMode, PluginHost, record_grants, record_manifest};
use crate::plugin::{Kind, Limits, scaffold};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KindArg {
    Capability,
    Provider,
}

impl From<KindArg> for Kind {
    fn from(k: KindArg) -> Kind {
        match k {
            KindArg::Capability => Kind::Capability,
            KindArg::Provider => Kind::Provider,
        }
    }
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum ExtensionCommand {
    /// Scaffold a guest crate that builds with `cargo build --release --target wasm32-wasip2`.
    New {
        /// Extension (and crate) name.
        name: String,
        /// What the scaffold builds: a capability or a provider.
        #[arg(long, value_enum)]
        kind: KindArg,
        /// Parent directory (default: the working directory).
        #[arg(long, value_name = "DIR", value_parser = super::flags::path)]
        dir: Option<PathBuf>,
    },
    /// Validate, audit, precompile and record the extension in DIR.
    Install {
        /// Directory holding extension.toml.
        #[arg(value_parser = super::flags::path)]
        dir: PathBuf,
        /// Grant a declared permission: fs.read:<name>=<dir>, fs.write:<name>=<dir>, env:<VAR>.
        #[arg(long = "grant", value_name = "PERM")]
        grants: Vec<String>,
    },
    /// Installed extensions.
    List,
    /// One extension: manifest, grants, components, limits, revisions.
    Inspect {
        /// The extension id (its manifest name, as `extension list` shows it).
        id: String,
    },
    /// Allow an installed extension's components to run.
    Enable {
        /// The extension id.
        id: String,
    },
    /// Stop an installed extension's components from running (nothing is deleted).
    Disable {
        /// The extension id.
        id: String,
    },
    /// Install a new revision of an installed extension (grants kept unless --grant is given).
    Upgrade {
        /// Directory holding the new revision's extension.toml.
        #[arg(value_parser = super::flags::path)]
        dir: PathBuf,
        /// Grant a declared permission: fs.read:<name>=<dir>, fs.write:<name>=<dir>, env:<VAR>
        /// (default: keep the current grants).
        #[arg(long = "grant", value_name = "PERM")]
        grants: Vec<String>,
    },
    /// Re-activate the previous revision.
    Rollback {
        /// The extension id.
        id: String,
    },
    /// Forget the extension and delete its files; goal state is untouched.
    Remove {
        /// The extension id.
        id: String,
    },
}

fn components_json(rec: &ExtensionRecord) -> Vec<serde_json::Value> {
    let Ok(m) = record_manifest(rec) else {
        return Vec::new();
    };
    m.provides
        .iter()
        .map(|p| {
            let label = format!("{}/{}", rec.id, p.id);
            let limits = Limits::resolve(p.kind, &p.limits, &label).ok();
            json!({
                "name": label,
                "kind": p.kind.as_str(),
                "sha256": rec.component_hashes.get(&p.id),
                "uses": p.uses,
                "limits": limits,
                "description": p.description,
            })
        })
        .collect()
}

fn record_json(rec: &ExtensionRecord) -> serde_json::Value {
    json!({
        "id": rec.id,
        "version": rec.version,
        "revision": rec.revision,
        "enabled": rec.enabled,
        "grants": rec.grants,
        "install_dir": rec.install_dir,
        "installed_at": rec.installed_at,
        "components": components_json(rec),
    })
}

pub fn run(ctx: &Context, cmd: ExtensionCommand) -> Result<Output> {
    if let ExtensionCommand::New { name, kind, dir } = cmd {
        let parent = match dir {
            Some(dir) => ctx.absolute(&dir)?,
            None => ctx.cwd()?.to_path_buf(),
        };
        let s = scaffold::create(&parent, &name, kind.into())?;
        return Ok(Output::new(json!({"scaffold": s}))
            .heading(format!(
                "Created {} {} in {}",
                s.kind.as_str(),
                s.name,
                s.dir.display()
            ))
            .list(s.files.clone())
            .para(format!("Build:   {}\nInstall: {}", s.build, s.install)));
    }
    let mut kernel = ctx.kernel()?;
    let host = PluginHost::for_project(kernel.paths());
    let actor = ctx.operator_or_agent();
    match cmd {
        ExtensionCommand::New { .. } => unreachable!("handled above"),
        ExtensionCommand::Install { dir, grants } => install(
            &mut kernel,
            &host,
            &actor,
            ctx,
            dir,
            grants,
            InstallMode::Install,
        ),
        ExtensionCommand::Upgrade { dir, grants } => install(
            &mut kernel,
            &host,
            &actor,
            ctx,
            dir,
            grants,
            InstallMode::Upgrade,
        ),
        ExtensionCommand::List => {
            let exts = kernel.extensions()?;
            let rows = exts
                .iter()
                .map(|e| {
                    let comps = components_json(e)
                        .iter()
                        .map(|c| {
                            format!(
                                "{} {}",
                                c["kind"].as_str().unwrap_or(""),
                                c["name"].as_str().unwrap_or("")
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", ");
                    vec![
                        e.id.clone(),
                        e.version.clone(),
                        e.revision.to_string(),
                        if e.enabled { "enabled" } else { "disabled" }.to_string(),
                        comps,
                    ]
                })
                .collect();
            Ok(
                Output::new(
                    json!({"extensions": exts.iter().map(record_json).collect::<Vec<_>>()}),
                )
                .heading(format!("{} installed extension(s)", exts.len()))
                .table(&["id", "version", "revision", "state", "components"], rows),
            )
        }
        ExtensionCommand::Inspect { id } => {
            let (rec, revisions) = kernel.extension_with_revisions(&id)?;
            let rec = rec.ok_or_else(|| {
                crate::error::not_found(format!(
                    "extension '{id}' is not installed; `loopx extension list` shows what is"
                ))
            })?;
            let manifest = record_manifest(&rec)?;
            let grants = record_grants(&rec).map(|g| g.len()).unwrap_or(0);
            let mut out = Output::new(json!({
                "extension": record_json(&rec),
                "manifest": rec.manifest,
                "revisions": revisions.iter().map(|r| json!({"revision": r.revision, "version": r.version, "installed_at": r.installed_at, "grants": r.grants})).collect::<Vec<_>>(),
            }))
            .heading(format!("Extension {} {} (revision {})", rec.id, rec.version, rec.revision))
            .fields([
                ("state", if rec.enabled { "enabled".to_string() } else { "disabled".to_string() }),
                ("api", manifest.api.clone()),
                ("description", manifest.description.clone()),
                ("declared", if manifest.permissions.is_empty() { "-".into() } else { manifest.permissions.join(", ") }),
                ("granted", if grants == 0 { "-".into() } else { rec.grants.join(", ") }),
                ("install dir", rec.install_dir.clone()),
            ]);
            for p in &manifest.provides {
                let label = format!("{}/{}", rec.id, p.id);
                let l = Limits::resolve(p.kind, &p.limits, &label)?;
                out = out.heading(format!("{} {label}", p.kind.as_str())).fields([
                    ("sha256", rec.component_hashes.get(&p.id).and_then(|v| v.as_str()).unwrap_or("-").to_string()),
                    ("uses", if p.uses.is_empty() { "-".into() } else { p.uses.join(", ") }),
                    (
                        "limits",
                        format!(
                            "fuel {}, deadline {} ms, memory {} MiB, output {} KiB, provider calls {}, log {} KiB",
                            l.fuel,
                            l.deadline_ms,
                            l.memory_bytes >> 20,
                            l.output_bytes >> 10,
                            l.max_provider_calls,
                            l.log_bytes >> 10
                        ),
                    ),
                ]);
            }
            Ok(out.heading("Revisions").table(
                &["revision", "version", "grants"],
                revisions
                    .iter()
                    .map(|r| {
                        vec![
                            r.revision.to_string(),
                            r.version.clone(),
                            r.grants.join(", "),
                        ]
                    })
                    .collect(),
            ))
        }
        ExtensionCommand::Enable { id } => {
            let rec = kernel.set_extension_enabled(&actor, &id, true)?;
            Ok(Output::new(json!({"extension": record_json(&rec)}))
                .heading(format!("Enabled {}", rec.id)))
        }
        ExtensionCommand::Disable { id } => {
            let rec = kernel.set_extension_enabled(&actor, &id, false)?;
            Ok(Output::new(json!({"extension": record_json(&rec)}))
                .heading(format!("Disabled {}", rec.id)))
        }
        ExtensionCommand::Rollback { id } => {
            let rec = kernel.rollback_extension(&actor, &id)?;
            Ok(
                Output::new(json!({"extension": record_json(&rec)})).heading(format!(
                    "Rolled {} back to revision {} ({})",
                    rec.id, rec.revision, rec.version
                )),
            )
        }
        ExtensionCommand::Remove { id } => {
            let rec = registry::remove_as(&mut kernel, &host, &actor, &id)?;
            Ok(Output::new(json!({"removed": rec.id, "revision": rec.revision}))
                .heading(format!("Removed {}", rec.id))
                .para("Goal state is unchanged; todos bound to its capabilities now need repair (see `loopx quota should-run`)."))
        }
    }
}

fn install(
    kernel: &mut crate::kernel::Kernel,
    host: &PluginHost,
    actor: &Actor,
    ctx: &Context,
    dir: PathBuf,
    grants: Vec<String>,
    mode: InstallMode,
) -> Result<Output> {
    let dir = ctx.absolute(&dir)?;
    ctx.progress(&format!(
        "installing {}: validating, auditing and compiling its components (a compile can take \
         seconds)",
        dir.display()
    ));
    let r = host.install_as(kernel, actor, &dir, &grants, ctx.cwd()?, mode)?;
    let rows = r
        .components
        .iter()
        .map(|c| {
            vec![
                format!("{}/{}", r.id, c.id),
                c.kind.as_str().to_string(),
                c.sha256[..16].to_string(),
                if c.compiled {
                    format!("{} ms", c.compile_ms)
                } else {
                    "cached".to_string()
                },
                c.imports.len().to_string(),
            ]
        })
        .collect();
    let verb = if r.previous_revision.is_some() {
        "Upgraded"
    } else {
        "Installed"
    };
    let mut fields = vec![
        ("revision", r.revision.to_string()),
        (
            "grants",
            if r.grants.is_empty() {
                "-".into()
            } else {
                r.grants.join(", ")
            },
        ),
        ("install dir", r.install_dir.clone()),
    ];
    if r.previous_revision.is_some() {
        fields.push((
            "grants added",
            if r.grants_added.is_empty() {
                "-".into()
            } else {
                r.grants_added.join(", ")
            },
        ));
        fields.push((
            "grants removed",
            if r.grants_removed.is_empty() {
                "-".into()
            } else {
                r.grants_removed.join(", ")
            },
        ));
    }
    Ok(Output::new(json!({"install": r}))
        .heading(format!("{verb} {} {}", r.id, r.version))
        .fields(fields)
        .table(&["component", "kind", "sha256", "compile", "imports"], rows))
}
