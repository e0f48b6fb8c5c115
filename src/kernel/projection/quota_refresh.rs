//! Keeping a goal's state files current after a quota change without rendering them again.
//!
//! A spend changes one figure of `state.json` and `STATE.md`, yet rendering them reads every live
//! todo; in the core tick `quota spend-slot` follows `refresh-state`, which has just rendered
//! them. So the files' stamp records, beside `state.json`'s own stat, the stat of `STATE.md`, the
//! store's commit counter they are current as of, and where each file's quota part lies. When
//! the stamp says the files were rendered at the commit right before this command's own, and
//! both files are still byte for byte that write, only the quota part is rewritten: everything
//! else in them is what a full render would show at that commit, and the quota part carries the
//! time it was read at (`quota_as_of`), while `generated_at` stays the time of the render. In any
//! other case (another commit in between, a file edited or replaced, a stamp missing or torn) the
//! files are rendered in full.

use std::ops::Range;
use std::path::Path;

use super::files::{read_stamp, stamp_of, stamp_path, with_temp_file_unless_declined, write_stamp};
use super::markdown::quota_markdown;
use super::write_quota_tail;
use crate::clock::now_ms;
use crate::error::Result;
use crate::kernel::store::CommitSeq;
use crate::kernel::{Kernel, quota};

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

/// Replaces `path` with a copy of itself whose bytes from `start` to `end` (the end of the file
/// when `None`) are `replacement`, if `path` is
/// still the file its stamp names (`stat`, its [`stamp_of`]) both before and after the copy is
/// taken; otherwise leaves it alone and returns `None`. The unchanged bytes are copied through
/// one open file by the kernel (`std::io::copy` between files is `copy_file_range`), not read
/// into this process: the todo lines of a large goal are most of `state.json`.
fn splice_file(
    path: &Path,
    stat: &str,
    start: u64,
    end: Option<u64>,
    replacement: &[u8],
) -> Result<Option<std::fs::Metadata>> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let Ok(src) = std::fs::File::open(path) else {
        return Ok(None);
    };
    let stamped = |f: &std::fs::File| f.metadata().is_ok_and(|m| stamp_of(&m) == stat);
    let len = src.metadata().map(|m| m.len()).unwrap_or(0);
    let end = end.unwrap_or(len);
    if !stamped(&src) || start > end || end > len {
        return Ok(None);
    }
    with_temp_file_unless_declined(path, |mut dst| {
        let mut from = &src;
        std::io::copy(&mut from.take(start), &mut dst)?;
        dst.write_all(replacement)?;
        from.seek(SeekFrom::Start(end))?;
        std::io::copy(&mut from, &mut dst)?;
        Ok(stamped(&src).then_some(dst))
    })
}

impl Kernel {
    /// Brings the goal's state files up to date after a commit that changed only its quota (a
    /// spend, a void, a policy change): the quota parts alone when the files were current right
    /// before that commit, otherwise a full render.
    pub(crate) fn refresh_goal_quota(&mut self, goal_id: &str) -> Result<()> {
        match self.last_commit {
            Some(committed) if self.rewrite_quota_parts(goal_id, committed)? => Ok(()),
            _ => self.write_goal_projection(goal_id),
        }
    }

    /// Rewrites the quota parts of the state files if they were rendered at the commit before
    /// `committed` and nothing has committed since; `Ok(false)` when they must be rendered.
    fn rewrite_quota_parts(&self, goal_id: &str, committed: CommitSeq) -> Result<bool> {
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
        let now = now_ms();
        let (seq, quota) =
            self.read(|tx| Ok((tx.commit_seq()?, quota::view_in_tx(tx, goal_id, None, now)?)))?;
        if seq != committed {
            return Ok(false);
        }
        let mut tail = Vec::with_capacity(512);
        write_quota_tail(&mut tail, &quota, now)
            .map_err(|e| crate::error::LoopxError::internal("rendering the quota", e))?;
        let mut section = String::new();
        quota_markdown(&mut section, &quota, now);
        let Some(json_meta) =
            splice_file(&json_path, &stamp.json, stamp.json_quota_at, None, &tail)?
        else {
            return Ok(false);
        };
        // Should STATE.md have changed under us, the full render that follows rewrites both.
        let Some(md_meta) = splice_file(
            &md_path,
            &stamp.md,
            stamp.md_quota.start,
            Some(stamp.md_quota.end),
            section.as_bytes(),
        )?
        else {
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
