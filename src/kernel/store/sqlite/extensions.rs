//! Installed extensions, their revisions, and the recorded digests of precompiled component
//! artifacts.

use super::*;

impl Db<'_> {
    pub(super) fn upsert_extension(&self, rec: &ExtensionRecord) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO extension_revisions (id, revision, version, manifest, grants, install_dir, component_hashes, \
                 installed_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    rec.id,
                    rec.revision,
                    rec.version,
                    to_json(&rec.manifest),
                    to_json(&rec.grants),
                    rec.install_dir,
                    to_json(&rec.component_hashes),
                    rec.installed_at
                ],
            )
            .map_err(self.err("recording an extension revision"))?;
        self.conn
            .execute(
                "INSERT INTO extensions (id, active_revision, enabled) VALUES (?1, ?2, ?3) ON CONFLICT(id) DO UPDATE \
                 SET active_revision = excluded.active_revision, enabled = excluded.enabled",
                params![rec.id, rec.revision, rec.enabled],
            )
            .map_err(self.err("recording an extension"))?;
        Ok(())
    }

    pub(super) fn extension(&self, id: &str) -> Result<Option<ExtensionRecord>> {
        self.query_opt(
            "SELECT r.id, r.revision, r.version, r.manifest, r.grants, r.install_dir, r.component_hashes, \
             r.installed_at, e.enabled FROM extensions e JOIN extension_revisions r \
             ON r.id = e.id AND r.revision = e.active_revision WHERE e.id = ?1",
            [id],
            extension_from_row,
            "reading an extension",
        )
    }

    pub(super) fn extensions(&self) -> Result<Vec<ExtensionRecord>> {
        self.query_all(
            "SELECT r.id, r.revision, r.version, r.manifest, r.grants, r.install_dir, r.component_hashes, \
             r.installed_at, e.enabled FROM extensions e JOIN extension_revisions r \
             ON r.id = e.id AND r.revision = e.active_revision ORDER BY e.id",
            [],
            extension_from_row,
            "listing extensions",
        )
    }

    pub(super) fn extension_revisions(&self, id: &str) -> Result<Vec<ExtensionRecord>> {
        self.query_all(
            "SELECT r.id, r.revision, r.version, r.manifest, r.grants, r.install_dir, r.component_hashes, \
             r.installed_at, (e.active_revision = r.revision AND e.enabled) FROM extension_revisions r \
             LEFT JOIN extensions e ON e.id = r.id WHERE r.id = ?1 ORDER BY r.revision DESC",
            [id],
            extension_from_row,
            "listing extension revisions",
        )
    }

    pub(super) fn set_extension_active(
        &self,
        id: &str,
        revision: Option<i64>,
        enabled: bool,
    ) -> Result<()> {
        self.conn
            .execute(
                "UPDATE extensions SET active_revision = COALESCE(?2, active_revision), enabled = ?3 WHERE id = ?1",
                params![id, revision, enabled],
            )
            .map_err(self.err("updating an extension"))?;
        Ok(())
    }

    pub(super) fn delete_extension(&self, id: &str) -> Result<()> {
        self.conn
            .execute("DELETE FROM extensions WHERE id = ?1", [id])
            .map_err(self.err("removing an extension"))?;
        self.conn
            .execute("DELETE FROM extension_revisions WHERE id = ?1", [id])
            .map_err(self.err("removing an extension"))?;
        Ok(())
    }

    pub(super) fn component_artifact(
        &self,
        component_sha256: &str,
        engine_key: &str,
    ) -> Result<Option<ArtifactRecord>> {
        self.query_opt(
            "SELECT component_sha256, engine_key, artifact_sha256, recorded_at \
             FROM component_artifacts WHERE component_sha256 = ?1 AND engine_key = ?2",
            params![component_sha256, engine_key],
            artifact_from_row,
            "reading a component artifact record",
        )
    }

    pub(super) fn record_component_artifact(&self, rec: &ArtifactRecord) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO component_artifacts (component_sha256, engine_key, artifact_sha256, recorded_at) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT(component_sha256, engine_key) DO UPDATE \
                 SET artifact_sha256 = excluded.artifact_sha256, recorded_at = excluded.recorded_at",
                params![
                    rec.component_sha256,
                    rec.engine_key,
                    rec.artifact_sha256,
                    rec.recorded_at
                ],
            )
            .map_err(self.err("recording a component artifact"))?;
        Ok(())
    }

    pub(super) fn component_artifacts(&self) -> Result<Vec<ArtifactRecord>> {
        self.query_all(
            "SELECT component_sha256, engine_key, artifact_sha256, recorded_at \
             FROM component_artifacts ORDER BY component_sha256, engine_key",
            [],
            artifact_from_row,
            "listing component artifacts",
        )
    }
}
