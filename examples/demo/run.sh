#!/usr/bin/env bash
# The LoopX demo, one command on a machine with only the Rust toolchain:
#
#   bash examples/demo/run.sh
#
# It builds LoopX and the first-party extensions, creates a small project whose tests fail, lets the
# issue-fix capability (fed by the fs-observe provider) plan the fix as todos, runs two scripted
# agents in parallel through `loopx loop` doing the real work on the project's files (one attempt
# fails validation and is repaired), resolves the gate an agent opens as the operator, and prints
# the status, the history and where the run reports are. Re-running starts from scratch.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
DEMO=${LOOPX_DEMO_DIR:-$REPO/target/loopx-demo}
step() { printf '\n==> %s\n' "$*"; }

step "Set up: the wasm32-wasip2 target, loopx (release), the issue-fix and fs-observe components"
rustup target add wasm32-wasip2
# LOOPX_BIN_DIR: use an already built loopx (the test suite runs this demo with its debug build).
if [ -z "${LOOPX_BIN_DIR:-}" ]; then
    cargo build --release --quiet --manifest-path "$REPO/Cargo.toml" --bins
    LOOPX_BIN_DIR="$REPO/target/release"
fi
cargo build --release --quiet --manifest-path "$REPO/Cargo.toml" --target wasm32-wasip2 -p issue-fix -p fs-observe
export PATH="$LOOPX_BIN_DIR:$PATH"
unset LOOPX_ROOT LOOPX_AGENT_ID LOOPX_TURN_KEY LOOPX_CLAIM_KEY

rm -rf "$DEMO"
mkdir -p "$DEMO"
cp -R "$REPO/examples/demo/project" "$DEMO/project"
P="$DEMO/project"
cd "$P"

step "A project whose tests fail: nothing in lib/ is implemented yet"
sh run-tests.sh || true
loopx init

step "Install the extensions (fs-observe may only read the test results, read-only)"
# Not the whole project: a grant that contains .loopx/ would let the provider read LoopX's own
# state, and install refuses it.
loopx extension install "$REPO/extensions/fs-observe" --grant "fs.read:workspace=$P/results"
loopx extension install "$REPO/extensions/issue-fix"
loopx extension list

loopx goal create --id stats --title "Ship a tested statistics report for data/numbers.txt" \
    --objective "Every test in run-tests.sh passes and public/report.md is published after an operator approves" \
    --project "$P"

step "The fs-observe provider observes the test results"
printf '{"operation": "test-results", "target": "test-results.txt"}\n' > "$DEMO/observe.json"
loopx provider call fs-observe/fs --input "$DEMO/observe.json"

step "The issue-fix capability plans the fix; first a dry run (the kernel's verdicts, nothing written)"
printf 'issue = the stats functions are not implemented\nresults = test-results.txt\n' > "$DEMO/issue.txt"
loopx capability invoke issue-fix/issue-fix --goal-id stats --input "$DEMO/issue.txt" --dry-run
loopx capability invoke issue-fix/issue-fix --goal-id stats --input "$DEMO/issue.txt"
loopx todo list --goal-id stats

run_agents() {
    local round=$1 pids=() a
    for a in agent-a agent-b; do
        loopx loop --goal-id stats --agent-id "$a" --until-idle --max-turns 20 --timeout-seconds 60 \
            --validate-json '["sh", "validate.sh"]' -- sh "$REPO/examples/demo/agent.sh" \
            > "$DEMO/$a.round$round.log" 2>&1 &
        pids+=($!)
    done
    local failed=0
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || failed=1
    done
    for a in agent-a agent-b; do
        sed "s/^/  [$a] /" "$DEMO/$a.round$round.log"
    done
    if [ "$failed" -ne 0 ]; then
        echo "a loop failed; see the logs above" >&2
        exit 1
    fi
}

step "Two agents loop on the goal in parallel (each turn: claim, host, validate, write back, spend)"
run_agents 1

step "An agent asked for a decision; the attention queue says who must act"
loopx status --goal-id stats
loopx gate list --goal-id stats

step "The operator approves (an agent inside a turn could not)"
loopx gate resolve --goal-id stats --todo-id stats-approve --comment "numbers checked; publish it"

step "The agents finish the goal"
run_agents 2

step "Result: the tests pass and the report is published"
sh run-tests.sh
cat public/report.md
echo
echo "who did what (from the agents' own log):"
sed 's/^/  /' .demo/work.log

loopx refresh-state --goal-id stats --summary "demo finished" > /dev/null
step "Status"
loopx status --goal-id stats
step "History (newest first; every turn is one run)"
loopx history --goal-id stats --limit 40
step "Summary"
loopx summary_all --goal-id stats
step "Where things are"
echo "  project:      $P"
echo "  state:        $P/.loopx/goals/stats/STATE.md and state.json"
echo "  run reports:  $P/.loopx/goals/stats/runs/<YYYY-MM>/ ($(find "$P/.loopx/goals/stats/runs" -name '*.json' | wc -l) runs, each .json + .md)"
echo "  agent logs:   $DEMO/agent-*.round*.log"
