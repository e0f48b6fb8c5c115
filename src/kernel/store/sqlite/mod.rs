//! SQLite implementation of the store traits: WAL, `synchronous=FULL`, `BEGIN IMMEDIATE` per
//! command.
//!
//! WAL lets readers (`quota should-run`, `status`) run beside the single writer; `synchronous=FULL`
//! makes every reported success survive power loss; taking the write lock at `BEGIN` means two
//! claimers serialize instead of one failing with a stale-snapshot upgrade error.
//!
//! One private module per responsibility: the connection and its transactions, row decoding and
//! error mapping shared by all queries, then one module per group of tables.

mod backup;
mod connection;
mod damage;
mod decode;
mod errors;
mod extensions;
mod goal_probes;
mod goals;
mod integrity;
mod monitors;
mod ops;
mod projection_cache;
mod quota;
mod retention;
mod runs;
mod todos;
mod turns;
mod tx;
mod wal_header;
mod watch;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::types::ValueRef;
use rusqlite::{
    Connection, ErrorCode, OpenFlags, OptionalExtension, Row, TransactionBehavior, params,
};

use super::migrations::MIGRATIONS;
use super::{
    ArtifactRecord, CommitSeq, OpRecord, ProjectedTodo, ProjectionCache, ProjectionCacheTx,
    SchemaUpgrade, Store, StoreRead, StoreTx, TodoLines, TodoOrder,
};
use crate::error::{LoopxError, NextAction, Result, conflict, msg};
use crate::model::{
    Claim, Evidence, ExtensionRecord, GateScope, Goal, GoalStatus, JournalStatus, LedgerEntry,
    LedgerKind, Phase, Priority, QuotaPolicy, Reward, Role, Run, Todo, TodoKind, TodoStatus,
    TurnRecord,
};

pub(crate) use connection::sync_directory;
use connection::*;
use damage::refuse_if_damaged;
pub use damage::{damage_marker, mark_damaged};
use decode::*;
use errors::*;
use tx::*;

/// An open SQLite database: one connection, used by one thread at a time.
pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
}

impl Store for SqliteStore {
    fn begin_read(&self) -> Result<Box<dyn StoreRead + '_>> {
        Ok(Box::new(SqliteTx::<Read>::begin(&self.conn, &self.path)?))
    }

    fn begin_write(&mut self) -> Result<Box<dyn StoreTx + '_>> {
        refuse_if_damaged(&self.path)?;
        Ok(Box::new(SqliteTx::<Write>::begin(&self.conn, &self.path)?))
    }

    fn refuse_if_damaged(&self) -> Result<()> {
        refuse_if_damaged(&self.path)
    }

    fn integrity_check(&self) -> Result<Vec<String>> {
        let db = Db::new(&self.conn, &self.path);
        let rows: Vec<String> = db.query_all(
            "PRAGMA integrity_check",
            [],
            |r| r.get::<_, String>(0),
            "running integrity_check",
        )?;
        Ok(rows.into_iter().filter(|r| r != "ok").collect())
    }

    fn content_problems(&self) -> Result<Vec<String>> {
        SqliteStore::content_problems(self)
    }

    fn schema_version(&self) -> Result<i64> {
        self.current_version()
    }

    fn backup_to(&self, dest: &Path) -> Result<u64> {
        SqliteStore::backup_to(self, dest)
    }

    fn vacuum(&mut self) -> Result<(u64, u64)> {
        SqliteStore::vacuum(self)
    }

    fn storage_bytes(&self) -> Result<(u64, u64)> {
        SqliteStore::storage_bytes(self)
    }

    fn data_version(&self) -> Result<i64> {
        SqliteStore::data_version(self)
    }

    fn op_log_position(&self) -> Result<i64> {
        SqliteStore::op_log_position(self)
    }
}
