//! The two numbers the change watcher (`kernel::watch`) tells a commit by.
//!
//! SQLite's `PRAGMA data_version` changes on this connection when another connection has
//! committed since it was last read, and never on a read; it can also move when another
//! connection checkpoints and restarts the WAL. It costs one look at the WAL index, so the
//! watcher reads it first. The operation log's newest rowid moves with every committed kernel
//! mutation (each appends exactly one row, and rows are never deleted) and with nothing else;
//! it costs one B-tree descent, so it only confirms what the first number suggests.

use super::*;

impl SqliteStore {
    pub(super) fn data_version(&self) -> Result<i64> {
        self.conn
            .query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0))
            .map_err(|e| map_err(&self.path, "reading the database's data_version", e))
    }

    pub(super) fn op_log_position(&self) -> Result<i64> {
        self.conn
            .query_row("SELECT coalesce(max(rowid), 0) FROM ops", [], |r| {
                r.get::<_, i64>(0)
            })
            .map_err(|e| map_err(&self.path, "reading the operation log's position", e))
    }
}
