//! LoopX's typed records: goals, todos, claims, evidence, runs, rewards, quota, extensions and
//! the turn journal.
//!
//! Plain data below both the store (which persists them) and the kernel and turn driver (which
//! decide on them), so the store never depends on the kernel. Enums carry their wire spelling via
//! serde so the JSON surface and the database agree.

mod journal;
pub mod monitor;

pub use journal::{
    COMPACTED_KEYS, JournalStatus, Phase, TurnRecord, TurnResultKind, compact_journal_data,
};
pub use monitor::{CheckResult, Deferral, GoalProbe, Monitor, MonitorFollowUp, ProbeSpec};

use serde::{Deserialize, Serialize};

macro_rules! wire_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ::serde::Serialize, ::serde::Deserialize)]
        pub enum $name { $($(#[$vm])* #[serde(rename = $text)] $variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
            pub fn parse(text: &str) -> $crate::error::Result<Self> {
                match text {
                    $($text => Ok($name::$variant),)+
                    other => Err($crate::error::bad_input(format!(
                        "unknown {} '{}': expected one of {}",
                        $crate::model::type_words(stringify!($name)),
                        other,
                        [$($text),+].join(", ")
                    ))),
                }
            }
        }

        impl $crate::model::WireEnum for $name {
            fn all() -> &'static [Self] {
                Self::ALL
            }
            fn as_str(self) -> &'static str {
                $name::as_str(self)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use wire_enum;

/// An enum with a fixed set of wire spellings (every [`wire_enum!`] type): what lets a flag offer
/// its values to `--help` and shell completions.
pub trait WireEnum: Copy + Send + Sync + 'static {
    fn all() -> &'static [Self];
    fn as_str(self) -> &'static str;
}

/// A type's name as words for a message: `TodoStatus` reads "todo status".
pub(crate) fn type_words(name: &str) -> String {
    let mut words = String::with_capacity(name.len() + 4);
    for (i, c) in name.char_indices() {
        if c.is_ascii_uppercase() && i > 0 {
            words.push(' ');
        }
        words.push(c.to_ascii_lowercase());
    }
    words
}

wire_enum!(
    /// Lifecycle of a goal. Only `active` goals may run agent turns.
    GoalStatus { Active => "active", Paused => "paused", Closed => "closed" }
);

wire_enum!(
    /// Who is expected to act on a todo.
    Role { Agent => "agent", User => "user" }
);

wire_enum!(
    /// What kind of work item a todo is. Gates are todos of kind `user_gate` (blocking) or
    /// `user_action` (informing) so they share ids, evidence and history with ordinary work.
    TodoKind { Task => "task", Monitor => "monitor", UserGate => "user_gate", UserAction => "user_action" }
);

wire_enum!(
    /// Stored status. A `claimed` todo whose lease expired is claimable again (takeover).
    TodoStatus {
        Open => "open",
        Claimed => "claimed",
        Blocked => "blocked",
        Deferred => "deferred",
        Completed => "completed",
        Archived => "archived",
    }
);

wire_enum!(
    /// Priority, P0 most urgent.
    Priority { P0 => "P0", P1 => "P1", P2 => "P2", P3 => "P3", P4 => "P4" }
);

impl Priority {
    pub fn rank(self) -> i64 {
        match self {
            Priority::P0 => 0,
            Priority::P1 => 1,
            Priority::P2 => 2,
            Priority::P3 => 3,
            Priority::P4 => 4,
        }
    }
    /// The priority stored as `rank`; `None` for a rank no priority has (a row edited by hand
    /// or damaged), which a reader reports rather than shows as some priority.
    pub fn from_rank(rank: i64) -> Option<Priority> {
        match rank {
            0 => Some(Priority::P0),
            1 => Some(Priority::P1),
            2 => Some(Priority::P2),
            3 => Some(Priority::P3),
            4 => Some(Priority::P4),
            _ => None,
        }
    }
}

impl TodoStatus {
    /// Terminal statuses satisfy dependencies and are never claimable.
    pub fn is_terminal(self) -> bool {
        matches!(self, TodoStatus::Completed | TodoStatus::Archived)
    }
}

/// A goal: the unit of durable work, one registry entry, one run stream, one quota lane.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Goal {
    pub id: String,
    pub title: String,
    pub objective: String,
    pub success_criteria: Vec<String>,
    pub status: GoalStatus,
    /// Project directory the goal works on (informational; agents run there).
    pub project_dir: Option<String>,
    pub next_probe: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A lease on a todo. The fence increases with every grant and never resets, so a write carrying
/// an older fence is provably from a superseded holder.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Claim {
    pub agent_id: String,
    pub fence: i64,
    pub expires_at: i64,
    pub idempotency_key: String,
    pub claimed_at: i64,
}

impl Claim {
    pub fn is_live(&self, now: i64) -> bool {
        now < self.expires_at
    }
}

/// Scope of a `user_gate`: the agent it blocks, or every agent on the goal.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "scope", rename_all = "snake_case")]
pub enum GateScope {
    BlocksAgent { agent_id: String },
    Global,
}

/// A work item. Gates are todos of kind `user_gate`/`user_action` with `role = user`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Todo {
    pub id: String,
    pub goal_id: String,
    pub role: Role,
    pub kind: TodoKind,
    pub title: String,
    pub detail: String,
    pub priority: Priority,
    pub status: TodoStatus,
    pub depends_on: Vec<String>,
    pub capability: Option<String>,
    pub lane: Option<String>,
    pub gate_scope: Option<GateScope>,
    pub claim: Option<Claim>,
    /// The highest fence ever granted on this todo (kept after release so fences never repeat).
    pub last_fence: i64,
    pub status_reason: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl Todo {
    pub fn is_gate(&self) -> bool {
        self.kind == TodoKind::UserGate
    }
    /// The claim that still binds, if any.
    pub fn live_claim(&self, now: i64) -> Option<&Claim> {
        self.claim.as_ref().filter(|c| c.is_live(now))
    }
    /// Whether this open gate blocks `agent_id`.
    pub fn gate_blocks(&self, agent_id: &str) -> bool {
        if !self.is_gate() || self.status.is_terminal() {
            return false;
        }
        match &self.gate_scope {
            Some(GateScope::Global) | None => true,
            Some(GateScope::BlocksAgent { agent_id: a }) => a == agent_id,
        }
    }
}

/// A piece of evidence attached to a todo.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Evidence {
    pub id: i64,
    pub goal_id: String,
    pub todo_id: String,
    pub text: String,
    pub artifact_path: Option<String>,
    pub artifact_digest: Option<String>,
    pub run_id: Option<String>,
    pub actor: String,
    pub created_at: i64,
}

/// One row of the run log (layer 3); the rich payload is also projected once to `runs/<id>.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Run {
    pub id: String,
    pub goal_id: String,
    pub agent_id: Option<String>,
    pub todo_id: Option<String>,
    pub classification: String,
    pub outcome: Option<String>,
    pub summary: String,
    pub payload: serde_json::Value,
    pub created_at: i64,
}

/// A reward overlay on a run (layer 4).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Reward {
    pub id: i64,
    pub goal_id: String,
    pub run_id: String,
    pub score: f64,
    pub comment: String,
    pub actor: String,
    pub created_at: i64,
}

/// Quota policy for one goal (layer 6).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct QuotaPolicy {
    /// Share of the window an agent may use; 0 pauses the goal's automatic compute.
    pub compute: f64,
    pub window_hours: f64,
    pub slot_minutes: f64,
    /// Overrides the slots derived from compute/window/slot when set.
    pub allowed_slots: Option<i64>,
    /// Maximum slots one agent may spend in the window.
    pub per_agent_cap: Option<i64>,
}

impl Default for QuotaPolicy {
    fn default() -> Self {
        QuotaPolicy {
            compute: 1.0,
            window_hours: 24.0,
            slot_minutes: 1.0,
            allowed_slots: None,
            per_agent_cap: None,
        }
    }
}

impl QuotaPolicy {
    pub fn allowed_slots(&self) -> i64 {
        match self.allowed_slots {
            Some(n) => n,
            None => (self.compute * self.window_hours * 60.0 / self.slot_minutes).floor() as i64,
        }
    }
    pub fn window_ms(&self) -> i64 {
        (self.window_hours * 3_600_000.0) as i64
    }

    /// Why this policy gives the goal no slot, in the operator's terms; `None` when it gives some.
    pub fn why_no_slots(&self) -> Option<String> {
        if self.allowed_slots() > 0 && (self.compute > 0.0 || self.allowed_slots.is_some()) {
            return None;
        }
        Some(match self.allowed_slots {
            Some(_) => "the quota allows 0 slots".to_string(),
            None if self.compute <= 0.0 => "compute quota is 0".to_string(),
            None => format!(
                "a {}-minute slot is longer than the goal's share of its window (compute {} of \
                 {} hours: {} minutes)",
                self.slot_minutes,
                self.compute,
                self.window_hours,
                self.compute * self.window_hours * 60.0
            ),
        })
    }
}

/// One row of the spend/void ledger.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LedgerEntry {
    pub effect_id: String,
    pub goal_id: String,
    pub agent_id: Option<String>,
    pub run_id: Option<String>,
    /// Positive for spends; voids reference the spend they cancel.
    pub slots: i64,
    pub kind: LedgerKind,
    pub voids_effect_id: Option<String>,
    pub created_at: i64,
}

wire_enum!(
    /// A ledger row either spends slots or voids an earlier spend.
    LedgerKind { Spend => "spend", Void => "void" }
);

/// An installed extension as recorded in the registry (layer 1).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExtensionRecord {
    pub id: String,
    pub version: String,
    pub enabled: bool,
    /// The manifest as installed, JSON.
    pub manifest: serde_json::Value,
    /// Permissions the operator granted at install.
    pub grants: Vec<String>,
    /// Directory holding the installed component files.
    pub install_dir: String,
    /// sha256 of each component, keyed by provides id.
    pub component_hashes: serde_json::Value,
    pub installed_at: i64,
    /// Monotonic revision; older revisions are kept for rollback.
    pub revision: i64,
}

/// The recorded digest of one precompiled component artifact (table `component_artifacts`): the
/// artifact compiled from the component with `component_sha256` by an engine whose compatibility
/// fingerprint is `engine_key` must hash to `artifact_sha256`, or it is never deserialized.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ArtifactRecord {
    pub component_sha256: String,
    pub engine_key: String,
    pub artifact_sha256: String,
    pub recorded_at: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused spelling names the type in words and lists every spelling, in the message a
    /// stored row or a host's JSON gets (flags list their values through clap instead).
    #[test]
    fn an_unknown_spelling_is_refused_in_words() {
        let e = TodoStatus::parse("done").unwrap_err().to_string();
        assert!(e.contains("unknown todo status 'done'"), "{e}");
        assert!(
            e.contains("open, claimed, blocked, deferred, completed, archived"),
            "{e}"
        );
        assert_eq!(type_words("MonitorFollowUp"), "monitor follow up");
        for status in <TodoStatus as WireEnum>::all() {
            assert_eq!(TodoStatus::parse(status.as_str()).ok(), Some(*status));
        }
    }
}
