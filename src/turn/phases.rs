//! The phase loop: run each phase the journal calls for until the turn is settled.
//!
//! Why this exists: [`advance`] looks only at the journal row to pick the next phase, so the same
//! code runs a fresh turn (host, result, validation, writeback, spend, closeout) and finishes an
//! interrupted one, where a host whose outcome was never journaled is not run again.

use std::time::{Duration, Instant};

use super::agent_side::AgentSide;
use super::commit::{commit_phase, fail, unexpected};
use super::host::{ProcessOutcome, ProcessSpec, run_process};
use super::journal::{JournalData, SpendRecord, ValidationRecord, next_phase};
use super::result::{HostStatus, MAX_STDERR_TAIL, MAX_STDOUT, host_stdin, parse_result};
use super::settle::{closeout, writeback};
use super::{JournalStatus, Phase, TurnResultKind};
use crate::error::Result;
use crate::kernel::Kernel;
use crate::kernel::turn_journal::{EffectOutcome, PhaseEffect};
use crate::model::TurnRecord;

/// Runs phases until the turn is settled. `can_run_host` is false during recovery: a host whose
/// outcome was never journaled is not run again.
pub(crate) fn advance(
    kernel: &mut Kernel,
    rec: &mut TurnRecord,
    data: &mut JournalData,
    can_run_host: bool,
) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    while rec.status == JournalStatus::InProgress {
        let started = Instant::now();
        match next_phase(rec, data) {
            Phase::HostExecute if !can_run_host => {
                fail(
                    data,
                    TurnResultKind::HostFailure,
                    Phase::HostExecute,
                    "host outcome unknown: loopx stopped before host_execute was journaled; \
                     the host is not run again and the lease is released"
                        .to_string(),
                );
                closeout(kernel, rec, data, started, &mut warnings)?;
            }
            Phase::HostExecute => {
                let outcome = match AgentSide::prepare(kernel, rec, data) {
                    Ok(side) => {
                        warnings.extend(side.warning.clone());
                        let spec = ProcessSpec {
                            argv: &data.host_argv,
                            cwd: std::path::Path::new(&data.cwd),
                            env: side.env(rec, data),
                            stdin: host_stdin(&data.request),
                            timeout: Duration::from_millis(data.timeout_ms),
                            stdout_cap: MAX_STDOUT,
                            stderr_cap: MAX_STDERR_TAIL,
                            sandbox: side.sandbox.as_ref(),
                        };
                        run_process(&spec)
                    }
                    Err(why) => ProcessOutcome {
                        spawn_error: Some(why),
                        ..ProcessOutcome::default()
                    },
                };
                commit_phase(
                    kernel,
                    rec,
                    data,
                    Phase::HostExecute,
                    started,
                    PhaseEffect::JournalOnly,
                    |_, d, _, _| {
                        d.host = Some(outcome);
                        Ok(None)
                    },
                )?;
            }
            Phase::TypedResult => {
                let host = data.host.clone().unwrap_or_default();
                let key = rec.turn_key.clone();
                let effect = PhaseEffect::JournalOnly;
                commit_phase(
                    kernel,
                    rec,
                    data,
                    Phase::TypedResult,
                    started,
                    effect,
                    |_, d, _, _| {
                        if !host.exited_ok() {
                            let why = match parse_result(&host, &key) {
                                Ok(_) => format!("host {}", host.describe()),
                                Err(e) => format!("host {} (result: {e})", host.describe()),
                            };
                            fail(d, TurnResultKind::HostFailure, Phase::HostExecute, why);
                            return Ok(None);
                        }
                        match parse_result(&host, &key) {
                            Ok(r) => d.result = Some(r),
                            Err(e) => {
                                d.result_error = Some(e.clone());
                                fail(
                                    d,
                                    TurnResultKind::ValidationFailed,
                                    Phase::TypedResult,
                                    format!("host exited 0 but its result is malformed: {e}"),
                                );
                            }
                        }
                        Ok(None)
                    },
                )?;
            }
            Phase::Validation => {
                let record = validate(kernel, rec, data);
                let effect = PhaseEffect::JournalOnly;
                commit_phase(
                    kernel,
                    rec,
                    data,
                    Phase::Validation,
                    started,
                    effect,
                    |_, d, _, _| {
                        if !record.passed {
                            fail(
                                d,
                                TurnResultKind::ValidationFailed,
                                Phase::Validation,
                                format!("validator rejected the result: {}", record.detail),
                            );
                        }
                        d.validation = Some(record);
                        Ok(None)
                    },
                )?;
            }
            Phase::DurableWriteback => writeback(kernel, rec, data, started, &mut warnings)?,
            Phase::QuotaSpend => {
                commit_phase(
                    kernel,
                    rec,
                    data,
                    Phase::QuotaSpend,
                    started,
                    PhaseEffect::Spend,
                    |outcome, d, _, _| {
                        match outcome {
                            EffectOutcome::Spent(Ok(receipt)) => {
                                d.spend = Some(SpendRecord {
                                    effect_id: receipt.entry.effect_id,
                                    slots: receipt.entry.slots,
                                    idempotent_replay: receipt.idempotent_replay,
                                })
                            }
                            EffectOutcome::Spent(Err(e)) => fail(
                                d,
                                TurnResultKind::QuotaSpendFailed,
                                Phase::QuotaSpend,
                                e.to_string(),
                            ),
                            other => return Err(unexpected(Phase::QuotaSpend, &other)),
                        }
                        Ok(None)
                    },
                )?;
            }
            Phase::TerminalCloseout => closeout(kernel, rec, data, started, &mut warnings)?,
        }
    }
    Ok(warnings)
}

/// The validation verdict (runs the validator for `progress`/`completed` claims).
fn validate(kernel: &Kernel, rec: &TurnRecord, data: &JournalData) -> ValidationRecord {
    let result = data
        .result
        .as_ref()
        .expect("validation follows a parsed result");
    let delivery = matches!(result.status, HostStatus::Progress | HostStatus::Completed);
    let completed = result.status == HostStatus::Completed;
    if !delivery {
        return ValidationRecord {
            ran: false,
            passed: true,
            completion_validated: false,
            detail: format!(
                "'{}' claims no delivery; nothing to validate",
                result.status
            ),
            validator: None,
        };
    }
    let Some(argv) = &data.validate_argv else {
        let (completion_validated, detail) = match (completed, data.trust_host_completion) {
            (true, true) => (
                true,
                "no validator; completion trusted (--trust-host-completion)".to_string(),
            ),
            (true, false) => (
                false,
                "no validator: the completion claim is recorded as progress (pass --validate-json, or --trust-host-completion)".to_string(),
            ),
            (false, _) => (false, "no validator; progress recorded".to_string()),
        };
        return ValidationRecord {
            ran: false,
            passed: true,
            completion_validated,
            detail,
            validator: None,
        };
    };
    let outcome = match AgentSide::prepare(kernel, rec, data) {
        Ok(side) => run_process(&ProcessSpec {
            argv,
            cwd: std::path::Path::new(&data.cwd),
            env: side.env(rec, data),
            stdin: serde_json::to_vec(result).expect("result serializes"),
            timeout: Duration::from_millis(data.timeout_ms),
            stdout_cap: 4096,
            stderr_cap: MAX_STDERR_TAIL,
            sandbox: side.sandbox.as_ref(),
        }),
        Err(why) => ProcessOutcome {
            spawn_error: Some(why),
            ..ProcessOutcome::default()
        },
    };
    let passed = outcome.exited_ok();
    ValidationRecord {
        ran: true,
        passed,
        completion_validated: passed && completed,
        detail: format!("validator {}", outcome.describe()),
        validator: Some(outcome),
    }
}
