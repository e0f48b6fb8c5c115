//! `loopx extension new`: a guest crate that builds into an installable component.
//!
//! Why this exists: the fastest way to get the contract right is to start from code that already
//! compiles against it. The scaffold is a standalone cargo package (its own `[workspace]`) holding a
//! copy of the WIT this binary implements (embedded at build time, so it always matches the host), a
//! `src/lib.rs` using `wit-bindgen`, and an `extension.toml` pointing at the artifact that
//! `cargo build --release --target wasm32-wasip2` produces.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Result, bad_input, conflict};

use super::manifest::{Kind, is_token};

/// The WIT package this host implements, embedded so scaffolds always match it.
pub const WIT: &str = include_str!("../../wit/loopx-plugin.wit");

/// What `new` created.
#[derive(Debug, Clone, Serialize)]
pub struct Scaffold {
    pub name: String,
    pub kind: Kind,
    pub dir: PathBuf,
    pub files: Vec<String>,
    pub build: String,
    pub install: String,
}

/// Creates `<parent>/<name>/` with a buildable guest crate of `kind`.
pub fn create(parent: &Path, name: &str, kind: Kind) -> Result<Scaffold> {
    if !is_token(name)
        || name.contains('.')
        || name.starts_with('-')
        || name.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(bad_input(format!(
            "extension name '{name}' must be a crate-safe token: letters, digits, '-' or '_', not starting with a digit"
        )));
    }
    let dir = parent.join(name);
    if dir.exists() {
        return Err(conflict(format!(
            "{} already exists; pick another name or --dir",
            dir.display()
        )));
    }
    let lib = name.replace('-', "_");
    let files: Vec<(&str, String)> = vec![
        ("Cargo.toml", cargo_toml(name)),
        (".gitignore", "/target\n".to_string()),
        ("extension.toml", manifest(name, &lib, kind)),
        ("wit/loopx-plugin.wit", WIT.to_string()),
        (
            "src/lib.rs",
            match kind {
                Kind::Capability => capability_lib(name),
                Kind::Provider => provider_lib(name),
            },
        ),
    ];
    for (rel, text) in &files {
        let path = dir.join(rel);
        if let Some(p) = path.parent() {
            std::fs::create_dir_all(p).map_err(|e| {
                crate::error::LoopxError::internal(format!("creating {}", p.display()), e)
            })?;
        }
        std::fs::write(&path, text).map_err(|e| {
            crate::error::LoopxError::internal(format!("writing {}", path.display()), e)
        })?;
    }
    Ok(Scaffold {
        name: name.to_string(),
        kind,
        build: format!(
            "cd {} && cargo build --release --target wasm32-wasip2",
            dir.display()
        ),
        install: format!("loopx extension install {}", dir.display()),
        dir,
        files: files.iter().map(|(r, _)| r.to_string()).collect(),
    })
}

fn cargo_toml(name: &str) -> String {
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
wit-bindgen = "0.57"

[profile.release]
opt-level = "s"
lto = true
strip = true

# A standalone package, even when created inside another cargo workspace.
[workspace]
"#
    )
}

fn manifest(name: &str, lib: &str, kind: Kind) -> String {
    let (perms, extra) = match kind {
        Kind::Capability => (
            "[]".to_string(),
            "# Providers this capability may call, as \"<extension>/<provider>\":\nuses = []\n"
                .to_string(),
        ),
        Kind::Provider => ("[\"fs.read:workspace\"]".to_string(), String::new()),
    };
    format!(
        r#"# LoopX extension manifest (see docs/extension-authors.md).
id = "{name}"
version = "0.1.0"
api = ">=0.1, <0.2"
# One line for `loopx extension list`: say what {name} observes or proposes.
description = "{name}, a LoopX {kind} made with `loopx extension new`"
# Permissions the operator may grant at install: fs.read:<name>, fs.write:<name>, env:<VAR>.
permissions = {perms}

[[provides]]
kind = "{kind}"
id = "{name}"
component = "target/wasm32-wasip2/release/{lib}.wasm"
{extra}
[provides.limits]
deadline_ms = 2000
memory_mib = 64
"#,
        kind = kind.as_str()
    )
}

fn capability_lib(name: &str) -> String {
    format!(
        r#"//! {name}: a LoopX capability. It reads the goal snapshot and the payload and returns typed
//! transition proposals; the kernel admits or refuses each one.

// The generated export glue for `propose` takes one argument per flattened field.
#![allow(clippy::too_many_arguments)]

wit_bindgen::generate!({{ world: "capability", path: "wit" }});

use loopx::plugin::host::log;
use loopx::plugin::types::{{AddTodo, LogLevel, Priority, TodoKind}};

struct Component;

impl Guest for Component {{
    fn describe() -> PluginInfo {{
        PluginInfo {{
            name: "{name}".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "turns each payload line into a todo".into(),
            operations: vec![],
        }}
    }}

    fn propose(input: ProposeInput) -> Result<Vec<Transition>, PluginError> {{
        let mut out = Vec::new();
        for (n, line) in input.payload.lines().map(str::trim).filter(|l| !l.is_empty()).enumerate() {{
            // A stable id makes re-proposing idempotent.
            let id = format!("{{}}-{name}-{{n}}", input.goal.goal_id);
            if input.goal.todos.iter().any(|t| t.id == id) {{
                continue;
            }}
            out.push(Transition::AddTodo(AddTodo {{
                id: Some(id),
                title: line.chars().take(200).collect(),
                detail: String::new(),
                priority: Priority::P2,
                kind: TodoKind::Task,
                lane: None,
                depends_on: vec![],
                capability: None,
            }}));
        }}
        log(LogLevel::Info, &format!("{{}} proposals", out.len()));
        if out.is_empty() {{
            out.push(Transition::NoChange("nothing new in the payload".into()));
        }}
        Ok(out)
    }}
}}

export!(Component);
"#
    )
}

fn provider_lib(name: &str) -> String {
    format!(
        r#"//! {name}: a LoopX provider. It makes one bounded observation using only what the operator
//! granted: `fs.read:workspace=<dir>` appears here as the directory `/workspace`.

wit_bindgen::generate!({{ world: "provider", path: "wit" }});

use loopx::plugin::types::Fact;

struct Component;

const MAX_BYTES: usize = 16 * 1024;

impl Guest for Component {{
    fn describe() -> PluginInfo {{
        PluginInfo {{
            name: "{name}".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "reads one file from the granted workspace".into(),
            operations: vec!["read".into()],
        }}
    }}

    fn observe(request: ObserveRequest) -> Result<Observation, PluginError> {{
        if request.operation != "read" {{
            return Err(PluginError::InvalidInput(format!("unknown operation {{}}", request.operation)));
        }}
        let path = format!("/workspace/{{}}", request.target.trim_start_matches('/'));
        let text = std::fs::read_to_string(&path).map_err(|e| PluginError::Unavailable(format!("{{path}}: {{e}}")))?;
        let truncated = text.len() > MAX_BYTES;
        let body: String = text.chars().take(MAX_BYTES).collect();
        Ok(Observation {{
            source: String::new(),
            kind: "file".into(),
            summary: format!("{{}} ({{}} bytes)", request.target, text.len()),
            facts: vec![Fact {{ key: "bytes".into(), value: text.len().to_string() }}],
            body,
            truncated,
        }})
    }}
}}

export!(Component);
"#
    )
}
