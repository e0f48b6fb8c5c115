//! Value parsers for every numeric flag and the text flags with a shape, each with a documented
//! valid range (`docs/cli.md`, "Flag ranges").
//!
//! Why here and not in the kernel alone: a flag is refused before any state is opened, with exit 2
//! and a message that names the flag and its range (clap's own message names the flag; see
//! [`render_value_error`]). The message never repeats the value: a 300-digit number or a NaN is
//! described, not echoed. Numeric flags also take hyphen values (`allow_hyphen_values`), so `-1`
//! reaches the range check instead of clap's "unexpected argument '-1'".

use std::ops::RangeInclusive;

use crate::model::WireEnum;

/// `--limit` of `history` and `turn list`: the kernel pages history by at most 1000 runs.
pub const LIMIT: RangeInclusive<i128> = 1..=1000;
/// `--timeout-seconds` of `turn run` and `loop` (the driver's own bound).
pub const TIMEOUT_SECONDS: RangeInclusive<i128> = 1..=86_400;
/// `--ttl-seconds` of `todo claim` and `todo renew` (the kernel's lease bound).
pub const TTL_SECONDS: RangeInclusive<i128> = 1..=86_400;
/// `--fence`: fences start at 1 and only grow.
pub const FENCE: RangeInclusive<i128> = 1..=i64::MAX as i128;
/// `loop --max-turns`.
pub const MAX_TURNS: RangeInclusive<i128> = 1..=100_000;
/// `loop --max-sleep-seconds`.
pub const MAX_SLEEP_SECONDS: RangeInclusive<i128> = 1..=86_400;
/// `loop --max-consecutive-failures` and `--max-unvalidated-turns`: 0 would stop before any turn.
pub const LOOP_COUNT: RangeInclusive<i128> = 1..=10_000;
/// `quota spend-slot --slots` (the kernel's bound).
pub const SLOTS: RangeInclusive<i128> = 1..=10_000;
pub use crate::kernel::quota::{COMPUTE, SLOT_COUNT, SLOT_MINUTES, WINDOW_HOURS};
/// `reward add --score` (the kernel's bound).
pub const SCORE: RangeInclusive<f64> = -1_000_000.0..=1_000_000.0;
pub use crate::kernel::goal::PROBE_TEXT_BYTES;
/// The day spans of `gc policy` (the kernel's bound).
pub const RETENTION_DAYS: RangeInclusive<i128> = 0..=crate::kernel::retention::MAX_DAYS as i128;

fn int_in<T: TryFrom<i128>>(s: &str, range: RangeInclusive<i128>) -> Result<T, String> {
    let (lo, hi) = (range.start(), range.end());
    let t = s.trim();
    let (negative, digits) = match t.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "must be a whole number; the valid range is {lo}..={hi}"
        ));
    }
    // More digits than an i128 holds is simply out of range (on the side of its sign).
    let magnitude: i128 = digits.parse().unwrap_or(i128::MAX);
    let v = if negative { -magnitude } else { magnitude };
    if !range.contains(&v) {
        return Err(format!("is out of range; the valid range is {lo}..={hi}"));
    }
    T::try_from(v).map_err(|_| format!("is out of range; the valid range is {lo}..={hi}"))
}

fn float_in(s: &str, range: RangeInclusive<f64>) -> Result<f64, String> {
    let (lo, hi) = (range.start(), range.end());
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("must be a number; the valid range is {lo}..={hi}"))?;
    // `parse` accepts "NaN" and "inf"; neither is in any range.
    if !v.is_finite() || !range.contains(&v) {
        return Err(format!(
            "is out of range; the valid range is {lo}..={hi} (a finite number)"
        ));
    }
    Ok(v)
}

pub fn limit(s: &str) -> Result<usize, String> {
    int_in(s, LIMIT)
}
pub fn timeout_seconds(s: &str) -> Result<u64, String> {
    int_in(s, TIMEOUT_SECONDS)
}
pub fn ttl_seconds(s: &str) -> Result<u64, String> {
    int_in(s, TTL_SECONDS)
}
pub fn fence(s: &str) -> Result<i64, String> {
    int_in(s, FENCE)
}
pub fn max_turns(s: &str) -> Result<u32, String> {
    int_in(s, MAX_TURNS)
}
pub fn max_sleep_seconds(s: &str) -> Result<u64, String> {
    int_in(s, MAX_SLEEP_SECONDS)
}
pub fn loop_count(s: &str) -> Result<u32, String> {
    int_in(s, LOOP_COUNT)
}
/// `todo add/update --max-no-change`: quiet checks before a monitor backs off.
pub const MAX_NO_CHANGE: RangeInclusive<i128> =
    0..=crate::kernel::monitor::MAX_NO_CHANGE_LIMIT as i128;
pub fn max_no_change(s: &str) -> Result<i64, String> {
    int_in(s, MAX_NO_CHANGE)
}
pub fn retention_days(s: &str) -> Result<i64, String> {
    int_in(s, RETENTION_DAYS)
}
pub fn slots(s: &str) -> Result<i64, String> {
    int_in(s, SLOTS)
}
pub fn slot_count(s: &str) -> Result<i64, String> {
    int_in(s, SLOT_COUNT)
}
pub fn compute(s: &str) -> Result<f64, String> {
    float_in(s, COMPUTE)
}
pub fn window_hours(s: &str) -> Result<f64, String> {
    float_in(s, WINDOW_HOURS)
}
pub fn slot_minutes(s: &str) -> Result<f64, String> {
    float_in(s, SLOT_MINUTES)
}
pub fn score(s: &str) -> Result<f64, String> {
    float_in(s, SCORE)
}

/// `probe set --text`: not blank (an empty probe used to clear the probe silently; `--clear` says
/// so explicitly) and within the kernel's limit.
pub fn probe_text(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err(format!(
            "is empty; give 1..={PROBE_TEXT_BYTES} bytes of text, or use --clear to remove the probe"
        ));
    }
    if s.len() > PROBE_TEXT_BYTES {
        return Err(format!(
            "is {} bytes; the valid length is 1..={PROBE_TEXT_BYTES} bytes",
            s.len()
        ));
    }
    Ok(s.to_string())
}

/// `--capability` of `todo add` and `turn run`/`loop`: the kernel's rule
/// ([`crate::kernel::todo::check_capability_name`]), stated without echoing the value.
/// Every path argument. Taking `&str` makes clap refuse bytes that are not UTF-8 before this runs
/// (exit 2, naming the argument): LoopX writes the paths it is given into JSON, Markdown and its
/// messages, which hold text, so such a path could not be reported back.
pub fn path(s: &str) -> Result<std::path::PathBuf, String> {
    if s.is_empty() {
        return Err("is empty; give a path".to_string());
    }
    Ok(std::path::PathBuf::from(s))
}

/// `--root`, which also comes from `LOOPX_ROOT`: an empty value names both, since the person
/// reading the refusal may never have typed `--root`.
pub fn root(s: &str) -> Result<std::path::PathBuf, String> {
    path(s).map_err(|_| {
        "is empty; pass a project directory with --root, or set LOOPX_ROOT to one (or unset it)"
            .to_string()
    })
}

pub fn capability(s: &str) -> Result<String, String> {
    crate::kernel::todo::check_capability_name(s).map_err(|_| {
        "is not a capability name: use <extension>/<capability> (e.g. issue-fix/issue-fix) or builtin:default".to_string()
    })?;
    Ok(s.to_string())
}

/// A flag taking one of a [`WireEnum`]'s spellings: clap knows the values, so `--help` lists
/// them, shell completions offer them, and a wrong one is refused with the list.
pub fn wire<E: WireEnum>() -> impl clap::builder::TypedValueParser<Value = E> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(E::all().iter().map(|e| e.as_str())).try_map(
        |text: String| {
            E::all()
                .iter()
                .copied()
                .find(|e| e.as_str() == text)
                .ok_or_else(|| format!("is not one of the listed values ('{text}')"))
        },
    )
}

/// Longest value quoted whole in a refusal; longer values are cut to this many characters.
const QUOTED_CHARS: usize = 32;

/// The message for a flag whose value a parser above refused: `--flag '<value>' <reason>`, the
/// value cut to [`QUOTED_CHARS`] characters (a 300-digit number is described, not repeated; the
/// caller makes the whole message inert). `None` for every other error, which clap renders.
pub fn render_value_error(e: &clap::Error) -> Option<String> {
    let (flag, value, reason) = value_error_parts(e)?;
    let value = value
        .map(|v| crate::error::quoted_input(&v, QUOTED_CHARS))
        .unwrap_or_default();
    Some(format!("error: {flag}{value} {reason}\n"))
}

/// The message of an unknown flag or subcommand holding control characters, built from the exact
/// word given: clap's own rendering drops escape sequences from it, so such a word would show
/// neither as typed (text, made inert by the caller) nor exactly (JSON). `None` for every other
/// error, which clap renders with its suggestions.
pub fn unknown_word_message(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let (kind, context) = match e.kind() {
        ErrorKind::UnknownArgument => ("unexpected argument", ContextKind::InvalidArg),
        ErrorKind::InvalidSubcommand => ("unrecognized subcommand", ContextKind::InvalidSubcommand),
        _ => return None,
    };
    match e.get(context) {
        Some(ContextValue::String(word)) if word.chars().any(char::is_control) => {
            Some(format!("{kind} '{word}'"))
        }
        _ => None,
    }
}

/// The flag, the exact value and the reason of a value a parser above or clap's set of values
/// refused; `None` for every other error. JSON error messages quote the value whole: JSON keeps the exact text.
pub fn value_error_parts(e: &clap::Error) -> Option<(String, Option<String>, String)> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let flag = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => arg.split_whitespace().next().unwrap_or("").to_string(),
        _ => return None,
    };
    let value = match e.get(ContextKind::InvalidValue) {
        Some(ContextValue::String(v)) => Some(v.clone()),
        _ => None,
    };
    let reason = match e.kind() {
        ErrorKind::ValueValidation => std::error::Error::source(e)?.to_string(),
        // A value outside a fixed set ([`wire`]), or none given: the set, in the shape of the
        // other reasons.
        ErrorKind::InvalidValue => match e.get(ContextKind::ValidValue) {
            Some(ContextValue::Strings(values)) if value.as_deref() == Some("") => {
                let reason = if values.is_empty() {
                    "needs a value".to_string()
                } else {
                    format!("needs a value: one of {}", values.join(", "))
                };
                return Some((flag, None, reason));
            }
            Some(ContextValue::Strings(values)) => {
                format!("is not one of the values it takes: {}", values.join(", "))
            }
            _ => return None,
        },
        _ => return None,
    };
    Some((flag, value, reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_range_checked_without_echo() {
        assert_eq!(limit("20"), Ok(20));
        for bad in [
            "0",
            "-1",
            "1001",
            "1e3",
            "",
            " ",
            "0x10",
            "NaN",
            &"9".repeat(300),
        ] {
            let e = limit(bad).unwrap_err();
            assert!(e.contains("1..=1000"), "{bad}: {e}");
            assert!(!e.contains("999999"), "{bad}: {e}");
        }
        assert_eq!(fence(&i64::MAX.to_string()), Ok(i64::MAX));
        assert!(fence(&(i64::MAX as i128 + 1).to_string()).is_err());
        assert_eq!(slot_count("0"), Ok(0));
    }

    #[test]
    fn floats_are_finite_and_in_range() {
        assert_eq!(slot_minutes("60"), Ok(60.0));
        for bad in ["1e-300", "0", "-1", "NaN", "inf", "-inf", "1e308", "x"] {
            assert!(slot_minutes(bad).is_err(), "{bad}");
        }
        assert_eq!(score("-5"), Ok(-5.0));
        assert!(score("1e7").is_err());
    }

    /// Every numeric flag of every command, as `<command path> --flag`. `tests/it/flag_ranges.rs`
    /// has one table row per entry; a new numeric flag fails this test until it gets a range here
    /// and a row there.
    pub const NUMERIC_FLAGS: &[&str] = &[
        "gc policy --history-days",
        "gc policy --journal-full-days",
        "gc policy --live-window-days",
        "gc policy --report-files-days",
        "history --limit",
        "loop --max-consecutive-failures",
        "loop --max-sleep-seconds",
        "loop --max-turns",
        "loop --max-unvalidated-turns",
        "loop --timeout-seconds",
        "quota set --allowed-slots",
        "quota set --compute",
        "quota set --per-agent-cap",
        "quota set --slot-minutes",
        "quota set --window-hours",
        "quota spend-slot --slots",
        "reward add --score",
        "todo add --max-no-change",
        "todo check --fence",
        "todo claim --ttl-seconds",
        "todo complete --fence",
        "todo release --fence",
        "todo renew --fence",
        "todo renew --ttl-seconds",
        "todo update --fence",
        "todo update --max-no-change",
        "turn list --limit",
        "turn run --timeout-seconds",
    ];

    fn numeric_flags(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        use clap::builder::ValueParser;
        // The parsed type decides: a flag of any of these types is numeric, whatever parser.
        let numeric = [
            ValueParser::from(clap::value_parser!(u8)).type_id(),
            ValueParser::from(clap::value_parser!(u16)).type_id(),
            ValueParser::from(clap::value_parser!(u32)).type_id(),
            ValueParser::from(clap::value_parser!(u64)).type_id(),
            ValueParser::from(clap::value_parser!(usize)).type_id(),
            ValueParser::from(clap::value_parser!(i32)).type_id(),
            ValueParser::from(clap::value_parser!(i64)).type_id(),
            ValueParser::from(clap::value_parser!(f32)).type_id(),
            ValueParser::from(clap::value_parser!(f64)).type_id(),
        ];
        for arg in cmd.get_arguments() {
            if numeric.contains(&arg.get_value_parser().type_id()) {
                let name = format!("{path} --{}", arg.get_long().unwrap_or("?"));
                assert!(
                    arg.is_allow_hyphen_values_set(),
                    "{name}: numeric flags take hyphen values so -1 reaches the range check"
                );
                out.push(name);
            }
        }
        for sub in cmd.get_subcommands() {
            let sub_path = if path.is_empty() {
                sub.get_name().to_string()
            } else {
                format!("{path} {}", sub.get_name())
            };
            numeric_flags(sub, &sub_path, out);
        }
    }

    #[test]
    fn every_numeric_flag_has_a_range() {
        use clap::CommandFactory;
        let mut cmd = crate::cli::Cli::command();
        cmd.build();
        let mut found = Vec::new();
        numeric_flags(&cmd, "", &mut found);
        found.sort();
        assert_eq!(found, NUMERIC_FLAGS);
    }

    #[test]
    fn text_flags() {
        assert!(probe_text("").is_err());
        assert!(probe_text("  ").is_err());
        assert!(probe_text("check the logs").is_ok());
        assert!(capability("no-slash").is_err());
        assert!(capability("issue-fix/issue-fix").is_ok());
        assert!(capability("builtin:default").is_ok());
    }

    #[test]
    fn long_values_are_cut_when_quoted() {
        let quoted = |v: &str| crate::error::quoted_input(v, QUOTED_CHARS);
        assert_eq!(quoted("0"), " '0'");
        let huge = "9".repeat(300);
        let q = quoted(&huge);
        assert!(q.len() < 60 && q.contains("(300 characters)"), "{q}");
    }
}
