//! Every numeric flag of every command refuses out-of-range, negative, zero (where 0 means
//! nothing), NaN/infinite and huge values with exit 2, a message naming the flag and its valid
//! range, no echo of the value, and no change to the project (issue 13, section 6). The list of
//! flags is checked for completeness against the clap tree by `cli::flags::tests`.

use crate::support::Project;

/// One numeric flag: the command before it, the flag, what follows it (required arguments and
/// the host argv), the range text the message must show, and the values to refuse.
struct Row {
    before: &'static [&'static str],
    flag: &'static str,
    after: &'static [&'static str],
    range: &'static str,
    bad: &'static [&'static str],
}

const HUGE: &str =
    "99999999999999999999999999999999999999999999999999999999999999999999999999999999";
const INTS_FROM_1: &[&str] = &["0", "-1", "-99", HUGE, "1.5", "NaN", "inf", "1e3", "", "x"];
const INTS_FROM_0: &[&str] = &["-1", HUGE, "1.5", "NaN", "inf", "x"];

const ROWS: &[Row] = &[
    Row {
        before: &["gc", "policy"],
        flag: "--live-window-days",
        after: &[],
        range: "0..=36500",
        bad: INTS_FROM_0,
    },
    Row {
        before: &["gc", "policy"],
        flag: "--journal-full-days",
        after: &[],
        range: "0..=36500",
        bad: INTS_FROM_0,
    },
    Row {
        before: &["gc", "policy"],
        flag: "--report-files-days",
        after: &[],
        range: "0..=36500",
        bad: INTS_FROM_0,
    },
    Row {
        before: &["gc", "policy"],
        flag: "--history-days",
        after: &[],
        range: "0..=36500",
        bad: INTS_FROM_0,
    },
    Row {
        before: &["history", "--goal-id", "g"],
        flag: "--limit",
        after: &[],
        range: "1..=1000",
        bad: INTS_FROM_1,
    },
    Row {
        before: &["turn", "list"],
        flag: "--limit",
        after: &[],
        range: "1..=1000",
        bad: INTS_FROM_1,
    },
    Row {
        before: &["turn", "run", "--goal-id", "g"],
        flag: "--timeout-seconds",
        after: &["--", "true"],
        range: "1..=86400",
        bad: INTS_FROM_1,
    },
    Row {
        before: &["loop", "--goal-id", "g"],
        flag: "--timeout-seconds",
        after: &["--", "true"],
        range: "1..=86400",
        bad: INTS_FROM_1,
    },
    Row {
        before: &["loop", "--goal-id", "g"],
        flag: "--max-turns",
        after: &["--", "true"],
        range: "1..=100000",
        bad: INTS_FROM_1,
    },
    Row {
        before: &["loop", "--goal-id", "g"],
        flag: "--max-sleep-seconds",
        after: &["--", "true"],
        range: "1..=86400",
        bad: INTS_FROM_1,
    },
    Row {
        before: &["loop", "--goal-id", "g"],
        flag: "--max-consecutive-failures",
        after: &["--", "true"],
        range: "1..=10000",
        bad: INTS_FROM_1,
    },
    Row {
        before: &["loop", "--goal-id", "g"],
        flag: "--max-unvalidated-turns",
        after: &["--", "true"],
        range: "1..=10000",
        bad: INTS_FROM_1,
    },
    Row {
        before: &[
            "todo",
            "add",
            "--goal-id",
            "g",
            "--kind",
            "monitor",
            "--every",
            "1h",
            "--title",
            "m",
        ],
        flag: "--max-no-change",
        after: &[],
        range: "0..=10000",
        bad: INTS_FROM_0,
    },
    Row {
        before: &["todo", "update", "--goal-id", "g", "--todo-id", "t1"],
        flag: "--max-no-change",
        after: &[],
        range: "0..=10000",
        bad: INTS_FROM_0,
    },
    Row {
        before: &["todo", "claim", "--goal-id", "g"],
        flag: "--ttl-seconds",
        after: &[],
        range: "1..=86400",
        bad: INTS_FROM_1,
    },
    Row {
        before: &["todo", "renew", "--goal-id", "g", "--todo-id", "t1"],
        flag: "--ttl-seconds",
        after: &[],
        range: "1..=86400",
        bad: INTS_FROM_1,
    },
    Row {
        before: &["todo", "renew", "--goal-id", "g", "--todo-id", "t1"],
        flag: "--fence",
        after: &[],
        range: "1..=9223372036854775807",
        bad: INTS_FROM_1,
    },
    Row {
        before: &[
            "todo",
            "check",
            "--goal-id",
            "g",
            "--todo-id",
            "t1",
            "--observation",
            "x",
        ],
        flag: "--fence",
        after: &[],
        range: "1..=9223372036854775807",
        bad: INTS_FROM_1,
    },
    Row {
        before: &["todo", "release", "--goal-id", "g", "--todo-id", "t1"],
        flag: "--fence",
        after: &[],
        range: "1..=9223372036854775807",
        bad: INTS_FROM_1,
    },
    Row {
        before: &["todo", "update", "--goal-id", "g", "--todo-id", "t1"],
        flag: "--fence",
        after: &[],
        range: "1..=9223372036854775807",
        bad: INTS_FROM_1,
    },
    Row {
        before: &["todo", "complete", "--goal-id", "g", "--todo-id", "t1"],
        flag: "--fence",
        after: &[],
        range: "1..=9223372036854775807",
        bad: INTS_FROM_1,
    },
    Row {
        before: &["quota", "spend-slot", "--goal-id", "g"],
        flag: "--slots",
        after: &[],
        range: "1..=10000",
        bad: INTS_FROM_1,
    },
    Row {
        before: &["quota", "set", "--goal-id", "g"],
        flag: "--allowed-slots",
        after: &[],
        range: "0..=1000000",
        bad: INTS_FROM_0,
    },
    Row {
        before: &["quota", "set", "--goal-id", "g"],
        flag: "--per-agent-cap",
        after: &[],
        range: "0..=1000000",
        bad: INTS_FROM_0,
    },
    Row {
        before: &["quota", "set", "--goal-id", "g"],
        flag: "--compute",
        after: &[],
        range: "0..=1000",
        bad: &["-1", "1001", "NaN", "inf", "-inf", "1e308", HUGE, "x"],
    },
    Row {
        before: &["quota", "set", "--goal-id", "g"],
        flag: "--window-hours",
        after: &[],
        range: "0.01..=10000",
        bad: &["0", "-1", "1e-300", "10001", "NaN", "inf", HUGE, "x"],
    },
    Row {
        before: &["quota", "set", "--goal-id", "g"],
        flag: "--slot-minutes",
        after: &[],
        range: "0.1..=10000",
        bad: &["0", "-1", "1e-300", "10001", "NaN", "inf", HUGE, "x"],
    },
    Row {
        before: &["reward", "add", "--goal-id", "g", "--run-id", "r1"],
        flag: "--score",
        after: &[],
        range: "-1000000..=1000000",
        bad: &["1e7", "-1e7", "NaN", "inf", "-inf", HUGE, "x"],
    },
];

/// What a refused command must leave as it was: every file of the project (database and WAL
/// included) and what `status` reports.
fn fingerprint(p: &Project) -> (std::collections::BTreeMap<String, String>, String) {
    let status = p.run(&["--format", "json", "status"]).ok().stdout;
    (p.snapshot(), status)
}

#[test]
fn every_numeric_flag_refuses_values_outside_its_range() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    let before = fingerprint(&p);
    let mut checked = 0;
    for row in ROWS {
        for bad in row.bad {
            let mut args: Vec<&str> = row.before.to_vec();
            args.push(row.flag);
            args.push(bad);
            args.extend_from_slice(row.after);
            let r = p.run(&args);
            let what = args.join(" ");
            assert_eq!(r.code, 2, "{what}: {r:?}");
            assert!(r.stderr.contains(row.flag), "{what}: {}", r.stderr);
            assert!(r.stderr.contains(row.range), "{what}: {}", r.stderr);
            assert!(
                !r.stderr.contains("unexpected argument"),
                "{what}: {}",
                r.stderr
            );
            if bad.len() > 20 {
                assert!(
                    !r.stderr.contains(bad),
                    "{what} echoed the value: {}",
                    r.stderr
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 100);
    assert_eq!(
        fingerprint(&p),
        before,
        "a refused flag changed the project"
    );
}

#[test]
fn text_flags_with_a_shape_are_refused() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    let before = fingerprint(&p);
    for (args, flag, expect) in [
        (
            vec!["probe", "set", "--goal-id", "g", "--text", ""],
            "--text",
            "--clear",
        ),
        (
            vec!["probe", "set", "--goal-id", "g", "--text", "   "],
            "--text",
            "--clear",
        ),
        (
            vec![
                "todo",
                "add",
                "--goal-id",
                "g",
                "--title",
                "x",
                "--capability",
                "no-slash",
            ],
            "--capability",
            "<extension>/<capability>",
        ),
        (
            vec![
                "todo",
                "add",
                "--goal-id",
                "g",
                "--title",
                "x",
                "--capability",
                "a/b/c",
            ],
            "--capability",
            "<extension>/<capability>",
        ),
        (
            vec![
                "turn",
                "run",
                "--goal-id",
                "g",
                "--capability",
                "no-slash",
                "--",
                "true",
            ],
            "--capability",
            "builtin:default",
        ),
    ] {
        let r = p.run(&args);
        assert_eq!(r.code, 2, "{args:?}: {r:?}");
        assert!(r.stderr.contains(flag), "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(expect), "{args:?}: {}", r.stderr);
    }
    assert_eq!(fingerprint(&p), before);
    // The valid forms still work.
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--title",
        "y",
        "--capability",
        "issue-fix/issue-fix",
    ]);
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--title",
        "z",
        "--capability",
        "builtin:default",
    ]);
    p.ok(&["probe", "set", "--goal-id", "g", "--text", "check the logs"]);
    p.ok(&[
        "quota",
        "set",
        "--goal-id",
        "g",
        "--slot-minutes",
        "0.1",
        "--window-hours",
        "0.01",
    ]);
}

/// `--every`, `--until` and `--failed` are text with a shape: a repeated or misordered unit, a
/// space, a number too long to represent, a time given as `-1h`, and an empty failure reason are
/// each refused with exit 2, a message that says what the value should look like, and no change.
#[test]
fn monitor_durations_times_and_failure_reasons_with_a_bad_shape_are_refused() {
    let p = Project::with_goal_g();
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--title",
        "watch",
        "--kind",
        "monitor",
        "--every",
        "1h",
    ]);
    let before = fingerprint(&p);
    let update = ["todo", "update", "--goal-id", "g", "--todo-id", "t1"];
    let check = ["todo", "check", "--goal-id", "g", "--todo-id", "t1"];
    let shape = "from the largest to the smallest";
    let far = format!("+{HUGE}d");
    let huge_days = format!("{HUGE}d");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        ([&update[..], &["--every", "1h1h"]].concat(), shape),
        ([&update[..], &["--every", "30m1h"]].concat(), shape),
        ([&update[..], &["--every", " 1h"]].concat(), shape),
        ([&update[..], &["--every", HUGE]].concat(), shape),
        (
            [&update[..], &["--every", &huge_days]].concat(),
            "got more than 30d",
        ),
        (
            [&update[..], &["--every", "999999999999d"]].concat(),
            "got more than 30d",
        ),
        ([&update[..], &["--until", "-1h"]].concat(), "+<duration>"),
        ([&update[..], &["--until", " +1h"]].concat(), "+<duration>"),
        ([&update[..], &["--until", "+1h1h"]].concat(), shape),
        ([&update[..], &["--until", &far]].concat(), "9999-12-31"),
        ([&check[..], &["--failed", ""]].concat(), "needs its reason"),
        (
            [&check[..], &["--failed", "   "]].concat(),
            "needs its reason",
        ),
    ];
    for (args, expect) in &cases {
        let r = p.run(args);
        assert_eq!(r.code, 2, "{args:?}: {r:?}");
        assert!(r.stderr.contains(expect), "{args:?}: {}", r.stderr);
        assert!(
            !r.stderr.contains(HUGE),
            "{args:?} echoed the value: {}",
            r.stderr
        );
    }
    assert_eq!(fingerprint(&p), before);
    p.ok(&[&update[..], &["--every", "1h30m"]].concat());
    p.ok(&[&check[..], &["--failed", "the endpoint timed out"]].concat());
}
