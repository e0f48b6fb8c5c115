//! Identifiers: validation of caller-supplied tokens and generation of sortable ids.
//!
//! Every id is a single path-safe token because goal and run ids become directory and file names
//! under `.loopx/`. Run and operation ids are ULIDs: sortable by creation time, unique without
//! coordination, never a timestamp with a collision suffix.

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
    let mut random = [0u8; 10];
    getrandom::fill(&mut random).expect("the operating system's random source is available");
    let mut bits = [0u8; 16];
    bits[6..].copy_from_slice(&random);
    let ms = crate::clock::now_ms().max(0) as u64;
    ulid::Ulid::from_parts(ms, u128::from_be_bytes(bits)).to_string()
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
