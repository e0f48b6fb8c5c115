#!/bin/sh
# Two agents looping on one goal in parallel, with the plain-script host.
#
#   LOOPX=target/debug/loopx examples/multi-agent.sh        # or with loopx on PATH
#
# Creates a throwaway project, a goal with six todos (one waiting on another), and runs two
# `loopx loop --until-idle` processes at once. Each turn's work appends "<agent> <todo>" to
# work.log and writes a file; the validator checks the file exists, so completion is proven, not
# claimed. The decision and the claim share one transaction, so the agents never take the same todo.
set -eu

LOOPX=${LOOPX:-loopx}
case "$LOOPX" in
    */*) LOOPX=$(cd "$(dirname "$LOOPX")" && pwd)/$(basename "$LOOPX") ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
project=$(mktemp -d "${TMPDIR:-/tmp}/loopx-multi.XXXXXX")
echo "project: $project"
cd "$project"

"$LOOPX" init >/dev/null
"$LOOPX" goal create --id site --title "Write the site pages" --project "$project" >/dev/null
for page in index about pricing docs blog; do
    "$LOOPX" todo add --goal-id site --id "$page" --title "Write $page.html" >/dev/null
done
"$LOOPX" todo add --goal-id site --id sitemap --title "Write sitemap.txt" \
    --depends-on index --depends-on about --depends-on pricing --depends-on docs --depends-on blog >/dev/null

# The work one turn does: write the todo's page (slowly enough that the agents overlap).
cat > work.sh <<'WORK'
#!/bin/sh
echo "$LOOPX_AGENT_ID $LOOPX_TODO_ID" >> work.log
sleep 0.3
if [ "$LOOPX_TODO_ID" = sitemap ]; then
    ls *.html > sitemap.txt
else
    echo "<h1>$LOOPX_TODO_ID</h1><!-- by $LOOPX_AGENT_ID -->" > "$LOOPX_TODO_ID.html"
fi
WORK
# The validator: the todo's artifact must exist and be non-empty.
cat > validate.sh <<'CHECK'
#!/bin/sh
cat > /dev/null
if [ "$LOOPX_TODO_ID" = sitemap ]; then test -s sitemap.txt; else test -s "$LOOPX_TODO_ID.html"; fi
CHECK
chmod +x work.sh validate.sh

for agent in alice bob; do
    "$LOOPX" loop --goal-id site --agent-id "$agent" --until-idle --max-turns 10 \
        --timeout-seconds 60 --validate-json "[\"$project/validate.sh\"]" \
        -- "$here/hosts/plain-script.sh" "$project/work.sh" > "loop-$agent.txt" &
done
wait

echo
echo "== who did what (work.log)"
cat work.log
echo
cat loop-alice.txt loop-bob.txt
echo
"$LOOPX" todo list --goal-id site
echo
"$LOOPX" history --goal-id site
echo
echo "run reports: $project/.loopx/goals/site/runs/<YYYY-MM>/"
if [ "$(cut -d' ' -f2 work.log | sort | uniq -d | wc -l)" -ne 0 ]; then
    echo "ERROR: a todo was worked twice" >&2
    exit 1
fi
