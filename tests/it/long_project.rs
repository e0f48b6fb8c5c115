//! The quota and the goal projections through the CLI as a long project uses them: the window's
//! count (kept as an aggregate in the store) against the spends and voids that made it, and
//! `STATE.md` current after each quota write. The cost side is `benches/long_project.rs`.

use proptest::prelude::*;
use serde_json::Value;

use crate::support::Project;

fn project() -> Project {
    let p = Project::new();
    p.goal("g");
    p
}

fn quota(p: &Project) -> Value {
    p.json(&["quota", "show", "--goal-id", "g"])["quota"].clone()
}

fn state_md(p: &Project) -> String {
    std::fs::read_to_string(p.state().join("goals/g/STATE.md")).unwrap()
}

/// `STATE.md` and `state.json` show a spend, a void and a new policy as soon as the command that
/// made it returns, as they show every other write.
#[test]
fn state_md_is_current_after_spend_void_and_policy() {
    let p = project();
    assert!(
        state_md(&p).contains("0 of 1440 slots spent"),
        "{}",
        state_md(&p)
    );
    p.ok(&[
        "quota",
        "spend-slot",
        "--goal-id",
        "g",
        "--effect-id",
        "e1",
        "--slots",
        "3",
    ]);
    assert!(
        state_md(&p).contains("3 of 1440 slots spent"),
        "{}",
        state_md(&p)
    );
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(p.state().join("goals/g/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(json["quota"]["spent_slots"], 3, "{json}");
    // A replay writes nothing, and the files stay as they are.
    let before = state_md(&p);
    p.ok(&[
        "quota",
        "spend-slot",
        "--goal-id",
        "g",
        "--effect-id",
        "e1",
        "--slots",
        "3",
    ]);
    assert_eq!(state_md(&p), before);
    p.ok(&["quota", "void-slot", "--goal-id", "g", "--effect-id", "e1"]);
    assert!(
        state_md(&p).contains("0 of 1440 slots spent"),
        "{}",
        state_md(&p)
    );
    p.ok(&["quota", "set", "--goal-id", "g", "--allowed-slots", "7"]);
    assert!(
        state_md(&p).contains("0 of 7 slots spent"),
        "{}",
        state_md(&p)
    );
}

fn state_json_text(p: &Project) -> String {
    std::fs::read_to_string(p.state().join("goals/g/state.json")).unwrap()
}

/// The two state files with their times blanked: what a render shows of the database.
fn state_files_untimed(p: &Project) -> (Value, String) {
    let mut json: Value = serde_json::from_str(&state_json_text(p)).unwrap();
    json["generated_at"] = Value::Null;
    json["quota_as_of"] = Value::Null;
    json["live_window"]["finished_since"] = Value::Null;
    let md = state_md(p)
        .lines()
        .map(|l| match (l.find("Generated 2"), l.find(", as of 2")) {
            (Some(i), _) | (_, Some(i)) => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    (json, md)
}

/// A spend right after a render rewrites only the quota parts of the state files (the render's
/// `generated_at` stays, the quota carries its own time), and the files are then exactly what a
/// full render of the database shows.
#[test]
fn a_spend_after_a_render_rewrites_only_the_quota_and_matches_a_full_render() {
    let p = project();
    for i in 0..5 {
        p.ok(&[
            "todo",
            "add",
            "--goal-id",
            "g",
            "--title",
            &format!("work {i}"),
        ]);
    }
    p.ok(&["refresh-state", "--goal-id", "g", "--agent-id", "a1"]);
    let (json_before, md_before) = (state_json_text(&p), state_md(&p));
    std::thread::sleep(std::time::Duration::from_millis(5));
    p.ok(&["quota", "spend-slot", "--goal-id", "g", "--agent-id", "a1"]);
    let (json_after, md_after) = (state_json_text(&p), state_md(&p));

    let tail = json_before.find("  \"quota_as_of\"").unwrap();
    assert_eq!(
        json_after[..tail],
        json_before[..tail],
        "only the quota fields change"
    );
    let v: Value = serde_json::from_str(&json_after).unwrap();
    assert_eq!(v["quota"]["spent_slots"], 1);
    assert_ne!(
        v["generated_at"], v["quota_as_of"],
        "the render's time stays"
    );
    let section = |md: &str| {
        let start = md.find("## Quota").unwrap();
        let end = start + md[start..].find("\n\n## ").unwrap_or(md.len() - start);
        (md[..start].to_string(), md[end..].to_string())
    };
    assert_eq!(section(&md_after), section(&md_before));
    assert!(md_after.contains("1 of 1440 slots spent"), "{md_after}");

    let spliced = state_files_untimed(&p);
    p.ok(&["refresh-state"]);
    assert_eq!(
        state_files_untimed(&p),
        spliced,
        "a full render shows the same"
    );
    let v: Value = serde_json::from_str(&state_json_text(&p)).unwrap();
    assert_eq!(v["generated_at"], v["quota_as_of"]);
}

/// When anything else committed since the render (a claim), or a file is no longer the one
/// LoopX wrote, a spend renders the files in full: they never show a state the database was not
/// in.
#[test]
fn a_spend_renders_in_full_after_another_commit_or_an_edited_file() {
    let p = project();
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--title",
        "work",
        "--id",
        "t1",
    ]);
    p.ok(&["refresh-state", "--goal-id", "g", "--agent-id", "a1"]);
    p.ok(&[
        "todo",
        "claim",
        "--goal-id",
        "g",
        "--todo-id",
        "t1",
        "--agent-id",
        "a1",
    ]);
    p.ok(&[
        "quota",
        "spend-slot",
        "--goal-id",
        "g",
        "--agent-id",
        "a1",
        "--effect-id",
        "e1",
    ]);
    assert!(state_md(&p).contains("claimed by a1"), "{}", state_md(&p));
    let v: Value = serde_json::from_str(&state_json_text(&p)).unwrap();
    assert_eq!(v["generated_at"], v["quota_as_of"], "rendered in full");

    // Edited by hand after the render: rendered again, not patched at stale offsets.
    let md_path = p.state().join("goals/g/STATE.md");
    std::fs::write(&md_path, format!("# edited\n{}", state_md(&p))).unwrap();
    p.ok(&[
        "quota",
        "spend-slot",
        "--goal-id",
        "g",
        "--agent-id",
        "a1",
        "--effect-id",
        "e2",
    ]);
    let md = state_md(&p);
    assert!(
        !md.starts_with("# edited") && md.contains("2 of 1440 slots spent"),
        "{md}"
    );
    let spliced = state_files_untimed(&p);
    p.ok(&["refresh-state"]);
    assert_eq!(state_files_untimed(&p), spliced);

    // A stamp that no longer parses: rendered in full as well.
    std::fs::write(p.state().join("goals/g/.state.json.stamp"), "garbage").unwrap();
    p.ok(&[
        "quota",
        "spend-slot",
        "--goal-id",
        "g",
        "--agent-id",
        "a1",
        "--effect-id",
        "e3",
    ]);
    assert!(
        state_md(&p).contains("3 of 1440 slots spent"),
        "{}",
        state_md(&p)
    );
    let v: Value = serde_json::from_str(&state_json_text(&p)).unwrap();
    assert_eq!(v["generated_at"], v["quota_as_of"]);
}

/// One step of the property below.
#[derive(Debug, Clone)]
enum Step {
    Spend { agent: Option<u8>, slots: u8 },
    Void(usize),
    Window(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (proptest::option::of(0u8..2), 1u8..4)
            .prop_map(|(agent, slots)| Step::Spend { agent, slots }),
        1 => (0usize..16).prop_map(Step::Void),
        1 => (1u8..48).prop_map(Step::Window),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    /// After any mix of spends (with and without an agent), voids and window changes, the goal's
    /// and each agent's spent slots are the sum of the spends not voided: every write moves the
    /// kept count, and none counts twice.
    #[test]
    fn spent_slots_equal_the_spends_not_voided(steps in proptest::collection::vec(step(), 1..10)) {
        let p = project();
        // (effect id, agent, slots, voided)
        let mut spends: Vec<(String, Option<String>, i64, bool)> = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            match s {
                Step::Spend { agent, slots } => {
                    let effect = format!("e{i}");
                    let agent = agent.map(|a| format!("a{a}"));
                    let slots_text = slots.to_string();
                    let mut args = vec![
                        "quota", "spend-slot", "--goal-id", "g", "--effect-id", &effect,
                        "--slots", &slots_text,
                    ];
                    if let Some(a) = &agent {
                        args.extend(["--agent-id", a.as_str()]);
                    }
                    p.ok(&args);
                    spends.push((effect, agent, i64::from(*slots), false));
                }
                Step::Void(n) if !spends.is_empty() => {
                    let k = n % spends.len();
                    p.ok(&["quota", "void-slot", "--goal-id", "g", "--effect-id", &spends[k].0]);
                    spends[k].3 = true;
                }
                Step::Void(_) => {}
                Step::Window(hours) => {
                    p.ok(&["quota", "set", "--goal-id", "g", "--window-hours", &hours.to_string()]);
                }
            }
            let live = |agent: Option<&str>| -> i64 {
                spends
                    .iter()
                    .filter(|s| !s.3)
                    .filter(|s| agent.is_none_or(|a| s.1.as_deref() == Some(a)))
                    .map(|s| s.2)
                    .sum()
            };
            prop_assert_eq!(quota(&p)["spent_slots"].as_i64(), Some(live(None)));
            for a in ["a0", "a1"] {
                let q = p.json(&["quota", "show", "--goal-id", "g", "--agent-id", a]);
                prop_assert_eq!(q["quota"]["agent_spent_slots"].as_i64(), Some(live(Some(a))));
            }
        }
    }
}
