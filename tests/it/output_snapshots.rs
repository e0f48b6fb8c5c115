//! Snapshot tests of what the main commands print, in text, JSON and Markdown.
//!
//! The other tests assert the fields they care about; these pin the whole output, so a refactor
//! that moves code between the kernel and the CLI (typed next actions, typed quota states) cannot
//! change a word of it unnoticed. Each scenario runs real commands against a fresh project and
//! compares one transcript with `tests/it/snapshots/<scenario>.txt` after replacing what differs
//! from run to run: ULIDs (numbered in order of first appearance, so "the same run id twice"
//! stays visible), RFC 3339 timestamps, epoch milliseconds and the temporary project path.
//!
//! After an intended change of output, regenerate with
//! `LOOPX_UPDATE_SNAPSHOTS=1 cargo test --test it output_snapshots` and review the diff.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One scenario: a temporary project and the transcript of the commands run in it.
struct Transcript {
    dir: tempfile::TempDir,
    text: String,
}

impl Transcript {
    fn new() -> Transcript {
        Transcript {
            dir: tempfile::tempdir().expect("tempdir"),
            text: String::new(),
        }
    }

    /// Runs `loopx <args>` in the project and appends the command, its exit code, stdout and
    /// stderr to the transcript. Returns stdout (not normalized) for commands that need a value
    /// from it.
    fn run(&mut self, args: &[&str]) -> String {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_loopx"));
        cmd.args(args).current_dir(self.dir.path());
        for k in [
            "LOOPX_ROOT",
            "LOOPX_TURN_KEY",
            "LOOPX_AGENT_ID",
            "LOOPX_CLAIM_KEY",
            "LOOPX_TEST_CRASH_AFTER",
        ] {
            cmd.env_remove(k);
        }
        let out = cmd.output().expect("spawn loopx");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let shown: Vec<String> = args.iter().map(|a| quote(a)).collect();
        self.text
            .push_str(&format!("$ loopx {}\n", shown.join(" ")));
        self.text.push_str(&format!(
            "[exit {}]\n",
            out.status.code().map_or("signal".into(), |c| c.to_string())
        ));
        self.text.push_str(&stdout);
        if !stdout.is_empty() && !stdout.ends_with('\n') {
            self.text.push('\n');
        }
        for line in stderr.lines() {
            self.text.push_str(&format!("stderr| {line}\n"));
        }
        self.text.push('\n');
        stdout
    }

    /// Runs a command with `--format json` and `--format text` (reads only: both see the same
    /// state).
    fn both(&mut self, args: &[&str]) {
        self.run(args);
        let mut json = vec!["--format", "json"];
        json.extend_from_slice(args);
        self.run(&json);
    }

    /// Compares the normalized transcript with `tests/it/snapshots/<name>.txt`.
    fn check(self, name: &str) {
        let actual = normalize(&self.text, &[self.dir.path().to_path_buf()]);
        let file = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/it/snapshots")
            .join(format!("{name}.txt"));
        if std::env::var_os("LOOPX_UPDATE_SNAPSHOTS").is_some() {
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, &actual).unwrap();
            // Nothing was compared: say so, and fail in CI like any other skip.
            crate::support::skip(
                "update-snapshots",
                &format!(
                    "LOOPX_UPDATE_SNAPSHOTS: wrote {} instead of comparing",
                    file.display()
                ),
            );
            return;
        }
        let expected = std::fs::read_to_string(&file).unwrap_or_else(|e| {
            panic!(
                "{} ({e}); create it with LOOPX_UPDATE_SNAPSHOTS=1",
                file.display()
            )
        });
        if actual != expected {
            let (n, (want, got)) = expected
                .lines()
                .chain(std::iter::repeat("<end of file>"))
                .zip(actual.lines().chain(std::iter::repeat("<end of output>")))
                .enumerate()
                .find(|(_, (a, b))| a != b)
                .expect("texts differ, so some line does");
            panic!(
                "output differs from {} at line {}:\n  expected: {want}\n  actual:   {got}\n\
                 whole output:\n{actual}",
                file.display(),
                n + 1
            );
        }
    }
}

/// The argument as a shell would need it, so a transcript line can be pasted.
fn quote(a: &str) -> String {
    if !a.is_empty()
        && a.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@".contains(&b))
    {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', r"'\''"))
    }
}

/// Replaces the project path, ULIDs, timestamps and epoch milliseconds with stable placeholders.
fn normalize(text: &str, dirs: &[PathBuf]) -> String {
    let mut text = text.to_string();
    for dir in dirs {
        // The canonical form first: it may be longer than the path as given (a symlinked /tmp).
        if let Ok(canonical) = dir.canonicalize() {
            text = text.replace(&*canonical.to_string_lossy(), "<PROJECT>");
        }
        text = text.replace(&*dir.to_string_lossy(), "<PROJECT>");
    }
    let text = replace_timestamps(&text);
    mask_quota_wait(&replace_ulids(&mask_report_months(&text)))
}

/// The month folder of a run report (`runs/2026-12/`) becomes `runs/<MONTH>/`.
fn mask_report_months(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("/runs/") {
        let (head, tail) = rest.split_at(at + "/runs/".len());
        out.push_str(head);
        let b = tail.as_bytes();
        let is_month = b.len() > 7
            && b[..4].iter().all(u8::is_ascii_digit)
            && b[4] == b'-'
            && b[5..7].iter().all(u8::is_ascii_digit)
            && b[7] == b'/';
        if is_month {
            out.push_str("<MONTH>/");
            rest = &tail[8..];
        } else {
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// How long a throttled agent waits is the time until the window frees a slot, counted from the
/// spend: the whole window minus however long the commands in between took, which varies with
/// the machine's load. The number is masked; the action that carries it is not.
fn mask_quota_wait(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut previous = "";
    for line in text.split_inclusive('\n') {
        let masked = if let Some(at) = line.find("wait_for_quota after ") {
            let head = &line[..at + "wait_for_quota after ".len()];
            let tail = line[head.len()..].trim_start_matches(|c: char| c.is_ascii_digit());
            format!("{head}<SECONDS>{tail}")
        } else if previous.contains("\"wait_for_quota\"")
            && let Some(at) = line.find("\"next_check_after_seconds\": ")
        {
            let head = &line[..at + "\"next_check_after_seconds\": ".len()];
            let tail = line[head.len()..].trim_start_matches(|c: char| c.is_ascii_digit());
            format!("{head}<SECONDS>{tail}")
        } else {
            line.to_string()
        };
        out.push_str(&masked);
        previous = line;
    }
    out
}

/// `2026-12-02T01:30:40.967Z` (with or without the fraction) becomes `<TIME>`.
fn replace_timestamps(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut copied = 0;
    while i < b.len() {
        if let Some(len) = timestamp_at(&b[i..]) {
            out.push_str(&text[copied..i]);
            out.push_str("<TIME>");
            i += len;
            copied = i;
        } else {
            i += 1;
        }
    }
    out.push_str(&text[copied..]);
    out
}

/// The length of an RFC 3339 UTC timestamp starting at `b[0]`, if one does.
fn timestamp_at(b: &[u8]) -> Option<usize> {
    const SHAPE: &[u8] = b"dddd-dd-ddTdd:dd:dd";
    if b.len() < SHAPE.len() {
        return None;
    }
    for (c, s) in b.iter().zip(SHAPE) {
        let fits = if *s == b'd' {
            c.is_ascii_digit()
        } else {
            c == s
        };
        if !fits {
            return None;
        }
    }
    let mut n = SHAPE.len();
    if b.get(n) == Some(&b'.') {
        n += 1;
        while b.get(n).is_some_and(u8::is_ascii_digit) {
            n += 1;
        }
    }
    (b.get(n) == Some(&b'Z')).then_some(n + 1)
}

/// Every 26-character Crockford base32 word (a ULID) becomes `<ULIDn>`, numbered by first
/// appearance, and every 13-digit number (epoch milliseconds, until 2286) `<MILLIS>`. A word is
/// a maximal run of ASCII letters and digits.
fn replace_ulids(text: &str) -> String {
    let is_ulid = |w: &str| {
        w.len() == 26
            && w.bytes().any(|b| b.is_ascii_digit())
            && w.bytes().all(|b| {
                b.is_ascii_digit()
                    || (b.is_ascii_uppercase() && !matches!(b, b'I' | b'L' | b'O' | b'U'))
            })
    };
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphanumeric()) {
        out.push_str(&rest[..start]);
        let word_len = rest[start..]
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len() - start);
        let word = &rest[start..start + word_len];
        if word.len() == 13 && word.bytes().all(|b| b.is_ascii_digit()) {
            // Milliseconds since the epoch (ledger rows carry them as numbers).
            out.push_str("<MILLIS>");
        } else if is_ulid(word) {
            let next = seen.len() + 1;
            let n = *seen.entry(word.to_string()).or_insert(next);
            out.push_str(&format!("<ULID{n}>"));
        } else {
            out.push_str(word);
        }
        rest = &rest[start + word_len..];
    }
    out.push_str(rest);
    out
}

/// The seeds' tick, every main command on the way: a goal with todos and a gate, the decision,
/// claim, completion, refresh, spend, and the reads that show the result.
#[test]
fn the_main_commands_print_what_they_printed() {
    let mut t = Transcript::new();
    t.run(&["init"]);
    t.run(&[
        "goal",
        "create",
        "--id",
        "g",
        "--title",
        "Ship the parser",
        "--objective",
        "A parser that accepts every valid input",
        "--success-criterion",
        "fuzzed for an hour",
    ]);
    t.run(&[
        "--format",
        "json",
        "goal",
        "create",
        "--id",
        "h",
        "--title",
        "Second goal",
    ]);
    t.run(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--title",
        "[P1] Write the lexer",
    ]);
    t.run(&[
        "--format",
        "json",
        "todo",
        "add",
        "--goal-id",
        "g",
        "--title",
        "Write the parser",
        "--priority",
        "P2",
        "--depends-on",
        "t1",
    ]);
    t.run(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--title",
        "Approve the grammar",
        "--kind",
        "user_gate",
        "--blocks-agent",
        "other",
    ]);
    t.run(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--title",
        "Read the report",
        "--kind",
        "user_action",
    ]);
    t.both(&["todo", "list", "--goal-id", "g"]);
    t.run(&["--format", "markdown", "todo", "list", "--goal-id", "g"]);
    t.both(&["goal", "list"]);
    t.both(&["status"]);
    t.run(&["--format", "markdown", "status"]);
    t.both(&[
        "quota",
        "should-run",
        "--goal-id",
        "g",
        "--agent-id",
        "agent",
    ]);
    t.run(&[
        "--format",
        "json",
        "todo",
        "claim",
        "--goal-id",
        "g",
        "--todo-id",
        "t1",
        "--agent-id",
        "agent",
        "--idempotency-key",
        "agent.t1.f1",
    ]);
    // The same claim again: an idempotent replay.
    t.run(&[
        "todo",
        "claim",
        "--goal-id",
        "g",
        "--todo-id",
        "t1",
        "--agent-id",
        "agent",
        "--idempotency-key",
        "agent.t1.f1",
    ]);
    // A renewal says so (it printed "Claimed" before).
    t.run(&[
        "todo",
        "renew",
        "--goal-id",
        "g",
        "--todo-id",
        "t1",
        "--agent-id",
        "agent",
        "--claim-key",
        "agent.t1.f1",
    ]);
    // The agent holds t1 now: the decision continues it and drops the claim command.
    t.both(&[
        "quota",
        "should-run",
        "--goal-id",
        "g",
        "--agent-id",
        "agent",
    ]);
    t.run(&[
        "todo",
        "complete",
        "--goal-id",
        "g",
        "--todo-id",
        "t1",
        "--agent-id",
        "agent",
        "--claim-key",
        "agent.t1.f1",
        "--evidence",
        "lexer passes its tests",
    ]);
    t.run(&[
        "--format",
        "json",
        "refresh-state",
        "--goal-id",
        "g",
        "--agent-id",
        "agent",
        "--todo-id",
        "t1",
    ]);
    t.run(&[
        "--format",
        "json",
        "quota",
        "spend-slot",
        "--goal-id",
        "g",
        "--agent-id",
        "agent",
    ]);
    t.run(&[
        "quota",
        "spend-slot",
        "--goal-id",
        "g",
        "--agent-id",
        "agent",
    ]);
    t.run(&["refresh-state", "--goal-id", "g"]);
    t.both(&["history", "--goal-id", "g"]);
    t.both(&["summary_all", "--goal-id", "g"]);
    t.both(&["gate", "list", "--goal-id", "g"]);
    t.both(&["quota", "show", "--goal-id", "g"]);
    t.run(&[
        "gate",
        "resolve",
        "--goal-id",
        "g",
        "--todo-id",
        "t3",
        "--comment",
        "grammar approved",
    ]);
    t.both(&["status", "--goal-id", "g"]);
    t.check("main_commands");
}

/// Every route of `quota should-run`, with the commands it hands the agent and the operator.
#[test]
fn every_route_prints_its_next_commands() {
    let mut t = Transcript::new();
    t.run(&["init"]);

    // Nothing to do: the agent is asked to plan the next step.
    t.run(&["goal", "create", "--id", "replan", "--title", "Empty goal"]);
    t.both(&[
        "quota",
        "should-run",
        "--goal-id",
        "replan",
        "--agent-id",
        "a1",
    ]);

    // A todo bound to a capability nobody installed: the operator repairs.
    t.run(&[
        "goal",
        "create",
        "--id",
        "repair",
        "--title",
        "Needs a plugin",
    ]);
    t.run(&[
        "todo",
        "add",
        "--goal-id",
        "repair",
        "--title",
        "Fix the issue",
        "--capability",
        "issue-fix/fix",
    ]);
    t.both(&[
        "quota",
        "should-run",
        "--goal-id",
        "repair",
        "--agent-id",
        "a1",
    ]);

    // A global gate: the operator decides.
    t.run(&[
        "goal",
        "create",
        "--id",
        "gated",
        "--title",
        "Behind a gate",
    ]);
    t.run(&["todo", "add", "--goal-id", "gated", "--title", "Work"]);
    t.run(&[
        "todo",
        "add",
        "--goal-id",
        "gated",
        "--title",
        "Choose the license",
        "--kind",
        "user_gate",
        "--global-gate",
    ]);
    t.both(&[
        "quota",
        "should-run",
        "--goal-id",
        "gated",
        "--agent-id",
        "a1",
    ]);

    // Compute 0: blocked until an operator sets a quota again.
    t.run(&[
        "goal",
        "create",
        "--id",
        "paused-quota",
        "--title",
        "No compute",
    ]);
    t.run(&[
        "todo",
        "add",
        "--goal-id",
        "paused-quota",
        "--title",
        "Work",
    ]);
    t.run(&[
        "quota",
        "set",
        "--goal-id",
        "paused-quota",
        "--compute",
        "0",
    ]);
    t.both(&[
        "quota",
        "should-run",
        "--goal-id",
        "paused-quota",
        "--agent-id",
        "a1",
    ]);

    // A paused goal: blocked until resumed.
    t.run(&["goal", "create", "--id", "paused", "--title", "Paused goal"]);
    t.run(&["todo", "add", "--goal-id", "paused", "--title", "Work"]);
    t.run(&["goal", "pause", "--goal-id", "paused"]);
    t.both(&[
        "quota",
        "should-run",
        "--goal-id",
        "paused",
        "--agent-id",
        "a1",
    ]);

    // The window used up: wait for quota.
    t.run(&["goal", "create", "--id", "spent", "--title", "Out of slots"]);
    t.run(&["todo", "add", "--goal-id", "spent", "--title", "Work"]);
    t.run(&["quota", "set", "--goal-id", "spent", "--allowed-slots", "1"]);
    t.run(&[
        "quota",
        "spend-slot",
        "--goal-id",
        "spent",
        "--effect-id",
        "manual-1",
    ]);
    t.both(&[
        "quota",
        "should-run",
        "--goal-id",
        "spent",
        "--agent-id",
        "a1",
    ]);

    // One slot per agent: a1 spent it, a2 may still run.
    t.run(&[
        "goal",
        "create",
        "--id",
        "capped",
        "--title",
        "Per-agent cap",
    ]);
    t.run(&["todo", "add", "--goal-id", "capped", "--title", "Work"]);
    t.run(&[
        "quota",
        "set",
        "--goal-id",
        "capped",
        "--per-agent-cap",
        "1",
    ]);
    t.run(&[
        "quota",
        "spend-slot",
        "--goal-id",
        "capped",
        "--agent-id",
        "a1",
        "--effect-id",
        "a1-1",
    ]);
    t.both(&[
        "quota",
        "should-run",
        "--goal-id",
        "capped",
        "--agent-id",
        "a1",
    ]);
    t.run(&[
        "quota",
        "should-run",
        "--goal-id",
        "capped",
        "--agent-id",
        "a2",
    ]);

    // Work claimed by someone else: wait.
    t.run(&["goal", "create", "--id", "taken", "--title", "All claimed"]);
    t.run(&["todo", "add", "--goal-id", "taken", "--title", "Work"]);
    t.run(&["todo", "claim", "--goal-id", "taken", "--agent-id", "a2"]);
    t.both(&[
        "quota",
        "should-run",
        "--goal-id",
        "taken",
        "--agent-id",
        "a1",
    ]);

    // A closed goal: stop.
    t.run(&["goal", "create", "--id", "closed", "--title", "Done"]);
    t.run(&["goal", "close", "--goal-id", "closed"]);
    t.both(&[
        "quota",
        "should-run",
        "--goal-id",
        "closed",
        "--agent-id",
        "a1",
    ]);

    // The attention queue over all of them.
    t.both(&["status"]);
    t.check("routes");
}

/// Refusals whose messages name the command that would help: their text is part of the
/// interface agents and operators read.
#[test]
fn refusals_name_the_command_that_helps() {
    let mut t = Transcript::new();
    t.run(&["init"]);
    t.run(&["goal", "create", "--id", "g", "--title", "Goal"]);
    t.run(&["todo", "add", "--goal-id", "g", "--title", "Work"]);
    t.run(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--title",
        "Decide",
        "--kind",
        "user_gate",
        "--global-gate",
    ]);
    // Unknown goal, todo and run.
    t.run(&["todo", "list", "--goal-id", "nope"]);
    t.run(&[
        "todo",
        "complete",
        "--goal-id",
        "g",
        "--todo-id",
        "t9",
        "--evidence",
        "x",
    ]);
    t.run(&[
        "reward",
        "add",
        "--goal-id",
        "g",
        "--run-id",
        "r1",
        "--score",
        "1",
    ]);
    // Gates are resolved, not claimed, completed or updated.
    t.run(&[
        "todo",
        "claim",
        "--goal-id",
        "g",
        "--todo-id",
        "t2",
        "--agent-id",
        "a1",
    ]);
    t.run(&[
        "--format",
        "json",
        "todo",
        "complete",
        "--goal-id",
        "g",
        "--todo-id",
        "t2",
        "--evidence",
        "done",
    ]);
    t.run(&[
        "todo",
        "update",
        "--goal-id",
        "g",
        "--todo-id",
        "t2",
        "--status",
        "completed",
    ]);
    t.run(&[
        "gate",
        "resolve",
        "--goal-id",
        "g",
        "--todo-id",
        "t1",
        "--comment",
        "x",
    ]);
    t.run(&[
        "todo",
        "update",
        "--goal-id",
        "g",
        "--todo-id",
        "t1",
        "--status",
        "claimed",
    ]);
    // Spending before any run was recorded.
    t.run(&["quota", "spend-slot", "--goal-id", "g", "--agent-id", "a1"]);
    // Nothing ready, a lease out of range, and a paused goal.
    t.run(&[
        "goal",
        "create",
        "--id",
        "empty",
        "--title",
        "Nothing to do",
    ]);
    t.run(&["todo", "claim", "--goal-id", "empty", "--agent-id", "a1"]);
    t.run(&[
        "todo",
        "claim",
        "--goal-id",
        "empty",
        "--agent-id",
        "a1",
        "--ttl-seconds",
        "0",
    ]);
    t.run(&["todo", "claim", "--goal-id", "g", "--agent-id", "a1"]);
    t.run(&["goal", "pause", "--goal-id", "g"]);
    t.run(&[
        "--format",
        "json",
        "todo",
        "claim",
        "--goal-id",
        "g",
        "--agent-id",
        "a1",
    ]);
    t.check("refusals");
}
