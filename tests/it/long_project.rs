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
