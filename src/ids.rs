//! Identifiers: validation of caller-supplied tokens and generation of sortable ids.
//!
//! Every id is a single path-safe token because goal and run ids become directory and file names
//! under `.loopx/`. Run and operation ids are ULIDs: sortable by creation time, unique without
//! coordination, never a timestamp with a collision suffix. A run's id is also ordered after every
//! stored one ([`ulid_after`]), so runs sort in commit order whatever the clock does.

use crate::error::{Result, bad_input, quoted_input};

/// Longest id accepted.
pub const MAX_ID_LEN: usize = 80;

/// Checks that `value` is a path-safe token: starts with a letter or digit, then letters, digits,
/// `.`, `_` or `-`, at most [`MAX_ID_LEN`] bytes. `what` names the field in the error.
pub fn validate_token(what: &str, value: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= MAX_ID_LEN
        && value.as_bytes()[0].is_ascii_alphanumeric()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        // Quoted whole up to a few times the longest valid id (JSON errors keep what the caller
        // sent, and the offending character shows); a longer value is named by its start and
        // length.
        Err(bad_input(format!(
            "invalid {what}{}: use 1-{MAX_ID_LEN} letters, digits, '.', '_' or '-', starting with a letter or digit",
            quoted_input(value, 4 * MAX_ID_LEN)
        )))
    }
}

/// A new ULID as a 26-character string: the current millisecond and 80 bits from the OS's random
/// source. One `getrandom` call, not a seeded user-space generator: a command makes a handful of
/// ids, and seeding ChaCha cost more than all of them (its start-up probes the CPU's features,
/// and every `cpuid` traps to the hypervisor on a virtual machine).
pub fn new_ulid() -> String {
    fresh_ulid().to_string()
}

fn fresh_ulid() -> ulid::Ulid {
    let mut random = [0u8; 10];
    getrandom::fill(&mut random).expect("the operating system's random source is available");
    let mut bits = [0u8; 16];
    bits[6..].copy_from_slice(&random);
    let ms = crate::clock::now_ms().max(0) as u64;
    ulid::Ulid::from_parts(ms, u128::from_be_bytes(bits))
}

/// A new ULID that sorts after `newest`, the newest id of its kind already stored: a fresh one
/// when it does, else `newest` plus one. Ids listed newest first (history) and "the latest run"
/// then follow the order of commits, even when two commits share a millisecond or the clock was
/// set back between them. Allocated inside the write transaction that stores the id, so no
/// other writer can take the same successor. A `newest` that is not a ULID gives a fresh one.
pub fn ulid_after(newest: Option<&str>) -> String {
    let fresh = fresh_ulid();
    let Some(newest) = newest.and_then(|n| ulid::Ulid::from_string(n).ok()) else {
        return fresh.to_string();
    };
    if fresh > newest {
        return fresh.to_string();
    }
    newest
        .increment()
        // The random part of `newest` is all ones: the next millisecond, fresh random bits.
        .unwrap_or_else(|| {
            ulid::Ulid::from_parts(newest.timestamp_ms().saturating_add(1), fresh.random())
        })
        .to_string()
}

/// A readable id derived from free text ("Fix the flaky test!" -> "fix-the-flaky-test").
///
/// Text in any script is transliterated to ASCII first ("Починить сборку" -> "pochinit-sborku",
/// "修复构建" -> "xiu-fu-gou-jian", "🚀" -> "rocket"), so the id stays a token [`validate_token`]
/// accepts, one anyone can type in a shell and that names the same directory on every
/// filesystem (no Unicode normalization to disagree about). Only text with nothing to
/// transliterate falls back to "goal".
pub fn slug(text: &str, max_len: usize) -> String {
    let ascii = deunicode::deunicode_with_tofu(text, " ");
    let mut out = String::new();
    for ch in ascii.chars().flat_map(char::to_lowercase) {
        if ch.is_ascii_alphanumeric() {
            out.push(ch);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
        if out.len() >= max_len {
            break;
        }
    }
    let trimmed = out.trim_end_matches('-');
    if trimmed.is_empty() {
        "goal".to_string()
    } else {
        trimmed.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new id sorts after the newest stored one whatever the clock says: one from the future
    /// (a clock set back since), one of this millisecond, one with its random part exhausted.
    #[test]
    fn an_id_after_the_newest_sorts_after_it() {
        let now = new_ulid();
        let future = ulid::Ulid::from_parts(u64::MAX >> 16, 7).to_string();
        let full = ulid::Ulid::from_parts(u64::MAX >> 17, u128::MAX >> 48).to_string();
        for newest in [now.clone(), future, full] {
            let next = ulid_after(Some(&newest));
            assert!(next > newest, "{next} after {newest}");
            assert_eq!(next.len(), 26);
        }
        let mut previous = now;
        for _ in 0..1000 {
            let next = ulid_after(Some(&previous));
            assert!(next > previous);
            previous = next;
        }
        assert_eq!(ulid_after(None).len(), 26);
        assert_eq!(ulid_after(Some("not-a-ulid")).len(), 26);
    }

    #[test]
    fn tokens() {
        assert!(validate_token("goal id", "demo-goal_1.2").is_ok());
        for bad in ["", "../x", "a/b", ".hidden", "a b", &"x".repeat(81)] {
            assert!(validate_token("goal id", bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn ulids_are_sortable_by_time_and_distinct() {
        let before = crate::clock::now_ms() as u64;
        let ids: Vec<String> = (0..64).map(|_| new_ulid()).collect();
        let after = crate::clock::now_ms() as u64;
        for id in &ids {
            assert_eq!(id.len(), 26, "{id}");
            let ms = ulid::Ulid::from_string(id).unwrap().timestamp_ms();
            assert!(
                (before..=after).contains(&ms),
                "{id}: {ms} outside {before}..={after}"
            );
        }
        // Distinct random parts, not just distinct ids: ids a millisecond apart differ even
        // when their random part is constant.
        let randoms: std::collections::HashSet<u128> = ids
            .iter()
            .map(|id| ulid::Ulid::from_string(id).unwrap().random())
            .collect();
        assert_eq!(randoms.len(), ids.len());
    }

    #[test]
    fn slugs() {
        assert_eq!(slug("Fix the flaky test!", 40), "fix-the-flaky-test");
        assert_eq!(slug("!!!", 40), "goal");
        assert_eq!(slug("abc def ghi", 5), "abc-d");
    }

    #[test]
    fn slugs_of_titles_in_other_scripts_are_meaningful_tokens() {
        for (title, id) in [
            ("Починить сборку", "pochinit-sborku"),
            ("修复构建", "xiu-fu-gou-jian"),
            ("إصلاح البناء", "slh-lbn"),
            ("🚀🔥", "rocket-fire"),
            ("Fix 日本 build", "fix-ri-ben-build"),
        ] {
            let got = slug(title, 40);
            assert_eq!(got, id, "{title}");
            assert!(validate_token("goal id", &got).is_ok(), "{got}");
        }
        // Nothing to transliterate (a private-use character, combining marks alone).
        assert_eq!(slug("\u{E000}\u{301}", 40), "goal");
    }
}
