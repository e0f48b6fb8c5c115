//! Wall-clock time as integer milliseconds, and its RFC 3339 rendering for people.
//!
//! The store keeps milliseconds since the Unix epoch: comparable in SQL, immune to time zones.
//! Rendering is done here rather than through a date crate because `refresh-state` renders three
//! timestamps per todo on every tick; [`Rfc3339`] formats into a stack buffer and serializes
//! without allocating.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (plus the test clock's offset in `test-hooks` builds).
pub fn now_ms() -> i64 {
    let system = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    test_clock::adjust(system)
}

/// The file inside `.loopx/` whose decimal content moves the test clock, in milliseconds.
pub const TEST_CLOCK_FILE: &str = "test-clock-offset-ms";

/// Test-only time travel. Compiled only with the `test-hooks` feature (the crate's own test and
/// bench builds, Cargo.toml), and read from a file inside `.loopx/`, never from the environment:
/// a host inside a turn can neither see nor write `.loopx/` (src/turn/isolation.rs), and a binary
/// anyone runs has no hook at all (docs/operator-guide.md, "Threat model").
#[cfg(feature = "test-hooks")]
pub mod test_clock {
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

    static VALUE_MS: AtomicI64 = AtomicI64::new(0);
    static FROZEN: AtomicBool = AtomicBool::new(false);

    /// The system time moved by the offset, or the frozen instant.
    pub(crate) fn adjust(system: i64) -> i64 {
        let value = VALUE_MS.load(Ordering::Relaxed);
        if FROZEN.load(Ordering::Relaxed) {
            value
        } else {
            system.saturating_add(value)
        }
    }

    /// Reads `<state>/test-clock-offset-ms`: `N` moves the clock by N ms, `@N` freezes it at N ms
    /// since the epoch (so a test can assert exact hints); absent or unreadable means no change.
    pub fn load(state: &std::path::Path) {
        let text = crate::state_file::read_bounded_text(
            &state.join(super::TEST_CLOCK_FILE),
            crate::state_file::MAX_RECORD_BYTES,
        )
        .unwrap_or_default();
        let text = text.trim();
        let (frozen, digits) = match text.strip_prefix('@') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        match digits.parse::<i64>() {
            Ok(v) => {
                VALUE_MS.store(v, Ordering::Relaxed);
                FROZEN.store(frozen, Ordering::Relaxed);
            }
            Err(_) => {
                VALUE_MS.store(0, Ordering::Relaxed);
                FROZEN.store(false, Ordering::Relaxed);
            }
        }
    }
}

/// Builds without `test-hooks` have no test clock: the offset is the constant 0.
#[cfg(not(feature = "test-hooks"))]
pub mod test_clock {
    #[inline(always)]
    pub(crate) fn adjust(system: i64) -> i64 {
        system
    }

    /// Does nothing: only `test-hooks` builds read a test clock.
    #[inline(always)]
    pub fn load(_state: &std::path::Path) {}
}

/// Parses an RFC 3339 time in UTC (`Z` or `+00:00`), with optional fractional seconds, to
/// milliseconds since the epoch. `None` for anything else (other offsets included).
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<i64> {
        let s = text.get(from..to)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, m, s) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    let mut rest = &text[19..];
    let mut millis = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        let digits = &frac[..n.min(3)];
        millis = digits.parse::<i64>().ok()? * 10i64.pow(3 - digits.len() as u32);
        rest = &frac[n..];
    }
    if !matches!(rest, "Z" | "z" | "+00:00") {
        return None;
    }
    let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let month_len = match month {
        2 if leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        1..=12 => 31,
        _ => return None,
    };
    if year < 1970 || day < 1 || day > month_len || h > 23 || m > 59 || s > 59 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(((days * 24 + h) * 60 + m) * 60_000 + s * 1000 + millis)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (the inverse of `civil_from_days`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Milliseconds in a day (the clock has no leap seconds).
pub const DAY_MS: i64 = 86_400_000;

/// `YYYY-MM` of a time: the name of its month's run-report folder and archive files.
pub fn month_label(ms: i64) -> String {
    String::from_utf8_lossy(&Rfc3339(ms).render()[..7]).into_owned()
}

/// The first millisecond of the month `ms` falls in, and of the month after it.
pub fn month_bounds(ms: i64) -> (i64, i64) {
    let r = Rfc3339(ms).render();
    let num = |a: usize, b: usize| -> i64 {
        std::str::from_utf8(&r[a..b])
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    let (y, m) = (num(0, 4), num(5, 7));
    let start = days_from_civil(y, m, 1) * DAY_MS;
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    (start, days_from_civil(ny, nm, 1) * DAY_MS)
}

/// Every month that starts at or after `from`'s month and ends at or before `until`: the
/// months wholly older than a cut-off.
pub fn complete_months(from: i64, until: i64) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let (mut start, mut end) = month_bounds(from);
    while end <= until {
        out.push((start, end));
        (start, end) = month_bounds(end);
    }
    out
}

/// RFC 3339 UTC with millisecond precision, e.g. `2026-11-29T09:00:00.123Z`.
pub fn rfc3339(ms: i64) -> String {
    Rfc3339(ms).to_string()
}

/// The last millisecond of the year 9999: the latest time RFC 3339's four-digit year can write.
/// Inputs that would land later are refused (`model::monitor::parse_until`).
pub const LATEST_MS: i64 = 253_402_300_799_999;

/// A millisecond timestamp that displays and serializes as RFC 3339 UTC. Times before the epoch
/// render as the epoch and times after [`LATEST_MS`] as it; the store holds neither, except
/// saturated sums such as a monitor's next check after a long backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rfc3339(pub i64);

impl Rfc3339 {
    /// The 24 ASCII bytes of the timestamp, for writers that assemble output by hand.
    pub(crate) fn render(self) -> [u8; 24] {
        let ms = self.0.clamp(0, LATEST_MS);
        let (days, ms_of_day) = (ms / 86_400_000, ms % 86_400_000);
        let (year, month, day) = civil_from_days(days);
        let (h, m, s, milli) = (
            ms_of_day / 3_600_000,
            ms_of_day / 60_000 % 60,
            ms_of_day / 1000 % 60,
            ms_of_day % 1000,
        );
        let mut out = *b"0000-00-00T00:00:00.000Z";
        let mut put = |at: usize, width: usize, mut value: i64| {
            for i in (at..at + width).rev() {
                out[i] = b'0' + (value % 10) as u8;
                value /= 10;
            }
        };
        put(0, 4, year);
        put(5, 2, month);
        put(8, 2, day);
        put(11, 2, h);
        put(14, 2, m);
        put(17, 2, s);
        put(20, 3, milli);
        out
    }
}

/// (year, month, day) of the proleptic Gregorian calendar for days since 1970-01-01 (>= 0).
/// Counts from 0000-03-01 so the leap day is the last day of a "year"; eras are 400 years.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

impl std::fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes = self.render();
        f.write_str(std::str::from_utf8(&bytes).expect("ASCII digits"))
    }
}

impl serde::Serialize for Rfc3339 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let bytes = self.render();
        s.serialize_str(std::str::from_utf8(&bytes).expect("ASCII digits"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn month_bounds_cover_the_calendar() {
        let t = 1_796_182_974_839; // 2026-12-02
        let (s, e) = month_bounds(t);
        assert_eq!(rfc3339(s), "2026-12-01T00:00:00.000Z");
        assert_eq!(rfc3339(e), "2027-01-01T00:00:00.000Z");
        assert_eq!(month_label(t), "2026-12");
        let (s, e) = month_bounds(days_from_civil(2024, 2, 10) * DAY_MS);
        assert_eq!((e - s) / DAY_MS, 29, "leap February");
        let months = complete_months(days_from_civil(2025, 11, 20) * DAY_MS, t);
        let labels: Vec<String> = months.iter().map(|m| month_label(m.0)).collect();
        assert_eq!(
            labels,
            [
                "2025-11", "2025-12", "2026-01", "2026-02", "2026-03", "2026-04", "2026-05",
                "2026-06", "2026-07", "2026-08", "2026-09", "2026-10", "2026-11"
            ]
        );
    }

    #[test]
    fn known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(-5), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_798_761_599_999), "2026-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
        assert_eq!(rfc3339(LATEST_MS), "9999-12-31T23:59:59.999Z");
        // Later instants (a saturated sum) show as the latest one, never as an earlier date.
        assert_eq!(rfc3339(LATEST_MS + 1), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(i64::MAX), "9999-12-31T23:59:59.999Z");
        assert_eq!(parse_rfc3339("9999-12-31T23:59:59.999Z"), Some(LATEST_MS));
        assert_eq!(
            serde_json::to_string(&Rfc3339(1_780_000_000_123)).unwrap(),
            "\"2026-05-28T20:26:40.123Z\""
        );
    }

    #[test]
    fn rfc3339_parses_what_it_renders() {
        for ms in [0, 951_782_400_000, 1_798_761_599_999, 1_796_187_600_000] {
            assert_eq!(parse_rfc3339(&rfc3339(ms)), Some(ms));
        }
        assert_eq!(
            parse_rfc3339("2026-12-02T05:00:00Z"),
            Some(1_796_187_600_000)
        );
        assert_eq!(
            parse_rfc3339("2026-12-02T05:00:00.5+00:00"),
            Some(1_796_187_600_500)
        );
        for bad in [
            "2026-02-30T00:00:00Z",
            "2026-12-02T05:00:00+01:00",
            "2026-12-02T25:00:00Z",
            "2026-12-02",
            "2026-12-02T05:00:00.Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn every_day_from_1970_to_2400_matches_a_naive_calendar() {
        let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let (mut y, mut m, mut d) = (1970, 1, 1);
        for days in 0..(430 * 366) {
            assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
            let month_len = match m {
                2 if leap(y) => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
            d += 1;
            if d > month_len {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
    }
}
