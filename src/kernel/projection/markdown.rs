//! The Markdown projections: `STATE.md` and the run reports. Every value an agent or plugin wrote
//! goes through [`crate::inert`], so nothing in them can drive a terminal that `cat`s the file or
//! open Markdown structure that hides text.

use std::fmt::Write as _;

use super::{LiveWindow, RenderedTodos};
use crate::clock::rfc3339;
use crate::inert::{self, md_block, md_code, md_inline};
use crate::kernel::quota;
use crate::model::{Evidence, Goal, Role, Run, Todo};

pub(super) fn run_markdown(run: &Run) -> String {
    let mut md = format!("# Run {}\n\n", run.id);
    md.push_str(&format!("- goal: {}\n", md_code(&run.goal_id)));
    if let Some(a) = &run.agent_id {
        md.push_str(&format!("- agent: {}\n", md_code(a)));
    }
    if let Some(t) = &run.todo_id {
        md.push_str(&format!("- todo: {}\n", md_code(t)));
    }
    md.push_str(&format!(
        "- classification: {}\n",
        md_inline(&run.classification)
    ));
    if let Some(o) = &run.outcome {
        md.push_str(&format!("- outcome: {}\n", md_inline(o)));
    }
    md.push_str(&format!("- created: {}\n\n", rfc3339(run.created_at)));
    md.push_str("## Summary\n\n");
    md.push_str(&if run.summary.is_empty() {
        "(none)".into()
    } else {
        md_block(&run.summary)
    });
    // JSON escapes C0 controls in strings but writes C1 and bidi controls as they are; inside
    // the fence they are made visible too. The exact payload is in the run's `.json` report. A
    // pretty-printed JSON line starts with indentation and a JSON token, never a backtick, so no
    // payload can close the fence early.
    let payload = serde_json::to_string_pretty(&run.payload).unwrap_or_default();
    md.push_str("\n\n## Payload\n\n```json\n");
    md.push_str(&inert::text(&payload));
    md.push_str("\n```\n");
    md
}

/// A todo's line in STATE.md's lists (pieces pushed, not formatted: one line per todo per refresh).
pub(super) fn todo_markdown(md: &mut String, t: &Todo, now: i64) {
    md.push_str(if t.status.is_terminal() {
        "- [x] ["
    } else {
        "- [ ] ["
    });
    md.push_str(t.priority.as_str());
    md.push_str("] ");
    inert::push_md_inline(md, &t.title);
    // Ids (this one and the dependencies) are path-safe tokens (`ids::validate_token`): there is
    // nothing in them to escape.
    md.push_str(" `");
    md.push_str(&t.id);
    md.push_str("` (");
    md.push_str(t.status.as_str());
    if let Some(c) = t.live_claim(now) {
        let _ = write!(
            md,
            ", claimed by {} fence {}",
            md_inline(&c.agent_id),
            c.fence
        );
    }
    for (i, dep) in t.depends_on.iter().enumerate() {
        md.push_str(if i == 0 { ", after " } else { ", " });
        md.push_str(dep);
    }
    md.push_str(")\n");
}

pub(super) fn state_markdown(
    goal: &Goal,
    todos: &RenderedTodos,
    evidence: &[Evidence],
    quota: &quota::QuotaView,
    window: &LiveWindow,
    monitors: &[crate::model::Monitor],
    now: i64,
) -> (String, std::ops::Range<usize>) {
    let mut md = String::with_capacity(1024 + todos.md.len());
    let _ = write!(md, "# {}\n\n", md_inline(&goal.title));
    md.push_str(&format!("Goal `{}` is **{}**. Generated {} from the LoopX database; edits here are not read back.\n\n", goal.id, goal.status, rfc3339(now)));
    md.push_str("## Objective\n\n");
    md.push_str(&md_block(&goal.objective));
    md.push_str("\n\n");
    if !goal.success_criteria.is_empty() {
        md.push_str("## Success criteria\n\n");
        for c in &goal.success_criteria {
            md.push_str(&format!("- {}\n", md_inline(c)));
        }
        md.push('\n');
    }
    for (heading, role) in [
        ("User todos and gates", Role::User),
        ("Agent todos", Role::Agent),
    ] {
        md.push_str(&format!("## {heading}\n\n"));
        let before = md.len();
        for (_, _, line) in todos.in_order().filter(|(r, _, _)| *r == role) {
            md.push_str(line);
        }
        if md.len() == before {
            md.push_str("(none)\n");
        }
        md.push('\n');
    }
    if !monitors.is_empty() {
        md.push_str("## Monitors\n\n");
        for m in monitors {
            let _ = writeln!(
                md,
                "- `{}` every {} s (now every {} s), next due {}, last check {} ({}), {} quiet in a row{}",
                md_inline(&m.todo_id),
                m.every_ms / 1000,
                m.interval_ms() / 1000,
                rfc3339(m.next_due_at),
                m.last_check_at
                    .map(rfc3339)
                    .unwrap_or_else(|| "never".into()),
                m.last_result.map(|r| r.as_str()).unwrap_or("none"),
                m.no_change_count,
                m.target
                    .as_deref()
                    .map(|t| format!(", watching {}", md_inline(t)))
                    .unwrap_or_default(),
            );
        }
        md.push('\n');
    }
    let older: i64 = window.older_todos.iter().map(|c| c.2).sum();
    if older > 0 {
        let _ = write!(
            md,
            "## Older work\n\n{older} todo(s) finished before {} (the last {} day(s) are shown above): see `archive/` (one file per month); every todo stays readable by its id and every run in the history.\n\n",
            rfc3339(window.finished_since),
            window.days
        );
    }
    let quota_start = md.len();
    quota_markdown(&mut md, quota, now);
    let quota_section = quota_start..md.len();
    if let Some(p) = &goal.next_probe {
        md.push_str(&format!(
            "## Next probe (stored, never executed)\n\n{}\n\n",
            md_code(p)
        ));
    }
    md.push_str("## Recent evidence\n\n");
    if evidence.is_empty() {
        md.push_str("(none)\n");
    }
    for e in evidence {
        md.push_str(&format!(
            "- `{}` {}: {}\n",
            e.todo_id,
            rfc3339(e.created_at),
            md_inline(&e.text)
        ));
    }
    (md, quota_section)
}

/// STATE.md's quota section, dated: a spend rewrites only this section when nothing else changed
/// since the file was rendered (`quota_refresh`), so it carries its own time.
pub(super) fn quota_markdown(md: &mut String, quota: &quota::QuotaView, now: i64) {
    let _ = write!(
        md,
        "## Quota\n\n{} of {} slots spent in the window ({}), as of {}.\n\n",
        quota.spent_slots,
        quota.allowed_slots,
        quota.state,
        rfc3339(now)
    );
}

/// The head of a goal's monthly archive (`archive/<YYYY-MM>.md`), up to its first todo; the
/// todos ([`todo_markdown`]) and runs ([`archive_run_markdown`]) follow one at a time, so a month
/// of history is never held in memory.
pub(super) fn archive_markdown_head(goal: &Goal, month: &str) -> String {
    format!(
        "# {} — {month}\n\nGoal `{}`: the work that finished in {month}, archived from the LoopX database once the month left the live window of `STATE.md`. Written once, never changed.\n\n## Finished todos\n\n",
        md_inline(&goal.title),
        goal.id
    )
}

/// What separates the archive's todos from its runs (`todos` of them were written).
pub(super) fn archive_markdown_runs_heading(todos: usize) -> &'static str {
    if todos == 0 {
        "(none)\n\n## Runs\n\n"
    } else {
        "\n## Runs\n\n"
    }
}

/// One run's line in the archive.
pub(super) fn archive_run_markdown(md: &mut String, r: &Run) {
    let _ = writeln!(
        md,
        "- `{}` {} {}: {}",
        r.id,
        rfc3339(r.created_at),
        md_inline(&r.classification),
        md_inline(&r.summary)
    );
}

/// The end of the archive (`runs` of them were written).
pub(super) fn archive_markdown_tail(runs: usize) -> &'static str {
    if runs == 0 { "(none)\n" } else { "" }
}

/// The goal's provider probe and its last outcome, appended to `STATE.md` where the goal has one
/// (the observation through `md_code`, inert).
pub(super) fn goal_probe_markdown(md: &mut String, p: &crate::model::GoalProbe) {
    let _ = write!(
        md,
        "\n## Provider probe (run by the heartbeat once per revision, or `probe run`)\n\n- {} {} on {}, revision {}{}\n- last run: {} ({}), {} run(s), {} failure(s) in a row\n",
        md_inline(&p.spec.provider),
        md_inline(&p.spec.operation),
        md_inline(&p.spec.target),
        p.revision,
        if p.pending() { ", not run yet" } else { "" },
        p.last_checked_at
            .map(rfc3339)
            .unwrap_or_else(|| "never".into()),
        p.last_result.map(|r| r.as_str()).unwrap_or("none"),
        p.runs,
        p.failures,
    );
    if let Some(f) = &p.last_failure {
        let _ = writeln!(md, "- last failure: {}", md_inline(f));
    }
    if let Some(o) = &p.last_observation {
        let _ = write!(
            md,
            "- last observation (baseline or change):\n\n{}\n",
            md_code(o)
        );
    }
}
