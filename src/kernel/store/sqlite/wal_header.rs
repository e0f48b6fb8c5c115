//! Telling a damaged write-ahead log from an empty one before SQLite opens the database.
//!
//! Why this exists: SQLite reads a WAL whose header is not valid (wrong magic, version or page
//! size, or a header checksum that does not match) as an empty log, since that is what a log
//! looks like before its first commit. A log with frames behind a damaged header is not that: it
//! holds commits the database file does not, SQLite silently shows the state as of the last
//! checkpoint, and the next write starts the log over, discarding them for good. SQLite writes
//! the header once, in one 32-byte write, before the log's first frame, and LoopX starts the log
//! over in place, never zeroing it; so a log long enough to hold a frame always has a valid
//! header unless something else wrote it.

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use crate::error::{LoopxError, Result, msg};

/// A WAL header's size, and the smallest frame (its 24-byte header and a 512-byte page).
const HEADER_BYTES: u64 = 32;
const SMALLEST_FRAME: u64 = 24 + 512;

/// The WAL's length (`None` when there is no WAL), or `Corrupt` when it is long enough to hold a
/// frame but its header is not one SQLite wrote. Any other failure to read it is left for
/// SQLite's own open to report.
pub(super) fn checked_wal_len(wal: &Path) -> Result<Option<u64>> {
    let Ok(file) = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(wal)
    else {
        return Ok(std::fs::symlink_metadata(wal).ok().map(|m| m.len()));
    };
    let Ok(meta) = file.metadata() else {
        return Ok(None);
    };
    let len = meta.len();
    if !meta.is_file() || len < HEADER_BYTES + SMALLEST_FRAME {
        return Ok(Some(len));
    }
    // This read takes none of SQLite's locks, so it may meet a writer rewriting the header of a
    // log it starts over, and see part of each; a second look after that write is done decides.
    let mut header = [0u8; HEADER_BYTES as usize];
    for attempt in 0..2 {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        if file.read_exact_at(&mut header, 0).is_err() || is_valid_header(&header) {
            return Ok(Some(len));
        }
    }
    Err(LoopxError::Corrupt {
        path: wal.to_path_buf(),
        detail: msg![
            "the database's write-ahead log is damaged: its header is not one SQLite wrote, so \
             the commits it holds cannot be read, and the next write would discard them. \
             Restore loopx.db and loopx.db-wal from a backup; or, to go on from the database's \
             last checkpoint without those commits, move loopx.db-wal aside"
        ],
    })
}

/// Whether `header` passes the checks SQLite makes before it reads a log's frames: the magic
/// number (whose low bit says the byte order of the checksums), the format version, a page size
/// that is a power of two from 512 to 65536, and the checksum of its first 24 bytes.
fn is_valid_header(header: &[u8; HEADER_BYTES as usize]) -> bool {
    let word = |at: usize| u32::from_be_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    let magic = word(0);
    if magic & !1 != 0x377f_0682 || word(4) != 3_007_000 {
        return false;
    }
    let page_size = word(8);
    if !page_size.is_power_of_two() || !(512..=65536).contains(&page_size) {
        return false;
    }
    let big_endian = magic & 1 == 1;
    let (mut s0, mut s1) = (0u32, 0u32);
    for pair in header[..24].chunks_exact(8) {
        let native = |b: &[u8]| {
            let b: [u8; 4] = b.try_into().expect("4 bytes");
            if big_endian {
                u32::from_be_bytes(b)
            } else {
                u32::from_le_bytes(b)
            }
        };
        s0 = s0.wrapping_add(native(&pair[..4])).wrapping_add(s1);
        s1 = s1.wrapping_add(native(&pair[4..])).wrapping_add(s0);
    }
    (s0, s1) == (word(24), word(28))
}
