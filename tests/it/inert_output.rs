//! Issue 13, section 4: no hostile byte reaches a terminal. Text written by agents (titles,
//! details, gate titles, evidence, run summaries, reward comments, goal titles and objectives,
//! probes) goes through every command's text and Markdown output and through every projection;
//! none of it may carry a raw escape, C1 control, bidi override, carriage return or backspace, nor
//! open Markdown structure that hides text. JSON output and the JSON projections keep it exactly.

use std::path::Path;

use crate::support::plugin::{extension, wasm};
use crate::support::{Project, turn_run};
use serde_json::Value;

/// Retitles the terminal, clears the screen, turns on concealed text, starts a C1 CSI, reverses
/// the line (RLO), isolates it (RLI), returns the cursor, backspaces, and opens an HTML comment
/// that would hide the rest of a rendered Markdown file; a table cell break, a link and an image
/// too.
const HOSTILE: &str = "HOSTILE \u{1b}]0;pwned\u{7} \u{1b}[2J \u{1b}[8m concealed \u{9b}31m \
                       \u{202e}desrever\u{202c} \u{2067}iso\u{2069} \u{200f} over\rwrite\u{8}x \
                       \u{7f} <!-- hide | cell [link](http://x) ![img](http://y) &#8238;";

/// The characters no text or Markdown output may contain raw.
fn is_forbidden(c: char) -> bool {
    matches!(
        c,
        '\u{0}'..='\u{8}'
            | '\u{b}'..='\u{1f}'
            | '\u{7f}'..='\u{9f}'
            | '\u{61c}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
    )
}

/// Asserts `out` (a text or Markdown output) holds no forbidden character, and that the hostile
/// text was shown (escaped), not dropped, when `must_show` says it is there.
fn assert_inert(what: &str, out: &str, must_show: bool) {
    if let Some((i, c)) = out.char_indices().find(|&(_, c)| is_forbidden(c)) {
        let start = out[..i].char_indices().rev().nth(60).map_or(0, |(j, _)| j);
        panic!(
            "{what}: raw U+{:04X} at byte {i}, after {:?}",
            c as u32,
            &out[start..i]
        );
    }
    if must_show {
        assert!(
            out.contains("HOSTILE") && out.contains("\\u{1b}") && out.contains("pwned"),
            "{what}: the hostile text must be shown escaped, not dropped:\n{out}"
        );
    }
}

/// Markdown-specific: outside fenced code blocks (where nothing is Markdown), no value opens
/// HTML, a character reference, a link or an image.
fn assert_inert_markdown(what: &str, md: &str) {
    assert_inert(what, md, true);
    let mut fence: Option<usize> = None;
    for line in md.lines() {
        let ticks = line.bytes().take_while(|&b| b == b'`').count();
        match fence {
            Some(open) if ticks >= open && line.trim_end().len() == ticks => fence = None,
            Some(_) => {}
            None if ticks >= 3 => fence = Some(ticks),
            None => {
                let line = &without_code_spans(line);
                for (i, _) in line.match_indices(['<', '&']) {
                    assert!(
                        line[..i].ends_with('\\'),
                        "{what}: unescaped Markdown structure in line {line:?}"
                    );
                }
                assert!(
                    !line.contains("[link](") && !line.contains("[img]("),
                    "{what}: a link or image in line {line:?}"
                );
            }
        }
    }
    assert!(fence.is_none(), "{what}: a fence left open");
}

/// `line` with its code spans (where nothing is Markdown) cut out: a run of backticks not after a
/// backslash opens one, the next run of the same length closes it.
fn without_code_spans(line: &str) -> String {
    let b = line.as_bytes();
    let run_at = |i: usize| b[i..].iter().take_while(|&&c| c == b'`').count();
    let (mut out, mut i) = (String::new(), 0);
    while i < b.len() {
        if b[i] == b'`' && (i == 0 || b[i - 1] != b'\\') {
            let n = run_at(i);
            let mut j = i + n;
            let close = loop {
                if j >= b.len() {
                    break None;
                }
                let m = if b[j] == b'`' { run_at(j) } else { 0 };
                if m == n {
                    break Some(j + n);
                }
                j += m.max(1);
            };
            match close {
                Some(end) => i = end,
                None => {
                    out.push_str(&line[i..i + n]);
                    i += n;
                }
            }
        } else {
            let c = line[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// True when `value` holds the string `s` anywhere.
fn holds(value: &Value, s: &str) -> bool {
    match value {
        Value::String(v) => v == s,
        Value::Array(items) => items.iter().any(|v| holds(v, s)),
        Value::Object(map) => map.values().any(|v| holds(v, s)),
        _ => false,
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn files_with_ext(dir: &Path, ext: &str) -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    out.sort();
    out
}

/// A goal, todos, a gate, evidence, a probe, a recorded run with a reward, and a turn whose host
/// reports the hostile text, all carrying it; then every read command in text and Markdown.
#[test]
fn hostile_text_is_inert_in_every_text_and_markdown_output() {
    let p = Project::new();
    let dir = p.path().to_str().unwrap().to_string();
    let objective = format!("{HOSTILE}\n```\n## Fake heading\n{HOSTILE}");
    p.ok(&[
        "goal",
        "create",
        "--id",
        "g",
        "--title",
        HOSTILE,
        "--objective",
        &objective,
        "--success-criterion",
        HOSTILE,
        "--project",
        &dir,
    ]);
    let multi_line = format!("{HOSTILE}\nsecond line {HOSTILE}");
    for (id, extra) in [
        ("t1", vec![]),
        ("t2", vec!["--depends-on", "t1"]),
        (
            "gate1",
            vec!["--kind", "user_gate", "--blocks-agent", "someone-else"],
        ),
    ] {
        let mut args = vec![
            "todo",
            "add",
            "--goal-id",
            "g",
            "--id",
            id,
            "--title",
            HOSTILE,
            "--detail",
            &multi_line,
        ];
        args.extend(extra);
        p.ok(&args);
    }
    p.ok(&[
        "todo",
        "update",
        "--goal-id",
        "g",
        "--todo-id",
        "t2",
        "--evidence",
        &multi_line,
    ]);
    p.ok(&["probe", "set", "--goal-id", "g", "--text", HOSTILE]);
    let run = p.json(&["refresh-state", "--goal-id", "g", "--summary", &multi_line]);
    let run_id = run["run_id"].as_str().expect("run id").to_string();
    p.ok(&[
        "reward",
        "add",
        "--goal-id",
        "g",
        "--run-id",
        &run_id,
        "--score",
        "1",
        "--comment",
        HOSTILE,
    ]);

    // A turn whose host reports the hostile text as its summary and evidence.
    let result = serde_json::json!({
        "schema_version": "loopx.turn_result.v1",
        "status": "progress",
        "summary": multi_line,
        "evidence": [{"text": multi_line}],
    });
    std::fs::write(p.path().join("result.json"), result.to_string()).unwrap();
    let host = p.script(
        "host.sh",
        &format!("cat > /dev/null\nprintf '%s\\n' '{HOSTILE}' >&2\ncat result.json\n"),
    );
    let turn = p.run(&turn_run("a1", &["--todo-id", "t1"], &[&host]));
    assert_eq!(turn.code, 0, "turn run: {turn:?}");
    assert_inert("turn run (text)", &turn.stdout, false);
    assert_inert("turn run (stderr)", &turn.stderr, false);
    // A host that fails: its last stderr line is quoted in the turn's detail, which `turn run`
    // prints; `loop` prints its report and a progress line per turn on stderr.
    let failing = p.script(
        "failing.sh",
        &format!("cat > /dev/null\nprintf '%s\\n' '{HOSTILE}' >&2\nexit 3\n"),
    );
    let turn = p.run(&turn_run("a1", &["--todo-id", "t1"], &[&failing]));
    assert_inert("failed turn run (text)", &turn.stdout, true);
    assert_inert("failed turn run (stderr)", &turn.stderr, false);
    let mut loop_args = vec![
        "loop",
        "--goal-id",
        "g",
        "--agent-id",
        "a1",
        "--max-turns",
        "1",
    ];
    loop_args.extend(["--until-idle", "--", failing.as_str()]);
    let looped = p.run(&loop_args);
    assert_inert("loop (text)", &looped.stdout, false);
    assert_inert("loop (progress on stderr)", &looped.stderr, false);

    let turn_key = p.json(&["turn", "list", "--goal-id", "g"])["turns"][0]["turn_key"]
        .as_str()
        .map(str::to_string);

    let mut reads: Vec<Vec<&str>> = vec![
        vec!["goal", "show", "--goal-id", "g"],
        vec!["goal", "list"],
        vec!["todo", "list", "--goal-id", "g"],
        vec!["todo", "show", "--goal-id", "g", "--todo-id", "t2"],
        vec!["gate", "list", "--goal-id", "g"],
        vec!["status"],
        vec!["status", "--goal-id", "g"],
        vec!["history", "--goal-id", "g"],
        vec!["summary_all", "--goal-id", "g"],
        vec!["quota", "should-run", "--goal-id", "g", "--agent-id", "a2"],
        vec!["quota", "show", "--goal-id", "g"],
        vec!["probe", "show", "--goal-id", "g"],
        vec!["turn", "plan", "--goal-id", "g", "--agent-id", "a2"],
        vec!["turn", "list", "--goal-id", "g"],
    ];
    if let Some(k) = &turn_key {
        reads.push(vec!["turn", "inspect", "--turn-key", k]);
    }
    for args in &reads {
        for format in ["text", "markdown"] {
            let mut full = vec!["--format", format];
            full.extend_from_slice(args);
            let r = p.run(&full);
            assert_eq!(r.code, 0, "{full:?}: {r:?}");
            let what = format!("{} ({format})", args.join(" "));
            // Every listing shows a hostile value except the turn commands, the quota view and
            // `status` without a gate for that agent.
            let shows = !matches!(args[0], "turn" | "quota") && args != &["status"];
            assert_inert(&what, &r.stdout, shows);
            assert_inert(&format!("{what} stderr"), &r.stderr, false);
        }
    }
    let md = p.run(&["--format", "markdown", "todo", "list", "--goal-id", "g"]);
    assert_inert_markdown("todo list (markdown)", &md.stdout);

    // Projections: STATE.md and every run report are inert; the JSON ones keep the exact text.
    let goal_dir = p.state().join("goals/g");
    assert_inert_markdown("STATE.md", &read(&goal_dir.join("STATE.md")));
    let month = loopx::paths::run_month(&run_id).unwrap();
    let reports = files_with_ext(&goal_dir.join("runs").join(month), "md");
    assert!(reports.len() >= 2, "a report per run: {reports:?}");
    for report in &reports {
        assert_inert_markdown(&report.display().to_string(), &read(report));
    }
    let state: Value = serde_json::from_str(&read(&goal_dir.join("state.json"))).unwrap();
    assert_eq!(state["goal"]["title"], HOSTILE);
    assert_eq!(state["goal"]["objective"], objective.as_str());
    assert_eq!(state["goal"]["next_probe"], HOSTILE);
    let titles: Vec<&Value> = (state["todos"].as_array().unwrap().iter())
        .map(|t| &t["title"])
        .collect();
    assert!(
        titles.len() == 3 && titles.iter().all(|t| *t == HOSTILE),
        "{titles:?}"
    );
    assert!(
        (state["recent_evidence"].as_array().unwrap().iter())
            .any(|e| e["text"] == multi_line.as_str())
    );
    let run_json: Value = serde_json::from_str(&read(
        &loopx::paths::ProjectPaths::at(p.path()).run_json("g", &run_id),
    ))
    .unwrap();
    assert_eq!(run_json["summary"], multi_line.as_str());
    let registry: Value = serde_json::from_str(&read(&p.state().join("registry.json"))).unwrap();
    assert_eq!(registry["goals"][0]["title"], HOSTILE);

    // JSON output round-trips the exact text.
    let shown = p.json(&["todo", "show", "--goal-id", "g", "--todo-id", "t2"]);
    assert_eq!(shown["todo"]["title"], HOSTILE);
    assert_eq!(shown["todo"]["detail"], multi_line.as_str());
    let goal = p.json(&["goal", "show", "--goal-id", "g"]);
    assert_eq!(goal["goal"]["title"], HOSTILE);
    assert_eq!(goal["goal"]["success_criteria"][0], HOSTILE);
    let history = p.json(&["history", "--goal-id", "g"]);
    assert!(
        holds(&history, &multi_line) && holds(&history, HOSTILE),
        "{history}"
    );
    let gates = p.json(&["gate", "list", "--goal-id", "g"]);
    assert!(holds(&gates, HOSTILE), "{gates}");
    let summary = p.json(&["summary_all", "--goal-id", "g"]);
    assert!(holds(&summary, &multi_line), "{summary}");
}

/// Refusals that echo what the caller typed: the kernel's errors and the flag parsers' (a value
/// outside a flag's set or range), each showing the input escaped in text and exact in JSON.
#[test]
fn errors_that_echo_input_are_inert() {
    let p = Project::with_goal_g();
    for args in [
        vec!["todo", "show", "--goal-id", "g", "--todo-id", HOSTILE],
        vec!["goal", "show", "--goal-id", HOSTILE],
        vec![
            "todo",
            "add",
            "--goal-id",
            "g",
            "--title",
            "x",
            "--priority",
            HOSTILE,
        ],
        vec!["todo", "list", "--goal-id", "g", "--status", HOSTILE],
        vec!["history", "--goal-id", "g", "--limit", HOSTILE],
    ] {
        let r = p.run(&args);
        assert_ne!(r.code, 0, "{args:?} must fail");
        assert_inert(&format!("{args:?} stdout"), &r.stdout, false);
        assert_inert(&format!("{args:?} stderr"), &r.stderr, true);
        // In JSON mode the message keeps the exact input.
        let mut full = vec!["--format", "json"];
        full.extend_from_slice(&args);
        let r = p.run(&full);
        let v: Value = serde_json::from_str(&r.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: stdout is not JSON ({e}): {}", r.stdout));
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(HOSTILE), "{args:?}: {message}");
        assert_inert(&format!("{args:?} json stderr"), &r.stderr, true);
    }
}

/// A file name that becomes a provider target, and a body only a plugin would show.
const HOSTILE_NAME: &str = "HOSTILE \u{1b}]0;pwned\u{7}\u{202e}\r\u{9b}31m\u{8}name";

/// `capability invoke` and `provider call` show what plugins wrote (observation bodies with a
/// NUL, provider targets, refusal reasons that echo a proposal, guest error text) inert in text
/// and Markdown, and exactly in JSON.
#[test]
fn plugin_text_is_inert_in_capability_and_provider_output() {
    let p = Project::with_goal_g();
    let data = p.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let body = format!("{HOSTILE}\nNUL \u{0} here\n");
    std::fs::write(data.join(HOSTILE_NAME), &body).unwrap();
    let probe = extension(
        p.path(),
        "probe",
        "provider",
        "p",
        &wasm("probe-provider"),
        &["fs.read:data"],
        "",
        "",
    );
    let cap = extension(
        p.path(),
        "hostile",
        "capability",
        "cap",
        &wasm("hostile-cap"),
        &[],
        "uses = [\"probe/p\"]",
        "",
    );
    let grant = format!("fs.read:data={}", data.display());
    let probe = probe.to_str().unwrap();
    p.ok(&["extension", "install", probe, "--grant", &grant]);
    p.ok(&["extension", "install", cap.to_str().unwrap()]);

    let target = format!("/data/{HOSTILE_NAME}");
    std::fs::write(
        p.path().join("read.json"),
        serde_json::json!({"operation": "read", "target": target, "params": {}}).to_string(),
    )
    .unwrap();
    std::fs::write(
        p.path().join("calls.txt"),
        format!("call probe/p read {target}\ncomplete {HOSTILE}\n"),
    )
    .unwrap();
    std::fs::write(p.path().join("error.txt"), format!("error {HOSTILE}\n")).unwrap();
    let provider = ["provider", "call", "probe/p", "--input", "read.json"];
    let invoke = [
        "capability",
        "invoke",
        "hostile/cap",
        "--goal-id",
        "g",
        "--dry-run",
        "--input",
        "calls.txt",
    ];
    for format in ["text", "markdown"] {
        for args in [&provider[..], &invoke[..]] {
            let mut full = vec!["--format", format];
            full.extend_from_slice(args);
            let r = p.run(&full);
            let what = format!("{} ({format})", args[..2].join(" "));
            assert_eq!(r.code, 0, "{what}: {r:?}");
            assert_inert(&what, &r.stdout, false);
            assert_inert(&format!("{what} stderr"), &r.stderr, false);
            assert!(
                r.stdout.contains("pwned") && r.stdout.contains("\\u{1b}"),
                "{what}: the plugin's text must be shown escaped:\n{}",
                r.stdout
            );
        }
        let md = p.run(&[
            "--format",
            "markdown",
            "provider",
            "call",
            "probe/p",
            "--input",
            "read.json",
        ]);
        assert_inert_markdown("provider call (markdown)", &md.stdout);
        assert!(
            md.stdout.contains("\\u{0}"),
            "the NUL is shown: {}",
            md.stdout
        );
    }
    // Guest error text reaches the operator through the error printer.
    for format in ["text", "markdown"] {
        let r = p.run(&[
            "--format",
            format,
            "capability",
            "invoke",
            "hostile/cap",
            "--goal-id",
            "g",
            "--dry-run",
            "--input",
            "error.txt",
        ]);
        assert_ne!(r.code, 0, "{r:?}");
        assert_inert("guest error (stdout)", &r.stdout, false);
        assert_inert("guest error (stderr)", &r.stderr, true);
    }

    // JSON keeps the exact text.
    let obs = p.json(&provider);
    assert_eq!(obs["observation"]["body"], body.as_str());
    let inv = p.json(&invoke);
    assert!(holds(&inv, &target), "provider target kept exactly: {inv}");
    assert!(holds(&inv, HOSTILE), "proposal kept exactly: {inv}");
    let r = p.run(&[
        "--format",
        "json",
        "capability",
        "invoke",
        "hostile/cap",
        "--goal-id",
        "g",
        "--dry-run",
        "--input",
        "error.txt",
    ]);
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains(HOSTILE), "{message}");
}
