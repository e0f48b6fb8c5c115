//! The command line follows the conventions of the tools its users know: every argument has a
//! help line, completions and a man page come from the parser's own definition, argument errors
//! speak JSON under `--format json`, and the documented sequences run as written.

use clap::CommandFactory;

use loopx::cli::Cli;

use crate::support;

/// Every subcommand, flag and positional of the whole tree, built (groups are deferred, so the
/// tree is built on purpose), each named by its command path.
fn missing_help(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if matches!(id, "help" | "version") {
            continue;
        }
        if arg.get_help().is_none() && arg.get_long_help().is_none() {
            let name = match arg.get_long() {
                Some(long) => format!("--{long}"),
                None => format!("<{id}>"),
            };
            out.push(format!("{path} {name}"));
        }
    }
    for sub in cmd.get_subcommands() {
        let sub_path = format!("{path} {}", sub.get_name());
        if sub.get_name() != "help" && sub.get_about().is_none() && sub.get_long_about().is_none() {
            out.push(format!("{sub_path} (the command itself)"));
        }
        missing_help(sub, &sub_path, out);
    }
}

#[test]
fn every_argument_and_command_has_help() {
    let mut cmd = Cli::command();
    cmd.build();
    let mut missing = Vec::new();
    missing_help(&cmd, "loopx", &mut missing);
    assert!(
        missing.is_empty(),
        "{} arguments or commands have no help line:\n{}",
        missing.len(),
        missing.join("\n")
    );
}

/// Each command's own help page opens with what the command does: the same line its group lists
/// for it (a doc comment on a flattened argument struct would replace it, as it once did for
/// `loop`, `turn run` and the lease commands).
fn help_opens_with_about(cmd: &mut clap::Command, path: &str, out: &mut Vec<String>) {
    for sub in cmd.get_subcommands_mut() {
        if sub.get_name() == "help" {
            continue;
        }
        let sub_path = format!("{path} {}", sub.get_name());
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        for (kind, help) in [
            ("-h", sub.render_help().to_string()),
            ("--help", sub.render_long_help().to_string()),
        ] {
            let first = help.lines().next().unwrap_or("");
            if about.is_empty() || !first.starts_with(about.trim_end_matches('.')) {
                out.push(format!(
                    "{sub_path} {kind}: opens with {first:?}, not {about:?}"
                ));
            }
        }
        help_opens_with_about(sub, &sub_path, out);
    }
}

#[test]
fn every_help_page_opens_with_what_the_command_does() {
    let mut cmd = Cli::command();
    cmd.build();
    let mut wrong = Vec::new();
    help_opens_with_about(&mut cmd, "loopx", &mut wrong);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every command's description, by command path.
fn abouts(cmd: &clap::Command, path: &str, out: &mut Vec<(String, String)>) {
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        let sub_path = format!("{path} {}", sub.get_name());
        out.push((
            sub_path.clone(),
            sub.get_about().map(|a| a.to_string()).unwrap_or_default(),
        ));
        abouts(sub, &sub_path, out);
    }
}

/// A doc comment on an argument struct that several commands flatten becomes the description of
/// each of them, and their help pages then agree with that wrong description; only two commands
/// saying the same thing shows it.
#[test]
fn no_two_commands_share_a_description() {
    let mut cmd = Cli::command();
    cmd.build();
    let mut all = Vec::new();
    abouts(&cmd, "loopx", &mut all);
    let mut seen = std::collections::BTreeMap::<&str, &str>::new();
    let mut shared = Vec::new();
    for (path, about) in &all {
        if let Some(first) = seen.insert(about, path) {
            shared.push(format!("{first} and {path}: {about:?}"));
        }
    }
    assert!(all.len() > 60, "walked only {} commands", all.len());
    assert!(shared.is_empty(), "{}", shared.join("\n"));
}

#[test]
fn loop_and_turn_run_help_start_with_what_they_do() {
    let p = support::Project::empty();
    for (args, opening) in [
        (&["loop", "--help"][..], "Run turns under a bounded budget"),
        (&["turn", "run", "--help"][..], "Run one turn:"),
    ] {
        let run = p.run(args).ok();
        assert!(
            run.stdout.starts_with(opening),
            "{args:?}: {}",
            run.stdout.lines().next().unwrap_or("")
        );
    }
}

#[test]
fn completions_name_the_commands_for_every_shell() {
    let p = support::Project::empty();
    let bash = p.run(&["completions", "bash"]).ok();
    for name in [
        "todo",
        "quota",
        "should-run",
        "start-goal",
        "--goal-id",
        "completions",
    ] {
        assert!(bash.stdout.contains(name), "bash script lacks {name}");
    }
    assert!(
        bash.stdout.contains("complete -F _loopx"),
        "{}",
        &bash.stdout[..200]
    );
    // Flags that take one of a fixed set of values offer those values.
    for values in [
        "open claimed blocked deferred completed archived",
        "P0 P1 P2 P3 P4",
        "task monitor user_gate user_action",
        "auto required off",
        "in_progress committed stopped failed",
        "open_todo replan",
    ] {
        assert!(bash.stdout.contains(values), "bash offers no {values}");
    }
    for (shell, marker) in [
        ("zsh", "#compdef loopx"),
        ("fish", "complete -c loopx"),
        ("powershell", "Register-ArgumentCompleter"),
    ] {
        let run = p.run(&["completions", shell]).ok();
        assert!(run.stdout.contains(marker), "{shell}");
        assert!(
            run.stdout.contains("should-run"),
            "{shell} lacks should-run"
        );
    }
    let bad = p.run(&["completions", "tcsh"]);
    assert_eq!(bad.code, 2, "{bad:?}");
    // JSON carries the script as data.
    let json = p
        .run(&["--format", "json", "completions", "bash"])
        .ok()
        .json();
    assert_eq!(json["shell"], "bash");
    assert_eq!(json["script"].as_str(), Some(bash.stdout.as_str()));
}

#[test]
fn the_man_page_is_roff_and_every_command_gets_one() {
    let p = support::Project::empty();
    let page = p.run(&["man"]).ok().stdout;
    let th = page
        .lines()
        .find(|l| !l.starts_with(".ie") && !l.starts_with(".el"))
        .unwrap_or("");
    assert!(th.starts_with(".TH loopx 1"), "first request: {th}");
    assert!(
        page.contains(".SH SUBCOMMANDS") && page.contains("start\\-goal"),
        "{page}"
    );
    if std::process::Command::new("groff")
        .arg("--version")
        .output()
        .is_ok()
    {
        let mut groff = std::process::Command::new("groff")
            .args(["-man", "-Tutf8", "-ww", "-z"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        groff
            .stdin
            .take()
            .unwrap()
            .write_all(page.as_bytes())
            .unwrap();
        let out = groff.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = p
        .run(&["--format", "json", "man", "--out", "pages"])
        .ok()
        .json();
    let pages = out["pages"].as_array().unwrap();
    let dir = p.path().join("pages");
    for name in [
        "loopx.1",
        "loopx-todo.1",
        "loopx-todo-claim.1",
        "loopx-quota-should-run.1",
    ] {
        let text =
            std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(text.contains(".TH "), "{name}");
    }
    let on_disk = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(pages.len(), on_disk);
    assert!(on_disk > 60, "{on_disk} pages");

    // What sits at a page's name is replaced as a name: a link's target is left alone and a FIFO
    // is not opened (which would wait for a reader forever).
    let target = p.path().join("precious.txt");
    std::fs::write(&target, "precious\n").unwrap();
    let links = p.path().join("links");
    std::fs::create_dir(&links).unwrap();
    std::os::unix::fs::symlink(&target, links.join("loopx-goal.1")).unwrap();
    let fifo = std::ffi::CString::new(links.join("loopx-todo.1").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path that lives across the call.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let mut man = p
        .command(&["man", "--out", "links"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert_eq!(exit_within(&mut man, 20), Some(0));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious\n");
    for name in ["loopx-goal.1", "loopx-todo.1"] {
        let meta = std::fs::symlink_metadata(links.join(name)).unwrap();
        assert!(meta.is_file(), "{name}: {meta:?}");
    }
    // A directory at a page's name is refused before any page is written.
    let blocked = p.path().join("blocked");
    std::fs::create_dir_all(blocked.join("loopx-todo-add.1")).unwrap();
    let r = p.run(&["man", "--out", "blocked"]);
    assert_eq!(r.code, 6, "{}", r.stderr);
    assert!(r.stderr.contains("loopx-todo-add.1"), "{}", r.stderr);
    assert_eq!(std::fs::read_dir(&blocked).unwrap().count(), 1);
}

/// Argument errors under `--format json` (before or after the command) print the envelope every
/// other error prints, on stdout, with exit 2; stderr keeps its one line.
#[test]
fn argument_errors_speak_json_when_asked() {
    let p = support::Project::new();
    p.goal("g");
    for args in [
        &[
            "--format",
            "json",
            "todo",
            "list",
            "--goal-id",
            "g",
            "--bogus",
        ][..],
        &[
            "todo",
            "list",
            "--goal-id",
            "g",
            "--format=json",
            "--status",
        ][..],
        &[
            "todo",
            "list",
            "--goal-id",
            "g",
            "--status",
            "nope",
            "--format",
            "json",
        ][..],
        &["--format", "json", "todo", "list"][..],
        &[
            "--format",
            "json",
            "reward",
            "add",
            "--goal-id",
            "g",
            "--run-id",
            "r",
            "--score",
            "NaN",
        ][..],
        &["--format", "json", "no-such-command"][..],
    ] {
        let run = p.run(args);
        assert_eq!(run.code, 2, "{args:?}: {run:?}");
        let v = run.json();
        assert_eq!(v["ok"], false, "{args:?}");
        assert_eq!(v["schema_version"], "loopx.cli.v1");
        assert_eq!(v["error"]["kind"], "bad_input", "{args:?}");
        assert_eq!(v["error"]["exit_code"], 2);
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            !message.is_empty() && !message.starts_with("error:"),
            "{message}"
        );
        assert!(
            run.stderr.starts_with("loopx: error: "),
            "{args:?}: {}",
            run.stderr
        );
    }
    // A value outside a flag's fixed set is refused with the set; a missing one asks for it.
    for (value, expected) in [
        (
            &["--priority", "P9"][..],
            "--priority 'P9' is not one of the values it takes: P0, P1, P2, P3, P4",
        ),
        (
            &["--priority"][..],
            "--priority needs a value: one of P0, P1, P2, P3, P4",
        ),
        (&["--detail"][..], "--detail needs a value"),
    ] {
        let mut args = vec![
            "--format",
            "json",
            "todo",
            "add",
            "--goal-id",
            "g",
            "--title",
            "x",
        ];
        args.extend_from_slice(value);
        let run = p.run(&args);
        assert_eq!(run.code, 2, "{run:?}");
        assert_eq!(run.json()["error"]["message"], expected);
        assert_eq!(run.stderr, format!("loopx: error: {expected}\n"));
    }
    // A missing required flag runs on into the list of what is missing.
    let missing = p.run(&["--format", "json", "goal", "create"]).json();
    assert_eq!(
        missing["error"]["message"],
        "the following required arguments were not provided: --title <TITLE>; usage: loopx goal \
         create --title <TITLE>"
    );
    // An unknown word that would drive a terminal is quoted exactly in JSON and escaped in text
    // (clap's own text drops the escape sequences, so neither would show what was typed).
    let word = "A\u{1b}[2JB\u{8}C";
    for (args, kind) in [
        (vec!["goal", word], "unrecognized subcommand"),
        (
            vec!["goal", "list", "--A\u{1b}[2JB\u{8}C"],
            "unexpected argument",
        ),
    ] {
        let text = p.run(&args);
        assert_eq!(text.code, 2, "{text:?}");
        assert!(
            text.stderr.contains(&format!("{kind} '"))
                && text.stderr.contains("\\u{1b}[2JB\\u{8}C"),
            "{}",
            text.stderr
        );
        assert!(!text.stderr.contains('\u{1b}'), "{:?}", text.stderr);
        let json = p.run(&[&["--format", "json"][..], &args].concat()).json();
        let message = json["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(kind) && message.contains(word),
            "{message:?}"
        );
    }
    // A group without its command names the commands, not the whole help page.
    let group = p.run(&["--format", "json", "todo"]).json();
    let message = group["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("a command is required: add, list, show, claim"),
        "{message}"
    );
    assert!(
        message.ends_with("usage: loopx todo [OPTIONS] <COMMAND>"),
        "{message}"
    );
    // The envelope names what was wrong.
    let unknown = p.run(&[
        "--format",
        "json",
        "todo",
        "list",
        "--goal-id",
        "g",
        "--bogus",
    ]);
    assert!(
        unknown.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--bogus")
    );
    // The same shape as a failure after parsing.
    let missing = p.run(&["--format", "json", "todo", "list", "--goal-id", "nope"]);
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v["error"].as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&missing.json()), keys(&unknown.json()));
    // Text mode keeps clap's text; `--format json` after `--` is a host's argument, not ours;
    // help and version are unchanged by it.
    let text = p.run(&["todo", "list", "--goal-id", "g", "--bogus"]);
    assert_eq!(text.code, 2);
    assert!(text.stdout.is_empty() && text.stderr.starts_with("error: unexpected argument"));
    let help = p.run(&["--format", "json", "todo", "--help"]).ok();
    assert!(
        help.stdout.starts_with("Add, list, claim"),
        "{}",
        help.stdout
    );
    let version = p.run(&["--format", "json", "--version"]).ok();
    assert!(version.stdout.starts_with("loopx "), "{}", version.stdout);
}

/// Tables are aligned by terminal columns: a CJK character or an emoji takes two, so the column
/// after a wide title starts at the same display column on every row.
#[test]
fn tables_align_wide_characters() {
    use unicode_width::UnicodeWidthStr;
    let p = support::Project::new();
    for (id, title) in [
        ("cjk", "修复构建系统"),
        ("latin", "plain title"),
        ("emoji", "🚀 launch"),
        ("cyrillic", "Починить"),
    ] {
        p.ok(&["goal", "create", "--title", title, "--id", id]);
    }
    let goals = p.ok(&["goal", "list"]).stdout;
    // The last column (created) follows the title column.
    let starts: Vec<usize> = goals
        .lines()
        .skip(1)
        .map(|line| {
            let last = line.rfind(' ').expect("columns") + 1;
            UnicodeWidthStr::width(&line[..last])
        })
        .collect();
    assert_eq!(starts.len(), 5, "{goals}");
    assert!(
        starts.iter().all(|s| *s == starts[0]),
        "{starts:?}\n{goals}"
    );
}

#[test]
fn goal_ids_from_titles_in_any_script_are_meaningful() {
    let p = support::Project::new();
    for (title, id) in [
        ("Починить сборку", "pochinit-sborku"),
        ("修复构建", "xiu-fu-gou-jian"),
        ("إصلاح البناء", "slh-lbn"),
        ("🚀🔥", "rocket-fire"),
    ] {
        let created = p.json(&["goal", "create", "--title", title]);
        assert_eq!(created["goal"]["id"], id, "{title}: {created}");
        // The id is a token every --goal-id check accepts.
        p.ok(&["goal", "show", "--goal-id", id]);
        assert!(p.state().join("goals").join(id).is_dir(), "{id}");
    }
}

#[test]
fn summary_all_shows_counts_as_text() {
    let p = support::Project::new();
    p.goal("g");
    p.add_todo("g", "one", &[]);
    p.add_todo("g", "two", &[]);
    let text = p.ok(&["summary_all", "--goal-id", "g"]).stdout;
    let todos = text
        .lines()
        .find(|l| l.trim_start().starts_with("todos"))
        .expect("todos field");
    assert!(todos.ends_with("agent: 2 open"), "{todos}");
    assert!(!text.contains('{'), "{text}");
    // JSON keeps the object.
    let json = p.json(&["summary_all", "--goal-id", "g"]);
    assert_eq!(json["todo_counts"]["agent"]["open"], 2);
}

/// `history --limit` above the page cap is refused with a message naming the cap, not served
/// with silently fewer rows.
#[test]
fn history_limit_above_its_cap_says_so() {
    let p = support::Project::new();
    p.goal("g");
    let run = p.run(&["history", "--goal-id", "g", "--limit", "5000"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("--limit") && run.stderr.contains("1..=1000"),
        "{}",
        run.stderr
    );
    p.ok(&["history", "--goal-id", "g", "--limit", "1000"]);
}

/// The documented agent sequence runs without `--goal-id` on a project with one active goal, and
/// with several the refusal names them (exit 2, nothing written).
#[test]
fn the_documented_sequence_runs_on_the_only_active_goal() {
    let p = support::Project::new();
    let none = p.run(&["quota", "should-run"]);
    assert_eq!(none.code, 2, "{none:?}");
    assert!(none.stderr.contains("no active goal"), "{}", none.stderr);

    p.goal("only");
    let todo = p.add_todo("only", "the work", &[]);
    let decision = p.json(&["quota", "should-run"]);
    assert_eq!(decision["goal_id"], "only", "{decision}");
    let claim = p.json(&["todo", "claim", "--agent-id", "a1"]);
    assert_eq!(claim["todo"]["id"], todo.as_str(), "{claim}");
    let fence = claim["claim"]["fence"].as_i64().unwrap().to_string();
    let proof = ["--agent-id", "a1", "--fence", &fence];
    let mut update = vec![
        "todo",
        "update",
        "--todo-id",
        &todo,
        "--evidence",
        "cargo test: ok",
    ];
    update.extend_from_slice(&proof);
    p.json(&update);
    let mut complete = vec!["todo", "complete", "--todo-id", &todo];
    complete.extend_from_slice(&proof);
    p.json(&complete);
    p.json(&[
        "quota",
        "spend-slot",
        "--agent-id",
        "a1",
        "--effect-id",
        "e1",
    ]);
    let quota = p.json(&["quota", "show", "--goal-id", "only"]);
    assert_eq!(quota["quota"]["spent_slots"], 1, "{quota}");
    let shown = p.json(&["todo", "show", "--goal-id", "only", "--todo-id", &todo]);
    assert_eq!(shown["todo"]["status"], "completed", "{shown}");

    // A paused goal does not count; a second active one makes the choice explicit.
    p.goal("paused");
    p.ok(&["goal", "pause", "--goal-id", "paused"]);
    p.json(&["quota", "should-run"]);
    p.goal("second");
    let before = p.snapshot();
    for args in [
        &["quota", "should-run"][..],
        &["todo", "claim"][..],
        &["todo", "update", "--todo-id", "t1", "--evidence", "x"][..],
        &["quota", "spend-slot"][..],
    ] {
        let run = p.run(args);
        assert_eq!(run.code, 2, "{args:?}: {run:?}");
        assert!(
            run.stderr.contains("2 active goals: only, second")
                || run.stderr.contains("2 active goals: second, only"),
            "{args:?}: {}",
            run.stderr
        );
    }
    assert_eq!(before, p.snapshot(), "a refusal writes nothing");
}

#[test]
fn start_goal_guided_refuses_without_a_terminal() {
    let p = support::Project::empty();
    let mut cmd = p.command(&["start-goal", "--guided"]);
    cmd.stdin(std::process::Stdio::piped());
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    // It refuses before reading: the pipe may be closed by the time this is written.
    let _ = child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Title\nObjective\n\n");
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("stdin is not one") && stderr.contains("--goal-text"),
        "{stderr}"
    );
    assert!(!p.state().exists(), "nothing was created");
    // --goal-text and --guided are one or the other.
    let both = p.run(&["start-goal", "--guided", "--goal-text", "x"]);
    assert_eq!(both.code, 2, "{both:?}");
}

/// The questions on a pseudo-terminal (util-linux `script` gives the command one), answered
/// from a pipe: a session with a todo over its limit (or a --goal-text over its) is refused
/// before anything is written; then title, objective, two todos, an empty line to finish.
#[test]
fn start_goal_guided_asks_on_a_terminal() {
    let p = support::Project::empty();
    // A todo over the title limit refuses the whole session, before anything is written.
    let long = format!("Title\nobjective\ntodo ok\n{}\n\n", "x".repeat(600));
    let Some((code, screen)) = guided_session(&p, &long) else {
        eprintln!("skipped: util-linux `script` is not installed");
        return;
    };
    assert_eq!(code, Some(2), "{screen}");
    assert!(screen.contains("todo title is 600 bytes"), "{screen}");
    assert!(
        !p.path().join(".loopx").exists(),
        "a refused start left a project"
    );
    // So does text over its limit given with --goal-text.
    let r = p.run(&["start-goal", "--goal-text", &"word ".repeat(20_000)]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        !p.path().join(".loopx").exists(),
        "a refused start left a project"
    );

    let (code, screen) = guided_session(
        &p,
        "Починить сборку\nThe build is green\nfix the linker flags\nrun the tests\n\n",
    )
    .unwrap();
    assert_eq!(code, Some(0), "{screen}");
    for question in [
        "Goal title",
        "What does success look like?",
        "First todo #1",
        "First todo #3",
    ] {
        assert!(screen.contains(question), "{question}: {screen}");
    }
    let goal = p.json(&["goal", "show", "--goal-id", "pochinit-sborku"]);
    assert_eq!(goal["goal"]["title"], "Починить сборку", "{goal}");
    assert_eq!(goal["goal"]["objective"], "The build is green");
    let todos = p.json(&["todo", "list", "--goal-id", "pochinit-sborku"]);
    let titles: Vec<&str> = todos["todos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["title"].as_str().unwrap())
        .collect();
    assert_eq!(titles, ["fix the linker flags", "run the tests"]);
}

#[test]
fn inspect_registry_prints_the_library_inspection() {
    let p = support::Project::new();
    p.goal("g");
    let ok = p.json(&["inspect_registry"]);
    assert_eq!(ok["inspection"]["ok"], true, "{ok}");
    assert_eq!(ok["inspection"]["goals"][0]["id"], "g");
    let text = p.ok(&["inspect_registry"]).stdout;
    assert!(text.contains(": ok") && text.contains("g "), "{text}");

    // A damaged file (any path): the typed problems, in full, and exit 5.
    let bad = p.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"schema_version":"nope","goals":[{"id":"a","status":"active"},{"id":"a","status":"gone"}]}"#,
    )
    .unwrap();
    let run = p.run(&["--format", "json", "inspect_registry", "bad.json"]);
    assert_eq!(run.code, 5, "{run:?}");
    let v = run.json();
    let kinds: Vec<&str> = v["inspection"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "unsupported_schema",
            "duplicate_goal_id",
            "goal_unknown_status"
        ]
    );
    let text = p.run(&["inspect_registry", "bad.json"]);
    assert_eq!(text.code, 5);
    assert!(
        text.stdout.contains("goal id 'a' is listed twice"),
        "{}",
        text.stdout
    );
    let missing = p.run(&["inspect_registry", "missing.json"]);
    assert_eq!(missing.code, 5);
    assert!(
        missing.stdout.contains("cannot be read"),
        "{}",
        missing.stdout
    );
}

/// `script` runs `line` on a pseudo-terminal in the project and returns what the terminal
/// showed, or `None` when util-linux `script` is not installed.
/// `--help` on a terminal styles its headings, unless NO_COLOR holds a value (an empty one does
/// not count, as no-color.org says); into a pipe it is plain.
#[test]
fn help_styling_follows_the_terminal_and_no_color() {
    let p = support::Project::new();
    let line = format!("{} goal --help", support::loopx_bin());
    let styled = |no_color: Option<&str>| -> Option<bool> {
        let mut cmd = script_command(&p, &line)?;
        cmd.stdin(std::process::Stdio::null())
            .env_remove("NO_COLOR");
        if let Some(v) = no_color {
            cmd.env("NO_COLOR", v);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        Some(out.stdout.contains(&0x1b))
    };
    let Some(plain_terminal) = styled(None) else {
        eprintln!("skipped: util-linux `script` is not installed");
        return;
    };
    assert!(plain_terminal);
    assert_eq!(styled(Some("")), Some(true));
    assert_eq!(styled(Some("1")), Some(false));
    assert!(!p.run(&["goal", "--help"]).stdout.contains('\u{1b}'));
}

/// `line` run by util-linux `script` on a pseudo-terminal in the project, without the
/// environment a turn would set; `None` when `script` is not installed.
fn script_command(p: &support::Project, line: &str) -> Option<std::process::Command> {
    std::process::Command::new("script")
        .arg("--version")
        .output()
        .ok()?;
    let mut cmd = std::process::Command::new("script");
    cmd.args(["-qec", line, "/dev/null"]).current_dir(p.path());
    for k in [
        "LOOPX_ROOT",
        "LOOPX_TURN_KEY",
        "LOOPX_AGENT_ID",
        "LOOPX_CLAIM_KEY",
    ] {
        cmd.env_remove(k);
    }
    Some(cmd)
}

/// `start-goal --guided` on a terminal (util-linux `script`), answered with `input`; `None`
/// without `script`.
fn guided_session(p: &support::Project, input: &str) -> Option<(Option<i32>, String)> {
    let line = format!("{} start-goal --guided", support::loopx_bin());
    let mut child = script_command(p, &line)?
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    Some((
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

fn on_a_terminal(p: &support::Project, line: &str) -> Option<(i32, String)> {
    let out = script_command(p, line)?
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    Some((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

/// `-q` drops the per-turn lines; `-v` adds the project and the duration; progress appears only
/// when stderr is a terminal.
#[test]
fn quiet_verbose_and_progress() {
    let p = support::Project::with_goal_g();
    let host = support::result_host("completed");
    let loop_args = |quiet: bool| {
        let mut args = if quiet { vec!["-q"] } else { vec![] };
        args.extend([
            "loop",
            "--goal-id",
            "g",
            "--agent-id",
            "a1",
            "--until-idle",
            "--max-turns",
            "1",
            "--isolation",
            "off",
            "--trust-host-completion",
            "--",
            "sh",
            "-c",
            &host,
        ]);
        args
    };
    p.add_todo("g", "one", &[]);
    let normal = p.run(&loop_args(false)).ok();
    assert!(normal.stderr.contains("turn 1/1 "), "{}", normal.stderr);
    // Into a pipe: no progress line.
    assert!(!normal.stderr.contains("loop on g"), "{}", normal.stderr);
    p.add_todo("g", "two", &[]);
    let quiet = p.run(&loop_args(true)).ok();
    assert!(quiet.stderr.is_empty(), "{}", quiet.stderr);
    assert!(
        quiet.stdout.contains("Loop of a1 on g: 1 turn(s)"),
        "{}",
        quiet.stdout
    );

    let plain = p.ok(&["status"]);
    assert!(plain.stderr.is_empty(), "{}", plain.stderr);
    let verbose = p.ok(&["-v", "status"]);
    assert_eq!(verbose.stdout, plain.stdout);
    assert!(
        verbose.stderr.contains("loopx: project "),
        "{}",
        verbose.stderr
    );
    assert!(
        verbose.stderr.contains("loopx: exit 0 after "),
        "{}",
        verbose.stderr
    );
    // Either side of the command: clap alone checks one level at a time.
    for args in [
        &["-q", "-v", "status"][..],
        &["-q", "status", "-v"],
        &["-v", "status", "-q"],
        &["--format", "json", "status", "--format", "text"],
        &["--format=json", "status", "--format=json"],
        // One lease proof, not two to reconcile.
        &[
            "todo",
            "complete",
            "--goal-id",
            "g",
            "--todo-id",
            "t1",
            "--fence",
            "1",
            "--claim-key",
            "k",
        ],
    ] {
        let refused = p.run(args);
        assert_eq!(refused.code, 2, "{args:?}: {refused:?}");
        assert!(
            refused.stdout.is_empty() || refused.json()["ok"] == false,
            "{refused:?}"
        );
    }

    // On a terminal the loop says what it is doing before it waits; -q silences that too.
    let bin = support::loopx_bin();
    let idle = format!("{bin} loop --goal-id g --until-idle --isolation off -- true");
    if let Some((code, screen)) = on_a_terminal(&p, &idle) {
        assert_eq!(code, 0, "{screen}");
        assert!(
            screen.contains("loopx: loop on g: up to 10 turn(s)"),
            "{screen}"
        );
        let quiet = format!("{bin} -q loop --goal-id g --until-idle --isolation off -- true");
        let (_, screen) = on_a_terminal(&p, &quiet).unwrap();
        assert!(!screen.contains("loop on g"), "{screen}");
        let watch = format!(
            "timeout --preserve-status -s TERM 1 {bin} loop --goal-id g --watch --isolation off -- true"
        );
        let (code, screen) = on_a_terminal(&p, &watch).unwrap();
        assert_eq!(code, 0, "{screen}");
        assert!(screen.contains("loopx: loop --watch on g: "), "{screen}");
    }
}

/// A `--watch` process with its stdout in a pipe, the lines it printed collected by a thread.
struct Watching {
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Watching {
    fn start(p: &support::Project, args: &[&str]) -> Watching {
        use std::io::BufRead;
        let mut child = p
            .command(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push(line);
            }
        });
        Watching { child, lines }
    }

    /// Waits (up to 20 s) until `n` blocks have been printed; returns the output so far.
    fn blocks(&self, n: usize) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let text = self.lines.lock().unwrap().join("\n");
            if text.lines().filter(|l| l.starts_with("--- ")).count() >= n {
                return text;
            }
            assert!(std::time::Instant::now() < deadline, "{n} blocks: {text}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// SIGTERM, then the exit code (within 10 s).
    fn stop(mut self) -> Option<i32> {
        // SAFETY: signalling our own child by its id.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        exit_within(&mut self.child, 10)
    }
}

fn exit_within(child: &mut std::process::Child, seconds: u64) -> Option<i32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("still running {seconds} s later");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `status --watch` and `todo list --watch` print a new block when another process commits, and
/// end with exit 0 on SIGTERM; a watcher whose reader has gone ends by itself.
#[test]
fn watch_redraws_on_every_commit() {
    let p = support::Project::new();
    p.goal("g");
    p.add_todo("g", "first", &[]);

    let status = Watching::start(&p, &["status", "--watch"]);
    let first = status.blocks(1);
    assert!(
        first.contains("Attention queue") && first.contains("1 "),
        "{first}"
    );
    p.add_todo("g", "second", &[]);
    let both = status.blocks(2);
    let second = both.rsplit("--- ").next().unwrap();
    assert!(second.contains("Attention queue"), "{second}");
    // A read changes nothing, so it draws nothing.
    p.ok(&["todo", "list", "--goal-id", "g"]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(status.blocks(2).matches("--- ").count(), 2);
    assert_eq!(status.stop(), Some(0), "a signal ends the watch cleanly");

    let list = Watching::start(&p, &["todo", "list", "--goal-id", "g", "--watch"]);
    assert!(!list.blocks(1).contains("third"));
    p.add_todo("g", "third", &[]);
    let two = list.blocks(2);
    assert!(
        two.rsplit("--- ").next().unwrap().contains("third"),
        "{two}"
    );
    assert_eq!(list.stop(), Some(0));

    // JSON: one document per line; a closed stdout ends the watch.
    let mut json = p
        .command(&[
            "--format",
            "json",
            "todo",
            "list",
            "--goal-id",
            "g",
            "--watch",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(json.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["todos"].as_array().unwrap().len(), 3, "{v}");
    // The reader is dropped above: the pipe is closed.
    assert_eq!(exit_within(&mut json, 10), Some(0));

    // On a terminal each redraw clears the screen and homes the cursor first.
    let line = format!(
        "timeout --preserve-status -s TERM 1 {} status --watch",
        support::loopx_bin()
    );
    if let Some((code, screen)) = on_a_terminal(&p, &line) {
        assert_eq!(code, 0, "{screen}");
        assert!(
            screen.starts_with("\x1b[H\x1b[2JAttention queue"),
            "{screen:?}"
        );
        assert!(!screen.contains("--- "), "{screen}");
    }
}

/// A restore puts another database at the path while a watch is open: the next redraw shows the
/// restored state (not the replaced file's), and a file that is no database ends the watch with
/// exit 5 instead of leaving it showing the old one.
#[test]
fn watch_follows_a_restored_database() {
    let p = support::Project::new();
    p.goal("g");
    p.add_todo("g", "before the backup", &[]);
    let state = p.dir.path().join(".loopx");
    let backup = p.dir.path().join("backup.db");
    p.ok(&["backup", backup.to_str().unwrap()]);
    p.add_todo("g", "after the backup", &[]);

    let list = Watching::start(&p, &["todo", "list", "--goal-id", "g", "--watch"]);
    assert!(list.blocks(1).contains("after the backup"));
    // The documented restore: the old files moved aside, the copy put in their place.
    let aside = p.dir.path().join("aside");
    std::fs::create_dir(&aside).unwrap();
    for name in ["loopx.db", "loopx.db-wal", "loopx.db-shm"] {
        let _ = std::fs::rename(state.join(name), aside.join(name));
    }
    std::fs::copy(&backup, state.join("loopx.db")).unwrap();
    let two = list.blocks(2);
    let redraw = two.rsplit("--- ").next().unwrap();
    assert!(redraw.contains("before the backup"), "{two}");
    assert!(!redraw.contains("after the backup"), "{two}");
    // Another commit, on the restored database, is drawn too.
    p.add_todo("g", "after the restore", &[]);
    assert!(
        list.blocks(3)
            .rsplit("--- ")
            .next()
            .unwrap()
            .contains("after the restore")
    );
    assert_eq!(list.stop(), Some(0));

    let mut status = p
        .command(&["status", "--watch"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let db = state.join("loopx.db");
    std::fs::rename(&db, aside.join("restored.db")).unwrap();
    std::fs::write(&db, "not a database\n".repeat(300)).unwrap();
    assert_eq!(exit_within(&mut status, 15), Some(5));
}

/// Installing a component says on a terminal that it is compiling (one install: a compile is
/// the slow part of this suite; that progress stays out of pipes is shown by the loop above,
/// through the same `Context::progress`).
#[test]
fn install_progress_on_a_terminal() {
    use support::plugin::{repo, wasm};
    wasm("issue-fix");
    let dir = repo().join("extensions/issue-fix");
    let p = support::Project::new();
    let line = format!(
        "{} extension install {}",
        support::loopx_bin(),
        dir.display()
    );
    if let Some((code, screen)) = on_a_terminal(&p, &line) {
        assert_eq!(code, 0, "{screen}");
        let progress = screen.find("loopx: installing ").expect(&screen);
        assert!(
            screen[progress..].contains("compiling its components"),
            "{screen}"
        );
        assert!(progress < screen.find("Installed").unwrap(), "{screen}");
    }
}

/// An empty `LOOPX_ROOT` is refused naming the variable as well as the flag: whoever reads the
/// refusal may never have typed `--root`.
#[test]
fn an_empty_root_names_the_variable_it_may_have_come_from() {
    let p = support::Project::new();
    let r = p.run_env(&["status"], &[("LOOPX_ROOT", "")]);
    assert_eq!(r.code, 2, "{} {}", r.stdout, r.stderr);
    assert!(r.stderr.contains("LOOPX_ROOT"), "{}", r.stderr);
}

/// A `loopx` whose agent channel is gone (`LOOPX_AGENT_SOCKET` left over from a turn that ended)
/// fails as an I/O failure, and under `--format json` prints the envelope like any error, also
/// when an argument is refused before anything is sent.
#[test]
fn a_channel_that_is_gone_is_an_io_failure_in_the_requested_format() {
    use std::os::unix::ffi::OsStrExt;
    let p = support::Project::new();
    let gone = p.path().join("no-such.sock");
    let gone = gone.to_str().unwrap();
    let r = p.run_env(
        &["--format", "json", "status"],
        &[("LOOPX_AGENT_SOCKET", gone)],
    );
    assert_eq!(r.code, 6, "{} {}", r.stdout, r.stderr);
    assert_eq!(r.json()["error"]["kind"], "io", "{}", r.stdout);
    assert!(r.stderr.contains("not answering"), "{}", r.stderr);

    let mut cmd = p.command(&[
        "--format",
        "json",
        "todo",
        "show",
        "--goal-id",
        "g",
        "--todo-id",
    ]);
    cmd.arg(std::ffi::OsStr::from_bytes(b"t\xff"))
        .env("LOOPX_AGENT_SOCKET", gone);
    let r = support::to_run(cmd.output().unwrap());
    assert_eq!(r.code, 2, "{} {}", r.stdout, r.stderr);
    assert_eq!(r.json()["error"]["kind"], "bad_input", "{}", r.stdout);
}
