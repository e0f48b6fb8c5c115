//! The kernel: the only writer of durable state.
//!
//! Every mutating command is a `Kernel` method that opens one write transaction, checks policy
//! against current state, writes, appends one operation-log entry, and commits. Callers (the CLI,
//! the turn driver, the plugin host) never touch the store directly, so every rule about claims,
//! gates and quota lives here, once.

pub mod admission;
pub mod claim;
pub mod decision;
pub mod doctor;
pub mod extension;
pub mod goal;
pub mod monitor;
pub mod projection;
pub mod quota;
pub mod retention;
pub mod run;
pub mod status;
mod store;
pub mod todo;
pub mod transition;
pub mod turn_journal;
pub mod watch;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::clock::now_ms;
use crate::error::{LoopxError, Message, NextAction, Part, Result, msg, refused};
use crate::ids::new_ulid;
pub use crate::kernel::store::SchemaUpgrade;
use crate::kernel::store::{Backend, CommitSeq, OpRecord, Store, StoreRead, StoreTx};
use crate::paths::ProjectPaths;

/// Agent id used when a command names none and `LOOPX_AGENT_ID` is unset.
pub const DEFAULT_AGENT_ID: &str = "agent";

/// Proof that a write comes from the current lease holder: the fence it was granted, or the
/// idempotency key it claimed with (the key is fixed before the claim, so commands can be
/// written out in advance; a takeover always uses a new key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseProof {
    Fence(i64),
    Key(String),
}

/// Who is asking. Operators (people at a terminal) may resolve gates and set policy; agents may
/// not, and their writes to claimed todos must carry a lease proof.
#[derive(Debug, Clone, PartialEq)]
pub enum Actor {
    Operator,
    Agent {
        agent_id: String,
        proof: Option<LeaseProof>,
        turn_key: Option<String>,
    },
    /// A capability's admitted proposal, on behalf of the agent whose turn it serves (if any).
    /// Admission has already checked that agent holds any lease it touches.
    Capability {
        capability: String,
        agent_id: Option<String>,
    },
}

impl Actor {
    pub fn label(&self) -> String {
        match self {
            Actor::Operator => "operator".to_string(),
            Actor::Agent { agent_id, .. } => format!("agent:{agent_id}"),
            Actor::Capability { capability, .. } => format!("capability:{capability}"),
        }
    }

    pub fn agent_id(&self) -> Option<&str> {
        match self {
            Actor::Operator => None,
            Actor::Agent { agent_id, .. } => Some(agent_id),
            Actor::Capability { agent_id, .. } => agent_id.as_deref(),
        }
    }

    /// Refuses unless this is an operator; `action` completes "only an operator can ...".
    pub fn require_operator(&self, action: &str) -> Result<()> {
        match self {
            Actor::Operator => Ok(()),
            Actor::Agent {
                agent_id, turn_key, ..
            } => Err(refused(format!(
                "only an operator can {action}; this command runs as agent '{agent_id}'{}",
                match turn_key {
                    Some(k) => format!(" inside turn {k}"),
                    None => String::new(),
                }
            ))),
            Actor::Capability { capability, .. } => Err(refused(format!(
                "only an operator can {action}; capability '{capability}' cannot"
            ))),
        }
    }
}

/// An open project: its paths and its store.
pub struct Kernel {
    paths: ProjectPaths,
    store: Box<dyn Store>,
    /// Failures after a commit (see [`Kernel::after_commit`]), for the CLI to print.
    warnings: Vec<Message>,
    /// The store's commit counter after this handle's last write transaction: what a projection
    /// rendered inside that transaction is current as of.
    last_commit: Option<CommitSeq>,
}

impl Kernel {
    /// Creates `.loopx/` under `project` with a fresh database and an empty registry projection.
    /// Returns `Ok(None)` when the project is already initialized (nothing is touched). Never
    /// replaces a database: an empty `loopx.db`, or a `loopx.db-wal` without its database, is
    /// damage to report (exit 5), not a project to start over in place (docs/decisions.md,
    /// "Only `init` creates a database, and never over one").
    pub fn init(project: &Path) -> Result<Option<Kernel>> {
        let paths = ProjectPaths::at(project);
        paths.require_text_path()?;
        let db = paths.db();
        match std::fs::metadata(&db) {
            // An existing project is opened, not only seen: a damaged database is reported here
            // as by every other command, not called initialized.
            Ok(meta) if meta.len() > 0 || !meta.is_file() => {
                Kernel::open(paths)?;
                return Ok(None);
            }
            Ok(_) => {
                return Err(LoopxError::Corrupt {
                    path: db,
                    detail: msg![
                        "the database file is empty (0 bytes); init does not write over it. \
                         Restore loopx.db and loopx.db-wal from a backup, or move .loopx aside \
                         and run ",
                        NextAction::InitProject,
                        " again to start an empty project"
                    ],
                });
            }
            Err(_) => {}
        }
        let mut wal = db.clone().into_os_string();
        wal.push("-wal");
        if std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0) {
            return Err(LoopxError::Corrupt {
                path: db,
                detail: msg![
                    format!(
                        "the database is missing but its write-ahead log {} is not: committed \
                         work may live only there. Restore loopx.db beside it, or move .loopx \
                         aside and run ",
                        std::path::Path::new(&wal).display()
                    ),
                    NextAction::InitProject,
                    " again to start an empty project"
                ],
            });
        }
        std::fs::create_dir_all(&paths.state).map_err(|e| {
            LoopxError::io(
                &paths.state,
                format!("creating {}", paths.state.display()),
                e,
            )
        })?;
        // A damage marker left beside a database that is gone says nothing about the new one.
        let marker = crate::kernel::store::damage_marker(&paths.db());
        if marker.exists() {
            std::fs::remove_file(&marker).map_err(|e| {
                LoopxError::io(&marker, format!("removing {}", marker.display()), e)
            })?;
        }
        let store = crate::kernel::store::create(Backend::default(), &paths.db())?;
        // The store made its own entries durable; this makes `.loopx/` itself so.
        crate::kernel::store::sync_directory(&paths.project)?;
        std::fs::create_dir_all(paths.goals_dir()).map_err(|e| {
            LoopxError::io(
                paths.goals_dir(),
                format!("creating {}", paths.goals_dir().display()),
                e,
            )
        })?;
        let mut kernel = Kernel {
            paths,
            store,
            warnings: Vec::new(),
            last_commit: None,
        };
        kernel.write_registry_projection()?;
        Ok(Some(kernel))
    }

    /// Opens an existing project and checks the registry projection is intact (a damaged
    /// projection is reported, never silently replaced).
    pub fn open(paths: ProjectPaths) -> Result<Kernel> {
        Kernel::open_with(paths, SchemaUpgrade::Apply)
    }

    /// [`Kernel::open`], with `upgrade` saying whether a schema older than this build's is
    /// migrated (every command) or refused (a process that must never write: the dashboard).
    pub fn open_with(paths: ProjectPaths, upgrade: SchemaUpgrade) -> Result<Kernel> {
        projection::check_json_projection(&paths.registry())?;
        // Test builds only (`test-hooks`): the test clock's offset from inside `.loopx/`.
        crate::clock::test_clock::load(&paths.state);
        let store = crate::kernel::store::open_with(Backend::default(), &paths.db(), upgrade)?;
        Ok(Kernel {
            paths,
            store,
            warnings: Vec::new(),
            last_commit: None,
        })
    }

    /// Wraps an already-open store without checking projections (for `doctor`, which reports
    /// damaged projections instead of refusing to start).
    pub fn from_store(paths: ProjectPaths, store: Box<dyn Store>) -> Kernel {
        Kernel {
            paths,
            store,
            warnings: Vec::new(),
            last_commit: None,
        }
    }

    pub fn paths(&self) -> &ProjectPaths {
        &self.paths
    }

    /// Opens the database now at the project's path in place of the one this handle has open:
    /// after a restore put another file there, a long-lived process (a loop, a watch) must not go
    /// on reading, or committing to, the replaced one. Warnings not yet printed are kept.
    pub fn reopen(&mut self, upgrade: SchemaUpgrade) -> Result<()> {
        let reopened = Kernel::open_with(self.paths.clone(), upgrade)?;
        self.store = reopened.store;
        self.last_commit = None;
        Ok(())
    }

    /// Settles a step that runs after the command's transaction committed (writing a
    /// projection). Its failure cannot undo the commit, so it must not fail the command: an
    /// exit code other than 0 would tell the caller nothing happened, and a caller that retries
    /// would record the run (or create the goal) a second time. It becomes a warning the CLI
    /// prints, and the projection is repaired by the next write of the goal or by
    /// `loopx refresh-state` without a goal (docs/decisions.md, "A command that committed
    /// succeeds").
    pub(crate) fn after_commit(&mut self, what: &str, result: Result<()>) {
        if let Err(e) = result {
            // The failure's own message keeps its typed pieces, so the front end renders them.
            let mut parts = vec![Part::from(format!(
                "the command committed, but {what} failed: "
            ))];
            match e.message() {
                Some(m) => parts.extend(m.parts().iter().cloned()),
                None => parts.push(Part::from(e.to_string())),
            }
            parts.extend([
                Part::from(format!(
                    " (exit code {}, {}). Nothing needs retrying; fix the cause, then run ",
                    e.exit_code(),
                    e.kind()
                )),
                Part::from(NextAction::Reproject),
                Part::from(" (no goal) to re-create the projections"),
            ]);
            self.warnings.push(Message::from_parts(parts));
        }
    }

    /// The warnings collected since the last call (see [`Kernel::after_commit`]).
    pub fn take_warnings(&mut self) -> Vec<Message> {
        std::mem::take(&mut self.warnings)
    }

    // The store's transactions are reachable only from the kernel's own modules: every write a
    // caller can make is a kernel method that checks the actor and logs the operation, and the
    // compiler, not a convention, keeps the CLI, the plugin host and the turn driver from opening
    // a transaction. Builds with the `test-hooks` feature (only the crate's own tests and
    // benches, see Cargo.toml) also get `read` and `write` as public methods, to seed and inspect
    // state directly; `cargo build` and `cargo check` have no such door.

    /// Runs `f` in one read snapshot, which has no method that writes.
    #[cfg(not(feature = "test-hooks"))]
    pub(in crate::kernel) fn read<R>(
        &self,
        f: impl FnOnce(&dyn StoreRead) -> Result<R>,
    ) -> Result<R> {
        self.in_snapshot(f)
    }

    /// Runs `f` in one read snapshot (test and bench builds: public, see above).
    #[cfg(feature = "test-hooks")]
    pub fn read<R>(&self, f: impl FnOnce(&dyn StoreRead) -> Result<R>) -> Result<R> {
        self.in_snapshot(f)
    }

    /// Runs `f` in one write transaction and commits it only if `f` succeeds.
    #[cfg(not(feature = "test-hooks"))]
    pub(in crate::kernel) fn write<R>(
        &mut self,
        f: impl FnOnce(&dyn StoreTx) -> Result<R>,
    ) -> Result<R> {
        self.in_transaction(f)
    }

    /// Runs `f` in one write transaction (test and bench builds: public, see above).
    #[cfg(feature = "test-hooks")]
    pub fn write<R>(&mut self, f: impl FnOnce(&dyn StoreTx) -> Result<R>) -> Result<R> {
        self.in_transaction(f)
    }

    fn in_snapshot<R>(&self, f: impl FnOnce(&dyn StoreRead) -> Result<R>) -> Result<R> {
        let tx = self.store.begin_read()?;
        let out = f(&*tx)?;
        drop(tx);
        Ok(out)
    }

    /// Whether a write transaction of this handle has committed: what the caller does after a
    /// later failure (an output it cannot print) must not invite a retry that writes twice.
    pub fn has_committed(&self) -> bool {
        self.last_commit.is_some()
    }

    fn in_transaction<R>(&mut self, f: impl FnOnce(&dyn StoreTx) -> Result<R>) -> Result<R> {
        let tx = self.store.begin_write()?;
        let out = f(&*tx)?;
        self.last_commit = Some(tx.commit()?);
        Ok(out)
    }

    /// Runs `f` in a write transaction and rolls it back: the checks of a real write, none of its
    /// effects (dry runs).
    pub(in crate::kernel) fn write_then_rollback<R>(
        &mut self,
        f: impl FnOnce(&dyn StoreTx) -> Result<R>,
    ) -> Result<R> {
        let tx = self.store.begin_write()?;
        let out = f(&*tx)?;
        drop(tx);
        Ok(out)
    }

    /// `PRAGMA integrity_check` problems (empty when healthy).
    pub fn integrity_problems(&self) -> Result<Vec<String>> {
        self.store.integrity_check()
    }

    pub fn schema_version(&self) -> Result<i64> {
        self.store.schema_version()
    }
}

/// Appends one operation-log entry inside the caller's transaction.
pub(crate) fn log_op(
    tx: &dyn StoreTx,
    goal_id: Option<&str>,
    actor: &Actor,
    kind: &str,
    detail: serde_json::Value,
) -> Result<()> {
    tx.append_op(&OpRecord {
        id: new_ulid(),
        goal_id: goal_id.map(str::to_string),
        actor: actor.label(),
        kind: kind.to_string(),
        detail,
        created_at: now_ms(),
    })
}

/// Loads a goal or fails with exit 3 naming it.
pub(crate) fn require_goal(tx: &dyn StoreRead, goal_id: &str) -> Result<crate::model::Goal> {
    crate::ids::validate_token("goal id", goal_id)?;
    tx.goal(goal_id)?.ok_or_else(|| {
        crate::error::not_found(msg![
            format!("unknown goal '{goal_id}'; "),
            NextAction::ListGoals,
            " shows the goals of this project"
        ])
    })
}

/// The goal, unless it is closed. Closing is final: a closed goal takes no new todos and none of
/// its todos reopens or changes its plan (`change` names what was refused); completing or
/// archiving what is left, and recording evidence, stay possible.
pub(crate) fn require_unclosed_goal(
    tx: &dyn StoreRead,
    goal_id: &str,
    change: &str,
) -> Result<crate::model::Goal> {
    let goal = require_goal(tx, goal_id)?;
    if goal.status == crate::model::GoalStatus::Closed {
        return Err(crate::error::refused(format!(
            "goal '{goal_id}' is closed, so {change} is refused; closed goals cannot be reopened. \
             Create a new goal instead"
        )));
    }
    Ok(goal)
}

/// The error for a run id that the goal does not have (exit 3).
pub(crate) fn unknown_run(goal_id: &str, run_id: &str) -> LoopxError {
    crate::error::not_found(msg![
        format!("unknown run '{run_id}' in goal '{goal_id}'; "),
        NextAction::ShowHistory {
            goal_id: goal_id.to_string()
        },
        " lists its runs"
    ])
}

/// Loads a todo of a goal or fails with exit 3 naming both.
pub(crate) fn require_todo(
    tx: &dyn StoreRead,
    goal_id: &str,
    todo_id: &str,
) -> Result<crate::model::Todo> {
    crate::ids::validate_token("todo id", todo_id)?;
    tx.todo(goal_id, todo_id)?.ok_or_else(|| {
        crate::error::not_found(msg![
            format!("unknown todo '{todo_id}' in goal '{goal_id}'; "),
            NextAction::ListTodos {
                goal_id: goal_id.to_string()
            },
            " shows its todos"
        ])
    })
}

/// A kernel handle can move to another thread (a server holds one per thread or a pool): its
/// store is `Send` by its trait, and reads go through `&self`. Checked when the crate compiles.
const _: () = {
    fn assert_send<T: Send>() {}
    let _ = assert_send::<Kernel>;
};

/// What the kernel's unit tests share: a fresh project on disk.
#[cfg(test)]
pub(crate) mod test_project {
    use super::{Actor, Kernel};
    use crate::kernel::goal::NewGoal;

    /// A fresh project in a temporary directory (kept alive by the returned guard).
    pub(crate) fn empty() -> (tempfile::TempDir, Kernel) {
        let dir = tempfile::tempdir().unwrap();
        let kernel = Kernel::init(dir.path()).unwrap().unwrap();
        (dir, kernel)
    }

    /// A fresh project with the active goal `g`.
    pub(crate) fn with_goal_g() -> (tempfile::TempDir, Kernel) {
        let (dir, mut kernel) = empty();
        let goal = NewGoal {
            id: Some("g".into()),
            title: "Goal".into(),
            ..NewGoal::default()
        };
        kernel.create_goal(&Actor::Operator, goal).unwrap();
        (dir, kernel)
    }
}
