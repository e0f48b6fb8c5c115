//! Read-only inspection of a registry projection (`.loopx/registry.json`).
//!
//! Tools and agents that only have the file (no database, no `loopx` binary on the path of the
//! caller's language) get the same answer the CLI would: is it well-formed, which goals does it
//! list, and, when it is not well-formed, typed problems saying exactly what is wrong.

use std::collections::HashSet;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::model::GoalStatus;

/// One goal as listed in the registry.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RegistryGoal {
    pub id: String,
    pub status: String,
}

/// A specific defect in a registry file.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RegistryProblem {
    /// The file could not be read at all.
    Unreadable { detail: String },
    /// The bytes are not JSON.
    InvalidJson {
        line: usize,
        column: usize,
        detail: String,
    },
    /// The JSON is not an object with a `goals` array.
    MissingGoals,
    /// `schema_version` is absent or not one this library reads.
    UnsupportedSchema { found: Option<String> },
    /// A goal entry lacks an id (or it is not a string).
    GoalMissingId { index: usize },
    /// A goal id is not a path-safe token.
    GoalInvalidId { index: usize, id: String },
    /// Two entries share an id.
    DuplicateGoalId { id: String },
    /// A goal entry lacks a status (or it is not a string).
    GoalMissingStatus { index: usize, id: String },
    /// The status is not `active`, `paused` or `closed`.
    GoalUnknownStatus {
        index: usize,
        id: String,
        status: String,
    },
}

impl std::fmt::Display for RegistryProblem {
    /// One sentence per problem, for people (the CLI's text output); JSON callers read the
    /// typed fields instead.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryProblem::Unreadable { detail } => {
                write!(f, "the file cannot be read: {detail}")
            }
            RegistryProblem::InvalidJson {
                line,
                column,
                detail,
            } => write!(f, "not JSON at line {line}, column {column}: {detail}"),
            RegistryProblem::MissingGoals => write!(f, "no `goals` array"),
            RegistryProblem::UnsupportedSchema { found: Some(found) } => {
                write!(f, "schema_version '{found}' is not one this version reads")
            }
            RegistryProblem::UnsupportedSchema { found: None } => write!(f, "no schema_version"),
            RegistryProblem::GoalMissingId { index } => write!(f, "goal #{index} has no id"),
            RegistryProblem::GoalInvalidId { index, id } => {
                write!(
                    f,
                    "goal #{index} has id '{id}', which is not a path-safe token"
                )
            }
            RegistryProblem::DuplicateGoalId { id } => write!(f, "goal id '{id}' is listed twice"),
            RegistryProblem::GoalMissingStatus { index, id } => {
                write!(f, "goal #{index} ('{id}') has no status")
            }
            RegistryProblem::GoalUnknownStatus { index, id, status } => write!(
                f,
                "goal #{index} ('{id}') has status '{status}'; expected active, paused or closed"
            ),
        }
    }
}

/// The result of [`inspect_registry`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RegistryInspection {
    /// True when there are no problems.
    pub ok: bool,
    pub goal_count: usize,
    pub goals: Vec<RegistryGoal>,
    pub problems: Vec<RegistryProblem>,
}

/// Reads and validates a registry file. Never fails: every defect is reported as a problem.
pub fn inspect_registry(path: impl AsRef<Path>) -> RegistryInspection {
    let mut problems = Vec::new();
    let mut goals = Vec::new();
    match crate::state_file::read_bounded(path.as_ref(), crate::state_file::MAX_PROJECTION_BYTES) {
        Err(e) => problems.push(RegistryProblem::Unreadable {
            detail: e.to_string(),
        }),
        Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Err(e) => problems.push(RegistryProblem::InvalidJson {
                line: e.line(),
                column: e.column(),
                detail: e.to_string(),
            }),
            Ok(value) => inspect_value(&value, &mut goals, &mut problems),
        },
    }
    RegistryInspection {
        ok: problems.is_empty(),
        goal_count: goals.len(),
        goals,
        problems,
    }
}

fn inspect_value(
    value: &Value,
    goals: &mut Vec<RegistryGoal>,
    problems: &mut Vec<RegistryProblem>,
) {
    let schema = value.get("schema_version").and_then(Value::as_str);
    if schema != Some(crate::kernel::projection::REGISTRY_SCHEMA) {
        problems.push(RegistryProblem::UnsupportedSchema {
            found: schema.map(str::to_string),
        });
    }
    let Some(entries) = value.get("goals").and_then(Value::as_array) else {
        problems.push(RegistryProblem::MissingGoals);
        return;
    };
    let mut seen = HashSet::new();
    for (index, entry) in entries.iter().enumerate() {
        let Some(id) = entry.get("id").and_then(Value::as_str) else {
            problems.push(RegistryProblem::GoalMissingId { index });
            continue;
        };
        if crate::ids::validate_token("goal id", id).is_err() {
            problems.push(RegistryProblem::GoalInvalidId {
                index,
                id: id.to_string(),
            });
        }
        if !seen.insert(id.to_string()) {
            problems.push(RegistryProblem::DuplicateGoalId { id: id.to_string() });
        }
        match entry.get("status").and_then(Value::as_str) {
            None => problems.push(RegistryProblem::GoalMissingStatus {
                index,
                id: id.to_string(),
            }),
            Some(status) => {
                if GoalStatus::parse(status).is_err() {
                    problems.push(RegistryProblem::GoalUnknownStatus {
                        index,
                        id: id.to_string(),
                        status: status.to_string(),
                    });
                }
                goals.push(RegistryGoal {
                    id: id.to_string(),
                    status: status.to_string(),
                });
            }
        }
    }
}
