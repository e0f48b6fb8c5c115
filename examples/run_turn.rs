//! Driving one turn from Rust with `loopx::runtime::run_turn`.
//!
//! Creates a throwaway project with one goal and one todo, writes a tiny host script, runs a turn
//! with a validator, and prints the outcome and the journal. Run with
//! `cargo run --example run_turn`.

use std::os::unix::fs::PermissionsExt;

use loopx::Kernel;
use loopx::kernel::Actor;
use loopx::kernel::goal::NewGoal;
use loopx::kernel::todo::NewTodo;
use loopx::paths::ProjectPaths;
use loopx::runtime::{TurnRequest, run_turn};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    Kernel::init(root)?;
    let mut kernel = Kernel::open(ProjectPaths::at(root))?;
    kernel.create_goal(
        &Actor::Operator,
        NewGoal {
            id: Some("hello".into()),
            title: "Say hello".into(),
            project_dir: Some(root.to_string_lossy().into_owned()),
            ..Default::default()
        },
    )?;
    kernel.add_todo(&Actor::Operator, "hello", NewTodo::task("Write hello.txt"))?;

    // The host: does the work, then prints one loopx.turn_result.v1 object on stdout.
    let host = root.join("host.sh");
    std::fs::write(
        &host,
        r#"#!/bin/sh
cat > /dev/null                      # the request JSON (unused here)
echo "hello from $LOOPX_AGENT_ID" > hello.txt
printf '{"schema_version":"loopx.turn_result.v1","status":"completed","summary":"wrote hello.txt","evidence":[{"text":"hello.txt written","artifact_path":"hello.txt"}]}'
"#,
    )?;
    std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o755))?;

    let mut req = TurnRequest::new("hello", "rust-example", vec![host.display().to_string()]);
    // The validator proves the completion claim: the file must exist and be non-empty.
    req.validate_argv = Some(vec!["test".into(), "-s".into(), "hello.txt".into()]);
    req.timeout_seconds = 60;

    let outcome = run_turn(&mut kernel, &req)?;
    println!(
        "turn {} on {}: {} ({})",
        outcome.turn_key.as_deref().unwrap_or("-"),
        outcome.todo_id.as_deref().unwrap_or("-"),
        outcome.kind.map(|k| k.as_str()).unwrap_or("no turn"),
        outcome
            .phases
            .iter()
            .map(|p| p.as_str())
            .collect::<Vec<_>>()
            .join(" -> ")
    );
    println!("spent: {}, lease: {:?}", outcome.spent, outcome.lease);
    let (todo, evidence) = kernel.todo("hello", outcome.todo_id.as_deref().unwrap_or("t1"))?;
    println!(
        "todo {} is {}; evidence: {}",
        todo.id,
        todo.status,
        evidence.len()
    );

    // Replaying the same key returns the stored result without running anything.
    req.turn_key = outcome.turn_key.clone();
    let replay = run_turn(&mut kernel, &req)?;
    println!("replayed: {} -> {:?}", replay.replayed, replay.kind);
    Ok(())
}
