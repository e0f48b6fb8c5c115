//! Keeping a goal's state files current after a quota change without rendering them again.
//!
//! A spend changes one figure of `state.json` and `STATE.md`, yet rendering them reads every live
//! todo; in the core tick `quota spend-slot` follows `refresh-state`, which has just rendered
//! them. So the files' stamp records, beside `state.json`'s own stat, the stat of `STATE.md`, the
//! store's commit counter they are current as of, and where each file's quota part lies. When
//! the stamp says the files were rendered at the commit right before this command's own, and
//! both files are still byte for byte that write, only the quota part is rewritten, with the
//! quota the command's own transaction read: everything else in them is what a full render would
//! show at that commit, and the quota part carries the time that transaction read it at
//! (`quota_as_of`), while `generated_at` stays the time of the render. In any other case (another
//! commit between the render and this one, a file edited or replaced, a stamp missing or torn)
//! the files are rendered in full.

use std::ops::Range;
use std::path::Path;

use super::files::{read_stamp, stamp_of, stamp_path, with_temp_file_unless_declined, write_stamp};
use super::markdown::quota_markdown;
use super::place::copy_range;
use super::write_quota_tail;
use crate::error::Result;
use crate::kernel::Kernel;
use crate::kernel::quota::QuotaView;
use crate::kernel::store::CommitSeq;

/// The stamp of a goal's `state.json` and `STATE.md` (`.state.json.stamp`): the first line is
/// `state.json`'s stat as every JSON projection's stamp has it; the second the rest, each number
/// zero-padded to a fixed width so a new stamp covers the old in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StateStamp {
    /// `state.json`'s stat ([`stamp_of`]).
    pub(super) json: String,
    /// `STATE.md`'s stat.
    pub(super) md: String,
    /// The commit counter both files are current as of.
    pub(super) seq: CommitSeq,
    /// Where `state.json`'s quota fields start; they run to the end of the file.
    pub(super) json_quota_at: u64,
    /// `STATE.md`'s quota section.
    pub(super) md_quota: Range<u64>,
}

impl StateStamp {
    fn to_text(&self) -> String {
        format!(
            "{}\n{} {:020} {:020} {:020} {:020}\n",
            self.json,
            self.md,
            self.seq.0,
            self.json_quota_at,
            self.md_quota.start,
            self.md_quota.end
        )
    }

    /// `None` for anything but a whole stamp of this shape (an older one-line stamp, a torn or
    /// edited one).
    fn parse(text: &str) -> Option<StateStamp> {
        let (json, rest) = text.split_once('\n')?;
        let rest = rest.strip_suffix('\n')?;
        let stat_len = json.len();
        if rest.len() <= stat_len || !rest.is_char_boundary(stat_len) {
            return None;
        }
        let (md, numbers) = rest.split_at(stat_len);
        let numbers: Vec<u64> = numbers
            .split(' ')
            .skip(1)
            .map(|n| n.parse().ok())
            .collect::<Option<_>>()?;
        let [seq, json_quota_at, start, end] = numbers[..] else {
            return None;
        };
        Some(StateStamp {
            json: json.to_string(),
            md: md.to_string(),
            seq: CommitSeq(seq),
            json_quota_at,
            md_quota: start..end,
        })
    }

    pub(super) fn write(&self, json_path: &Path) -> Result<()> {
        write_stamp(&stamp_path(json_path), self.to_text().as_bytes())
    }
}

/// A file the stamp names, opened for a splice: still the stamped file, and its bytes from
/// `start` to `end` are a quota part as this module writes them.
struct StampedPart<'a> {
    file: std::fs::File,
    stat: &'a str,
    start: u64,
    end: u64,
    /// The file's length when opened, which its stat in the stamp vouches for.
    len: u64,
}

impl<'a> StampedPart<'a> {
    /// `None` unless `path` is still the file a stamp names (`stat`, its [`stamp_of`]) and the
    /// bytes the stamp places from `start` to `end` (the end of the file when `None`) pass
    /// `is_quota_part`: a stamp with offsets that do not fit the file (torn, stale, or written
    /// by someone else) must not splice text into the middle of a todo line.
    fn open(
        path: &Path,
        stat: &'a str,
        start: u64,
        end: Option<u64>,
        is_quota_part: fn(&[u8]) -> bool,
    ) -> Option<StampedPart<'a>> {
        use std::os::unix::fs::FileExt;
        let (file, meta) = crate::state_file::open_regular(path).ok()?;
        if stamp_of(&meta) != stat {
            return None;
        }
        let end = end.unwrap_or(meta.len());
        if start > end || end > meta.len() || end - start > MAX_QUOTA_PART {
            return None;
        }
        let mut old = vec![0; (end - start) as usize];
        file.read_exact_at(&mut old, start).ok()?;
        is_quota_part(&old).then_some(StampedPart {
            file,
            stat,
            start,
            end,
            len: meta.len(),
        })
    }

    fn still_stamped(&self) -> bool {
        self.file
            .metadata()
            .is_ok_and(|m| stamp_of(&m) == self.stat)
    }

    /// Replaces `path` with a copy of this file whose quota part is `replacement`, unless the
    /// file changed while it was copied (`None`, `path` left alone). The unchanged bytes are
    /// copied by the kernel ([`copy_range`]), not read into this process: the todo lines of a
    /// large goal are most of `state.json`.
    fn replace(&self, path: &Path, replacement: &[u8]) -> Result<Option<std::fs::Metadata>> {
        use std::io::Write;
        with_temp_file_unless_declined(path, |mut dst| {
            copy_range(&self.file, 0, self.start, &mut dst)?;
            dst.write_all(replacement)?;
            copy_range(&self.file, self.end, self.len - self.end, &mut dst)?;
            Ok(self.still_stamped().then_some(dst))
        })
    }
}

/// More than any quota part this module writes: a stamp that places one larger is not ours.
const MAX_QUOTA_PART: u64 = 4096;

/// `state.json` from its quota fields to its end, as [`write_quota_tail`] writes it.
fn is_json_quota_tail(part: &[u8]) -> bool {
    part.starts_with(b"  \"quota_as_of\": ")
        && part.ends_with(b"}\n}\n")
        && part.iter().filter(|&&b| b == b'\n').count() == 3
}

/// `STATE.md`'s quota section, as [`quota_markdown`] writes it: one heading, one line.
fn is_md_quota_section(part: &[u8]) -> bool {
    part.starts_with(b"## Quota\n\n")
        && part.ends_with(b".\n\n")
        && part.iter().filter(|&&b| b == b'\n').count() == 4
}

impl Kernel {
    /// Brings the goal's state files up to date after a commit that changed only its quota (a
    /// spend, a void, a policy change): the quota parts alone when the files were current right
    /// before that commit, otherwise a full render. `quota` is the goal's quota as that commit's
    /// transaction read it at `now`, so the rewritten parts show exactly the commit's state.
    pub(crate) fn refresh_goal_quota(
        &mut self,
        goal_id: &str,
        quota: &QuotaView,
        now: i64,
    ) -> Result<()> {
        match self.last_commit {
            Some(committed) if self.rewrite_quota_parts(goal_id, committed, quota, now)? => Ok(()),
            _ => self.write_goal_projection(goal_id),
        }
    }

    /// Rewrites the quota parts of the state files with `quota` if they were rendered at the
    /// commit before `committed`; `Ok(false)` when they must be rendered. The files then show
    /// the state as of `committed` and are stamped so: a later commit's own refresh brings them
    /// further.
    fn rewrite_quota_parts(
        &self,
        goal_id: &str,
        committed: CommitSeq,
        quota: &QuotaView,
        now: i64,
    ) -> Result<bool> {
        let json_path = self.paths().goal_state_json(goal_id);
        let md_path = self.paths().goal_state_md(goal_id);
        let Some(stamp) = read_stamp(&json_path)
            .as_deref()
            .and_then(StateStamp::parse)
        else {
            return Ok(false);
        };
        if stamp.seq.next() != committed {
            return Ok(false);
        }
        let mut tail = Vec::with_capacity(512);
        write_quota_tail(&mut tail, quota, now)
            .map_err(|e| crate::error::LoopxError::internal("rendering the quota", e))?;
        let mut section = String::new();
        quota_markdown(&mut section, quota, now);
        // Both files are checked before either is replaced.
        let (Some(json), Some(md)) = (
            StampedPart::open(
                &json_path,
                &stamp.json,
                stamp.json_quota_at,
                None,
                is_json_quota_tail,
            ),
            StampedPart::open(
                &md_path,
                &stamp.md,
                stamp.md_quota.start,
                Some(stamp.md_quota.end),
                is_md_quota_section,
            ),
        ) else {
            return Ok(false);
        };
        let Some(json_meta) = json.replace(&json_path, &tail)? else {
            return Ok(false);
        };
        // Should STATE.md change under us now, the full render that follows rewrites both.
        let Some(md_meta) = md.replace(&md_path, section.as_bytes())? else {
            return Ok(false);
        };
        StateStamp {
            json: stamp_of(&json_meta),
            md: stamp_of(&md_meta),
            seq: committed,
            json_quota_at: stamp.json_quota_at,
            md_quota: stamp.md_quota.start..stamp.md_quota.start + section.len() as u64,
        }
        .write(&json_path)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp() -> StateStamp {
        StateStamp {
            json: format!("{:020} {:020}.{:09} {:020}", 10, 1, 2, 3),
            md: format!("{:020} {:020}.{:09} {:020}", 20, 4, 5, 6),
            seq: CommitSeq(42),
            json_quota_at: 7,
            md_quota: 8..9,
        }
    }

    #[test]
    fn a_stamp_reads_back_and_anything_else_is_no_stamp() {
        let s = stamp();
        assert_eq!(StateStamp::parse(&s.to_text()), Some(s.clone()));
        let text = s.to_text();
        // A one-line stamp (other JSON projections, older files), a torn one, an edited one.
        assert_eq!(StateStamp::parse(text.lines().next().unwrap()), None);
        assert_eq!(StateStamp::parse(&text[..text.len() - 10]), None);
        assert_eq!(StateStamp::parse(&text.replace("42", "4x")), None);
        assert_eq!(StateStamp::parse(""), None);
    }
}
