//! Helpers for the turn and loop tests on top of [`Project`]: goal `g`, todos on it, small
//! `/bin/sh` hosts written into the project (the driver itself never uses a shell), and the
//! processes a host leaves behind.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Stdio};

use serde_json::Value;

use super::Project;

/// `turn run --goal-id g --agent-id <agent> <flags> -- <host>`: the argument list of most turn tests.
pub fn turn_run<'a>(agent: &'a str, flags: &[&'a str], host: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["turn", "run", "--goal-id", "g", "--agent-id", agent];
    args.extend_from_slice(flags);
    args.push("--");
    args.extend_from_slice(host);
    args
}

/// A host that prints a valid result with `status` and one evidence line naming the todo, and
/// appends "<agent> <todo> <turn>" to `hosts.log` (so tests can count executions).
pub fn result_host(status: &str) -> String {
    format!(
        r#"cat > /dev/null
echo "$LOOPX_AGENT_ID $LOOPX_TODO_ID $LOOPX_TURN_KEY" >> hosts.log
printf '{{"schema_version":"loopx.turn_result.v1","status":"{status}","summary":"worked on %s","evidence":[{{"text":"evidence for %s"}}]}}' "$LOOPX_TODO_ID" "$LOOPX_TODO_ID"
"#
    )
}

impl Project {
    /// A fresh project with goal `g`, its project directory the project itself.
    pub fn with_goal_g() -> Project {
        let p = Project::new();
        p.ok(&[
            "goal",
            "create",
            "--title",
            "Turn test goal",
            "--id",
            "g",
            "--project",
            p.path().to_str().unwrap(),
        ]);
        p
    }

    pub fn spawn(&self, args: &[&str]) -> Child {
        self.command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn loopx")
    }

    /// Adds todo `id` ("work <id>") to goal `g`.
    pub fn add_work(&self, id: &str) {
        self.ok(&[
            "todo",
            "add",
            "--goal-id",
            "g",
            "--id",
            id,
            "--title",
            &format!("work {id}"),
        ]);
    }

    /// Writes an executable `/bin/sh` script and returns its path.
    pub fn script(&self, name: &str, body: &str) -> String {
        let path = self.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.to_str().unwrap().to_string()
    }

    pub fn todo(&self, id: &str) -> Value {
        self.json(&["todo", "show", "--goal-id", "g", "--todo-id", id])
    }

    pub fn todo_status(&self, id: &str) -> String {
        self.todo(id)["todo"]["status"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub fn evidence_count(&self, id: &str) -> usize {
        self.todo(id)["evidence"].as_array().unwrap().len()
    }

    /// Effect ids of the spend rows in the ledger.
    pub fn spends(&self) -> Vec<String> {
        let q = self.json(&["quota", "show", "--goal-id", "g"]);
        q["recent_ledger"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "spend")
            .map(|e| e["effect_id"].as_str().unwrap().to_string())
            .collect()
    }

    pub fn spent_slots(&self) -> i64 {
        self.json(&["quota", "show", "--goal-id", "g"])["quota"]["spent_slots"]
            .as_i64()
            .unwrap()
    }

    pub fn history(&self) -> Vec<Value> {
        let h = self.json(&["history", "--goal-id", "g"]);
        find_array(&h, &["history", "runs", "entries"])
    }

    pub fn hosts_log(&self) -> Vec<String> {
        std::fs::read_to_string(self.path().join("hosts.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    pub fn journal(&self, key: &str) -> Value {
        self.json(&["turn", "inspect", "--turn-key", key])["journal"].clone()
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path().join(name)
    }
}

/// The first of `keys` that holds an array in `v`.
pub fn find_array(v: &Value, keys: &[&str]) -> Vec<Value> {
    for k in keys {
        if let Some(a) = v[*k].as_array() {
            return a.clone();
        }
    }
    panic!("none of {keys:?} is an array in {v}");
}

/// Whether a process is still running (a zombie counts as gone).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

/// Live processes (zombies excluded) whose working directory is `dir`: what a host left running,
/// found from outside whatever PID namespace it ran in (a host's own `$$` is its pid inside).
pub fn processes_in(dir: &std::path::Path) -> Vec<i32> {
    let want = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if pid != me
            && std::fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd == want)
            && alive(pid)
        {
            found.push(pid);
        }
    }
    found
}

/// Waits for `cond` to hold, checking every 20 ms; panics naming `what` if it has not within
/// `limit`. The limit is a bound on a hang, not a claim about speed: set it generously.
pub fn wait_for(what: &str, limit: std::time::Duration, mut cond: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !cond() {
        assert!(
            t0.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Waits up to `limit` for [`processes_in`] to find nothing; returns what is still there.
pub fn wait_until_gone(dir: &std::path::Path, limit: std::time::Duration) -> Vec<i32> {
    let t0 = std::time::Instant::now();
    loop {
        let left = processes_in(dir);
        if left.is_empty() || t0.elapsed() > limit {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
