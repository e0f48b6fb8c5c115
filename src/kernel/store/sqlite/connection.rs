//! Opening the database and configuring its connection: creation, the read-only and immutable
//! fallbacks, the pragmas every connection runs with (WAL, `synchronous=FULL`, mmap, no
//! checkpoint on close), migrations, and the directory syncs that make new files durable.

use super::*;

/// How long a writer waits for the write lock before reporting a conflict.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

impl SqliteStore {
    /// Creates the database with its schema and opens it. The database is built whole under a
    /// temp name ([`crate::state_file::temp_path`]) and linked into place, so a process killed
    /// while creating it leaves no `loopx.db` (the next `init` starts again, `gc` removes the
    /// litter), never an empty or half-made one that every command would have to call damage.
    /// When another process linked its database first, that one is opened.
    pub fn create(path: &Path) -> Result<SqliteStore> {
        crate::state_file::remove_stale_temps(path);
        let tmp = crate::state_file::temp_path(path);
        let result =
            Self::build(&tmp).and_then(|()| match super::backup::link_no_replace(&tmp, path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(LoopxError::io(
                    path,
                    format!("linking the new database into place at {}", path.display()),
                    e,
                )),
            });
        remove_database_files(&tmp);
        result?;
        sync_directory(path.parent().unwrap_or(Path::new("")))?;
        let store = Self::open_read_write(path, SchemaUpgrade::Apply)?;
        store.sync_directory()?;
        Ok(store)
    }

    /// Makes a complete database at `tmp`: the schema migrated in WAL mode, then checkpointed
    /// into the file (and synced by the checkpoint) so the file alone holds it.
    fn build(tmp: &Path) -> Result<()> {
        remove_database_files(tmp);
        let conn = Connection::open_with_flags(
            tmp,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| map_err(tmp, "creating the database", e))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| map_err(tmp, "enabling WAL", e))?;
        let mut store = SqliteStore {
            conn,
            path: tmp.to_path_buf(),
        };
        store.configure()?;
        store.migrate()?;
        store
            .conn
            .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .map_err(|e| map_err(tmp, "writing the new database", e))
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
    pub fn open(path: &Path, upgrade: SchemaUpgrade) -> Result<SqliteStore> {
        let len = match std::fs::metadata(path) {
            Ok(meta) if meta.is_file() => meta.len(),
            Ok(_) => {
                return Err(LoopxError::Corrupt {
                    path: path.to_path_buf(),
                    detail:
                        "not a regular file; move it aside and restore the database from a backup"
                            .into(),
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(crate::error::not_found(msg![
                    format!("no LoopX database at {}; run ", path.display()),
                    NextAction::InitProject,
                    " in the project first"
                ]));
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
                detail: msg![
                    "the database file is empty (0 bytes), so the project's state is gone; \
                     restore loopx.db and loopx.db-wal from a backup. It is never re-created in \
                     place: to start over, move .loopx aside and run ",
                    NextAction::InitProject
                ],
            });
        }
        let wal = wal_path(path);
        let wal_len = super::wal_header::checked_wal_len(&wal)?;
        match Self::open_read_write(path, upgrade) {
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

    pub(super) fn open_read_write(path: &Path, upgrade: SchemaUpgrade) -> Result<SqliteStore> {
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
        match upgrade {
            SchemaUpgrade::Apply => store.migrate()?,
            SchemaUpgrade::Refuse => store.require_current_schema()?,
        }
        Ok(store)
    }

    /// Opens a database that has no WAL content read-only and `immutable`: SQLite then needs no
    /// WAL index and takes no locks. Only for a database nothing can be writing (see `open`).
    pub(super) fn open_immutable(path: &Path) -> Result<SqliteStore> {
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
    /// Makes the directory entries of the database and its WAL durable, for a process that just
    /// created either (`init`, or the first open after something removed the WAL). SQLite itself
    /// fsyncs the directory on the first commit of every process that opens the WAL, because it
    /// opens the WAL with `O_CREAT` and cannot tell whether it made it: a quarter of a
    /// millisecond on every write command. LoopX builds SQLite with `SQLITE_DISABLE_DIRSYNC`
    /// (`.cargo/config.toml`) and syncs the directory here instead, only when the entry is new.
    /// Called once the WAL is open (the schema has been read), before any commit is reported.
    pub(super) fn sync_directory(&self) -> Result<()> {
        sync_directory(self.path.parent().unwrap_or(Path::new("")))
    }

    pub(super) fn configure(&mut self) -> Result<()> {
        let path = self.path.clone();
        self.conn
            .busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| map_err(&path, "setting busy timeout", e))?;
        // Everything that needs no statement comes first: the first statement reads the schema,
        // and on a damaged database that read fails and the connection is dropped. Without
        // `NO_CKPT_ON_CLOSE` already set, that close would checkpoint the WAL into the damaged
        // file and delete it, destroying the commits a repair could still recover.
        self.conn
            .set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
        // See WAL_CHECKPOINT_FRAMES: checkpoints are explicit, never automatic or on close. The
        // hook replaces SQLite's automatic checkpoint.
        self.conn.wal_hook(Some(note_wal_frames));
        self.conn
            .set_db_config(
                rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
                true,
            )
            .map_err(|e| map_err(&path, "configuring checkpoints", e))?;
        // The query planner stability guarantee: a statement's plan never depends on the values
        // bound to it. Without it SQLite prepares a statement with a bound `LIMIT` (history
        // pages, the projections' finished todos) a second time on its first step, to plan with
        // the value; none of LoopX's plans gain from that, and each second prepare cost as much
        // as the first (docs/benchmarks.md).
        self.conn
            .set_db_config(
                rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
                true,
            )
            .map_err(|e| map_err(&path, "configuring the query planner", e))?;
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
        Ok(())
    }

    /// Brings the schema up to date. Reads `user_version` first so an up-to-date database (the
    /// common case) costs one read and takes no write lock.
    pub(super) fn migrate(&mut self) -> Result<()> {
        let path = self.path.clone();
        let (current, latest) = self.schema_versions()?;
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

    /// For a store opened without upgrading: an older schema is refused (it would need a
    /// write), a newer one is damage as for every open.
    fn require_current_schema(&self) -> Result<()> {
        let (current, latest) = self.schema_versions()?;
        if current < latest {
            return Err(crate::error::conflict(msg![
                format!(
                    "the database {} is at schema version {current}, older than the version \
                     {latest} this program reads, and this program never writes to bring it up \
                     to date; run ",
                    self.path.display()
                ),
                NextAction::ListGoals,
                " in the project once (any loopx command upgrades it), then retry"
            ]));
        }
        Ok(())
    }

    /// The schema version the database is at and the one this build writes; a database at a
    /// newer version than this build knows is refused as damage (this build cannot read it).
    fn schema_versions(&self) -> Result<(i64, i64)> {
        let current = self.current_version()?;
        let latest = MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
        if current > latest {
            return Err(LoopxError::Corrupt {
                path: self.path.clone(),
                detail: format!(
                    "schema version {current} is newer than this loopx supports ({latest}); upgrade loopx"
                )
                .into(),
            });
        }
        Ok((current, latest))
    }

    pub(super) fn current_version(&self) -> Result<i64> {
        self.conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| map_err(&self.path, "reading schema version", e))
    }
}

/// Compiled statements a connection keeps. Compiling is most of what a short command costs after
/// opening the store, and rusqlite's default (16) is fewer than the distinct statements of
/// `refresh-state` (about 35), so the quota reads its record and its render share were each
/// compiled twice. Above any one command's count, every statement compiles once per process; a
/// long-lived process (`loopx-serve`, `loop --watch`) keeps at most this many.
const STATEMENT_CACHE_CAPACITY: usize = 64;

/// Checkpoint once the WAL holds more frames than this (256 KiB of 4 KiB pages). Each CLI command
/// is a fresh process, and the first connection of a process rebuilds the WAL index by reading
/// every frame in the WAL: the WAL's length is a cost every command pays on open. SQLite's own
/// checkpoints do not fit that life: the one on close would cost every command (read-only ones
/// included) fsyncs of the database file, and a passive auto-checkpoint never lets the WAL start
/// over, because how much of it was copied back lives in the WAL index, which the next process
/// rebuilds from scratch. So the writer whose commit takes the WAL past this many frames copies
/// it into the database and starts the WAL over in place (see [`SqliteTx::restart_wal`]).
pub(super) const WAL_CHECKPOINT_FRAMES: i32 = 64;

/// The WAL is cut back to this size when it starts over, should a large transaction have grown
/// it; below it the file keeps its blocks (see [`SqliteTx::restart_wal`]).
pub(super) const WAL_SIZE_LIMIT: u64 = 1 << 20;

thread_local! {
    /// Frames in the WAL after this thread's last commit, as SQLite's WAL hook reports them (the
    /// file's length does not tell: the WAL is rewritten in place).
    pub(super) static WAL_FRAMES: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

/// SQLite's WAL hook: runs inside each commit, on the committing thread.
pub(super) fn note_wal_frames(
    _wal: &rusqlite::hooks::Wal,
    frames: std::ffi::c_int,
) -> rusqlite::Result<()> {
    WAL_FRAMES.set(frames);
    Ok(())
}

/// Database pages are read through a memory map instead of copied into SQLite's page cache: a
/// short-lived process then maps pages the kernel already caches instead of allocating and
/// zeroing fresh memory for each, which on a VM is most of the cost of a read.
pub(super) const MMAP_BYTES: u64 = 1 << 30;

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

/// `path` as the path part of a SQLite `file:` URI (`%`, `?` and `#` escaped).
pub(super) fn uri_path(path: &Path) -> String {
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

/// Removes a database file and SQLite's companions of it, those that exist.
fn remove_database_files(db: &Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let _ = std::fs::remove_file(name);
    }
}

/// SQLite's write-ahead log beside the database at `db`.
pub(super) fn wal_path(db: &Path) -> PathBuf {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}
