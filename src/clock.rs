//! Wall-clock time as integer milliseconds, and its RFC 3339 rendering for people.
//!
//! The store keeps milliseconds since the Unix epoch: comparable in SQL, immune to time zones.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// RFC 3339 UTC with millisecond precision, e.g. `2026-11-29T09:00:00.123Z`.
pub fn rfc3339(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}
