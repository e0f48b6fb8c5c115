//! Scheduled monitors: the schedule and check state of a `monitor` todo, and deferred todos'
//! resume times.
//!
//! A monitor is a todo of kind `monitor` plus one row of its own (table `monitors`, keyed by goal
//! and todo id) holding its cadence, next due time, last check and result digest. The row lives
//! apart from `todos` so the todo hot paths stay as they are. The backoff rule is here, as a pure
//! function of the row, so the decision (a pure read) and the check (a write) compute the same
//! schedule (docs/state-model.md, "Monitors").

use serde::{Deserialize, Serialize};

use super::wire_enum;
use crate::error::{Result, bad_input, quoted_input};

/// Quiet checks multiply the cadence by at most this much (docs/state-model.md, "Monitors").
pub const BACKOFF_CAP: i64 = 8;
/// `--max-no-change` when none is given: three quiet checks, then backoff.
pub const DEFAULT_MAX_NO_CHANGE: i64 = 3;
/// Shortest cadence: one second (the heartbeat example uses seconds).
pub const MIN_EVERY_MS: i64 = 1_000;
/// Longest cadence: 30 days.
pub const MAX_EVERY_MS: i64 = 30 * 86_400_000;

wire_enum!(
    /// What a material change does besides recording its evidence.
    MonitorFollowUp {
        /// Opens an agent task todo naming the change.
        OpenTodo => "open_todo",
        /// Flags the goal for replanning (an agent task to replan, at P1).
        Replan => "replan",
        /// Records the evidence only (`--watch-only`).
        None => "none",
    }
);

wire_enum!(
    /// What one check found.
    CheckResult {
        /// The first observation: the digest every later one is compared with.
        Baseline => "baseline",
        /// Same digest as the last check.
        Unchanged => "unchanged",
        /// A different digest: evidence and the follow-up were recorded.
        Changed => "changed",
        /// The check did not produce an observation (provider failure, timeout, disabled).
        Failed => "failed",
    }
);

/// A provider operation run by the kernel side when the monitor is due (`--probe`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProbeSpec {
    /// `<extension>/<provider>`.
    pub provider: String,
    pub operation: String,
    pub target: String,
}

/// The schedule and check state of one monitor todo.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Monitor {
    pub goal_id: String,
    pub todo_id: String,
    /// The base cadence.
    pub every_ms: i64,
    /// When the monitor ends (archived by the next sweep or check at or after it).
    pub until_at: Option<i64>,
    /// What is watched (a metric key, a URL, a path), for the agent and the follow-up.
    pub target: Option<String>,
    pub follow_up: MonitorFollowUp,
    /// Quiet checks in a row after which the cadence backs off.
    pub max_no_change: i64,
    pub probe: Option<ProbeSpec>,
    pub next_due_at: i64,
    pub last_check_at: Option<i64>,
    pub last_digest: Option<String>,
    pub last_result: Option<CheckResult>,
    /// Quiet checks in a row (reset by a change).
    pub no_change_count: i64,
    /// Whether the latest successful check saw a material change.
    pub material_change: bool,
    pub checks: i64,
    /// Failed checks in a row (reset by a successful one).
    pub failures: i64,
    pub last_failure: Option<String>,
    /// Increases with every claimed check: a result carrying an older number is refused.
    pub check_seq: i64,
    /// The todo's `last_fence` when the last check was recorded; a higher fence means a turn took
    /// the monitor since and did not record a check.
    pub checked_fence: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

impl Monitor {
    /// The cadence multiplier after `no_change_count` quiet checks: 1 until `max_no_change` of
    /// them, then 2, 4, ... doubling per further quiet check, capped at [`BACKOFF_CAP`]. A change
    /// (or the baseline) leaves no quiet check, so it is always at the cadence: `max_no_change`
    /// 0 therefore backs off from the first quiet check, as 1 does.
    pub fn backoff_factor(&self) -> i64 {
        let over = self.no_change_count - self.max_no_change.max(1);
        if over < 0 {
            1
        } else {
            1i64.checked_shl((over + 1).min(32) as u32)
                .unwrap_or(BACKOFF_CAP)
                .min(BACKOFF_CAP)
        }
    }

    /// The current interval between checks (the cadence times the backoff).
    pub fn interval_ms(&self) -> i64 {
        self.every_ms.saturating_mul(self.backoff_factor())
    }

    /// Whether the monitor's `--until` has passed at `now`.
    pub fn expired(&self, now: i64) -> bool {
        self.until_at.is_some_and(|u| now >= u)
    }

    /// When the monitor is next due, given the todo's highest granted fence and its last write:
    /// a turn that took the monitor and settled without recording a check counts as a failed
    /// check, so the monitor is retried one cadence after it instead of at once.
    pub fn due_at(&self, todo_last_fence: i64, todo_updated_at: i64) -> i64 {
        if todo_last_fence > self.checked_fence {
            self.next_due_at
                .max(todo_updated_at.saturating_add(self.every_ms))
        } else {
            self.next_due_at
        }
    }
}

/// Longest observation text a goal probe keeps for the operator to read (its digest covers all
/// of it).
pub const GOAL_PROBE_OBSERVATION_BYTES: usize = 4096;

/// A goal's provider probe (table `goal_probes`, migration 10): the executable form of the goal's
/// `next_probe`, which stays a note that is never run. The heartbeat runs each revision once
/// (`revision` above `ran_revision`), and `probe run` runs it on demand; every run is claimed
/// first (`run_seq`), so two overlapping heartbeats never run one revision twice and a result
/// carrying a superseded `run_seq` is refused. Results compare digests as monitor checks do.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GoalProbe {
    pub goal_id: String,
    pub spec: ProbeSpec,
    /// Bumped by every `probe set` of a provider probe.
    pub revision: i64,
    /// The revision the latest claimed run ran; the heartbeat runs the probe while it is below
    /// `revision`.
    pub ran_revision: i64,
    /// Bumped by every claimed run.
    pub run_seq: i64,
    /// Runs recorded (any result).
    pub runs: i64,
    /// Failed runs in a row (reset by a successful one).
    pub failures: i64,
    pub last_result: Option<CheckResult>,
    pub last_digest: Option<String>,
    pub last_checked_at: Option<i64>,
    pub last_failure: Option<String>,
    /// The observation of the latest baseline or change, at most
    /// [`GOAL_PROBE_OBSERVATION_BYTES`]: the record of what changed, shown inert.
    pub last_observation: Option<String>,
    /// When the latest change was seen.
    pub changed_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl GoalProbe {
    /// Whether the current revision has not been run yet (the heartbeat runs it once).
    pub fn pending(&self) -> bool {
        self.ran_revision < self.revision
    }
}

/// A deferred todo's resume time (table `todo_deferrals`): the todo goes back to `open` at
/// `until_at` by itself (the next heartbeat tick or kernel write on the goal).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Deferral {
    pub goal_id: String,
    pub todo_id: String,
    pub until_at: i64,
}

/// How much of a malformed duration or time an error quotes.
const QUOTED_CHARS: usize = 32;

/// Parses a duration such as `90s`, `15m`, `1h`, `2d` or `1h30m` into milliseconds (`ms` also
/// accepted, for tests of short cadences). Units go from the largest to the smallest, each at most
/// once, with nothing around or between them: `1h30h` is a typo for `1h30m`, not 31 hours. A
/// duration too long to represent saturates, so the caller's range check names the limit.
pub fn parse_duration_ms(text: &str) -> Result<i64> {
    let bad = || {
        bad_input(format!(
            "invalid duration{}: use numbers with units from the largest to the smallest, each \
             once, e.g. 30s, 15m, 1h, 2d or 1h30m",
            quoted_input(&crate::inert::line(text), QUOTED_CHARS)
        ))
    };
    if text.is_empty() {
        return Err(bad());
    }
    let mut total: i64 = 0;
    let mut previous_unit = i64::MAX;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        // Only ASCII digits: the parse fails only on overflow.
        let n: i64 = rest[..digits].parse().unwrap_or(i64::MAX);
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        if unit >= previous_unit {
            return Err(bad());
        }
        previous_unit = unit;
        rest = &rest[unit_len..];
        total = total.saturating_add(n.saturating_mul(unit));
    }
    Ok(total)
}

/// Parses `--until`: an RFC 3339 UTC time (`2026-12-02T05:00:00Z`) or `+<duration>` from `now`.
pub fn parse_until(text: &str, now: i64) -> Result<i64> {
    let t = text;
    if let Some(d) = t.strip_prefix('+') {
        let at = now.saturating_add(parse_duration_ms(d)?);
        if at > crate::clock::LATEST_MS {
            return Err(bad_input(format!(
                "{} lands after 9999-12-31T23:59:59Z, the latest time LoopX can write: give a \
                 shorter duration or an RFC 3339 time",
                quoted_input(&crate::inert::line(t), QUOTED_CHARS).trim_start()
            )));
        }
        return Ok(at);
    }
    crate::clock::parse_rfc3339(t).ok_or_else(|| {
        bad_input(format!(
            "invalid time{}: use RFC 3339 UTC like 2026-12-02T05:00:00Z, or +<duration> like +2h",
            quoted_input(&crate::inert::line(t), QUOTED_CHARS)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_each_unit_once_largest_first() {
        for (text, ms) in [
            ("90s", 90_000),
            ("15m", 900_000),
            ("1h30m", 5_400_000),
            ("2d", 172_800_000),
            ("1d2h3m4s5ms", 93_784_005),
            ("0s", 0),
            ("250ms", 250),
        ] {
            assert_eq!(parse_duration_ms(text).unwrap(), ms, "{text}");
        }
        for text in [
            "1h1h", "30m1h", "1h30h", "1s1ms1s", "1h 30m", " 1h", "1h ", "", "h", "1", "1x", "-1h",
            "1.5h", "+1h", "1H",
        ] {
            let err = parse_duration_ms(text).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{text:?}");
            assert!(err.to_string().contains("largest to the smallest"), "{err}");
        }
        for huge in [
            "999999999999d",
            "99999999999999999999999999d",
            "9223372036854775807ms1",
        ] {
            let saturated = parse_duration_ms(huge);
            if huge.ends_with("ms1") {
                assert!(saturated.is_err(), "{huge}");
            } else {
                assert_eq!(saturated.unwrap(), i64::MAX, "{huge}");
            }
        }
        assert!(parse_until(" +1h", 0).is_err());
    }

    #[test]
    fn an_until_past_the_year_9999_is_refused() {
        let now = 1_796_187_600_000;
        assert_eq!(parse_until("+1d", now).unwrap(), now + 86_400_000);
        for far in [
            "+99999999999d",
            "+106751991d",
            "+106751991167d",
            "+99999999999999999999999999d",
        ] {
            let err = parse_until(far, now).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{far}");
            assert!(err.to_string().contains("9999-12-31"), "{err}");
        }
    }

    fn monitor(no_change: i64, max: i64) -> Monitor {
        Monitor {
            goal_id: "g".into(),
            todo_id: "m".into(),
            every_ms: 3_600_000,
            until_at: None,
            target: None,
            follow_up: MonitorFollowUp::OpenTodo,
            max_no_change: max,
            probe: None,
            next_due_at: 0,
            last_check_at: None,
            last_digest: None,
            last_result: None,
            no_change_count: no_change,
            material_change: false,
            checks: 0,
            failures: 0,
            last_failure: None,
            check_seq: 0,
            checked_fence: 0,
            created_at: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn backoff_progression_is_one_until_the_limit_then_doubles_to_the_cap() {
        let factors: Vec<i64> = (0..8).map(|n| monitor(n, 3).backoff_factor()).collect();
        assert_eq!(factors, vec![1, 1, 1, 2, 4, 8, 8, 8]);
        // A change leaves no quiet check: at the cadence even with no quiet check allowed.
        let none_allowed: Vec<i64> = (0..4).map(|n| monitor(n, 0).backoff_factor()).collect();
        assert_eq!(none_allowed, vec![1, 2, 4, 8]);
        assert_eq!(monitor(1_000_000, 3).backoff_factor(), BACKOFF_CAP);
        assert_eq!(monitor(4, 3).interval_ms(), 4 * 3_600_000);
    }

    #[test]
    fn a_turn_that_took_the_monitor_without_a_check_waits_a_cadence() {
        let mut m = monitor(0, 3);
        m.next_due_at = 100;
        assert_eq!(m.due_at(0, 50), 100);
        m.checked_fence = 2;
        assert_eq!(m.due_at(3, 500), 500 + 3_600_000);
    }

    #[test]
    fn durations_and_times_parse() {
        assert_eq!(parse_duration_ms("1h").unwrap(), 3_600_000);
        assert_eq!(parse_duration_ms("1h30m").unwrap(), 5_400_000);
        assert_eq!(parse_duration_ms("2s").unwrap(), 2_000);
        assert_eq!(parse_duration_ms("250ms").unwrap(), 250);
        for bad in ["", "h", "1", "1x", "-1h", "1h-"] {
            assert!(parse_duration_ms(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_until("+1m", 1000).unwrap(), 61_000);
        assert_eq!(
            parse_until("2026-12-02T05:00:00Z", 0).unwrap(),
            1_796_187_600_000
        );
        assert!(parse_until("tomorrow", 0).is_err());
    }
}
