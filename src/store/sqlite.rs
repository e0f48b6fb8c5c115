//! SQLite implementation of [`Store`]: WAL, `synchronous=FULL`, `BEGIN IMMEDIATE` per command.
//!
//! WAL lets readers (`quota should-run`, `status`) run beside the single writer; `synchronous=FULL`
//! makes every reported success survive power loss; taking the write lock at `BEGIN` means two
//! claimers serialize instead of one failing with a stale-snapshot upgrade error.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::types::ValueRef;
use rusqlite::{
    Connection, ErrorCode, OpenFlags, OptionalExtension, Row, TransactionBehavior, params,
};

use super::migrations::MIGRATIONS;
use super::{ArtifactRecord, OpRecord, ProjectedTodo, Store, StoreTx, TodoLines, TodoOrder};
use crate::error::{LoopxError, Result, conflict};
use crate::model::{
    Claim, Evidence, ExtensionRecord, GateScope, Goal, GoalStatus, JournalStatus, LedgerEntry,
    LedgerKind, Phase, Priority, QuotaPolicy, Reward, Role, Run, Todo, TodoKind, TodoStatus,
    TurnRecord,
};

/// How long a writer waits for the write lock before reporting a conflict.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
}

/// Classifies a SQLite failure: damage is `Corrupt` (exit 5, names the file), lock timeouts are
/// `Conflict`, a machine that refuses the I/O (full disk, read-only filesystem or database file,
/// permission, a failing device) is `Io` (exit 6), everything else is internal. `errno` is the OS
/// error SQLite saw (`sqlite3_system_errno`), 0 when unknown.
fn map_err(path: &Path, context: &str, err: rusqlite::Error) -> LoopxError {
    map_err_errno(path, context, err, 0)
}

fn map_err_errno(path: &Path, context: &str, err: rusqlite::Error, errno: i32) -> LoopxError {
    if let rusqlite::Error::SqliteFailure(e, _) = &err {
        match e.code {
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => {
                let detail = format!(
                    "{err} (while {context}); restore it from a backup or move it aside and run `loopx init`"
                );
                // SQLite found a damaged page: mark the project so that writes refuse instead
                // of building on the damage (`SqliteStore::begin_write`); `doctor` clears it.
                mark_damaged(path, &detail);
                return LoopxError::Corrupt {
                    path: path.to_path_buf(),
                    detail,
                };
            }
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
                return conflict(format!(
                    "the store {} is busy ({context}); retry",
                    path.display()
                ));
            }
            ErrorCode::DiskFull
            | ErrorCode::ReadOnly
            | ErrorCode::PermissionDenied
            | ErrorCode::SystemIoFailure
            | ErrorCode::CannotOpen => {
                let (source, context) = if errno != 0 {
                    (
                        std::io::Error::from_raw_os_error(errno),
                        format!("{context} in {} ({err})", path.display()),
                    )
                } else {
                    // SQLite did not see an OS error (it refused by itself, say to write a
                    // database it had to open read-only): its own words are the reason.
                    let kind = match e.code {
                        ErrorCode::DiskFull => std::io::ErrorKind::StorageFull,
                        ErrorCode::ReadOnly => std::io::ErrorKind::ReadOnlyFilesystem,
                        ErrorCode::PermissionDenied => std::io::ErrorKind::PermissionDenied,
                        _ => std::io::ErrorKind::Other,
                    };
                    (
                        std::io::Error::new(kind, err.to_string()),
                        format!("{context} in {}", path.display()),
                    )
                };
                return LoopxError::Io {
                    path: path.to_path_buf(),
                    context,
                    source,
                };
            }
            _ => {}
        }
    }
    if let Some(detail) = undecodable(&err) {
        // A row whose stored bytes do not decode (invalid UTF-8, JSON that does not parse, a
        // value of the wrong type) is damaged content, not a LoopX bug. Not marked like a damaged
        // page: the file is sound and one bad row must not stop every write (the row's owner
        // may still settle or replace it); `doctor` lists every such row.
        return LoopxError::Corrupt {
            path: path.to_path_buf(),
            detail: format!(
                "{detail} (while {context}); run `loopx doctor` for every damaged row, then restore from a backup"
            ),
        };
    }
    LoopxError::internal(format!("{context} in {}", path.display()), err)
}

/// The OS error behind the connection's last failure (0 when none). Read only on the error path.
fn system_errno(conn: &Connection) -> i32 {
    // SAFETY: `handle` is the live connection's own pointer, used for one read-only call on this
    // thread while `conn` is borrowed; `sqlite3_system_errno` only reads a field of it.
    unsafe { rusqlite::ffi::sqlite3_system_errno(conn.handle()) }
}

/// The description of a decoding failure, or `None` for any other error.
fn undecodable(err: &rusqlite::Error) -> Option<String> {
    match err {
        rusqlite::Error::FromSqlConversionFailure(_, _, inner) => {
            Some(match inner.downcast_ref::<RowDamage>() {
                Some(damage) => damage.to_string(),
                None => format!("a stored value does not decode: {inner}"),
            })
        }
        rusqlite::Error::Utf8Error(_)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => {
            Some(format!("a stored value does not decode: {err}"))
        }
        _ => None,
    }
}

/// A row that does not decode, with its table and key, so the error names what to repair.
#[derive(Debug)]
struct RowDamage {
    table: &'static str,
    key: String,
    reason: String,
}

impl std::fmt::Display for RowDamage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "row {} of table {} does not decode: {}",
            self.key, self.table, self.reason
        )
    }
}

impl std::error::Error for RowDamage {}

/// Runs a row decoder; a decoding failure is re-raised as [`RowDamage`] naming `table` and the
/// row's key (columns `keys`). Costs nothing unless the row is damaged.
fn locate<T>(
    row: &Row,
    table: &'static str,
    keys: &[usize],
    decode: impl FnOnce() -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    decode().map_err(|err| {
        if undecodable(&err).is_none() {
            return err;
        }
        let key: Vec<String> = keys
            .iter()
            .map(|&idx| match row.get_ref(idx) {
                Ok(ValueRef::Text(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                Ok(ValueRef::Integer(i)) => i.to_string(),
                Ok(other) => format!("{:?}", other.data_type()),
                Err(_) => "?".to_string(),
            })
            .collect();
        let reason = match &err {
            rusqlite::Error::FromSqlConversionFailure(idx, _, inner) => {
                format!("column {}: {inner}", column_name(row, *idx))
            }
            rusqlite::Error::InvalidColumnType(idx, name, ty) => {
                format!("column {name} (#{idx}) holds {ty}")
            }
            rusqlite::Error::IntegralValueOutOfRange(idx, v) => {
                format!("column {}: {v} is out of range", column_name(row, *idx))
            }
            other => other.to_string(),
        };
        rusqlite::Error::FromSqlConversionFailure(
            0,
            rusqlite::types::Type::Text,
            Box::new(RowDamage {
                table,
                key: format!("({})", key.join(", ")),
                reason,
            }),
        )
    })
}

fn column_name(row: &Row, idx: usize) -> String {
    row.as_ref()
        .column_name(idx)
        .map(str::to_string)
        .unwrap_or_else(|_| format!("#{idx}"))
}

/// The file whose existence tells every write that SQLite found a damaged page in this
/// project's database: `.loopx/CORRUPT` beside `loopx.db`. A file, not a row, because the write
/// path checks it with one `stat` before taking the write lock, and a damaged database may not
/// be able to hold a row.
pub const DAMAGE_MARKER: &str = "CORRUPT";

/// The damage marker of the database at `db`.
pub fn damage_marker(db: &Path) -> PathBuf {
    db.with_file_name(DAMAGE_MARKER)
}

/// Records that the database at `db` is damaged. Best effort: on a read-only or full disk the
/// command still fails with exit 5; only the later writes lose the early refusal (and SQLite
/// then reports the damage again on the pages they touch).
pub fn mark_damaged(db: &Path, detail: &str) {
    // Only a project's own database (`.loopx/loopx.db`): a damaged file met elsewhere, such as a
    // backup being written, must not leave a marker in a directory that is not a project.
    let is_project_db = db.file_name() == Some(std::ffi::OsStr::new(crate::paths::DB_FILE))
        && db.parent().and_then(Path::file_name)
            == Some(std::ffi::OsStr::new(crate::paths::STATE_DIR));
    if !is_project_db {
        return;
    }
    let marker = damage_marker(db);
    if marker.exists() {
        return;
    }
    let text = format!(
        "SQLite reported damage in {} at {} ms since the epoch:\n{detail}\n\
         Writes refuse while this file exists. Restore the database from a backup, then run \
         `loopx doctor`, which removes this file once the database checks healthy.\n",
        db.display(),
        crate::clock::now_ms()
    );
    let _ = std::fs::write(&marker, text);
}

/// Refuses a write when the damage marker exists: one `stat` (docs/decisions.md, "Writes stop
/// at the first sign of a damaged database").
fn refuse_if_damaged(db: &Path) -> Result<()> {
    let marker = damage_marker(db);
    match std::fs::symlink_metadata(&marker) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        _ => Err(LoopxError::Corrupt {
            path: db.to_path_buf(),
            detail: format!(
                "writes are refused: damage was found in this database ({} exists; it says what \
                 and when). Restore the database from a backup (`loopx backup` makes one), then \
                 run `loopx doctor`, which removes the marker once the database checks healthy",
                marker.display()
            ),
        }),
    }
}

impl SqliteStore {
    /// Creates the database (and runs migrations). Fails if it already exists.
    pub fn create(path: &Path) -> Result<SqliteStore> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| map_err(path, "creating the database", e))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| map_err(path, "enabling WAL", e))?;
        let mut store = SqliteStore {
            conn,
            path: path.to_path_buf(),
        };
        store.configure()?;
        store.migrate()?;
        store.sync_directory()?;
        Ok(store)
    }

    /// Opens an existing database. Never creates one: a missing file is `NotFound`, and an empty
    /// one is `Corrupt` (exit 5): `init` writes the first page before it returns, so an empty
    /// file is a database that lost its content (a truncation, a botched copy), and opening it
    /// would silently start an empty project in its place.
    ///
    /// On a read-only filesystem (or a database file the process may not write) SQLite opens the
    /// file read-only by itself; reads work as long as the WAL's index (`loopx.db-shm`) exists
    /// or the WAL is empty. When the index is missing and cannot be created, a database with an
    /// empty or missing WAL is opened `immutable` (nothing else can be writing a read-only file);
    /// one whose WAL holds frames cannot be read correctly without its index and is reported as
    /// an I/O failure (exit 6), never as damage.
    pub fn open(path: &Path) -> Result<SqliteStore> {
        let len = match std::fs::metadata(path) {
            Ok(meta) if meta.is_file() => meta.len(),
            Ok(_) => {
                return Err(LoopxError::Corrupt {
                    path: path.to_path_buf(),
                    detail:
                        "not a regular file; move it aside and restore the database from a backup"
                            .to_string(),
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(crate::error::not_found(format!(
                    "no LoopX database at {}; run `loopx init` in the project first",
                    path.display()
                )));
            }
            Err(e) => {
                return Err(LoopxError::io(
                    path,
                    format!("reading {}", path.display()),
                    e,
                ));
            }
        };
        if len == 0 {
            return Err(LoopxError::Corrupt {
                path: path.to_path_buf(),
                detail: "the database file is empty (0 bytes), so the project's state is gone; \
                         restore loopx.db and loopx.db-wal from a backup. It is never re-created \
                         in place: to start over, move .loopx aside and run `loopx init`"
                    .to_string(),
            });
        }
        let wal = wal_path(path);
        let wal_len = std::fs::metadata(&wal).map(|m| m.len()).ok();
        match Self::open_read_write(path) {
            Ok(store) => {
                if wal_len.is_none() {
                    // Only a new WAL needs its directory entry made durable, and only a store
                    // that could write one made it.
                    if !store.conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(true) {
                        store.sync_directory()?;
                    }
                }
                Ok(store)
            }
            Err(LoopxError::Io { .. }) if wal_len.unwrap_or(0) == 0 => Self::open_immutable(path),
            Err(LoopxError::Io {
                path: p,
                context,
                source,
            }) => Err(LoopxError::Io {
                path: p,
                context: format!(
                    "{context}; the database's write-ahead log ({}) holds changes that cannot be \
                     read without its index (loopx.db-shm), which cannot be created here: make the \
                     filesystem writable once, or copy the whole .loopx directory elsewhere",
                    wal.display()
                ),
                source,
            }),
            Err(e) => Err(e),
        }
    }

    fn open_read_write(path: &Path) -> Result<SqliteStore> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| map_err(path, "opening the database", e))?;
        let mut store = SqliteStore {
            conn,
            path: path.to_path_buf(),
        };
        store.configure()?;
        store.migrate()?;
        Ok(store)
    }

    /// Opens a database that has no WAL content read-only and `immutable`: SQLite then needs no
    /// WAL index and takes no locks. Only for a database nothing can be writing (see `open`).
    fn open_immutable(path: &Path) -> Result<SqliteStore> {
        let uri = format!("file:{}?immutable=1", uri_path(path));
        let conn = Connection::open_with_flags(
            &uri,
            OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_URI
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| map_err(path, "opening the database read-only", e))?;
        let store = SqliteStore {
            conn,
            path: path.to_path_buf(),
        };
        let current = store.current_version()?;
        let latest = MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
        if current != latest {
            return Err(LoopxError::Io {
                path: path.to_path_buf(),
                context: format!(
                    "the database {} is at schema version {current} and this loopx needs {latest}; \
                     it cannot be upgraded on a read-only filesystem",
                    path.display()
                ),
                source: std::io::Error::from(std::io::ErrorKind::ReadOnlyFilesystem),
            });
        }
        Ok(store)
    }

    /// A consistent copy of the database at `dest` through SQLite's online backup API, which
    /// reads every page in one read transaction (WAL content included) while writers go on. The
    /// copy is written to a temporary file beside `dest`, checked with `PRAGMA integrity_check`,
    /// synced, and only then linked into place, so `dest` never holds a partial copy; an existing
    /// `dest` is never replaced.
    pub fn backup_to(&self, dest: &Path) -> Result<u64> {
        let dir = match dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let tmp = dir.join(format!(
            ".{}.{}.backup-tmp",
            dest.file_name().and_then(|n| n.to_str()).unwrap_or("loopx"),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&tmp);
        let result = self.backup_into(&tmp).and_then(|pages| {
            // Never over an existing file, even one created after the caller looked.
            link_no_replace(&tmp, dest).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    crate::error::conflict(format!(
                        "{} already exists; a backup never replaces a file: choose a new path",
                        dest.display()
                    ))
                } else {
                    LoopxError::io(dest, format!("linking the backup to {}", dest.display()), e)
                }
            })?;
            sync_directory(&dir)?;
            Ok(pages)
        });
        let _ = std::fs::remove_file(&tmp);
        result
    }

    /// Copies every page into a new database file at `tmp`, checks it, and syncs it.
    fn backup_into(&self, tmp: &Path) -> Result<u64> {
        use rusqlite::backup::{Backup, StepResult};
        let mut copy = Connection::open_with_flags(
            tmp,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| map_err(tmp, "creating the backup file", e))?;
        // The copy is one self-contained file: its pages are written straight into it (rollback
        // journal, deleted at the end), not into a WAL beside it that could be lost.
        copy.pragma_update(None, "journal_mode", "DELETE")
            .map_err(|e| map_err(tmp, "preparing the backup file", e))?;
        let pages = {
            let backup = Backup::new(&self.conn, &mut copy)
                .map_err(|e| map_err(&self.path, "starting the backup", e))?;
            // All pages in one step: one read transaction, so the copy is one consistent
            // snapshot, and a concurrent writer does not restart the copy.
            loop {
                match backup
                    .step(-1)
                    .map_err(|e| map_err(&self.path, "copying pages", e))?
                {
                    StepResult::Done => break,
                    StepResult::More => continue,
                    StepResult::Busy | StepResult::Locked => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => continue,
                }
            }
            backup.progress().pagecount
        };
        // The pages were copied as they are, so damage in the copy is damage in the source: it is
        // reported against the project's database, and marks it like any damage SQLite reports.
        let problems: Vec<String> =
            match copy.prepare("PRAGMA integrity_check").and_then(|mut s| {
                s.query_map([], |r| r.get::<_, String>(0))?
                    .collect::<rusqlite::Result<Vec<String>>>()
            }) {
                Ok(rows) => rows.into_iter().filter(|r| r != "ok").collect(),
                Err(rusqlite::Error::SqliteFailure(f, message))
                    if matches!(f.code, ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) =>
                {
                    vec![message.unwrap_or_else(|| f.to_string())]
                }
                Err(e) => return Err(map_err(tmp, "checking the backup", e)),
            };
        if !problems.is_empty() {
            let detail = format!(
                "the backup copy fails PRAGMA integrity_check ({}), so this database is damaged; \
                 no backup was written. Run `loopx doctor`, and restore from an earlier backup",
                problems.join("; ")
            );
            mark_damaged(&self.path, &detail);
            return Err(LoopxError::Corrupt {
                path: self.path.clone(),
                detail,
            });
        }
        // A restored copy must run as the project's database does, in WAL mode (readers beside
        // the writer). Switching writes the mode into the file's header; closing the last
        // connection then checkpoints and deletes the new WAL, so the copy stays one file.
        copy.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| map_err(tmp, "finishing the backup file", e))?;
        copy.close()
            .map_err(|(_, e)| map_err(tmp, "closing the backup file", e))?;
        let mut copy_wal = tmp.as_os_str().to_owned();
        copy_wal.push("-wal");
        if std::path::Path::new(&copy_wal).exists() {
            return Err(LoopxError::internal(
                "finishing the backup file",
                anyhow::anyhow!(
                    "SQLite left {} behind after closing the copy",
                    tmp.display()
                ),
            ));
        }
        std::fs::File::open(tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| LoopxError::io(tmp, format!("syncing {}", tmp.display()), e))?;
        Ok(u64::try_from(pages).unwrap_or(0))
    }

    /// Makes the directory entries of the database and its WAL durable, for a process that just
    /// created either (`init`, or the first open after something removed the WAL). SQLite itself
    /// fsyncs the directory on the first commit of every process that opens the WAL, because it
    /// opens the WAL with `O_CREAT` and cannot tell whether it made it: a quarter of a
    /// millisecond on every write command. LoopX builds SQLite with `SQLITE_DISABLE_DIRSYNC`
    /// (`.cargo/config.toml`) and syncs the directory here instead, only when the entry is new.
    /// Called once the WAL is open (the schema has been read), before any commit is reported.
    fn sync_directory(&self) -> Result<()> {
        sync_directory(self.path.parent().unwrap_or(Path::new("")))
    }

    fn configure(&mut self) -> Result<()> {
        let path = self.path.clone();
        self.conn
            .busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| map_err(&path, "setting busy timeout", e))?;
        self.conn
            .execute_batch(&format!(
                "PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON; \
                 PRAGMA journal_size_limit={WAL_SIZE_LIMIT}; PRAGMA mmap_size={MMAP_BYTES};"
            ))
            .map_err(|e| {
                map_err_errno(
                    &path,
                    "configuring the connection",
                    e,
                    system_errno(&self.conn),
                )
            })?;
        // See WAL_CHECKPOINT_FRAMES: checkpoints are explicit, never automatic or on close. The
        // hook replaces SQLite's automatic checkpoint.
        self.conn.wal_hook(Some(note_wal_frames));
        self.conn
            .set_db_config(
                rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
                true,
            )
            .map_err(|e| map_err(&path, "configuring checkpoints", e))?;
        Ok(())
    }

    /// Brings the schema up to date. Reads `user_version` first so an up-to-date database (the
    /// common case) costs one read and takes no write lock.
    fn migrate(&mut self) -> Result<()> {
        let path = self.path.clone();
        let current = self.current_version()?;
        let latest = MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
        if current > latest {
            return Err(LoopxError::Corrupt {
                path,
                detail: format!(
                    "schema version {current} is newer than this loopx supports ({latest}); upgrade loopx"
                ),
            });
        }
        if current == latest {
            return Ok(());
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| map_err(&path, "starting migration", e))?;
        // Re-read under the write lock: another process may have migrated meanwhile.
        let current: i64 = tx
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| map_err(&path, "reading schema version", e))?;
        for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
            tx.execute_batch(sql)
                .map_err(|e| map_err(&path, &format!("applying migration {version}"), e))?;
            tx.pragma_update(None, "user_version", version)
                .map_err(|e| map_err(&path, "recording migration", e))?;
        }
        tx.commit()
            .map_err(|e| map_err(&path, "committing migration", e))
    }

    fn current_version(&self) -> Result<i64> {
        self.conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| map_err(&self.path, "reading schema version", e))
    }
}

/// Stored JSON columns, by table: each must parse as JSON wherever it is read. The turn journal's
/// `phases` and `data` are left to the journal's own check (`doctor`'s "turn journal").
const JSON_COLUMNS: &[(&str, &str)] = &[
    ("goals", "success_criteria"),
    ("todos", "gate_scope"),
    ("runs", "payload"),
    ("ops", "detail"),
    ("extension_revisions", "manifest"),
    ("extension_revisions", "grants"),
    ("extension_revisions", "component_hashes"),
];

/// References between rows that the schema does not enforce (only `todos.goal_id` is a foreign
/// key), as (what, query selecting the dangling row's key as text).
const REFERENCE_CHECKS: &[(&str, &str)] = &[
    (
        "todo -> goal",
        "SELECT t.goal_id || '/' || t.id FROM todos t WHERE NOT EXISTS (SELECT 1 FROM goals g WHERE g.id = t.goal_id)",
    ),
    (
        "dependency -> todo",
        "SELECT d.goal_id || '/' || d.todo_id || ' -> ' || d.depends_on FROM todo_deps d \
         WHERE NOT EXISTS (SELECT 1 FROM todos t WHERE t.goal_id = d.goal_id AND t.id = d.todo_id) \
            OR NOT EXISTS (SELECT 1 FROM todos t WHERE t.goal_id = d.goal_id AND t.id = d.depends_on)",
    ),
    (
        "evidence -> todo",
        "SELECT 'evidence ' || e.id || ' (' || e.goal_id || '/' || e.todo_id || ')' FROM evidence e \
         WHERE NOT EXISTS (SELECT 1 FROM todos t WHERE t.goal_id = e.goal_id AND t.id = e.todo_id)",
    ),
    (
        "evidence -> run",
        "SELECT 'evidence ' || e.id || ' -> run ' || e.run_id FROM evidence e \
         WHERE e.run_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = e.run_id)",
    ),
    (
        "run -> goal",
        "SELECT r.id || ' -> goal ' || r.goal_id FROM runs r WHERE NOT EXISTS (SELECT 1 FROM goals g WHERE g.id = r.goal_id)",
    ),
    (
        "run -> todo",
        "SELECT r.id || ' -> todo ' || r.goal_id || '/' || r.todo_id FROM runs r WHERE r.todo_id IS NOT NULL \
         AND NOT EXISTS (SELECT 1 FROM todos t WHERE t.goal_id = r.goal_id AND t.id = r.todo_id)",
    ),
    (
        "reward -> run",
        "SELECT 'reward ' || w.id || ' -> run ' || w.run_id FROM rewards w WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = w.run_id)",
    ),
    (
        "quota policy -> goal",
        "SELECT q.goal_id FROM quota_policy q WHERE NOT EXISTS (SELECT 1 FROM goals g WHERE g.id = q.goal_id)",
    ),
    (
        "ledger -> goal",
        "SELECT l.effect_id || ' -> goal ' || l.goal_id FROM quota_ledger l WHERE NOT EXISTS (SELECT 1 FROM goals g WHERE g.id = l.goal_id)",
    ),
    (
        "turn -> goal",
        "SELECT u.turn_key || ' -> goal ' || u.goal_id FROM turns u WHERE NOT EXISTS (SELECT 1 FROM goals g WHERE g.id = u.goal_id)",
    ),
    (
        "turn -> todo",
        "SELECT u.turn_key || ' -> todo ' || u.goal_id || '/' || u.todo_id FROM turns u WHERE u.todo_id IS NOT NULL \
         AND NOT EXISTS (SELECT 1 FROM todos t WHERE t.goal_id = u.goal_id AND t.id = u.todo_id)",
    ),
    (
        "extension -> revision",
        "SELECT e.id || ' revision ' || e.active_revision FROM extensions e \
         WHERE NOT EXISTS (SELECT 1 FROM extension_revisions r WHERE r.id = e.id AND r.revision = e.active_revision)",
    ),
];

/// At most this many problems of one kind are listed by [`SqliteStore::content_problems`]; the
/// rest are counted.
const PROBLEMS_LISTED: usize = 20;

impl SqliteStore {
    /// Checks the content `PRAGMA integrity_check` cannot see (for `doctor`; reads every row):
    /// text that is not UTF-8, stored JSON that does not parse, rows the readers cannot decode,
    /// and references to rows that do not exist. Each problem names its table and key.
    pub fn content_problems(&mut self) -> Result<Vec<String>> {
        let mut problems = Vec::new();
        self.scan_rows(&mut problems)?;
        for (what, sql) in REFERENCE_CHECKS {
            let dangling: Vec<String> = self
                .conn
                .prepare(sql)
                .and_then(|mut stmt| {
                    stmt.query_map([], |r| {
                        Ok(match r.get_ref(0)? {
                            ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
                            other => format!("{:?}", other.data_type()),
                        })
                    })?
                    .collect()
                })
                .map_err(|e| map_err(&self.path, "checking references", e))?;
            list_problems(&mut problems, &dangling, |key| {
                format!("dangling reference {what}: {key}")
            });
        }
        // Every row through the decoders the commands use, so whatever `doctor` passes, the
        // commands can read (enum values, integer ranges, column types).
        let tx = self.begin_read()?;
        let mut decode = |what: &str, result: Result<()>| {
            if let Err(e) = result {
                problems.push(format!("{what}: {e}"));
            }
        };
        let goals = tx.goals();
        let goal_ids: Vec<String> = match &goals {
            Ok(goals) => goals.iter().map(|g| g.id.clone()).collect(),
            Err(_) => Vec::new(),
        };
        decode("goals", goals.map(drop));
        for goal in &goal_ids {
            decode("todos", tx.todos(goal).map(drop));
            decode("runs", tx.runs(goal, i64::MAX as usize, None).map(drop));
            decode(
                "evidence",
                tx.recent_evidence(goal, i64::MAX as usize).map(drop),
            );
            decode(
                "rewards",
                tx.recent_rewards(goal, i64::MAX as usize).map(drop),
            );
            decode(
                "quota ledger",
                tx.recent_ledger(goal, i64::MAX as usize).map(drop),
            );
            decode("quota policy", tx.quota_policy(goal).map(drop));
        }
        decode("operation log", tx.ops(None, i64::MAX as usize).map(drop));
        decode("extensions", tx.extensions().map(drop));
        drop(tx);
        Ok(problems)
    }

    /// Every text value of every table checked for UTF-8, and every stored JSON column parsed.
    fn scan_rows(&self, problems: &mut Vec<String>) -> Result<()> {
        let err = |e| map_err(&self.path, "scanning rows", e);
        let tables: Vec<String> = self
            .conn
            .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
            .and_then(|mut stmt| stmt.query_map([], |r| r.get(0))?.collect())
            .map_err(err)?;
        for table in tables {
            // (name, primary-key position) of each column; the key names a damaged row.
            let columns: Vec<(String, i64)> = self
                .conn
                .prepare(&format!("PRAGMA table_info(\"{table}\")"))
                .and_then(|mut stmt| {
                    stmt.query_map([], |r| Ok((r.get(1)?, r.get(5)?)))?
                        .collect()
                })
                .map_err(err)?;
            let mut key: Vec<usize> = (0..columns.len()).filter(|&i| columns[i].1 > 0).collect();
            key.sort_by_key(|&i| columns[i].1);
            let json: Vec<bool> = columns
                .iter()
                .map(|(c, _)| JSON_COLUMNS.contains(&(table.as_str(), c.as_str())))
                .collect();
            let list = columns
                .iter()
                .map(|(c, _)| format!("\"{c}\""))
                .collect::<Vec<_>>()
                .join(", ");
            let mut stmt = self
                .conn
                .prepare(&format!("SELECT {list} FROM \"{table}\""))
                .map_err(err)?;
            let mut rows = stmt.query([]).map_err(err)?;
            let mut found = Vec::new();
            while let Some(row) = rows.next().map_err(err)? {
                for (idx, (column, _)) in columns.iter().enumerate() {
                    let ValueRef::Text(bytes) = row.get_ref(idx).map_err(err)? else {
                        continue;
                    };
                    let reason = match std::str::from_utf8(bytes) {
                        Err(e) => Some(format!("not UTF-8 ({e})")),
                        Ok(text) if json[idx] => serde_json::from_str::<serde_json::Value>(text)
                            .err()
                            .map(|e| format!("stored JSON does not parse ({e})")),
                        Ok(_) => None,
                    };
                    if let Some(reason) = reason {
                        let key_text: Vec<String> = key
                            .iter()
                            .map(|&k| match row.get_ref(k) {
                                Ok(ValueRef::Text(t)) => String::from_utf8_lossy(t).into_owned(),
                                Ok(ValueRef::Integer(i)) => i.to_string(),
                                _ => "?".to_string(),
                            })
                            .collect();
                        found.push(format!(
                            "table {table} row ({}) column {column}: {reason}",
                            key_text.join(", ")
                        ));
                    }
                }
            }
            list_problems(problems, &found, |p| p.to_string());
        }
        Ok(())
    }
}

/// Appends the first [`PROBLEMS_LISTED`] of `found`, formatted, and a count of the rest.
fn list_problems(problems: &mut Vec<String>, found: &[String], format: impl Fn(&str) -> String) {
    for item in found.iter().take(PROBLEMS_LISTED) {
        problems.push(format(item));
    }
    if found.len() > PROBLEMS_LISTED {
        problems.push(format!(
            "... and {} more like the above",
            found.len() - PROBLEMS_LISTED
        ));
    }
}

impl Store for SqliteStore {
    fn begin_read(&mut self) -> Result<Box<dyn StoreTx + '_>> {
        SqliteTx::begin(&self.conn, &self.path, false)
    }

    fn begin_write(&mut self) -> Result<Box<dyn StoreTx + '_>> {
        refuse_if_damaged(&self.path)?;
        SqliteTx::begin(&self.conn, &self.path, true)
    }

    fn integrity_check(&mut self) -> Result<Vec<String>> {
        let path = self.path.clone();
        let mut stmt = self
            .conn
            .prepare("PRAGMA integrity_check")
            .map_err(|e| map_err(&path, "running integrity_check", e))?;
        let rows: Vec<String> = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .and_then(|rows| rows.collect())
            .map_err(|e| map_err(&path, "running integrity_check", e))?;
        Ok(rows.into_iter().filter(|r| r != "ok").collect())
    }

    fn schema_version(&mut self) -> Result<i64> {
        self.current_version()
    }
}

/// One transaction on the connection. Ends with `commit`, or rolls back when dropped.
struct SqliteTx<'a> {
    conn: &'a Connection,
    path: &'a Path,
    writable: bool,
    finished: bool,
}

impl<'a> SqliteTx<'a> {
    fn begin(
        conn: &'a Connection,
        path: &'a Path,
        writable: bool,
    ) -> Result<Box<dyn StoreTx + 'a>> {
        let (sql, context) = if writable {
            ("BEGIN IMMEDIATE", "taking the write lock")
        } else {
            ("BEGIN DEFERRED", "starting a read")
        };
        conn.execute_batch(sql)
            .map_err(|e| map_err_errno(path, context, e, system_errno(conn)))?;
        Ok(Box::new(SqliteTx {
            conn,
            path,
            writable,
            finished: false,
        }))
    }
}

impl Drop for SqliteTx<'_> {
    fn drop(&mut self) {
        if !self.finished {
            // Rolling back a failed or abandoned transaction; an error here leaves SQLite to roll
            // back when the connection closes, which it does anyway.
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

/// Checkpoint once the WAL holds more frames than this (256 KiB of 4 KiB pages). Each CLI command
/// is a fresh process, and the first connection of a process rebuilds the WAL index by reading
/// every frame in the WAL: the WAL's length is a cost every command pays on open. SQLite's own
/// checkpoints do not fit that life: the one on close would cost every command (read-only ones
/// included) fsyncs of the database file, and a passive auto-checkpoint never lets the WAL start
/// over, because how much of it was copied back lives in the WAL index, which the next process
/// rebuilds from scratch. So the writer whose commit takes the WAL past this many frames copies
/// it into the database and starts the WAL over in place (see [`SqliteTx::restart_wal`]).
const WAL_CHECKPOINT_FRAMES: i32 = 64;

/// The WAL is cut back to this size when it starts over, should a large transaction have grown
/// it; below it the file keeps its blocks (see [`SqliteTx::restart_wal`]).
const WAL_SIZE_LIMIT: u64 = 1 << 20;

thread_local! {
    /// Frames in the WAL after this thread's last commit, as SQLite's WAL hook reports them (the
    /// file's length does not tell: the WAL is rewritten in place).
    static WAL_FRAMES: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

/// SQLite's WAL hook: runs inside each commit, on the committing thread.
fn note_wal_frames(_wal: &rusqlite::hooks::Wal, frames: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_FRAMES.set(frames);
    Ok(())
}

/// Database pages are read through a memory map instead of copied into SQLite's page cache: a
/// short-lived process then maps pages the kernel already caches instead of allocating and
/// zeroing fresh memory for each, which on a VM is most of the cost of a read.
const MMAP_BYTES: u64 = 1 << 30;

const TODO_COLUMNS: &str = "goal_id, id, role, kind, title, detail, priority, status, capability, lane, gate_scope, \
     claim_agent, claim_fence, claim_expires_at, claim_key, claimed_at, last_fence, status_reason, created_at, updated_at";
/// How many columns `TODO_COLUMNS` names; a query may select more after them.
const TODO_COLUMN_COUNT: usize = 20;

/// The ids of a goal's open user todos (gates), in listing order. Read by every `should-run` and
/// `claim`. Without statistics SQLite preferred scanning all of the goal's todos by primary key
/// and sorting them (0.95 M instructions at 1,000 todos) to the index that holds the few user
/// todos, hence `INDEXED BY`.
const OPEN_USER_TODO_IDS: &str = "SELECT id FROM todos INDEXED BY todos_by_role_status \
     WHERE goal_id = ?1 AND role = 'user' AND status NOT IN ('completed', 'archived') \
     ORDER BY priority, seq";

/// fsyncs the directory `dir`, so the entries created in it survive a power cut.
/// An empty path is the working directory.
pub(crate) fn sync_directory(dir: &Path) -> Result<()> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| LoopxError::internal(format!("syncing directory {}", dir.display()), e))
}

/// Gives the finished file `tmp` the name `dest`, failing with `AlreadyExists` if `dest` exists.
/// A hard link refuses an existing name atomically; filesystems without hard links (FAT on a USB
/// drive, some network mounts) get `renameat2(RENAME_NOREPLACE)`, which refuses it atomically too.
/// Only where neither exists is the name checked and then taken, with a window between the two.
fn link_no_replace(tmp: &Path, dest: &Path) -> std::io::Result<()> {
    let linked = std::fs::hard_link(tmp, dest);
    match &linked {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return linked,
        Err(_) => {}
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::ffi::OsStrExt;
        let from = std::ffi::CString::new(tmp.as_os_str().as_bytes())?;
        let to = std::ffi::CString::new(dest.as_os_str().as_bytes())?;
        // SAFETY: both paths are NUL-terminated strings that outlive the call; `AT_FDCWD`
        // resolves relative paths as `rename` would.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                from.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINVAL) {
            return Err(err);
        }
    }
    if dest.symlink_metadata().is_ok() {
        return Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists));
    }
    std::fs::rename(tmp, dest)
}

/// `path` as the path part of a SQLite `file:` URI (`%`, `?` and `#` escaped).
fn uri_path(path: &Path) -> String {
    let mut out = String::new();
    for c in path.to_string_lossy().chars() {
        match c {
            '%' => out.push_str("%25"),
            '?' => out.push_str("%3f"),
            '#' => out.push_str("%23"),
            c => out.push(c),
        }
    }
    out
}

/// SQLite's write-ahead log beside the database at `db`.
fn wal_path(db: &Path) -> PathBuf {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

/// A text column `idx` whose content does not decode.
fn bad_text(idx: usize, e: impl std::error::Error + Send + Sync + 'static) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e))
}

fn text_enum<T>(row: &Row, idx: usize, parse: fn(&str) -> Result<T>) -> rusqlite::Result<T> {
    // Borrowed, not a `String`: enum columns are read for every todo of every listing.
    let text = row.get_ref(idx)?.as_str()?;
    parse(text).map_err(|e| bad_text(idx, e))
}

fn json_col<T: serde::de::DeserializeOwned>(row: &Row, idx: usize) -> rusqlite::Result<T> {
    let text: String = row.get(idx)?;
    serde_json::from_str(&text).map_err(|e| bad_text(idx, e))
}

fn todo_from_row(row: &Row) -> rusqlite::Result<Todo> {
    let mut todo = Todo {
        id: String::new(),
        goal_id: String::new(),
        role: Role::Agent,
        kind: TodoKind::Task,
        title: String::new(),
        detail: String::new(),
        priority: Priority::P2,
        status: TodoStatus::Open,
        depends_on: Vec::new(),
        capability: None,
        lane: None,
        gate_scope: None,
        claim: None,
        last_fence: 0,
        status_reason: None,
        created_at: 0,
        updated_at: 0,
    };
    read_todo_located(row, &mut todo)?;
    Ok(todo)
}

/// [`read_todo_into`] naming the todo whose row does not decode.
fn read_todo_located(row: &Row, todo: &mut Todo) -> rusqlite::Result<()> {
    locate(row, "todos", &[0, 1], || read_todo_into(row, todo))
}

/// Decodes a `{TODO_COLUMNS}` row into `todo`, reusing its strings' buffers, so a listing of every
/// todo can run through one `Todo` without allocating per row. Leaves `depends_on` alone.
fn read_todo_into(row: &Row, todo: &mut Todo) -> rusqlite::Result<()> {
    fn text(row: &Row, idx: usize, dst: &mut String) -> rusqlite::Result<()> {
        dst.clear();
        dst.push_str(row.get_ref(idx)?.as_str()?);
        Ok(())
    }
    fn optional_text(row: &Row, idx: usize, dst: &mut Option<String>) -> rusqlite::Result<()> {
        match (row.get_ref(idx)?.as_str_or_null()?, dst.as_mut()) {
            (None, _) => *dst = None,
            (Some(value), Some(buf)) => {
                buf.clear();
                buf.push_str(value);
            }
            (Some(value), None) => *dst = Some(value.to_owned()),
        }
        Ok(())
    }
    text(row, 0, &mut todo.goal_id)?;
    text(row, 1, &mut todo.id)?;
    todo.role = text_enum(row, 2, Role::parse)?;
    todo.kind = text_enum(row, 3, TodoKind::parse)?;
    text(row, 4, &mut todo.title)?;
    text(row, 5, &mut todo.detail)?;
    todo.priority = Priority::from_rank(row.get(6)?);
    todo.status = text_enum(row, 7, TodoStatus::parse)?;
    optional_text(row, 8, &mut todo.capability)?;
    optional_text(row, 9, &mut todo.lane)?;
    todo.gate_scope = match row.get_ref(10)?.as_str_or_null()? {
        Some(text) => Some(serde_json::from_str::<GateScope>(text).map_err(|e| bad_text(10, e))?),
        None => None,
    };
    todo.claim = match row.get_ref(11)?.as_str_or_null()? {
        Some(agent_id) => Some(Claim {
            agent_id: agent_id.to_owned(),
            fence: row.get(12)?,
            expires_at: row.get(13)?,
            idempotency_key: row.get(14)?,
            claimed_at: row.get(15)?,
        }),
        None => None,
    };
    todo.last_fence = row.get(16)?;
    optional_text(row, 17, &mut todo.status_reason)?;
    todo.created_at = row.get(18)?;
    todo.updated_at = row.get(19)?;
    Ok(())
}

fn goal_from_row(row: &Row) -> rusqlite::Result<Goal> {
    locate(row, "goals", &[0], || {
        Ok(Goal {
            id: row.get(0)?,
            title: row.get(1)?,
            objective: row.get(2)?,
            success_criteria: json_col(row, 3)?,
            status: text_enum(row, 4, GoalStatus::parse)?,
            project_dir: row.get(5)?,
            next_probe: row.get(6)?,
            created_at: row.get(7)?,
            updated_at: row.get(8)?,
        })
    })
}

const GOAL_COLUMNS: &str = "id, title, objective, success_criteria, status, project_dir, next_probe, created_at, updated_at";

fn run_from_row(row: &Row) -> rusqlite::Result<Run> {
    locate(row, "runs", &[0], || {
        Ok(Run {
            id: row.get(0)?,
            goal_id: row.get(1)?,
            agent_id: row.get(2)?,
            todo_id: row.get(3)?,
            classification: row.get(4)?,
            outcome: row.get(5)?,
            summary: row.get(6)?,
            payload: json_col(row, 7)?,
            created_at: row.get(8)?,
        })
    })
}

const RUN_COLUMNS: &str =
    "id, goal_id, agent_id, todo_id, classification, outcome, summary, payload, created_at";

fn evidence_from_row(row: &Row) -> rusqlite::Result<Evidence> {
    locate(row, "evidence", &[0], || {
        Ok(Evidence {
            id: row.get(0)?,
            goal_id: row.get(1)?,
            todo_id: row.get(2)?,
            text: row.get(3)?,
            artifact_path: row.get(4)?,
            artifact_digest: row.get(5)?,
            run_id: row.get(6)?,
            actor: row.get(7)?,
            created_at: row.get(8)?,
        })
    })
}

const EVIDENCE_COLUMNS: &str =
    "id, goal_id, todo_id, text, artifact_path, artifact_digest, run_id, actor, created_at";

fn reward_from_row(row: &Row) -> rusqlite::Result<Reward> {
    locate(row, "rewards", &[0], || {
        Ok(Reward {
            id: row.get(0)?,
            goal_id: row.get(1)?,
            run_id: row.get(2)?,
            score: row.get(3)?,
            comment: row.get(4)?,
            actor: row.get(5)?,
            created_at: row.get(6)?,
        })
    })
}

fn ledger_from_row(row: &Row) -> rusqlite::Result<LedgerEntry> {
    locate(row, "quota_ledger", &[0], || {
        Ok(LedgerEntry {
            effect_id: row.get(0)?,
            goal_id: row.get(1)?,
            agent_id: row.get(2)?,
            run_id: row.get(3)?,
            slots: row.get(4)?,
            kind: text_enum(row, 5, LedgerKind::parse)?,
            voids_effect_id: row.get(6)?,
            created_at: row.get(7)?,
        })
    })
}

const LEDGER_COLUMNS: &str =
    "effect_id, goal_id, agent_id, run_id, slots, kind, voids_effect_id, created_at";

fn artifact_from_row(row: &Row) -> rusqlite::Result<ArtifactRecord> {
    Ok(ArtifactRecord {
        component_sha256: row.get(0)?,
        engine_key: row.get(1)?,
        artifact_sha256: row.get(2)?,
        recorded_at: row.get(3)?,
    })
}

fn extension_from_row(row: &Row) -> rusqlite::Result<ExtensionRecord> {
    locate(row, "extension_revisions", &[0, 1], || {
        Ok(ExtensionRecord {
            id: row.get(0)?,
            revision: row.get(1)?,
            version: row.get(2)?,
            manifest: json_col(row, 3)?,
            grants: json_col(row, 4)?,
            install_dir: row.get(5)?,
            component_hashes: json_col(row, 6)?,
            installed_at: row.get(7)?,
            enabled: row.get::<_, Option<bool>>(8)?.unwrap_or(false),
        })
    })
}

fn turn_from_row(row: &Row) -> rusqlite::Result<TurnRecord> {
    // `phases` and `data` are decoded leniently: a row whose JSON cannot be read back (invalid
    // UTF-8, nesting beyond serde_json's reader limit, a damaged page) is returned with
    // `data_error` set instead of failing the whole query, so recovery, `turn list` and every
    // other agent's turn keep working while the driver settles that one row.
    let lenient = |idx: usize| -> rusqlite::Result<(String, Option<String>)> {
        match row.get_ref(idx)? {
            ValueRef::Text(bytes) => match std::str::from_utf8(bytes) {
                Ok(t) => Ok((t.to_string(), None)),
                Err(e) => Ok((
                    String::from_utf8_lossy(bytes).into_owned(),
                    Some(format!("not UTF-8: {e}")),
                )),
            },
            other => Ok((
                String::new(),
                Some(format!("stored as {:?}, not text", other.data_type())),
            )),
        }
    };
    let (phases_text, phases_err) = lenient(5)?;
    let (data_text, data_err) = lenient(6)?;
    let phases = match phases_err.map_or_else(
        || serde_json::from_str::<Vec<Phase>>(&phases_text).map_err(|e| e.to_string()),
        Err,
    ) {
        Ok(p) => Ok(p),
        Err(e) => Err(format!("phases: {e}")),
    };
    let data = match data_err.map_or_else(
        || serde_json::from_str::<serde_json::Value>(&data_text).map_err(|e| e.to_string()),
        Err,
    ) {
        Ok(d) => Ok(d),
        Err(e) => Err(format!("data: {e}")),
    };
    let status_text: String = row.get(4)?;
    let status = JournalStatus::parse(&status_text)
        .map_err(|_| format!("status: unknown journal status '{status_text}'"));
    let (phases, data, data_error) = match (phases, data, &status) {
        (Ok(p), Ok(d), Ok(_)) => (p, d, None),
        (p, d, _) => {
            let why: Vec<String> = [p.as_ref().err(), d.as_ref().err(), status.as_ref().err()]
                .into_iter()
                .flatten()
                .cloned()
                .collect();
            (
                p.unwrap_or_default(),
                serde_json::Value::String(data_text),
                Some(why.join("; ")),
            )
        }
    };
    Ok(TurnRecord {
        turn_key: row.get(0)?,
        goal_id: row.get(1)?,
        agent_id: row.get(2)?,
        todo_id: row.get(3)?,
        // A status nobody wrote is settled like any undecodable row: recovery sees it unsettled
        // and `data_error` says why.
        status: status.unwrap_or(JournalStatus::InProgress),
        phases,
        data,
        created_at: row.get(7)?,
        updated_at: row.get(8)?,
        data_error,
    })
}

const TURN_COLUMNS: &str =
    "turn_key, goal_id, agent_id, todo_id, status, phases, data, created_at, updated_at";

/// The valid cached lines of a `for_each_projected_todo` row (`view_key, view_json, view_md, id,
/// valid`), or `None` when the todo must be rendered.
fn cached_lines<'r>(row: &'r Row<'_>) -> rusqlite::Result<Option<TodoLines<'r>>> {
    if !row.get::<_, bool>(4)? {
        return Ok(None);
    }
    let (ValueRef::Integer(key), ValueRef::Text(json), ValueRef::Text(md)) =
        (row.get_ref(0)?, row.get_ref(1)?, row.get_ref(2)?)
    else {
        return Ok(None);
    };
    let Some((order, role, status)) = unpack_view_key(key) else {
        return Ok(None);
    };
    // Cached lines are derived data: lines that are not UTF-8 (a damaged page, a stray write) are
    // no reason to fail the command; the todo is rendered from its row instead, and the next
    // refresh caches fresh lines over them.
    let (Ok(json), Ok(md)) = (std::str::from_utf8(json), std::str::from_utf8(md)) else {
        return Ok(None);
    };
    Ok(Some(TodoLines {
        order,
        role,
        status,
        json,
        md,
    }))
}

/// Bits of `view_key` holding the todo's creation sequence; above them the priority rank (4 bits),
/// the status and the role (4 bits each, their position in `ALL`).
const VIEW_KEY_SEQ_BITS: u32 = 44;

/// Packs a cached todo's order, role and status into the `view_key` column; `None` when a value
/// does not fit (the todo is then simply not cached).
fn pack_view_key(lines: &TodoLines<'_>) -> Option<i64> {
    let TodoOrder { priority_rank, seq } = lines.order;
    let fits = (0..1i64 << VIEW_KEY_SEQ_BITS).contains(&seq) && (0..16).contains(&priority_rank);
    fits.then_some(
        (lines.role as i64) << (VIEW_KEY_SEQ_BITS + 8)
            | (lines.status as i64) << (VIEW_KEY_SEQ_BITS + 4)
            | priority_rank << VIEW_KEY_SEQ_BITS
            | seq,
    )
}

/// The inverse of [`pack_view_key`]; `None` for a key it could not have written.
fn unpack_view_key(key: i64) -> Option<(TodoOrder, Role, TodoStatus)> {
    let field = |shift: u32| ((key >> shift) & 0xf) as usize;
    let role = *Role::ALL.get(field(VIEW_KEY_SEQ_BITS + 8))?;
    let status = *TodoStatus::ALL.get(field(VIEW_KEY_SEQ_BITS + 4))?;
    if key >> (VIEW_KEY_SEQ_BITS + 12) != 0 {
        return None;
    }
    let order = TodoOrder::new(
        field(VIEW_KEY_SEQ_BITS) as i64,
        key & ((1 << VIEW_KEY_SEQ_BITS) - 1),
    );
    Some((order, role, status))
}

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("kernel records always serialize")
}

impl SqliteTx<'_> {
    /// Copies the WAL into the database and starts it over from its first frame, keeping the
    /// file's blocks. Truncating it instead (SQLite's `TRUNCATE` checkpoint) gave the blocks
    /// back: the `ftruncate` took over a millisecond on this disk (mounted with `discard`), and
    /// every commit after it appended to a growing file, whose fsync must also write the file's
    /// new size and block map (0.8-1.0 ms, against 0.4 ms for overwriting written blocks).
    ///
    /// A `RESTART` checkpoint records that every frame was copied only in this process's WAL
    /// index. The next process rebuilds the index from the file, would count the old frames as
    /// live and append after them; so this process writes once more, rewriting `user_version`
    /// with its own value. That commit's frame goes to the start of the WAL under a new salt,
    /// which ends the old frames for every later reader.
    fn restart_wal(&self) -> rusqlite::Result<()> {
        let (busy, frames, copied): (i64, i64, i64) =
            self.conn
                .query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
        if busy != 0 || frames != copied {
            return Ok(()); // a reader held on to the WAL; the next writer tries again
        }
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let written = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))
            .and_then(|version| {
                self.conn
                    .execute_batch(&format!("PRAGMA user_version = {version}; COMMIT"))
            });
        if written.is_err() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        written
    }

    /// The error mapping for one call site. The context is static, so mapping costs nothing
    /// until an error happens: row loops call this once per row.
    fn err(&self, context: &'static str) -> impl FnOnce(rusqlite::Error) -> LoopxError + '_ {
        move |e| map_err_errno(self.path, context, e, system_errno(self.conn))
    }

    fn ensure_writable(&self) -> Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(LoopxError::internal(
                "store write",
                anyhow::anyhow!("write attempted inside a read snapshot"),
            ))
        }
    }

    fn deps_of(&self, goal_id: &str, todo_id: &str) -> Result<Vec<String>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT depends_on FROM todo_deps WHERE goal_id = ?1 AND todo_id = ?2 ORDER BY depends_on")
            .map_err(self.err("reading dependencies"))?;
        let deps = stmt
            .query_map(params![goal_id, todo_id], |r| r.get(0))
            .and_then(|rows| rows.collect())
            .map_err(self.err("reading dependencies"))?;
        Ok(deps)
    }

    fn with_deps(&self, mut todos: Vec<Todo>) -> Result<Vec<Todo>> {
        for todo in &mut todos {
            todo.depends_on = self.deps_of(&todo.goal_id, &todo.id)?;
        }
        Ok(todos)
    }

    /// The goal's todos whose ids `sql` selects (its first column), in that order, each then read
    /// in full by its key. Queries that pick a few todos select only ids because SQLite's cost
    /// of preparing a statement grows with its result columns (about 15 K instructions per
    /// column in the ordered queries with subqueries here, against 4 K in a lookup by key), and
    /// every process prepares afresh; an id-only query can also run from an index alone.
    fn todos_by_selected_ids(
        &self,
        goal_id: &str,
        sql: &str,
        params: impl rusqlite::Params,
        context: &'static str,
    ) -> Result<Vec<Todo>> {
        let ids: Vec<String> = self
            .conn
            .prepare_cached(sql)
            .and_then(|mut stmt| stmt.query_map(params, |r| r.get(0))?.collect())
            .map_err(self.err(context))?;
        self.todos_by_id(goal_id, &ids)
    }

    /// The goal's todos `ids`, in that order, read in the same transaction that selected them.
    fn todos_by_id(&self, goal_id: &str, ids: &[String]) -> Result<Vec<Todo>> {
        ids.iter()
            .map(|id| {
                self.todo(goal_id, id)?.ok_or_else(|| {
                    LoopxError::internal(
                        "reading selected todos",
                        anyhow::anyhow!("todo {goal_id}/{id} vanished within its transaction"),
                    )
                })
            })
            .collect()
    }

    /// Calls `visit` for each of a goal's todos matching `and_where` (SQL appended to
    /// `WHERE goal_id = ?1`), in key order, decoded one by one into the same `Todo`, with its
    /// dependencies (loaded in one pass, not one query per todo) and its listing-order key.
    /// Rows are read as stored: an `ORDER BY priority, seq` would copy every full row through
    /// SQLite's sorter, or, along an index, look each row up by its key; both cost more than
    /// letting the caller order the small keys.
    fn visit_todos(
        &self,
        and_where: &str,
        params: impl rusqlite::Params,
        visit: &mut dyn FnMut(&Todo, TodoOrder) -> Result<()>,
    ) -> Result<()> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {TODO_COLUMNS}, seq FROM todos WHERE goal_id = ?1{and_where}"
            ))
            .map_err(self.err("listing todos"))?;
        let mut rows = stmt.query(params).map_err(self.err("listing todos"))?;
        let mut current: Option<Todo> = None;
        let mut deps: Option<std::collections::HashMap<String, Vec<String>>> = None;
        while let Some(row) = rows.next().map_err(self.err("listing todos"))? {
            let todo = match current.as_mut() {
                Some(todo) => {
                    read_todo_located(row, todo).map_err(self.err("listing todos"))?;
                    todo
                }
                None => current.insert(todo_from_row(row).map_err(self.err("listing todos"))?),
            };
            let deps = match &mut deps {
                Some(deps) => deps,
                None => deps.insert(self.goal_deps(&todo.goal_id)?),
            };
            todo.depends_on = deps.remove(&todo.id).unwrap_or_default();
            let seq = row
                .get(TODO_COLUMN_COUNT)
                .map_err(self.err("listing todos"))?;
            visit(todo, TodoOrder::new(todo.priority.rank(), seq))?;
        }
        Ok(())
    }

    /// Every dependency of a goal's todos, by todo id.
    fn goal_deps(&self, goal_id: &str) -> Result<std::collections::HashMap<String, Vec<String>>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT todo_id, depends_on FROM todo_deps WHERE goal_id = ?1 ORDER BY todo_id, depends_on")
            .map_err(self.err("listing dependencies"))?;
        let rows = stmt
            .query_map([goal_id], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(self.err("listing dependencies"))?;
        let mut by_todo: std::collections::HashMap<String, Vec<String>> =
            std::collections::HashMap::new();
        for row in rows {
            let (todo_id, dep) = row.map_err(self.err("listing dependencies"))?;
            by_todo.entry(todo_id).or_default().push(dep);
        }
        Ok(by_todo)
    }

    fn write_todo(&self, todo: &Todo, insert: bool) -> Result<()> {
        self.ensure_writable()?;
        let gate_scope = todo.gate_scope.as_ref().map(to_json);
        let claim = todo.claim.as_ref();
        let values = params![
            todo.goal_id,
            todo.id,
            todo.role.as_str(),
            todo.kind.as_str(),
            todo.title,
            todo.detail,
            todo.priority.rank(),
            todo.status.as_str(),
            todo.capability,
            todo.lane,
            gate_scope,
            claim.map(|c| c.agent_id.clone()),
            claim.map(|c| c.fence),
            claim.map(|c| c.expires_at),
            claim.map(|c| c.idempotency_key.clone()),
            claim.map(|c| c.claimed_at),
            todo.last_fence,
            todo.status_reason,
            todo.created_at,
            todo.updated_at,
        ];
        if insert {
            let sql = format!(
                "INSERT INTO todos ({TODO_COLUMNS}, seq) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, \
                 ?14, ?15, ?16, ?17, ?18, ?19, ?20, (SELECT COALESCE(MAX(seq), 0) + 1 FROM todos WHERE goal_id = ?1))"
            );
            self.conn
                .prepare_cached(&sql)
                .and_then(|mut s| s.execute(values))
                .map_err(self.err("inserting a todo"))?;
            let mut dep = self
                .conn
                .prepare_cached("INSERT OR IGNORE INTO todo_deps (goal_id, todo_id, depends_on) VALUES (?1, ?2, ?3)")
                .map_err(self.err("inserting dependencies"))?;
            for d in &todo.depends_on {
                dep.execute(params![todo.goal_id, todo.id, d])
                    .map_err(self.err("inserting dependencies"))?;
            }
        } else {
            let sql = "UPDATE todos SET role = ?3, kind = ?4, title = ?5, detail = ?6, priority = ?7, status = ?8, \
                 capability = ?9, lane = ?10, gate_scope = ?11, claim_agent = ?12, claim_fence = ?13, \
                 claim_expires_at = ?14, claim_key = ?15, claimed_at = ?16, last_fence = ?17, status_reason = ?18, \
                 created_at = ?19, updated_at = ?20, view_format = NULL, view_json = NULL, view_md = NULL, view_key = NULL \
                 WHERE goal_id = ?1 AND id = ?2";
            self.conn
                .prepare_cached(sql)
                .and_then(|mut s| s.execute(values))
                .map_err(self.err("updating a todo"))?;
        }
        Ok(())
    }
}

impl StoreTx for SqliteTx<'_> {
    fn commit(mut self: Box<Self>) -> Result<()> {
        let path = self.path;
        self.conn
            .execute_batch("COMMIT")
            .map_err(|e| map_err_errno(path, "committing", e, system_errno(self.conn)))?;
        self.finished = true;
        if self.writable && WAL_FRAMES.take() > WAL_CHECKPOINT_FRAMES {
            // The commit is already durable; a failed checkpoint only means the next writer
            // tries again.
            let _ = self.restart_wal();
        }
        Ok(())
    }

    fn insert_goal(&self, goal: &Goal) -> Result<()> {
        self.ensure_writable()?;
        self.conn
            .execute(
                &format!(
                    "INSERT INTO goals ({GOAL_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
                ),
                params![
                    goal.id,
                    goal.title,
                    goal.objective,
                    to_json(&goal.success_criteria),
                    goal.status.as_str(),
                    goal.project_dir,
                    goal.next_probe,
                    goal.created_at,
                    goal.updated_at
                ],
            )
            .map_err(self.err("inserting a goal"))?;
        Ok(())
    }

    fn goal(&self, id: &str) -> Result<Option<Goal>> {
        self.conn
            .prepare_cached(&format!("SELECT {GOAL_COLUMNS} FROM goals WHERE id = ?1"))
            .and_then(|mut s| s.query_row([id], goal_from_row).optional())
            .map_err(self.err("reading a goal"))
    }

    fn goals(&self) -> Result<Vec<Goal>> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {GOAL_COLUMNS} FROM goals ORDER BY created_at, id"
            ))
            .map_err(self.err("listing goals"))?;
        stmt.query_map([], goal_from_row)
            .and_then(|rows| rows.collect())
            .map_err(self.err("listing goals"))
    }

    fn update_goal(&self, goal: &Goal) -> Result<()> {
        self.ensure_writable()?;
        self.conn
            .execute(
                "UPDATE goals SET title = ?2, objective = ?3, success_criteria = ?4, status = ?5, project_dir = ?6, \
                 next_probe = ?7, updated_at = ?8 WHERE id = ?1",
                params![
                    goal.id,
                    goal.title,
                    goal.objective,
                    to_json(&goal.success_criteria),
                    goal.status.as_str(),
                    goal.project_dir,
                    goal.next_probe,
                    goal.updated_at
                ],
            )
            .map_err(self.err("updating a goal"))?;
        Ok(())
    }

    fn goal_ids_with_status(&self, status: GoalStatus) -> Result<Vec<String>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id FROM goals WHERE status = ?1 ORDER BY created_at, id")
            .map_err(self.err("listing goals"))?;
        stmt.query_map([status.as_str()], |r| r.get(0))
            .and_then(|rows| rows.collect())
            .map_err(self.err("listing goals"))
    }

    fn insert_todo(&self, todo: &Todo) -> Result<()> {
        self.write_todo(todo, true)
    }

    fn update_todo(&self, todo: &Todo) -> Result<()> {
        self.write_todo(todo, false)
    }

    fn todo(&self, goal_id: &str, todo_id: &str) -> Result<Option<Todo>> {
        let todo = self
            .conn
            .prepare_cached(&format!(
                "SELECT {TODO_COLUMNS} FROM todos WHERE goal_id = ?1 AND id = ?2"
            ))
            .and_then(|mut s| {
                s.query_row(params![goal_id, todo_id], todo_from_row)
                    .optional()
            })
            .map_err(self.err("reading a todo"))?;
        match todo {
            Some(t) => Ok(self.with_deps(vec![t])?.pop()),
            None => Ok(None),
        }
    }

    fn todos(&self, goal_id: &str) -> Result<Vec<Todo>> {
        let mut rows = Vec::new();
        self.for_each_todo(goal_id, &mut |todo, order| {
            rows.push((order, todo.clone()));
            Ok(())
        })?;
        // Sort the keys, then move each todo once: todos are hundreds of bytes each.
        let mut keys: Vec<(TodoOrder, usize)> = rows
            .iter()
            .enumerate()
            .map(|(i, (order, _))| (*order, i))
            .collect();
        keys.sort_unstable();
        let mut slots: Vec<Option<Todo>> = rows.into_iter().map(|(_, t)| Some(t)).collect();
        Ok(keys
            .iter()
            .map(|&(_, i)| slots[i].take().expect("each index once"))
            .collect())
    }

    fn for_each_todo(
        &self,
        goal_id: &str,
        visit: &mut dyn FnMut(&Todo, TodoOrder) -> Result<()>,
    ) -> Result<()> {
        self.visit_todos("", params![goal_id], visit)
    }

    fn for_each_projected_todo(
        &self,
        goal_id: &str,
        format: i64,
        visit: &mut dyn FnMut(ProjectedTodo<'_>) -> Result<()>,
    ) -> Result<()> {
        // One scan over the cached lines and their packed keys; the todos without valid lines (in
        // a tick, the one just completed and the claimed ones) are then read in full by key. A
        // second scan filtered on the cache columns would walk every row again to find those few.
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT view_key, view_json, view_md, id, view_format IS ?2 AND claim_agent IS NULL \
                 FROM todos WHERE goal_id = ?1",
            )
            .map_err(self.err("listing projected todos"))?;
        let mut rows = stmt
            .query(params![goal_id, format])
            .map_err(self.err("listing projected todos"))?;
        let mut uncached: Vec<String> = Vec::new();
        while let Some(row) = rows.next().map_err(self.err("listing projected todos"))? {
            match cached_lines(row).map_err(self.err("listing projected todos"))? {
                Some(lines) => visit(ProjectedTodo::Cached(lines))?,
                None => uncached.push(row.get(3).map_err(self.err("listing projected todos"))?),
            }
        }
        if uncached.is_empty() {
            return Ok(());
        }
        self.visit_todos(
            " AND id IN (SELECT value FROM json_each(?2))",
            params![goal_id, to_json(&uncached)],
            &mut |todo, order| visit(ProjectedTodo::Uncached(todo, order)),
        )
    }

    fn cache_projected_todo(
        &self,
        goal_id: &str,
        todo_id: &str,
        format: i64,
        lines: &TodoLines<'_>,
    ) -> Result<()> {
        self.ensure_writable()?;
        let Some(key) = pack_view_key(lines) else {
            return Ok(()); // out of the packed range: rendered afresh each time instead
        };
        self.conn
            .prepare_cached(
                "UPDATE todos SET view_format = ?3, view_json = ?4, view_md = ?5, view_key = ?6 \
                 WHERE goal_id = ?1 AND id = ?2",
            )
            .and_then(|mut s| {
                s.execute(params![goal_id, todo_id, format, lines.json, lines.md, key])
            })
            .map_err(self.err("caching projection lines"))?;
        Ok(())
    }

    fn todo_count(&self, goal_id: &str) -> Result<i64> {
        self.conn
            .prepare_cached("SELECT COUNT(*) FROM todos WHERE goal_id = ?1")
            .and_then(|mut s| s.query_row([goal_id], |r| r.get(0)))
            .map_err(self.err("counting todos"))
    }

    fn ready_todos(&self, goal_id: &str, now: i64, limit: usize) -> Result<Vec<Todo>> {
        // Two simple queries, not one: each walks `todos_by_role_status` in priority order and
        // stops after `limit` todos whose dependencies are all completed (open ones, and claimed
        // ones whose lease expired), and the two short lists are merged here. A compound SELECT
        // costs twice as much to prepare, and a bound LIMIT makes SQLite re-prepare it; both are
        // paid by every process.
        let deps_met = "NOT EXISTS (SELECT 1 FROM todo_deps d WHERE d.goal_id = t.goal_id AND d.todo_id = t.id \
             AND NOT EXISTS (SELECT 1 FROM todos u WHERE u.goal_id = d.goal_id AND u.id = d.depends_on \
             AND u.status = 'completed'))";
        // Only the keys are selected (see `todos_by_selected_ids`); the winners are read in full.
        let open = format!(
            "SELECT id, priority, seq FROM todos t WHERE t.goal_id = ?1 AND t.role = 'agent' \
             AND t.status = 'open' AND {deps_met} ORDER BY t.priority, t.seq LIMIT {limit}"
        );
        let expired = format!(
            "SELECT id, priority, seq FROM todos t WHERE t.goal_id = ?1 AND t.role = 'agent' \
             AND t.status = 'claimed' AND t.claim_expires_at <= ?2 AND {deps_met} \
             ORDER BY t.priority, t.seq LIMIT {limit}"
        );
        let context = "selecting ready todos";
        let mut keys: Vec<(TodoOrder, String)> = Vec::new();
        for (sql, params) in [(&open, params![goal_id]), (&expired, params![goal_id, now])] {
            let mut stmt = self.conn.prepare_cached(sql).map_err(self.err(context))?;
            let rows = stmt
                .query_map(params, |r| {
                    Ok((TodoOrder::new(r.get(1)?, r.get(2)?), r.get(0)?))
                })
                .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                .map_err(self.err(context))?;
            keys.extend(rows);
        }
        keys.sort_unstable();
        keys.truncate(limit);
        let ids: Vec<String> = keys.into_iter().map(|(_, id)| id).collect();
        self.todos_by_id(goal_id, &ids)
    }

    fn claimed_by(&self, goal_id: &str, agent_id: &str, now: i64) -> Result<Option<Todo>> {
        Ok(self
            .todos_by_selected_ids(
                goal_id,
                "SELECT id FROM todos WHERE goal_id = ?1 AND claim_agent = ?2 AND status = 'claimed' \
                 AND claim_expires_at > ?3 ORDER BY priority, seq LIMIT 1",
                params![goal_id, agent_id, now],
                "reading the agent's claim",
            )?
            .pop())
    }

    fn open_user_todos(&self, goal_id: &str) -> Result<Vec<Todo>> {
        self.todos_by_selected_ids(
            goal_id,
            OPEN_USER_TODO_IDS,
            params![goal_id],
            "listing gates",
        )
    }

    fn todo_status_counts(&self, goal_id: &str) -> Result<Vec<(String, String, i64)>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT role, status, COUNT(*) FROM todos WHERE goal_id = ?1 GROUP BY role, status",
            )
            .map_err(self.err("counting todos"))?;
        stmt.query_map([goal_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .and_then(|rows| rows.collect())
            .map_err(self.err("counting todos"))
    }

    fn bound_capabilities(&self, goal_id: &str) -> Result<Vec<String>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT DISTINCT capability FROM todos WHERE goal_id = ?1 AND capability IS NOT NULL \
                 AND status NOT IN ('completed', 'archived') ORDER BY capability",
            )
            .map_err(self.err("listing capability bindings"))?;
        stmt.query_map([goal_id], |r| r.get(0))
            .and_then(|rows| rows.collect())
            .map_err(self.err("listing capability bindings"))
    }

    fn insert_evidence(&self, e: &Evidence) -> Result<i64> {
        self.ensure_writable()?;
        self.conn
            .prepare_cached(
                "INSERT INTO evidence (goal_id, todo_id, text, artifact_path, artifact_digest, run_id, actor, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    e.goal_id,
                    e.todo_id,
                    e.text,
                    e.artifact_path,
                    e.artifact_digest,
                    e.run_id,
                    e.actor,
                    e.created_at
                ])
            })
            .map_err(self.err("inserting evidence"))?;
        Ok(self.conn.last_insert_rowid())
    }

    fn evidence_for(&self, goal_id: &str, todo_id: &str) -> Result<Vec<Evidence>> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {EVIDENCE_COLUMNS} FROM evidence WHERE goal_id = ?1 AND todo_id = ?2 ORDER BY id"
            ))
            .map_err(self.err("reading evidence"))?;
        stmt.query_map(params![goal_id, todo_id], evidence_from_row)
            .and_then(|rows| rows.collect())
            .map_err(self.err("reading evidence"))
    }

    fn recent_evidence(&self, goal_id: &str, limit: usize) -> Result<Vec<Evidence>> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {EVIDENCE_COLUMNS} FROM evidence WHERE goal_id = ?1 ORDER BY id DESC LIMIT ?2"
            ))
            .map_err(self.err("reading evidence"))?;
        stmt.query_map(params![goal_id, limit as i64], evidence_from_row)
            .and_then(|rows| rows.collect())
            .map_err(self.err("reading evidence"))
    }

    fn insert_run(&self, run: &Run) -> Result<()> {
        self.ensure_writable()?;
        self.conn
            .prepare_cached(&format!(
                "INSERT INTO runs ({RUN_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
            ))
            .and_then(|mut s| {
                s.execute(params![
                    run.id,
                    run.goal_id,
                    run.agent_id,
                    run.todo_id,
                    run.classification,
                    run.outcome,
                    run.summary,
                    to_json(&run.payload),
                    run.created_at
                ])
            })
            .map_err(self.err("inserting a run"))?;
        Ok(())
    }

    fn run(&self, goal_id: &str, run_id: &str) -> Result<Option<Run>> {
        self.conn
            .prepare_cached(&format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE goal_id = ?1 AND id = ?2"
            ))
            .and_then(|mut s| {
                s.query_row(params![goal_id, run_id], run_from_row)
                    .optional()
            })
            .map_err(self.err("reading a run"))
    }

    fn runs(&self, goal_id: &str, limit: usize, before: Option<&str>) -> Result<Vec<Run>> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE goal_id = ?1 AND (?2 IS NULL OR id < ?2) ORDER BY id DESC LIMIT ?3"
            ))
            .map_err(self.err("reading history"))?;
        stmt.query_map(params![goal_id, before, limit as i64], run_from_row)
            .and_then(|rows| rows.collect())
            .map_err(self.err("reading history"))
    }

    fn latest_run(&self, goal_id: &str, agent_id: Option<&str>) -> Result<Option<Run>> {
        let sql = match agent_id {
            Some(_) => format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE goal_id = ?1 AND agent_id = ?2 ORDER BY id DESC LIMIT 1"
            ),
            None => format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE goal_id = ?1 AND ?2 IS NULL ORDER BY id DESC LIMIT 1"
            ),
        };
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut s| {
                s.query_row(params![goal_id, agent_id], run_from_row)
                    .optional()
            })
            .map_err(self.err("reading the latest run"))
    }

    fn run_count(&self, goal_id: &str) -> Result<i64> {
        self.conn
            .prepare_cached("SELECT COUNT(*) FROM runs WHERE goal_id = ?1")
            .and_then(|mut s| s.query_row([goal_id], |r| r.get(0)))
            .map_err(self.err("counting runs"))
    }

    fn insert_reward(&self, r: &Reward) -> Result<i64> {
        self.ensure_writable()?;
        self.conn
            .prepare_cached(
                "INSERT INTO rewards (goal_id, run_id, score, comment, actor, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .and_then(|mut s| s.execute(params![r.goal_id, r.run_id, r.score, r.comment, r.actor, r.created_at]))
            .map_err(self.err("inserting a reward"))?;
        Ok(self.conn.last_insert_rowid())
    }

    fn rewards_for_runs(&self, goal_id: &str, run_ids: &[String]) -> Result<Vec<Reward>> {
        let mut out = Vec::new();
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id, goal_id, run_id, score, comment, actor, created_at FROM rewards \
                 WHERE goal_id = ?1 AND run_id = ?2 ORDER BY id",
            )
            .map_err(self.err("reading rewards"))?;
        for run_id in run_ids {
            let rows: Vec<Reward> = stmt
                .query_map(params![goal_id, run_id], reward_from_row)
                .and_then(|rows| rows.collect())
                .map_err(self.err("reading rewards"))?;
            out.extend(rows);
        }
        Ok(out)
    }

    fn recent_rewards(&self, goal_id: &str, limit: usize) -> Result<Vec<Reward>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id, goal_id, run_id, score, comment, actor, created_at FROM rewards \
                 WHERE goal_id = ?1 ORDER BY id DESC LIMIT ?2",
            )
            .map_err(self.err("reading rewards"))?;
        stmt.query_map(params![goal_id, limit as i64], reward_from_row)
            .and_then(|rows| rows.collect())
            .map_err(self.err("reading rewards"))
    }

    fn quota_policy(&self, goal_id: &str) -> Result<Option<QuotaPolicy>> {
        self.conn
            .prepare_cached(
                "SELECT compute, window_hours, slot_minutes, allowed_slots, per_agent_cap FROM quota_policy WHERE goal_id = ?1",
            )
            .and_then(|mut s| {
                s.query_row([goal_id], |r| {
                    Ok(QuotaPolicy {
                        compute: r.get(0)?,
                        window_hours: r.get(1)?,
                        slot_minutes: r.get(2)?,
                        allowed_slots: r.get(3)?,
                        per_agent_cap: r.get(4)?,
                    })
                })
                .optional()
            })
            .map_err(self.err("reading quota policy"))
    }

    fn set_quota_policy(&self, goal_id: &str, p: &QuotaPolicy) -> Result<()> {
        self.ensure_writable()?;
        self.conn
            .execute(
                "INSERT INTO quota_policy (goal_id, compute, window_hours, slot_minutes, allowed_slots, per_agent_cap) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(goal_id) DO UPDATE SET compute = excluded.compute, \
                 window_hours = excluded.window_hours, slot_minutes = excluded.slot_minutes, \
                 allowed_slots = excluded.allowed_slots, per_agent_cap = excluded.per_agent_cap",
                params![goal_id, p.compute, p.window_hours, p.slot_minutes, p.allowed_slots, p.per_agent_cap],
            )
            .map_err(self.err("writing quota policy"))?;
        Ok(())
    }

    fn ledger_entry(&self, effect_id: &str) -> Result<Option<LedgerEntry>> {
        self.conn
            .prepare_cached(&format!(
                "SELECT {LEDGER_COLUMNS} FROM quota_ledger WHERE effect_id = ?1"
            ))
            .and_then(|mut s| s.query_row([effect_id], ledger_from_row).optional())
            .map_err(self.err("reading the ledger"))
    }

    fn insert_ledger(&self, e: &LedgerEntry) -> Result<bool> {
        self.ensure_writable()?;
        let n = self
            .conn
            .prepare_cached(&format!(
                "INSERT OR IGNORE INTO quota_ledger ({LEDGER_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
            ))
            .and_then(|mut s| {
                s.execute(params![
                    e.effect_id,
                    e.goal_id,
                    e.agent_id,
                    e.run_id,
                    e.slots,
                    e.kind.as_str(),
                    e.voids_effect_id,
                    e.created_at
                ])
            })
            .map_err(self.err("writing the ledger"))?;
        Ok(n == 1)
    }

    fn spent_since(&self, goal_id: &str, since: i64, agent_id: Option<&str>) -> Result<i64> {
        self.conn
            .prepare_cached(
                "SELECT COALESCE(SUM(slots), 0) FROM quota_ledger WHERE goal_id = ?1 AND created_at >= ?2 \
                 AND (?3 IS NULL OR agent_id = ?3)",
            )
            .and_then(|mut s| s.query_row(params![goal_id, since, agent_id], |r| r.get(0)))
            .map_err(self.err("summing the ledger"))
    }

    fn oldest_spend_since(&self, goal_id: &str, since: i64) -> Result<Option<i64>> {
        self.conn
            .prepare_cached(
                "SELECT MIN(created_at) FROM quota_ledger WHERE goal_id = ?1 AND created_at >= ?2 AND kind = 'spend'",
            )
            .and_then(|mut s| s.query_row(params![goal_id, since], |r| r.get(0)))
            .map_err(self.err("reading the ledger"))
    }

    fn recent_ledger(&self, goal_id: &str, limit: usize) -> Result<Vec<LedgerEntry>> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {LEDGER_COLUMNS} FROM quota_ledger WHERE goal_id = ?1 ORDER BY created_at DESC, effect_id LIMIT ?2"
            ))
            .map_err(self.err("reading the ledger"))?;
        stmt.query_map(params![goal_id, limit as i64], ledger_from_row)
            .and_then(|rows| rows.collect())
            .map_err(self.err("reading the ledger"))
    }

    fn append_op(&self, op: &OpRecord) -> Result<()> {
        self.ensure_writable()?;
        self.conn
            .prepare_cached("INSERT INTO ops (id, goal_id, actor, kind, detail, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
            .and_then(|mut s| {
                s.execute(params![op.id, op.goal_id, op.actor, op.kind, to_json(&op.detail), op.created_at])
            })
            .map_err(self.err("appending to the operation log"))?;
        Ok(())
    }

    fn ops(&self, goal_id: Option<&str>, limit: usize) -> Result<Vec<OpRecord>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id, goal_id, actor, kind, detail, created_at FROM ops WHERE (?1 IS NULL OR goal_id = ?1) \
                 ORDER BY id DESC LIMIT ?2",
            )
            .map_err(self.err("reading the operation log"))?;
        stmt.query_map(params![goal_id, limit as i64], |r| {
            locate(r, "ops", &[0], || {
                Ok(OpRecord {
                    id: r.get(0)?,
                    goal_id: r.get(1)?,
                    actor: r.get(2)?,
                    kind: r.get(3)?,
                    detail: json_col(r, 4)?,
                    created_at: r.get(5)?,
                })
            })
        })
        .and_then(|rows| rows.collect())
        .map_err(self.err("reading the operation log"))
    }

    fn upsert_extension(&self, rec: &ExtensionRecord) -> Result<()> {
        self.ensure_writable()?;
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

    fn extension(&self, id: &str) -> Result<Option<ExtensionRecord>> {
        self.conn
            .prepare_cached(
                "SELECT r.id, r.revision, r.version, r.manifest, r.grants, r.install_dir, r.component_hashes, \
                 r.installed_at, e.enabled FROM extensions e JOIN extension_revisions r \
                 ON r.id = e.id AND r.revision = e.active_revision WHERE e.id = ?1",
            )
            .and_then(|mut s| s.query_row([id], extension_from_row).optional())
            .map_err(self.err("reading an extension"))
    }

    fn extensions(&self) -> Result<Vec<ExtensionRecord>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT r.id, r.revision, r.version, r.manifest, r.grants, r.install_dir, r.component_hashes, \
                 r.installed_at, e.enabled FROM extensions e JOIN extension_revisions r \
                 ON r.id = e.id AND r.revision = e.active_revision ORDER BY e.id",
            )
            .map_err(self.err("listing extensions"))?;
        stmt.query_map([], extension_from_row)
            .and_then(|rows| rows.collect())
            .map_err(self.err("listing extensions"))
    }

    fn extension_revisions(&self, id: &str) -> Result<Vec<ExtensionRecord>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT r.id, r.revision, r.version, r.manifest, r.grants, r.install_dir, r.component_hashes, \
                 r.installed_at, (e.active_revision = r.revision AND e.enabled) FROM extension_revisions r \
                 LEFT JOIN extensions e ON e.id = r.id WHERE r.id = ?1 ORDER BY r.revision DESC",
            )
            .map_err(self.err("listing extension revisions"))?;
        stmt.query_map([id], extension_from_row)
            .and_then(|rows| rows.collect())
            .map_err(self.err("listing extension revisions"))
    }

    fn set_extension_active(&self, id: &str, revision: Option<i64>, enabled: bool) -> Result<()> {
        self.ensure_writable()?;
        self.conn
            .execute(
                "UPDATE extensions SET active_revision = COALESCE(?2, active_revision), enabled = ?3 WHERE id = ?1",
                params![id, revision, enabled],
            )
            .map_err(self.err("updating an extension"))?;
        Ok(())
    }

    fn delete_extension(&self, id: &str) -> Result<()> {
        self.ensure_writable()?;
        self.conn
            .execute("DELETE FROM extensions WHERE id = ?1", [id])
            .map_err(self.err("removing an extension"))?;
        self.conn
            .execute("DELETE FROM extension_revisions WHERE id = ?1", [id])
            .map_err(self.err("removing an extension"))?;
        Ok(())
    }

    fn component_artifact(
        &self,
        component_sha256: &str,
        engine_key: &str,
    ) -> Result<Option<ArtifactRecord>> {
        self.conn
            .prepare_cached(
                "SELECT component_sha256, engine_key, artifact_sha256, recorded_at \
                 FROM component_artifacts WHERE component_sha256 = ?1 AND engine_key = ?2",
            )
            .and_then(|mut s| {
                s.query_row(params![component_sha256, engine_key], artifact_from_row)
                    .optional()
            })
            .map_err(self.err("reading a component artifact record"))
    }

    fn record_component_artifact(&self, rec: &ArtifactRecord) -> Result<()> {
        self.ensure_writable()?;
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

    fn component_artifacts(&self) -> Result<Vec<ArtifactRecord>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT component_sha256, engine_key, artifact_sha256, recorded_at \
                 FROM component_artifacts ORDER BY component_sha256, engine_key",
            )
            .map_err(self.err("listing component artifacts"))?;
        stmt.query_map([], artifact_from_row)
            .and_then(|rows| rows.collect())
            .map_err(self.err("listing component artifacts"))
    }

    fn turn(&self, turn_key: &str) -> Result<Option<TurnRecord>> {
        self.conn
            .prepare_cached(&format!(
                "SELECT {TURN_COLUMNS} FROM turns WHERE turn_key = ?1"
            ))
            .and_then(|mut s| s.query_row([turn_key], turn_from_row).optional())
            .map_err(self.err("reading a turn"))
    }

    fn upsert_turn(&self, t: &TurnRecord) -> Result<()> {
        self.ensure_writable()?;
        self.conn
            .prepare_cached(&format!(
                "INSERT INTO turns ({TURN_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
                 ON CONFLICT(turn_key) DO UPDATE SET todo_id = excluded.todo_id, status = excluded.status, \
                 phases = excluded.phases, data = excluded.data, updated_at = excluded.updated_at"
            ))
            .and_then(|mut s| {
                s.execute(params![
                    t.turn_key,
                    t.goal_id,
                    t.agent_id,
                    t.todo_id,
                    t.status.as_str(),
                    to_json(&t.phases),
                    to_json(&t.data),
                    t.created_at,
                    t.updated_at
                ])
            })
            .map_err(self.err("journaling a turn"))?;
        Ok(())
    }

    fn unsettled_turns(&self, goal_id: Option<&str>) -> Result<Vec<TurnRecord>> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {TURN_COLUMNS} FROM turns WHERE status = 'in_progress' AND (?1 IS NULL OR goal_id = ?1) \
                 ORDER BY created_at"
            ))
            .map_err(self.err("listing unsettled turns"))?;
        stmt.query_map([goal_id], turn_from_row)
            .and_then(|rows| rows.collect())
            .map_err(self.err("listing unsettled turns"))
    }

    fn reserved_slots(&self, goal_id: &str, agent_id: Option<&str>) -> Result<(i64, i64)> {
        // `turns_unsettled (status, goal_id)` bounds this by the goal's live turns, never by the
        // journal's history.
        self.conn
            .prepare_cached(
                "SELECT COUNT(*), COALESCE(SUM(agent_id = ?2), 0) FROM turns \
                 WHERE status = 'in_progress' AND goal_id = ?1 AND instr(phases, '\"quota_spend\"') = 0",
            )
            .and_then(|mut s| {
                s.query_row(params![goal_id, agent_id], |r| Ok((r.get(0)?, r.get(1)?)))
            })
            .map_err(self.err("counting the slots reserved by running turns"))
    }

    fn unsettled_turn_on(&self, goal_id: &str, todo_id: &str) -> Result<Option<(String, String)>> {
        self.conn
            .prepare_cached(
                "SELECT turn_key, agent_id FROM turns \
                 WHERE status = 'in_progress' AND goal_id = ?1 AND todo_id = ?2 LIMIT 1",
            )
            .and_then(|mut s| {
                s.query_row(params![goal_id, todo_id], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .map_err(self.err("finding the turn working a todo"))
    }

    fn recent_turns(
        &self,
        goal_id: Option<&str>,
        status: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TurnRecord>> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {TURN_COLUMNS} FROM turns WHERE (?1 IS NULL OR goal_id = ?1) \
                 AND (?2 IS NULL OR status = ?2) ORDER BY created_at DESC, turn_key DESC LIMIT ?3"
            ))
            .map_err(self.err("listing turns"))?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        stmt.query_map(params![goal_id, status, limit], turn_from_row)
            .and_then(|rows| rows.collect())
            .map_err(self.err("listing turns"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn goal() -> Goal {
        Goal {
            id: "g".into(),
            title: "G".into(),
            objective: "o".into(),
            success_criteria: Vec::new(),
            status: GoalStatus::Active,
            project_dir: None,
            next_probe: None,
            created_at: 1,
            updated_at: 1,
        }
    }

    fn todo(id: &str, priority: Priority, capability: Option<&str>, claimed: bool) -> Todo {
        Todo {
            id: id.into(),
            goal_id: "g".into(),
            role: Role::Agent,
            kind: TodoKind::Task,
            title: format!("title of {id}"),
            detail: if claimed {
                "long detail".into()
            } else {
                String::new()
            },
            priority,
            status: if claimed {
                TodoStatus::Claimed
            } else {
                TodoStatus::Open
            },
            depends_on: Vec::new(),
            capability: capability.map(str::to_owned),
            lane: None,
            gate_scope: None,
            claim: claimed.then(|| Claim {
                agent_id: "a1".into(),
                fence: 3,
                expires_at: 9_000,
                idempotency_key: "k".into(),
                claimed_at: 1_000,
            }),
            last_fence: if claimed { 3 } else { 0 },
            status_reason: claimed.then(|| "busy".to_owned()),
            created_at: 5,
            updated_at: 6,
        }
    }

    /// Rows are visited in key order ("t10" before "t9") into one reused `Todo`; `todos()` must
    /// still come out by priority then creation, and no field may leak from one row to the next.
    #[test]
    fn todos_come_in_listing_order_and_reused_rows_do_not_leak() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::create(&dir.path().join("loopx.db")).unwrap();
        let created = [
            todo("t9", Priority::P2, Some("cap.a"), true),
            Todo {
                depends_on: vec!["t3".into(), "t9".into()],
                ..todo("t10", Priority::P2, None, false)
            },
            todo("t2", Priority::P0, None, false),
            todo("t1", Priority::P4, Some("cap.b"), false),
            todo("t3", Priority::P0, None, true),
        ];
        {
            let tx = store.begin_write().unwrap();
            tx.insert_goal(&goal()).unwrap();
            for t in &created {
                tx.insert_todo(t).unwrap();
            }
            tx.commit().unwrap();
        }
        let tx = store.begin_read().unwrap();
        let listed = tx.todos("g").unwrap();
        let ids: Vec<&str> = listed.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["t2", "t3", "t9", "t10", "t1"]);
        for t in &listed {
            let original = created.iter().find(|c| c.id == t.id).unwrap();
            assert_eq!(t, original, "{} read back exactly", t.id);
        }
        let mut visited = Vec::new();
        tx.for_each_todo("g", &mut |t, order| {
            visited.push((order, t.clone()));
            Ok(())
        })
        .unwrap();
        visited.sort_by_key(|(order, _)| *order);
        let visited: Vec<Todo> = visited.into_iter().map(|(_, t)| t).collect();
        assert_eq!(visited, listed);
    }

    /// The queries that pick a few todos select ids, then read each todo by key: what they return
    /// must still be whole todos (dependencies included) in listing order, filtered as before.
    #[test]
    fn ready_claimed_and_gate_queries_return_whole_todos_in_listing_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::create(&dir.path().join("loopx.db")).unwrap();
        let live_claim = |t: Todo, expires_at: i64| Todo {
            claim: t.claim.map(|c| Claim { expires_at, ..c }),
            ..t
        };
        let with_status = |t: Todo, status: TodoStatus| Todo { status, ..t };
        let gate = |id: &str, priority: Priority, status: TodoStatus| Todo {
            role: Role::User,
            kind: TodoKind::UserGate,
            status,
            ..todo(id, priority, None, false)
        };
        let created = [
            todo("a", Priority::P1, None, false),
            // Claimed, lease expired at 9,000: ready again.
            todo("b", Priority::P0, None, true),
            // Claimed, lease live at 10,000: a1's claim, not ready.
            live_claim(todo("c", Priority::P0, None, true), 20_000),
            // Depends on `a`, which is not completed: not ready.
            Todo {
                depends_on: vec!["a".into()],
                ..todo("d", Priority::P0, None, false)
            },
            // Depends only on completed `f`: ready.
            Todo {
                depends_on: vec!["f".into()],
                ..todo("e", Priority::P3, Some("cap.x"), false)
            },
            with_status(todo("f", Priority::P0, None, false), TodoStatus::Completed),
            gate("u2", Priority::P2, TodoStatus::Open),
            gate("u1", Priority::P1, TodoStatus::Open),
            gate("u3", Priority::P0, TodoStatus::Completed),
        ];
        {
            let tx = store.begin_write().unwrap();
            tx.insert_goal(&goal()).unwrap();
            for t in &created {
                tx.insert_todo(t).unwrap();
            }
            tx.commit().unwrap();
        }
        let original = |id: &str| created.iter().find(|c| c.id == id).unwrap().clone();
        let tx = store.begin_read().unwrap();
        let now = 10_000;
        assert_eq!(
            tx.ready_todos("g", now, 10).unwrap(),
            [original("b"), original("a"), original("e")]
        );
        assert_eq!(
            tx.ready_todos("g", now, 2).unwrap(),
            [original("b"), original("a")]
        );
        assert_eq!(tx.claimed_by("g", "a1", now).unwrap(), Some(original("c")));
        assert_eq!(tx.claimed_by("g", "a2", now).unwrap(), None);
        assert_eq!(
            tx.open_user_todos("g").unwrap(),
            [original("u1"), original("u2")]
        );
    }

    #[test]
    fn sqlite_is_built_with_the_flags_of_cargo_config() {
        // Without DISABLE_DIRSYNC, every write command pays an extra directory fsync on its first
        // commit. It is one of the `LIBSQLITE3_FLAGS` in `.cargo/config.toml`, whose other
        // settings (`HAVE_FDATASYNC` among them) compile_options does not list: a build that
        // misses that file fails here.
        let conn = Connection::open_in_memory().unwrap();
        let options: Vec<String> = conn
            .prepare("PRAGMA compile_options")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(
            options.iter().any(|o| o == "DISABLE_DIRSYNC"),
            "SQLite built without SQLITE_DISABLE_DIRSYNC: {options:?}"
        );
        // The full-text and R-tree modules, which LoopX never uses, are left out: each
        // connection registered them, and FTS5 alone linked the math library into every process.
        for unused in [
            "ENABLE_FTS3",
            "ENABLE_FTS5",
            "ENABLE_RTREE",
            "ENABLE_DBSTAT_VTAB",
        ] {
            assert!(
                !options.iter().any(|o| o == unused),
                "SQLite built with SQLITE_{unused}: {options:?}"
            );
        }
    }

    #[test]
    fn a_store_whose_wal_was_removed_reopens_with_its_data() {
        // Another SQLite client closing the database last checkpoints and deletes the WAL; the
        // next open creates it again (and syncs the directory, `sync_directory`).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("loopx.db");
        {
            let mut store = SqliteStore::create(&path).unwrap();
            let tx = store.begin_write().unwrap();
            tx.insert_goal(&goal()).unwrap();
            tx.commit().unwrap();
        }
        assert!(wal_path(&path).exists());
        let plain = Connection::open(&path).unwrap();
        plain
            .query_row("SELECT COUNT(*) FROM goals", [], |r| r.get::<_, i64>(0))
            .unwrap();
        plain.close().unwrap();
        assert!(!wal_path(&path).exists(), "a plain close removes the WAL");
        let mut store = SqliteStore::open(&path).unwrap();
        assert!(wal_path(&path).exists());
        let tx = store.begin_write().unwrap();
        assert_eq!(tx.goal("g").unwrap().map(|g| g.title), Some("G".into()));
        tx.insert_todo(&todo("t1", Priority::P1, None, false))
            .unwrap();
        tx.commit().unwrap();
    }

    #[test]
    fn the_wal_starts_over_in_place_across_fresh_connections() {
        // Every command is a new connection that rebuilds the WAL index from the file. The WAL
        // must still start over once past WAL_CHECKPOINT_FRAMES (bounded length) and must keep
        // its blocks when it does (never truncated to nothing).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("loopx.db");
        drop(SqliteStore::create(&path).unwrap());
        let bound = (WAL_CHECKPOINT_FRAMES as u64 + 16) * (32 + 24 + 4096);
        let mut longest = 0;
        for i in 0..300 {
            let mut store = SqliteStore::open(&path).unwrap();
            let tx = store.begin_write().unwrap();
            tx.insert_goal(&Goal {
                id: format!("g{i}"),
                ..goal()
            })
            .unwrap();
            tx.commit().unwrap();
            let len = std::fs::metadata(wal_path(&path)).unwrap().len();
            assert!(
                len <= bound,
                "commit {i}: WAL of {len} bytes, bound {bound}"
            );
            assert!(
                len >= longest,
                "commit {i}: WAL cut from {longest} to {len} bytes"
            );
            longest = len;
        }
        assert!(longest > bound / 2, "the WAL never filled: {longest} bytes");
        let mut store = SqliteStore::open(&path).unwrap();
        assert!(store.integrity_check().unwrap().is_empty());
        let tx = store.begin_read().unwrap();
        assert_eq!(tx.goals().unwrap().len(), 300);
    }

    #[test]
    fn gate_ids_are_read_from_the_role_index_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::create(&dir.path().join("loopx.db")).unwrap();
        let plan: Vec<String> = store
            .conn
            .prepare(&format!("EXPLAIN QUERY PLAN {OPEN_USER_TODO_IDS}"))
            .unwrap()
            .query_map(["g"], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(
            plan.iter().any(|step| step
                .contains("USING COVERING INDEX todos_by_role_status (goal_id=? AND role=?)")),
            "{plan:?}"
        );
    }

    #[test]
    fn view_key_round_trips_every_role_status_and_order() {
        for &role in Role::ALL {
            for &status in TodoStatus::ALL {
                for (rank, seq) in [(0, 0), (4, 1), (2, 123_456), (15, (1 << 44) - 1)] {
                    let lines = TodoLines {
                        order: TodoOrder::new(rank, seq),
                        role,
                        status,
                        json: "",
                        md: "",
                    };
                    let key = pack_view_key(&lines).expect("fits");
                    assert_eq!(
                        unpack_view_key(key),
                        Some((lines.order, role, status)),
                        "{role:?} {status:?} {rank} {seq}"
                    );
                }
            }
        }
        let too_far = TodoLines {
            order: TodoOrder::new(0, 1 << 44),
            role: Role::Agent,
            status: TodoStatus::Open,
            json: "",
            md: "",
        };
        assert_eq!(pack_view_key(&too_far), None);
        assert_eq!(unpack_view_key(-1), None);
        assert_eq!(unpack_view_key(15 << 52), None, "no 16th role");
    }

    fn visit(tx: &dyn StoreTx, format: i64) -> Vec<(String, Option<String>)> {
        let mut out = Vec::new();
        tx.for_each_projected_todo("g", format, &mut |t| {
            out.push(match t {
                ProjectedTodo::Cached(lines) => (lines.json.to_owned(), Some(lines.md.to_owned())),
                ProjectedTodo::Uncached(t, _) => (t.id.clone(), None),
            });
            Ok(())
        })
        .unwrap();
        out.sort();
        out
    }

    /// Lines are served only in the format they were cached in, never for a claimed todo, and
    /// never after the todo is written again.
    #[test]
    fn cached_lines_are_served_only_while_valid() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::create(&dir.path().join("loopx.db")).unwrap();
        let tx = store.begin_write().unwrap();
        tx.insert_goal(&goal()).unwrap();
        tx.insert_todo(&todo("t1", Priority::P1, None, false))
            .unwrap();
        tx.insert_todo(&todo("t2", Priority::P1, None, true))
            .unwrap();
        assert_eq!(
            visit(&*tx, 1),
            [("t1".to_owned(), None), ("t2".to_owned(), None)]
        );
        let lines = |json, md| TodoLines {
            order: TodoOrder::new(1, 1),
            role: Role::Agent,
            status: TodoStatus::Open,
            json,
            md,
        };
        tx.cache_projected_todo("g", "t1", 1, &lines("J1", "M1"))
            .unwrap();
        tx.cache_projected_todo("g", "t2", 1, &lines("J2", "M2"))
            .unwrap();
        assert_eq!(
            visit(&*tx, 1),
            [
                ("J1".to_owned(), Some("M1".to_owned())),
                ("t2".to_owned(), None)
            ],
            "t1 cached; t2 is claimed, so its lines depend on the time"
        );
        assert_eq!(
            visit(&*tx, 2),
            [("t1".to_owned(), None), ("t2".to_owned(), None)],
            "another format renders afresh"
        );
        let mut t1 = tx.todo("g", "t1").unwrap().unwrap();
        t1.title = "changed".into();
        tx.update_todo(&t1).unwrap();
        assert_eq!(
            visit(&*tx, 1),
            [("t1".to_owned(), None), ("t2".to_owned(), None)],
            "a write clears the lines"
        );
        tx.commit().unwrap();
    }
}
