//! Wall-clock time as integer milliseconds, and its RFC 3339 rendering for people.
//!
//! The store keeps milliseconds since the Unix epoch: comparable in SQL, immune to time zones.
//! Rendering is done here rather than through a date crate because `refresh-state` renders three
//! timestamps per todo on every tick; [`Rfc3339`] formats into a stack buffer and serializes
//! without allocating.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// RFC 3339 UTC with millisecond precision, e.g. `2026-11-29T09:00:00.123Z`.
pub fn rfc3339(ms: i64) -> String {
    Rfc3339(ms).to_string()
}

/// A millisecond timestamp that displays and serializes as RFC 3339 UTC. Times before the epoch
/// render as the epoch; the store never holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rfc3339(pub i64);

impl Rfc3339 {
    /// The 24 ASCII bytes of the timestamp, for writers that assemble output by hand.
    pub(crate) fn render(self) -> [u8; 24] {
        let ms = self.0.max(0);
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
        put(0, 4, year.min(9999));
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
    fn known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(-5), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_798_761_599_999), "2026-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
        assert_eq!(
            serde_json::to_string(&Rfc3339(1_780_000_000_123)).unwrap(),
            "\"2026-05-28T20:26:40.123Z\""
        );
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
