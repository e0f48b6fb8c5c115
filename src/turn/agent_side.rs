//! What the host and the validator run with: their sandbox, the agent channel and the turn's
//! environment.
//!
//! Why this exists: both processes of a turn are started the same way, by the first driver and
//! again by recovery (the validator may run twice), and a turn that started isolated must never
//! be continued unisolated. One place decides that and builds the environment.

use super::channel::{ChannelServer, SOCKET_ENV, TurnIdentity};
use super::isolation::{self, Isolation, IsolationMode, Sandbox};
use super::journal::JournalData;
use crate::kernel::Kernel;
use crate::model::TurnRecord;

/// What a host or validator process runs with: its sandbox and the agent channel through which
/// its `loopx` calls reach this driver. Dropping it closes the channel.
pub(crate) struct AgentSide {
    pub(crate) sandbox: Option<Sandbox>,
    channel: Option<ChannelServer>,
    /// Why the agent channel could not be started, for the turn's warnings.
    pub(crate) warning: Option<String>,
}

impl AgentSide {
    /// `Err` when the turn started isolated and this process cannot isolate: the process is
    /// then not run at all rather than run with access to `.loopx/`.
    pub(crate) fn prepare(
        kernel: &Kernel,
        rec: &TurnRecord,
        data: &JournalData,
    ) -> std::result::Result<AgentSide, String> {
        let sandbox = match data.isolation {
            Isolation::None => None,
            Isolation::Namespace => {
                isolation::resolve(IsolationMode::Required, &kernel.paths().state)
                    .map_err(|e| e.to_string())?
                    .0
            }
        };
        let identity = TurnIdentity {
            goal_id: rec.goal_id.clone(),
            agent_id: rec.agent_id.clone(),
            turn_key: rec.turn_key.clone(),
            claim_key: data.claim.claim_key.clone(),
            fence: data.claim.fence,
        };
        let (channel, warning) = match ChannelServer::start(kernel.paths(), identity) {
            Ok(channel) => (channel, None),
            Err(e) => {
                // Without the channel an isolated host cannot reach `.loopx/` at all, while an
                // unisolated one opens the project itself with the turn's identity variables.
                let consequence = if sandbox.is_some() {
                    "the host's loopx calls fail, since an isolated host cannot reach the project"
                } else {
                    "the host's loopx calls open the project directly, as the turn's agent"
                };
                (
                    None,
                    Some(format!(
                        "the agent channel could not be started ({e}): {consequence}; \
                         give TMPDIR a writable directory"
                    )),
                )
            }
        };
        Ok(AgentSide {
            sandbox,
            channel,
            warning,
        })
    }

    pub(crate) fn env(&self, rec: &TurnRecord, data: &JournalData) -> Vec<(String, String)> {
        let mut env = host_env(rec, data);
        if let Some(channel) = &self.channel {
            env.push((
                SOCKET_ENV.to_string(),
                channel.socket().to_string_lossy().into_owned(),
            ));
        }
        env
    }
}

pub(crate) fn host_env(rec: &TurnRecord, data: &JournalData) -> Vec<(String, String)> {
    vec![
        ("LOOPX_GOAL_ID".into(), rec.goal_id.clone()),
        ("LOOPX_AGENT_ID".into(), rec.agent_id.clone()),
        (
            "LOOPX_TODO_ID".into(),
            rec.todo_id.clone().unwrap_or_default(),
        ),
        ("LOOPX_TURN_KEY".into(), rec.turn_key.clone()),
        ("LOOPX_CLAIM_KEY".into(), data.claim.claim_key.clone()),
        ("LOOPX_FENCE".into(), data.claim.fence.to_string()),
        ("LOOPX_ROOT".into(), data.project_root.clone()),
    ]
}
