#!/bin/sh
# A LoopX turn host that runs the Codex CLI non-interactively for one bounded turn.
#
#   loopx loop --goal-id G --agent-id codex-1 --timeout-seconds 1800 \
#       --validate-json '["cargo","test"]' -- examples/hosts/codex-cli.sh
#
# Command template (what this wrapper runs):
#   codex exec --full-auto --output-last-message <file> "<prompt with the request JSON>" [$CODEX_ARGS]
#
# The final agent message must end with one line
#   LOOPX_RESULT: {"schema_version":"loopx.turn_result.v1", ...}
# which this wrapper prints on stdout. No marker line: exit 3 (LoopX records host_failure).
# Needs the `codex` CLI on PATH and its own authentication.
set -u

command -v codex >/dev/null 2>&1 || {
    echo "codex-cli.sh: the 'codex' CLI is not on PATH" >&2
    exit 127
}
request=$(cat)
prompt="You are agent $LOOPX_AGENT_ID executing ONE bounded LoopX turn on todo $LOOPX_TODO_ID.
Work only on that todo, in the current directory. Do not resolve gates or change other todos.

The turn request:
$request

End your final message with exactly one line:
LOOPX_RESULT: {\"schema_version\":\"loopx.turn_result.v1\",\"status\":\"<progress|completed|repair_required|replan_required|user_action_required|wait>\",\"summary\":\"<= 2000 chars\",\"evidence\":[{\"text\":\"what changed and how you checked it\"}]}"

last=$(mktemp "${TMPDIR:-/tmp}/loopx-codex.XXXXXX") || exit 1
trap 'rm -f "$last"' EXIT
# Codex's progress output goes to stderr so stdout stays the result channel.
# shellcheck disable=SC2086
codex exec --full-auto --output-last-message "$last" ${CODEX_ARGS:-} "$prompt" 1>&2
code=$?
if [ "$code" -ne 0 ]; then
    exit "$code"
fi
result=$(grep '^LOOPX_RESULT: ' "$last" | tail -n 1 | sed 's/^LOOPX_RESULT: //')
if [ -z "$result" ]; then
    echo "codex-cli.sh: the final message has no LOOPX_RESULT line" >&2
    exit 3
fi
printf '%s\n' "$result"
