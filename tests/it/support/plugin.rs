//! Helpers for the plugin-host suites (the `sandbox_*` modules and the WebAssembly turn tests).
//!
//! Building guests: [`wasm`] builds every guest component (first-party extensions and the hostile
//! guests under `tests/guests/`) once per test process, guarded by a `OnceLock`, with
//! `cargo build --release --target wasm32-wasip2 -p ...` into the workspace target directory
//! (`$CARGO_TARGET_DIR` or `<repo>/target`, subdirectory `wasm32-wasip2/release`). Several test
//! processes running at once do not fight: cargo itself serializes builds on the target directory's
//! file lock ("Blocking waiting for file lock"), and a build that finds everything up to date is a
//! no-op. Built `.wasm` files are never committed.
//!
//! Compiled artifacts are not shared between projects: install trusts only an artifact it compiled
//! itself or one whose digest its own registry recorded, so a copied-in artifact would be exactly
//! the planted file `sandbox_install` proves is never used. Each project's installs compile.
//!
//! Projects: [`Sandbox::new`] initializes a fresh `.loopx/` in a temporary directory and opens the
//! kernel and plugin host on it. [`Sandbox::fingerprint`] is every row of every table the database
//! holds, so a test can assert "unchanged".

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use loopx::kernel::goal::NewGoal;
use loopx::kernel::{Actor, Kernel};
use loopx::paths::ProjectPaths;
use loopx::plugin::{InstallMode, InstallReport, PluginHost};

use super::Project;

/// Every guest package the suites use.
pub const GUESTS: &[&str] = &[
    "hostile-cap",
    "probe-provider",
    "net-provider",
    "fs-cap",
    "fs-observe",
    "issue-fix",
];

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn guest_dir() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.current_dir(repo())
            .args(["build", "--release", "--target", "wasm32-wasip2"]);
        for g in GUESTS {
            cmd.args(["-p", g]);
        }
        let out = cmd
            .output()
            .expect("running cargo build for the guest components");
        assert!(
            out.status.success(),
            "building guest components failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo().join("target"));
        target.join("wasm32-wasip2").join("release")
    })
}

/// Path of a built guest component, e.g. `wasm("hostile-cap")`.
pub fn wasm(package: &str) -> PathBuf {
    let p = guest_dir().join(format!("{}.wasm", package.replace('-', "_")));
    assert!(p.is_file(), "{} was not built", p.display());
    p
}

/// A [`Project`] with the kernel and plugin host open in this process: the plugin suites call the
/// library directly; the CLI methods of [`Project`] work on the same directory through `Deref`.
pub struct Sandbox {
    pub project: Project,
    pub kernel: Kernel,
    pub host: PluginHost,
}

impl std::ops::Deref for Sandbox {
    type Target = Project;
    fn deref(&self) -> &Project {
        &self.project
    }
}

impl Sandbox {
    pub fn new() -> Sandbox {
        let project = Project::empty();
        let kernel = Kernel::init(project.path())
            .unwrap()
            .expect("fresh project");
        let host = PluginHost::for_project(&ProjectPaths::at(project.path()));
        Sandbox {
            project,
            kernel,
            host,
        }
    }

    pub fn paths(&self) -> ProjectPaths {
        ProjectPaths::at(self.path())
    }

    /// Creates goal `id` with a title.
    pub fn goal(&mut self, id: &str) {
        self.kernel
            .create_goal(
                &Actor::Operator,
                NewGoal {
                    id: Some(id.into()),
                    title: format!("Goal {id}"),
                    objective: Some("fix it".into()),
                    success_criteria: vec![],
                    project_dir: None,
                },
            )
            .unwrap();
    }

    /// Installs the extension in `dir` with `grants`.
    pub fn install(&mut self, dir: &Path, grants: &[&str]) -> loopx::Result<InstallReport> {
        let grants: Vec<String> = grants.iter().map(|s| s.to_string()).collect();
        self.host
            .install(&mut self.kernel, dir, &grants, dir, InstallMode::Install)
    }

    /// Every row of every table of the database ([`Project::db_dump`]): what "nothing changed"
    /// compares.
    pub fn fingerprint(&mut self) -> String {
        self.project.db_dump(None)
    }

    /// Goal state only (goals, todos, their dependencies, evidence): what a refused proposal must
    /// not change (admission still records the refusal in the run log and the operation log, by
    /// design).
    pub fn state_fingerprint(&mut self) -> String {
        self.project
            .db_dump(Some(&["goals", "todos", "todo_deps", "evidence"]))
    }
}

/// Writes an extension directory under `parent` whose single component is `component` (absolute
/// path to a built guest). `extra` is appended to the `[[provides]]` table (e.g. `uses = [...]`),
/// `limits` becomes `[provides.limits]`, `permissions` the top-level list.
// One positional argument per manifest field keeps the call sites readable as a manifest.
#[allow(clippy::too_many_arguments)]
pub fn extension(
    parent: &Path,
    id: &str,
    kind: &str,
    provides_id: &str,
    component: &Path,
    permissions: &[&str],
    extra: &str,
    limits: &str,
) -> PathBuf {
    let dir = parent.join(format!("src-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let perms: Vec<String> = permissions.iter().map(|p| format!("\"{p}\"")).collect();
    let text = format!(
        "id = \"{id}\"\nversion = \"0.1.0\"\napi = \">=0.1, <0.2\"\npermissions = [{}]\n\n[[provides]]\nkind = \"{kind}\"\nid = \"{provides_id}\"\ncomponent = \"{}\"\n{extra}\n[provides.limits]\n{limits}\n",
        perms.join(", "),
        component.display()
    );
    std::fs::write(dir.join("extension.toml"), text).unwrap();
    dir
}

/// Makes a FIFO at `fifo` and, after `delay`, opens it for writing and closes it, so a reader
/// still blocked on it gets EOF: a test of a host that waits for the reader then fails instead
/// of hanging.
pub fn fifo_released_after(fifo: &Path, delay: std::time::Duration) {
    let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "mkfifo");
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        for _ in 0..200 {
            // Non-blocking: fails with ENXIO while no reader has it open.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_NONBLOCK) };
            if fd >= 0 {
                unsafe { libc::close(fd) };
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    });
}
