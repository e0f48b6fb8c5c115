#!/bin/sh
# A LoopX turn host around any command: runs WORK_CMD for the turn's todo and reports the result.
#
#   loopx turn run --goal-id G --agent-id A -- examples/hosts/plain-script.sh make test
#   loopx loop     --goal-id G --agent-id A --until-idle \
#       --validate-json '["make","check"]' -- examples/hosts/plain-script.sh ./do-the-work.sh
#
# Protocol (docs/turn-protocol.md): the request JSON arrives on stdin; LOOPX_GOAL_ID,
# LOOPX_AGENT_ID, LOOPX_TODO_ID, LOOPX_TURN_KEY, LOOPX_CLAIM_KEY and LOOPX_ROOT are set; exactly one
# loopx.turn_result.v1 object goes to stdout. Everything else goes to stderr.
#
# The work command sees the same environment plus LOOPX_REQUEST_FILE (the request, saved). Exit 0
# claims "completed" (a validator, or --trust-host-completion, decides whether that stands);
# exit 75 claims "wait"; any other exit claims "repair_required" with the output tail as the reason.
set -u

if [ "$#" -eq 0 ]; then
    echo "usage: plain-script.sh WORK_CMD [ARGS...]" >&2
    exit 2
fi

json_escape() {
    # Escapes a string for a JSON string literal: backslash, quote, tab, newlines; drops other
    # control characters.
    printf '%s' "$1" | tr -d '\000-\010\013-\037' | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' |
        awk 'BEGIN { ORS = "" } NR > 1 { print "\\n" } { print }'
}

workdir=$(mktemp -d "${TMPDIR:-/tmp}/loopx-host.XXXXXX") || exit 1
trap 'rm -rf "$workdir"' EXIT
cat > "$workdir/request.json"
LOOPX_REQUEST_FILE="$workdir/request.json"
export LOOPX_REQUEST_FILE

"$@" > "$workdir/out.txt" 2>&1
code=$?
# The work's output is copied to stderr for the operator; stdout carries only the result.
cat "$workdir/out.txt" >&2
tail=$(tail -n 5 "$workdir/out.txt" | cut -c1-300)

case "$code" in
    0) status=completed; summary="ran '$*' for ${LOOPX_TODO_ID:-?}: exit 0" ;;
    75) status=wait; summary="'$*' asked to wait: $tail" ;;
    *) status=repair_required; summary="'$*' failed with exit $code: $tail" ;;
esac
evidence="ran '$*' (exit $code) in $(pwd)"
if [ -n "$tail" ]; then
    evidence="$evidence; output ends: $tail"
fi

printf '{"schema_version":"loopx.turn_result.v1","turn_key":"%s","status":"%s","summary":"%s","evidence":[{"text":"%s"}],"observations":[{"kind":"command","data":{"argv":"%s","exit_code":%d}}]}\n' \
    "$(json_escape "${LOOPX_TURN_KEY:-}")" "$status" "$(json_escape "$summary")" \
    "$(json_escape "$evidence")" "$(json_escape "$*")" "$code"
