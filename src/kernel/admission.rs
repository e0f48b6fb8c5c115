//! Admission: the only way a capability's proposal becomes state.
//!
//! Each proposal is checked against current state (the todo exists in this goal, the calling agent
//! holds its lease, no gate is touched, sizes within limits). Accepted proposals commit together in
//! one transaction with a run row that records every verdict, refused ones included, so the run log
//! says exactly what a plugin asked for and why it was or was not done.

use serde_json::json;

use super::decision::installed_capabilities;
use super::todo::{NewTodo, add_evidence, authorize_write, complete_in_tx, insert_new_todo};
use super::transition::{
    AdmissionReport, MAX_PROPOSAL_TEXT, MAX_PROPOSALS_PER_CALL, ProposalSource, TextField,
    Transition, Verdict,
};
use super::{Actor, Kernel, log_op, require_goal};
use crate::clock::now_ms;
use crate::error::{LoopxError, Result};
use crate::kernel::store::StoreTx;
use crate::model::{GateScope, GoalStatus, Role, Run, TodoKind, TodoStatus};

/// Why a proposal is refused; becomes the verdict's reason.
type Refusal = String;

/// Longest `artifact_path` a piece of evidence may name, in bytes.
pub const MAX_ARTIFACT_PATH: usize = 1024;

/// The checks of a proposal that need no state: every field within its limits. This is the one
/// validation of a proposal's shape, whatever carried it: a capability's batch and a turn result's
/// `proposals` reach it through [`admit_in_tx`], and the turn result's `evidence[]` items are
/// checked by calling it on the `attach_evidence` they become (`turn::result`), so a path or digest
/// refused in one form is refused in every form. Checks of artifact paths and digests belong here.
pub fn check_proposal(t: &Transition) -> std::result::Result<(), Refusal> {
    // Only prose is bounded here (references have the checks of whatever uses them: ids are
    // tokens, paths and digests have their own limits below). Bounding references here too
    // would change which refusal some proposals get today.
    for (field, _, text) in t
        .text_fields()
        .into_iter()
        .filter(|f| f.1 == TextField::Prose)
    {
        if text.len() > MAX_PROPOSAL_TEXT {
            return Err(format!(
                "{field} is {} bytes; the limit is {MAX_PROPOSAL_TEXT}",
                text.len()
            ));
        }
    }
    if let Transition::AttachEvidence {
        artifact_path,
        artifact_digest,
        ..
    } = t
    {
        if let Some(p) = artifact_path {
            check_artifact_path(p)?;
        }
        if let Some(d) = artifact_digest
            && !(d.len() == 64 && d.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        {
            return Err(format!(
                "artifact_digest must be a sha256: exactly 64 lowercase hex characters (got {} bytes)",
                d.len()
            ));
        }
    }
    Ok(())
}

/// An evidence artifact names a file of the project: a relative path (no leading `/` or `\`, no
/// drive letter) with no `..` component, so it cannot point outside the project whoever resolves
/// it, within [`MAX_ARTIFACT_PATH`] bytes, and free of control characters (NUL, C0, DEL, C1) and bidirectional overrides, which
/// would hide what it names from the operator reading it. The reason never echoes the path: it may
/// be exactly the hostile text it is refused for.
fn check_artifact_path(p: &str) -> std::result::Result<(), Refusal> {
    let bad = |why: &str| {
        Err(format!(
            "artifact_path {why}; it must be a relative path inside the project (1-{MAX_ARTIFACT_PATH} bytes, no '..', no control or bidirectional-override characters)"
        ))
    };
    if p.is_empty() || p.len() > MAX_ARTIFACT_PATH {
        return bad(&format!("is {} bytes", p.len()));
    }
    // Bidirectional overrides and isolates reorder what a terminal shows, like a control
    // character hides it.
    if p.chars()
        .any(|c| c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'))
    {
        return bad("contains a control or bidirectional-override character");
    }
    let b = p.as_bytes();
    if b[0] == b'/' || b[0] == b'\\' || (b.len() >= 2 && b[1] == b':' && b[0].is_ascii_alphabetic())
    {
        return bad("is absolute");
    }
    if p.split(['/', '\\']).any(|c| c == "..") {
        return bad("leaves the project through '..'");
    }
    Ok(())
}

/// Turns a kernel error on one proposal into a refusal; store failures still abort the batch.
fn refusal(err: LoopxError) -> Result<Refusal> {
    match err {
        LoopxError::Internal { .. } | LoopxError::Corrupt { .. } => Err(err),
        other => Ok(other.to_string()),
    }
}

/// Checks and applies one proposal inside `tx`. `Ok(Err(reason))` is a refusal.
fn apply(
    tx: &dyn StoreTx,
    source: &ProposalSource,
    actor: &Actor,
    t: &Transition,
    report: &mut AdmissionReport,
    now: i64,
) -> Result<std::result::Result<(String, Option<String>), Refusal>> {
    if let Err(r) = check_proposal(t) {
        return Ok(Err(r));
    }
    let goal_id = &source.goal_id;
    // Loads a todo of *this* goal; any other id (including another goal's todo) is refused.
    let load = |todo_id: &str| -> Result<std::result::Result<crate::model::Todo, Refusal>> {
        if crate::ids::validate_token("todo id", todo_id).is_err() {
            return Ok(Err(format!("'{todo_id}' is not a valid todo id")));
        }
        Ok(tx
            .todo(goal_id, todo_id)?
            .ok_or_else(|| format!("no todo '{todo_id}' in goal '{goal_id}'")))
    };
    let touch = |todo: &crate::model::Todo,
                 what: &str|
     -> Result<std::result::Result<(), Refusal>> {
        if todo.role == Role::User {
            return Ok(Err(format!(
                "todo '{}' is a {}; a capability can never {what} a gate or user action (only an operator acts on them)",
                todo.id, todo.kind
            )));
        }
        match authorize_write(todo, actor) {
            Ok(()) => Ok(Ok(())),
            Err(e) => Ok(Err(refusal(e)?)),
        }
    };
    Ok(match t {
        Transition::AddTodo {
            id,
            title,
            detail,
            priority,
            kind,
            lane,
            depends_on,
            capability,
        } => {
            if !matches!(kind, TodoKind::Task | TodoKind::Monitor) {
                return Ok(Err(format!(
                    "add_todo may add task or monitor todos, not {kind}; use open_user_gate"
                )));
            }
            // A todo bound to a capability that is not there routes the goal to repair until an
            // operator acts: binding one is the operator's decision (`todo add --capability`),
            // never a proposal's.
            if let Some(bound) = capability
                && !bound.starts_with("builtin:")
                && !installed_capabilities(tx)?.contains(bound)
            {
                return Ok(Err(format!(
                    "capability{} is not installed and enabled; a proposal may bind a new \
                     todo only to an installed capability (only an operator binds one that is \
                     not installed yet)",
                    crate::error::quoted_input(bound, 80)
                )));
            }
            if let Some(existing) = id.as_deref().map(load).transpose()?.and_then(|r| r.ok()) {
                return Ok(Ok((
                    format!("todo '{}' already exists; unchanged", existing.id),
                    Some(existing.id),
                )));
            }
            let new = NewTodo {
                id: id.clone(),
                title: title.clone(),
                detail: detail.clone(),
                priority: Some(*priority),
                kind: *kind,
                depends_on: depends_on.clone(),
                capability: capability.clone(),
                lane: lane.clone(),
                gate_scope: None,
            };
            match insert_new_todo(tx, goal_id, new, now) {
                Ok(todo) => Ok((format!("created todo '{}'", todo.id), Some(todo.id))),
                Err(e) => Err(refusal(e)?),
            }
        }
        Transition::AttachEvidence {
            todo_id,
            text,
            artifact_path,
            artifact_digest,
        } => {
            let todo = match load(todo_id)? {
                Ok(t) => t,
                Err(r) => return Ok(Err(r)),
            };
            // Evidence on a gate is what the operator reads before resolving it; a capability
            // writing there would be arguing the operator's decision for them.
            if let Err(r) = touch(&todo, "attach evidence to")? {
                return Ok(Err(r));
            }
            let artifact = artifact_path.clone().map(|p| (p, artifact_digest.clone()));
            match add_evidence(tx, &todo, actor, text, artifact, None, now) {
                Ok(_) => Ok((
                    format!("evidence attached to '{todo_id}'"),
                    Some(todo_id.clone()),
                )),
                Err(e) => Err(refusal(e)?),
            }
        }
        Transition::CompleteTodo { todo_id, evidence } => {
            let todo = match load(todo_id)? {
                Ok(t) => t,
                Err(r) => return Ok(Err(r)),
            };
            if let Err(r) = touch(&todo, "complete")? {
                return Ok(Err(r));
            }
            match complete_in_tx(tx, todo, actor, evidence.as_deref(), now) {
                Ok(c) if c.changed => Ok((format!("completed '{todo_id}'"), Some(todo_id.clone()))),
                Ok(_) => Ok((
                    format!("'{todo_id}' was already completed; unchanged"),
                    Some(todo_id.clone()),
                )),
                Err(e) => Err(refusal(e)?),
            }
        }
        Transition::BlockTodo { todo_id, reason } | Transition::DeferTodo { todo_id, reason } => {
            let (status, verb) = if matches!(t, Transition::BlockTodo { .. }) {
                (TodoStatus::Blocked, "block")
            } else {
                (TodoStatus::Deferred, "defer")
            };
            let mut todo = match load(todo_id)? {
                Ok(t) => t,
                Err(r) => return Ok(Err(r)),
            };
            if let Err(r) = touch(&todo, verb)? {
                return Ok(Err(r));
            }
            if todo.status.is_terminal() {
                return Ok(Err(format!(
                    "todo '{todo_id}' is {}; terminal todos do not change",
                    todo.status
                )));
            }
            todo.status = status;
            todo.claim = None;
            todo.status_reason = Some(reason.clone());
            todo.updated_at = now;
            tx.update_todo(&todo)?;
            Ok((format!("{verb}ed '{todo_id}'"), Some(todo_id.clone())))
        }
        Transition::OpenUserGate {
            title,
            detail,
            blocking,
            blocks_agent,
        } => {
            // A capability may stop only the agent it acts for: a global gate (or one blocking
            // another agent) would halt work the capability has no part in until an operator
            // answers. Operators open such gates themselves (`todo add --kind user_gate`).
            let (kind, scope) = match (blocking, blocks_agent) {
                (true, Some(a)) if source.agent_id.as_deref() == Some(a.as_str()) => (
                    TodoKind::UserGate,
                    Some(GateScope::BlocksAgent {
                        agent_id: a.clone(),
                    }),
                ),
                (true, Some(_)) => {
                    return Ok(Err(format!(
                        "a capability may open a blocking gate only for the agent it acts for ({}); only an operator opens gates that block other agents",
                        source
                            .agent_id
                            .as_deref()
                            .unwrap_or("none: invoked without an agent")
                    )));
                }
                (true, None) => {
                    return Ok(Err(
                        "a capability may not open a gate that blocks every agent; set blocks_agent to the agent it acts for, or open a non-blocking user action (only an operator opens global gates)"
                            .to_string(),
                    ));
                }
                (false, _) => (TodoKind::UserAction, None),
            };
            let new = NewTodo {
                kind,
                gate_scope: scope,
                detail: detail.clone(),
                ..NewTodo::task(title.clone())
            };
            match insert_new_todo(tx, goal_id, new, now) {
                Ok(todo) => Ok((format!("opened {} '{}'", todo.kind, todo.id), Some(todo.id))),
                Err(e) => Err(refusal(e)?),
            }
        }
        Transition::RequestReplan { .. } => {
            report.replan_requested = true;
            Ok(("replan requested".to_string(), None))
        }
        Transition::ScheduleWake { after_seconds, .. } => {
            report.wake_after_seconds = Some(*after_seconds);
            Ok((format!("wake requested in {after_seconds}s"), None))
        }
        Transition::NoChange { reason } => Ok((format!("no change: {reason}"), None)),
    })
}

/// Why a batch from `source` may no longer be admitted, if it may not: its WebAssembly
/// capability is no longer installed and enabled, or its extension is now another revision
/// than the one that ran (an operator disabled, removed or upgraded it during the call).
/// Read in the admitting transaction, so no operator change can slip between check and commit.
fn withdrawn(tx: &dyn StoreTx, source: &ProposalSource) -> Result<Option<Refusal>> {
    if source.capability.starts_with("builtin:") {
        return Ok(None);
    }
    let name = &source.capability;
    if !installed_capabilities(tx)?.contains(name) {
        return Ok(Some(format!(
            "capability {name} is no longer installed and enabled (an operator disabled or \
             removed it while it ran); nothing it proposed is admitted"
        )));
    }
    let extension = name.split_once('/').map_or(name.as_str(), |(ext, _)| ext);
    let installed = tx.extension(extension)?.map(|e| e.revision);
    match (source.revision, installed) {
        (Some(ran), Some(now)) if ran != now => Ok(Some(format!(
            "extension '{extension}' was upgraded or rolled back while {name} ran (revision \
             {ran}, now {now}); nothing it proposed is admitted"
        ))),
        _ => Ok(None),
    }
}

/// Admits a batch inside the caller's transaction (the turn driver commits it together with its
/// journal phase). Writes state for accepted proposals but no run row.
pub(crate) fn admit_in_tx(
    tx: &dyn StoreTx,
    source: &ProposalSource,
    proposals: &[Transition],
    dry_run: bool,
    now: i64,
) -> Result<AdmissionReport> {
    let goal = require_goal(tx, &source.goal_id)?;
    let withdrawn = withdrawn(tx, source)?;
    let actor = Actor::Capability {
        capability: source.capability.clone(),
        agent_id: source.agent_id.clone(),
    };
    let mut report = AdmissionReport {
        goal_id: source.goal_id.clone(),
        capability: source.capability.clone(),
        dry_run,
        verdicts: Vec::new(),
        accepted: 0,
        refused: 0,
        run_id: None,
        replan_requested: false,
        wake_after_seconds: None,
    };
    for (index, t) in proposals.iter().enumerate() {
        let outcome = if index >= MAX_PROPOSALS_PER_CALL {
            Err(format!(
                "over the limit of {MAX_PROPOSALS_PER_CALL} proposals per call"
            ))
        } else if let Some(why) = &withdrawn {
            Err(why.clone())
        } else if goal.status != GoalStatus::Active {
            Err(format!(
                "goal '{}' is {}; nothing is admitted",
                goal.id, goal.status
            ))
        } else {
            apply(tx, source, &actor, t, &mut report, now)?
        };
        let verdict = match outcome {
            Ok((reason, todo_id)) => Verdict {
                index,
                transition: t.kind().to_string(),
                accepted: true,
                reason,
                todo_id,
            },
            Err(reason) => Verdict {
                index,
                transition: t.kind().to_string(),
                accepted: false,
                reason,
                todo_id: None,
            },
        };
        if verdict.accepted {
            report.accepted += 1;
        } else {
            report.refused += 1;
        }
        report.verdicts.push(verdict);
    }
    if !dry_run && report.accepted > 0 {
        log_op(
            tx,
            Some(&source.goal_id),
            &actor,
            "admit",
            json!({"accepted": report.accepted, "refused": report.refused}),
        )?;
    }
    Ok(report)
}

impl Kernel {
    /// Admits a capability's proposals: accepted ones commit in one transaction together with a
    /// run row recording every verdict. With `dry_run` the same checks run and roll back.
    pub fn admit(
        &mut self,
        source: &ProposalSource,
        proposals: &[Transition],
        dry_run: bool,
    ) -> Result<AdmissionReport> {
        if dry_run {
            return self
                .write_then_rollback(|tx| admit_in_tx(tx, source, proposals, true, now_ms()));
        }
        let (report, run) = self.write(|tx| {
            let now = now_ms();
            let mut report = admit_in_tx(tx, source, proposals, false, now)?;
            let run = Run {
                id: super::run::RunIds::new(tx).next()?,
                goal_id: source.goal_id.clone(),
                agent_id: source.agent_id.clone(),
                todo_id: None,
                classification: "capability_proposals".to_string(),
                outcome: Some(if report.refused == 0 { "accepted" } else { "partially_refused" }.to_string()),
                summary: format!("{}: {} accepted, {} refused", source.capability, report.accepted, report.refused),
                payload: json!({"source": source, "proposals": proposals, "verdicts": report.verdicts}),
                created_at: now,
            };
            tx.insert_run(&run)?;
            report.run_id = Some(run.id.clone());
            Ok((report, run))
        })?;
        self.write_run_report(&run)?;
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(path: Option<&str>, digest: Option<&str>) -> Transition {
        Transition::AttachEvidence {
            todo_id: "t1".into(),
            text: "x".into(),
            artifact_path: path.map(str::to_string),
            artifact_digest: digest.map(str::to_string),
        }
    }

    #[test]
    fn artifact_paths_and_digests() {
        let sha = "0123456789abcdef".repeat(4);
        for ok in ["out/report.md", "a..b/c", "./x", "notes/é.md"] {
            assert!(
                check_proposal(&evidence(Some(ok), Some(&sha))).is_ok(),
                "{ok}"
            );
        }
        let long = "a".repeat(MAX_ARTIFACT_PATH + 1);
        for bad in [
            "",
            "/etc/passwd",
            "\\\\server\\share",
            "C:\\x",
            "..",
            "a/../../b",
            "a\\..\\b",
            "\0x",
            "a\x1b[2Jb",
            "a\u{9b}b",
            "a\u{202e}b",
            long.as_str(),
        ] {
            let why = check_proposal(&evidence(Some(bad), None)).unwrap_err();
            assert!(why.starts_with("artifact_path"), "{bad:?}: {why}");
            assert!(!why.contains('\0') && !why.contains('\x1b'), "{why}");
        }
        for bad in [
            "",
            "00",
            &sha.to_uppercase(),
            &format!("{sha}0"),
            &sha.replace('0', "g"),
        ] {
            let why = check_proposal(&evidence(Some("a"), Some(bad))).unwrap_err();
            assert!(why.starts_with("artifact_digest"), "{bad:?}: {why}");
        }
    }
}
