//! The extension registry's writes: install, upgrade, enable, disable, roll back, remove, and the
//! digest of a recompiled artifact.
//!
//! Why this exists: the plugin host does the WebAssembly work (reading, auditing and compiling
//! components, copying their files into place), but what an extension *is* in a project (its
//! active revision, grants, hashes and artifact digests) is durable state, and the kernel is its
//! only writer. Each change here checks that the actor may make it (operators only), writes the
//! rows and the operation-log entry in one transaction, and rewrites the registry projection
//! itself, so no caller can forget it.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{Actor, Kernel, log_op};
use crate::error::{LoopxError, NextAction, Result, msg, not_found, refused};
use crate::model::ArtifactRecord;
use crate::model::ExtensionRecord;

/// A change to a project's extensions. Every one of them is an operator decision: it changes
/// which code runs in the project and what that code may touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtensionChange {
    Install,
    Upgrade,
    Enable,
    Disable,
    Rollback,
    Remove,
}

impl ExtensionChange {
    /// Completes "only an operator can ...".
    fn action(self) -> &'static str {
        match self {
            ExtensionChange::Install => "install extensions",
            ExtensionChange::Upgrade => "upgrade extensions",
            ExtensionChange::Enable => "enable extensions",
            ExtensionChange::Disable => "disable extensions",
            ExtensionChange::Rollback => "roll back extensions",
            ExtensionChange::Remove => "remove extensions",
        }
    }
}

/// A revision the plugin host prepared (validated, audited, compiled, its files in place), for
/// the kernel to record.
#[derive(Debug, Clone)]
pub struct ExtensionRevision {
    pub record: ExtensionRecord,
    /// The compiled artifact of each component, recorded in the same transaction as the revision:
    /// an installed component always has its artifact's digest on record, and a recorded digest
    /// always belongs to an install.
    pub artifacts: Vec<ArtifactRecord>,
    /// Extra detail for the operation-log entry (grants, component hashes, engine key).
    pub detail: Value,
}

fn ext_not_found(id: &str) -> LoopxError {
    not_found(msg![
        format!("extension '{id}' is not installed; "),
        NextAction::ListExtensions,
        " shows what is"
    ])
}

impl Kernel {
    /// Refuses `change` unless `actor` is an operator. The plugin host asks before it does any
    /// work (so a refused agent costs no compile and sees the refusal, not a manifest error);
    /// every write below asks again.
    pub fn authorize_extension_change(&self, actor: &Actor, change: ExtensionChange) -> Result<()> {
        actor.require_operator(change.action())
    }

    /// The active revision of extension `id`, if installed.
    pub fn extension(&self, id: &str) -> Result<Option<ExtensionRecord>> {
        self.read(|tx| tx.extension(id))
    }

    /// Every installed extension (its active revision).
    pub fn extensions(&self) -> Result<Vec<ExtensionRecord>> {
        self.read(|tx| tx.extensions())
    }

    /// Every recorded revision of extension `id`.
    pub fn extension_revisions(&self, id: &str) -> Result<Vec<ExtensionRecord>> {
        self.read(|tx| tx.extension_revisions(id))
    }

    /// The active revision and every revision of `id`, read in one snapshot.
    pub fn extension_with_revisions(
        &self,
        id: &str,
    ) -> Result<(Option<ExtensionRecord>, Vec<ExtensionRecord>)> {
        self.read(|tx| Ok((tx.extension(id)?, tx.extension_revisions(id)?)))
    }

    /// The artifact recorded for component `component_sha256` compiled by engine `engine_key`.
    pub fn component_artifact(
        &self,
        component_sha256: &str,
        engine_key: &str,
    ) -> Result<Option<ArtifactRecord>> {
        self.read(|tx| tx.component_artifact(component_sha256, engine_key))
    }

    /// Records a new revision (`Install` or `Upgrade`) with its artifacts and one operation-log
    /// entry, then rewrites the registry projection. An install of an id already installed is a
    /// conflict, an upgrade of one that is not is not-found: checked again here, in the
    /// transaction, because the host's check ran before its (long) compile.
    pub fn record_extension_revision(
        &mut self,
        actor: &Actor,
        change: ExtensionChange,
        revision: &ExtensionRevision,
    ) -> Result<()> {
        if !matches!(change, ExtensionChange::Install | ExtensionChange::Upgrade) {
            return Err(LoopxError::internal(
                "recording an extension revision",
                anyhow::anyhow!("{change:?} records no revision"),
            ));
        }
        self.authorize_extension_change(actor, change)?;
        let record = &revision.record;
        self.write(|tx| {
            match (change, tx.extension(&record.id)?) {
                (ExtensionChange::Install, Some(rec)) => {
                    return Err(crate::error::conflict(msg![
                        format!(
                            "extension '{}' is already installed (version {}, revision {}); use ",
                            rec.id, rec.version, rec.revision
                        ),
                        NextAction::UpgradeExtension
                    ]));
                }
                (ExtensionChange::Upgrade, None) => return Err(ext_not_found(&record.id)),
                _ => {}
            }
            tx.upsert_extension(record)?;
            for a in &revision.artifacts {
                tx.record_component_artifact(a)?;
            }
            log_op(
                tx,
                None,
                actor,
                match change {
                    ExtensionChange::Install => "extension_install",
                    _ => "extension_upgrade",
                },
                revision.detail.clone(),
            )
        })?;
        self.write_registry_projection()
    }

    /// Records the digest of an artifact the plugin host recompiled from verified component bytes
    /// (a new engine, a cleared cache). Any actor may cause it, since nothing about what the
    /// component may do changes, only the compiled form of bytes an operator installed; the entry
    /// is logged as the operator's for that reason.
    pub fn record_recompiled_artifact(
        &mut self,
        plugin: &str,
        record: &ArtifactRecord,
    ) -> Result<()> {
        self.write(|tx| {
            tx.record_component_artifact(record)?;
            log_op(
                tx,
                None,
                &Actor::Operator,
                "artifact_recompile",
                json!({"plugin": plugin, "component": record.component_sha256, "artifact": record.artifact_sha256, "engine_key": record.engine_key}),
            )
        })
    }

    /// Enables or disables an installed extension; returns its active revision as it now is.
    pub fn set_extension_enabled(
        &mut self,
        actor: &Actor,
        id: &str,
        enabled: bool,
    ) -> Result<ExtensionRecord> {
        let change = if enabled {
            ExtensionChange::Enable
        } else {
            ExtensionChange::Disable
        };
        self.authorize_extension_change(actor, change)?;
        let rec = self.write(|tx| {
            let rec = tx.extension(id)?.ok_or_else(|| ext_not_found(id))?;
            tx.set_extension_active(id, None, enabled)?;
            log_op(
                tx,
                None,
                actor,
                if enabled {
                    "extension_enable"
                } else {
                    "extension_disable"
                },
                json!({"id": id}),
            )?;
            Ok(ExtensionRecord { enabled, ..rec })
        })?;
        self.write_registry_projection()?;
        Ok(rec)
    }

    /// Re-activates the newest revision older than the active one (keeping enabled/disabled).
    pub fn rollback_extension(&mut self, actor: &Actor, id: &str) -> Result<ExtensionRecord> {
        self.authorize_extension_change(actor, ExtensionChange::Rollback)?;
        let rec = self.write(|tx| {
            let active = tx.extension(id)?.ok_or_else(|| ext_not_found(id))?;
            let revisions = tx.extension_revisions(id)?;
            let previous = revisions
                .iter()
                .filter(|r| r.revision < active.revision)
                .max_by_key(|r| r.revision)
                .ok_or_else(|| {
                    refused(format!(
                        "extension '{id}' has no revision older than {} to roll back to",
                        active.revision
                    ))
                })?;
            if !Path::new(&previous.install_dir).is_dir() {
                return Err(LoopxError::Corrupt {
                    path: PathBuf::from(&previous.install_dir),
                    detail: format!(
                        "revision {} of '{id}' has no installed files",
                        previous.revision
                    )
                    .into(),
                });
            }
            tx.set_extension_active(id, Some(previous.revision), active.enabled)?;
            log_op(
                tx,
                None,
                actor,
                "extension_rollback",
                json!({"id": id, "from": active.revision, "to": previous.revision}),
            )?;
            Ok(ExtensionRecord {
                enabled: active.enabled,
                ..previous.clone()
            })
        })?;
        self.write_registry_projection()?;
        Ok(rec)
    }

    /// Forgets extension `id` (every revision) and rewrites the registry projection; returns the
    /// revision that was active. Deleting the files is the plugin host's (after this commits, so
    /// a refused or failed removal leaves them in place).
    pub fn remove_extension(&mut self, actor: &Actor, id: &str) -> Result<ExtensionRecord> {
        self.authorize_extension_change(actor, ExtensionChange::Remove)?;
        let rec = self.write(|tx| {
            let rec = tx.extension(id)?.ok_or_else(|| ext_not_found(id))?;
            tx.delete_extension(id)?;
            log_op(
                tx,
                None,
                actor,
                "extension_remove",
                json!({"id": id, "revision": rec.revision}),
            )?;
            Ok(rec)
        })?;
        self.write_registry_projection()?;
        Ok(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn revision(id: &str, revision: i64) -> ExtensionRevision {
        ExtensionRevision {
            record: ExtensionRecord {
                id: id.into(),
                version: "0.1.0".into(),
                enabled: true,
                manifest: json!({}),
                grants: Vec::new(),
                install_dir: format!("/nonexistent/{id}/{revision}"),
                component_hashes: json!({}),
                installed_at: 1,
                revision,
            },
            artifacts: vec![ArtifactRecord {
                component_sha256: "c".repeat(64),
                engine_key: "engine".into(),
                artifact_sha256: "a".repeat(64),
                recorded_at: 1,
            }],
            detail: json!({"id": id}),
        }
    }

    fn ops(k: &Kernel) -> usize {
        k.read(|tx| tx.ops(None, 10_000)).unwrap().len()
    }

    /// Which code runs in a project is an operator decision, whoever calls the kernel: an agent
    /// (even inside a turn) or a capability is refused every extension change through the
    /// library API, not only through `loopx extension`, and the refusal writes nothing.
    #[test]
    fn only_an_operator_changes_extensions_through_the_kernel() {
        let (_dir, mut k) = crate::kernel::test_project::empty();
        let not_operators = [
            Actor::Agent {
                agent_id: "a1".into(),
                proof: None,
                turn_key: None,
            },
            Actor::Agent {
                agent_id: "a1".into(),
                proof: None,
                turn_key: Some("turn-1".into()),
            },
            Actor::Capability {
                capability: "x/y".into(),
                agent_id: Some("a1".into()),
            },
        ];
        for actor in &not_operators {
            let err = k
                .record_extension_revision(actor, ExtensionChange::Install, &revision("ext", 1))
                .unwrap_err();
            assert_eq!(err.exit_code(), 1, "{actor:?}: {err}");
            assert!(
                err.to_string()
                    .contains("only an operator can install extensions"),
                "{err}"
            );
        }
        assert!(k.extensions().unwrap().is_empty());
        assert!(
            k.component_artifact(&"c".repeat(64), "engine")
                .unwrap()
                .is_none()
        );

        k.record_extension_revision(
            &Actor::Operator,
            ExtensionChange::Install,
            &revision("ext", 1),
        )
        .unwrap();
        let registry = std::fs::read_to_string(k.paths().registry()).unwrap();
        assert!(
            registry.contains("\"ext\""),
            "the kernel rewrote the projection: {registry}"
        );
        assert!(
            k.component_artifact(&"c".repeat(64), "engine")
                .unwrap()
                .is_some()
        );
        let before = ops(&k);
        for actor in &not_operators {
            let refusals = [
                k.record_extension_revision(actor, ExtensionChange::Upgrade, &revision("ext", 2))
                    .map(|_| ()),
                k.set_extension_enabled(actor, "ext", false).map(|_| ()),
                k.set_extension_enabled(actor, "ext", true).map(|_| ()),
                k.rollback_extension(actor, "ext").map(|_| ()),
                k.remove_extension(actor, "ext").map(|_| ()),
            ];
            for r in refusals {
                let err = r.unwrap_err();
                assert_eq!(err.exit_code(), 1, "{actor:?}: {err}");
                assert!(err.to_string().contains("only an operator can"), "{err}");
            }
        }
        assert_eq!(ops(&k), before, "a refused change logged something");
        let rec = k.extension("ext").unwrap().expect("still installed");
        assert!(rec.enabled);
        assert_eq!(rec.revision, 1);

        let removed = k.remove_extension(&Actor::Operator, "ext").unwrap();
        assert_eq!(removed.revision, 1);
        assert!(k.extension("ext").unwrap().is_none());
        let registry = std::fs::read_to_string(k.paths().registry()).unwrap();
        assert!(!registry.contains("\"ext\""), "{registry}");
    }

    /// An install of an id already installed, or an upgrade of one that is not, is refused in
    /// the kernel's own transaction as well as by the host's early check.
    #[test]
    fn install_and_upgrade_are_checked_against_the_registry_in_the_transaction() {
        let (_dir, mut k) = crate::kernel::test_project::empty();
        let err = k
            .record_extension_revision(
                &Actor::Operator,
                ExtensionChange::Upgrade,
                &revision("ext", 1),
            )
            .unwrap_err();
        assert_eq!(err.exit_code(), 3, "{err}");
        k.record_extension_revision(
            &Actor::Operator,
            ExtensionChange::Install,
            &revision("ext", 1),
        )
        .unwrap();
        let err = k
            .record_extension_revision(
                &Actor::Operator,
                ExtensionChange::Install,
                &revision("ext", 2),
            )
            .unwrap_err();
        assert_eq!(err.exit_code(), 4, "{err}");
        k.record_extension_revision(
            &Actor::Operator,
            ExtensionChange::Upgrade,
            &revision("ext", 2),
        )
        .unwrap();
        assert_eq!(k.extension("ext").unwrap().unwrap().revision, 2);
    }
}
