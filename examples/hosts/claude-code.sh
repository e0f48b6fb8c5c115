#!/bin/sh
# A LoopX turn host that runs Claude Code headless for one bounded turn.
#
#   loopx loop --goal-id G --agent-id claude-1 --timeout-seconds 1800 \
#       --validate-json '["make","check"]' -- examples/hosts/claude-code.sh
#
# Command template (what this wrapper runs):
#   claude -p "<prompt with the request JSON>" --output-format text \
#          --permission-mode acceptEdits [--model ...] [$CLAUDE_ARGS]
#
# The prompt hands the model the turn request and asks it to end with one line
#   LOOPX_RESULT: {"schema_version":"loopx.turn_result.v1", ...}
# This wrapper prints that JSON (and nothing else) on stdout. No marker line means the turn produced
# no result: the wrapper exits 3, which LoopX records as host_failure (exit 0 alone proves nothing).
# Needs the `claude` CLI on PATH and its own authentication; LoopX never sees the session.
set -u

command -v claude >/dev/null 2>&1 || {
    echo "claude-code.sh: the 'claude' CLI is not on PATH" >&2
    exit 127
}
request=$(cat)
prompt="You are agent $LOOPX_AGENT_ID executing ONE bounded LoopX turn on todo $LOOPX_TODO_ID.
Work only on that todo, in the current directory. Do not resolve gates or change other todos.
You may record intermediate evidence with:
  loopx todo update --goal-id $LOOPX_GOAL_ID --todo-id $LOOPX_TODO_ID --evidence '...'
(LOOPX_CLAIM_KEY in your environment proves your lease).

The turn request:
$request

When you stop, print as the very last line, on one line:
LOOPX_RESULT: {\"schema_version\":\"loopx.turn_result.v1\",\"status\":\"<progress|completed|repair_required|replan_required|user_action_required|wait>\",\"summary\":\"<= 2000 chars\",\"evidence\":[{\"text\":\"what changed and how you checked it\"}]}"

out=$(mktemp "${TMPDIR:-/tmp}/loopx-claude.XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT
# shellcheck disable=SC2086
claude -p "$prompt" --output-format text --permission-mode acceptEdits ${CLAUDE_ARGS:-} > "$out"
code=$?
cat "$out" >&2
if [ "$code" -ne 0 ]; then
    exit "$code"
fi
result=$(grep '^LOOPX_RESULT: ' "$out" | tail -n 1 | sed 's/^LOOPX_RESULT: //')
if [ -z "$result" ]; then
    echo "claude-code.sh: the model ended without a LOOPX_RESULT line" >&2
    exit 3
fi
printf '%s\n' "$result"
