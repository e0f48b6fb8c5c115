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

/// `quota spend-slot` on goal `g` as agent `a1`, with `extra` arguments.
fn spend(p: &Project, extra: &[&str]) {
    let mut args = vec!["quota", "spend-slot", "--goal-id", "g", "--agent-id", "a1"];
    args.extend_from_slice(extra);
    p.ok(&args);
}

/// Whether the state files were last rendered in full (a full render dates the quota with the
/// render; a rewrite of the quota parts alone leaves the render's `generated_at`).
fn rendered_in_full(p: &Project) -> bool {
    let v: Value = serde_json::from_str(&state_json_text(p)).unwrap();
    v["generated_at"] == v["quota_as_of"]
}

/// A project with todos `t1`..`t5` on goal `g` and its state files just rendered, as the tick
/// leaves them before its spend.
fn rendered_project() -> Project {
    let p = project();
    for i in 1..=5 {
        p.add_todo("g", &format!("work {i}"), &["--id", &format!("t{i}")]);
    }
    p.ok(&["refresh-state", "--goal-id", "g", "--agent-id", "a1"]);
    // The quota's time must differ from the render's for the tests to tell them apart.
    std::thread::sleep(std::time::Duration::from_millis(5));
    p
}

/// A spend right after a render rewrites only the quota parts of the state files (the render's
/// `generated_at` stays, the quota carries its own time), and the files are then exactly what a
/// full render of the database shows.
#[test]
fn a_spend_after_a_render_rewrites_only_the_quota_and_matches_a_full_render() {
    let p = rendered_project();
    let (json_before, md_before) = (state_json_text(&p), state_md(&p));
    spend(&p, &[]);
    let (json_after, md_after) = (state_json_text(&p), state_md(&p));

    let tail = json_before.find("  \"quota_as_of\"").unwrap();
    assert_eq!(
        json_after[..tail],
        json_before[..tail],
        "only the quota fields change"
    );
    let v: Value = serde_json::from_str(&json_after).unwrap();
    assert_eq!(v["quota"]["spent_slots"], 1);
    assert!(!rendered_in_full(&p), "the render's time stays");
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
    assert!(rendered_in_full(&p));
}

/// When anything else committed since the render (a claim), or a file is no longer the one
/// LoopX wrote, a spend renders the files in full: they never show a state the database was not
/// in.
#[test]
fn a_spend_renders_in_full_after_another_commit_or_an_edited_file() {
    let p = rendered_project();
    p.ok(&Project::todo_args("claim", "g", "t1", "a1", &[]));
    spend(&p, &["--effect-id", "e1"]);
    assert!(state_md(&p).contains("claimed by a1"), "{}", state_md(&p));
    assert!(rendered_in_full(&p));

    // Edited by hand after the render: rendered again, not patched at stale offsets.
    let md_path = p.state().join("goals/g/STATE.md");
    std::fs::write(&md_path, format!("# edited\n{}", state_md(&p))).unwrap();
    spend(&p, &["--effect-id", "e2"]);
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
    spend(&p, &["--effect-id", "e3"]);
    assert!(
        state_md(&p).contains("3 of 1440 slots spent"),
        "{}",
        state_md(&p)
    );
    assert!(rendered_in_full(&p));
}

/// A stamp that names the files as they are but places their quota parts elsewhere (stale,
/// torn, or written by someone who can write `.loopx/`) splices nothing into the middle of the
/// files: each placement is checked against the bytes there, and the files are rendered in full.
#[test]
fn a_stamp_with_wrong_offsets_renders_in_full_instead_of_splicing() {
    let stamp_path = |p: &Project| p.state().join("goals/g/.state.json.stamp");
    // The second line: STATE.md's stat (72 characters), then seq, the JSON offset, and the
    // Markdown section's start and end, each 20 digits.
    let with_field = |stamp: &str, field: usize, value: u64| -> String {
        let (json, rest) = stamp.split_once('\n').unwrap();
        let mut fields: Vec<String> = rest[73..].trim_end().split(' ').map(String::from).collect();
        fields[field] = format!("{value:020}");
        format!("{json}\n{} {}\n", &rest[..72], fields.join(" "))
    };
    for (field, shift) in [(1, 7), (1, 0), (2, 3), (3, 1)] {
        let p = rendered_project();
        let stamp = std::fs::read_to_string(stamp_path(&p)).unwrap();
        let fields: Vec<u64> = stamp.lines().nth(1).unwrap()[73..]
            .split(' ')
            .map(|n| n.parse().unwrap())
            .collect();
        let moved = if shift == 0 { 0 } else { fields[field] - shift };
        // Rewritten in place, as LoopX writes it: the files' stats still match.
        std::fs::OpenOptions::new()
            .write(true)
            .open(stamp_path(&p))
            .and_then(|mut f| {
                std::io::Write::write_all(&mut f, with_field(&stamp, field, moved).as_bytes())
            })
            .unwrap();
        spend(&p, &[]);
        assert!(rendered_in_full(&p), "field {field} moved to {moved}");
        let md = state_md(&p);
        assert_eq!(md.matches("## Quota").count(), 1, "{md}");
        assert!(md.contains("1 of 1440 slots spent"), "{md}");
        let spliced = state_files_untimed(&p);
        p.ok(&["refresh-state"]);
        assert_eq!(state_files_untimed(&p), spliced);
    }
}

/// Spends from many processes at once after one render: whatever order their rewrites and
/// renders land in, the files stay whole, and the next quota change brings them up to date with
/// the database (a stale stamp or counter sends it to a full render).
#[test]
fn concurrent_spends_leave_whole_files_that_the_next_change_brings_up_to_date() {
    let p = rendered_project();
    std::thread::scope(|scope| {
        for i in 0..8 {
            let p = &p;
            scope.spawn(move || {
                let effect = format!("c{i}");
                spend(p, &["--effect-id", &effect]);
            });
        }
    });
    let json: Value = serde_json::from_str(&state_json_text(&p)).unwrap();
    let spent = json["quota"]["spent_slots"].as_i64().unwrap();
    assert!((1..=8).contains(&spent), "{json}");
    assert_eq!(state_md(&p).matches("## Quota").count(), 1);
    spend(&p, &["--effect-id", "last"]);
    let json: Value = serde_json::from_str(&state_json_text(&p)).unwrap();
    assert_eq!(json["quota"]["spent_slots"], 9);
    assert_eq!(
        json["quota"],
        quota(&p),
        "the files show the database's quota"
    );
    assert!(
        state_md(&p).contains("9 of 1440 slots spent"),
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
