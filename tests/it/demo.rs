//! The README's main demo, end to end, with the debug build of loopx: two scripted agents, real
//! work on files, a validation failure that is repaired, an agent-opened gate the operator resolves.

use std::process::Command;

#[test]
fn the_readme_demo_runs_to_a_published_report() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_loopx"))
        .parent()
        .unwrap();
    let demo = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(repo.join("examples/demo/run.sh"))
        .env("LOOPX_BIN_DIR", bin_dir)
        .env("LOOPX_DEMO_DIR", demo.path())
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");

    let project = demo.path().join("project");
    let report =
        std::fs::read_to_string(project.join("public/report.md")).expect("report published");
    for line in ["sum: 58", "max: 25", "count: 6", "mean: 9"] {
        assert!(report.contains(line), "{report}");
    }
    assert!(
        stdout.contains("validation_failed"),
        "one turn fails validation:\n{stdout}"
    );
    assert!(stdout.contains("Gate stats-approve approved"), "{stdout}");
    let log = std::fs::read_to_string(project.join(".demo/work.log")).unwrap();
    let max_attempts = log.lines().filter(|l| l.contains("-patch-max-")).count();
    assert_eq!(
        max_attempts, 2,
        "the failed max patch is repaired by a second turn:\n{log}"
    );

    // The state LoopX recorded agrees with the files.
    let loopx = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_loopx"))
            .args(args)
            .current_dir(&project)
            .env_remove("LOOPX_ROOT")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let todos = loopx(&["--format", "json", "todo", "list", "--goal-id", "stats"]);
    for t in todos["todos"].as_array().unwrap() {
        assert_eq!(t["status"], "completed", "{t}");
    }
    let history = loopx(&[
        "--format",
        "json",
        "history",
        "--goal-id",
        "stats",
        "--limit",
        "100",
    ]);
    let kinds: Vec<&str> = history["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["classification"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"validation_failed"));
    assert!(
        kinds
            .iter()
            .filter(|k| **k == "validated_completion")
            .count()
            >= 8,
        "{kinds:?}"
    );
    let quota = loopx(&["--format", "json", "quota", "show", "--goal-id", "stats"]);
    assert_eq!(
        quota["quota"]["spent_slots"].as_i64().unwrap(),
        kinds
            .iter()
            .filter(|k| **k == "validated_completion")
            .count() as i64,
        "one spend per validated turn, none for the failed one"
    );
    // The closing lines point at the reports and count them as they are stored (by month).
    let reports = format!(
        "({} runs, each .json + .md)",
        history["runs"].as_array().unwrap().len()
    );
    assert!(
        stdout.contains(&reports),
        "expected {reports} in:\n{stdout}"
    );
}
