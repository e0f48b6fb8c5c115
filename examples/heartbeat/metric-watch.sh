#!/bin/sh
# An hourly metric watch on a file the fs-observe provider reads; a material change opens an agent
# todo, which the heartbeat then hands to the agent. Runs in about 20 seconds with EVERY=2s.
#
#   cargo build --release --target wasm32-wasip2 -p fs-observe      # the provider, once
#   LOOPX=target/debug/loopx EVERY=2s examples/heartbeat/metric-watch.sh
#
# The monitor is provider-backed (`--probe fs-observe/fs metric metrics.txt`): the heartbeat
# (`loopx loop --watch`) runs the probe itself when it is due, with the grant given at install
# (read access to data/ only), and spends no agent turn and no quota slot on it. The same reading
# is a quiet check (counted, no evidence); a different one records one evidence row and opens an
# agent todo ("Act on the change seen by monitor p95"), which the next decision routes to the
# agent: here a plain script that writes a note, proven by a validator.
set -eu

LOOPX=${LOOPX:-loopx}
case "$LOOPX" in
    */*) LOOPX=$(cd "$(dirname "$LOOPX")" && pwd)/$(basename "$LOOPX") ;;
esac
EVERY=${EVERY:-1h}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
project=$(mktemp -d "${TMPDIR:-/tmp}/loopx-metric.XXXXXX")
echo "project: $project (monitor every $EVERY)"
cd "$project"
mkdir data
echo "p95_ms = 120" > data/metrics.txt

"$LOOPX" init >/dev/null
"$LOOPX" extension install "$repo/extensions/fs-observe" --grant "fs.read:workspace=$project/data" >/dev/null
"$LOOPX" goal create --id latency --title "Keep p95 latency in check" --project "$project" >/dev/null
"$LOOPX" todo add --goal-id latency --id p95 --kind monitor --every "$EVERY" --target p95_ms \
    --title "Watch p95 latency" --probe fs-observe/fs metric metrics.txt >/dev/null

# The agent's work on a follow-up todo: note the reading it acts on.
cat > work.sh <<'WORK'
#!/bin/sh
echo "$LOOPX_TODO_ID: looked at $(cat data/metrics.txt)" >> notes.txt
WORK
cat > validate.sh <<'CHECK'
#!/bin/sh
cat > /dev/null
grep -q "^$LOOPX_TODO_ID:" notes.txt
CHECK
chmod +x work.sh validate.sh

"$LOOPX" loop --watch --goal-id latency --agent-id watcher --timeout-seconds 60 \
    --validate-json "[\"$project/validate.sh\"]" \
    -- "$repo/examples/hosts/plain-script.sh" "$project/work.sh" > heartbeat.txt 2> heartbeat.log &
beat=$!
sleep 6
echo "p95_ms = 480" > data/metrics.txt     # the metric moves: a material change
sleep 8
kill -TERM "$beat"
wait "$beat" || true

echo "== heartbeat (stderr)"
cat heartbeat.log
echo
echo "== todos"
"$LOOPX" todo list --goal-id latency
echo
echo "== the agent's notes"
cat notes.txt 2>/dev/null || echo "(none)"
