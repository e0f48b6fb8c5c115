//! How SQLite failures become LoopX errors: damage is exit 5 naming the file (and the row, when
//! one does not decode), a lock timeout is a conflict, a machine refusing the I/O is exit 6.
//! Every query's error path goes through here, so the classification is made once.

use super::*;

/// Classifies a SQLite failure: damage is `Corrupt` (exit 5, names the file), lock timeouts are
/// `Conflict`, a machine that refuses the I/O (full disk, read-only filesystem or database file,
/// permission, a failing device) is `Io` (exit 6), everything else is internal. `errno` is the OS
/// error SQLite saw (`sqlite3_system_errno`), 0 when unknown.
pub(super) fn map_err(path: &Path, context: &str, err: rusqlite::Error) -> LoopxError {
    map_err_errno(path, context, err, 0)
}

pub(super) fn map_err_errno(
    path: &Path,
    context: &str,
    err: rusqlite::Error,
    errno: i32,
) -> LoopxError {
    if let rusqlite::Error::SqliteFailure(e, _) = &err {
        match e.code {
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => {
                let detail = msg![
                    format!(
                        "{err} (while {context}); restore it from a backup or move it aside and run "
                    ),
                    NextAction::InitProject
                ];
                // SQLite found a damaged page: mark the project so that writes refuse instead
                // of building on the damage (`SqliteStore::begin_write`); `doctor` clears it.
                mark_damaged(path, &detail.to_string());
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
            detail: msg![
                format!("{detail} (while {context}); run "),
                NextAction::CheckProject,
                " for every damaged row, then restore from a backup"
            ],
        };
    }
    LoopxError::internal(format!("{context} in {}", path.display()), err)
}

/// The OS error behind the connection's last failure (0 when none). Read only on the error path.
pub(super) fn system_errno(conn: &Connection) -> i32 {
    // SAFETY: `handle` is the live connection's own pointer, used for one read-only call on this
    // thread while `conn` is borrowed; `sqlite3_system_errno` only reads a field of it.
    unsafe { rusqlite::ffi::sqlite3_system_errno(conn.handle()) }
}

/// The description of a decoding failure, or `None` for any other error.
pub(super) fn undecodable(err: &rusqlite::Error) -> Option<String> {
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
pub(super) struct RowDamage {
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
pub(super) fn locate<T>(
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

pub(super) fn column_name(row: &Row, idx: usize) -> String {
    row.as_ref()
        .column_name(idx)
        .map(str::to_string)
        .unwrap_or_else(|_| format!("#{idx}"))
}
