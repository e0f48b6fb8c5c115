//! `loopx::registry::inspect_registry`: the library view of a registry projection.

use loopx::registry::{RegistryProblem, inspect_registry};

fn write(content: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("registry.json");
    std::fs::write(&path, content).unwrap();
    (dir, path)
}

#[test]
fn a_valid_registry_lists_goal_ids_and_statuses() {
    let (_d, path) = write(
        r#"{"schema_version":"loopx.registry.v1","goals":[{"id":"a","status":"active"},{"id":"b","status":"closed"}]}"#,
    );
    let r = inspect_registry(&path);
    assert!(r.ok, "{:?}", r.problems);
    assert_eq!(r.goal_count, 2);
    assert_eq!(r.goals[1].id, "b");
    assert_eq!(r.goals[1].status, "closed");
}

#[test]
fn malformed_registries_get_typed_problems() {
    let (_d, path) = write("{\"goals\": [");
    let r = inspect_registry(&path);
    assert!(!r.ok);
    assert!(matches!(
        r.problems[0],
        RegistryProblem::InvalidJson { line: 1, .. }
    ));

    let (_d, path) = write(r#"{"schema_version":"loopx.registry.v1"}"#);
    assert_eq!(
        inspect_registry(&path).problems,
        vec![RegistryProblem::MissingGoals]
    );

    let (_d, path) = write(
        r#"{"schema_version":"loopx.registry.v1","goals":[{"id":"a","status":"active"},{"id":"a","status":"weird"},{"status":"active"},{"id":"../x","status":"paused"},{"id":"c"}]}"#,
    );
    let r = inspect_registry(&path);
    assert!(!r.ok);
    assert!(
        r.problems
            .contains(&RegistryProblem::DuplicateGoalId { id: "a".into() })
    );
    assert!(r.problems.contains(&RegistryProblem::GoalUnknownStatus {
        index: 1,
        id: "a".into(),
        status: "weird".into()
    }));
    assert!(
        r.problems
            .contains(&RegistryProblem::GoalMissingId { index: 2 })
    );
    assert!(r.problems.contains(&RegistryProblem::GoalInvalidId {
        index: 3,
        id: "../x".into()
    }));
    assert!(r.problems.contains(&RegistryProblem::GoalMissingStatus {
        index: 4,
        id: "c".into()
    }));

    let r = inspect_registry(std::path::Path::new("/definitely/not/here.json"));
    assert!(matches!(r.problems[0], RegistryProblem::Unreadable { .. }));
    assert_eq!(r.goal_count, 0);
}

#[test]
fn the_projection_written_by_loopx_inspects_clean() {
    let dir = tempfile::tempdir().unwrap();
    loopx::Kernel::init(dir.path())
        .unwrap()
        .expect("fresh project");
    let paths = loopx::paths::ProjectPaths::at(dir.path());
    let mut kernel = loopx::Kernel::open(paths.clone()).unwrap();
    kernel
        .create_goal(
            &loopx::kernel::Actor::Operator,
            loopx::kernel::goal::NewGoal {
                title: "Lib goal".into(),
                ..Default::default()
            },
        )
        .unwrap();
    let r = inspect_registry(paths.registry());
    assert!(r.ok, "{:?}", r.problems);
    assert_eq!(r.goals[0].id, "lib-goal");
    assert_eq!(r.goals[0].status, "active");
}
