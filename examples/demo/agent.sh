#!/bin/sh
# A scripted agent for the LoopX demo, run by `loopx loop` as the turn host. It does real work on
# the demo project's files for the todo in LOOPX_TODO_ID and prints one loopx.turn_result.v1 object.
# It plays an honest but fallible engineer: the first attempt at `max` sorts as text, which the
# validator rejects; the next attempt (by whichever agent gets the todo) gets it right.
set -u
cat > /dev/null # the request JSON; this agent only needs the environment LoopX sets
todo=${LOOPX_TODO_ID:?}
agent=${LOOPX_AGENT_ID:?}
mkdir -p .demo notes out public
echo "$agent $todo" >> .demo/work.log
sleep 0.3 # long enough for the two agents' turns to overlap

json() { # a JSON string literal (the texts here are single lines)
    printf '"%s"' "$(printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g')"
}
result() { # status, summary, evidence
    printf '{"schema_version":"loopx.turn_result.v1","status":"%s","summary":%s,"evidence":[{"text":%s}]}\n' \
        "$1" "$(json "$2")" "$(json "$3")"
}

case "$todo" in
    *-feasibility)
        sh run-tests.sh > /dev/null
        { echo "# Feasibility"; echo; echo "Failing before any change:"; grep FAIL results/test-results.txt; echo;
          echo "Each test checks one function in lib/; all are unimplemented, none is flaky."; } > notes/feasibility.md
        result completed "scoped $(grep -c FAIL results/test-results.txt) failing tests" "notes/feasibility.md lists the failing tests"
        ;;
    *-patch-*)
        name=${todo##*-patch-}
        name=${name%-*} # issue-fix ids end in a short hash of the test name
        case "$name" in
            sum) body='awk '"'"'{ s += $1 } END { print s }'"'"' "$1"' ;;
            count) body='awk '"'"'END { print NR }'"'"' "$1"' ;;
            mean) body='awk '"'"'{ s += $1 } END { print int(s / NR) }'"'"' "$1"' ;;
            max)
                if [ -e .demo/max-attempted ]; then
                    body='sort -n "$1" | tail -n 1'
                else
                    touch .demo/max-attempted
                    body='sort "$1" | tail -n 1'
                fi
                ;;
            *) result repair_required "no recipe for $name" "unknown test $name"; exit 0 ;;
        esac
        printf '#!/bin/sh\n# %s of the numbers in the file given as $1, one per line.\n%s\n' "$name" "$body" > "lib/$name.sh"
        result completed "implemented lib/$name.sh" "lib/$name.sh: $body"
        ;;
    *-checks)
        if sh run-tests.sh > /dev/null; then
            result completed "full suite green" "run-tests.sh: $(grep -c PASS results/test-results.txt) passed, 0 failed"
        else
            result repair_required "suite still red: $(grep FAIL results/test-results.txt | tr '\n' ' ')" "run-tests.sh failed"
        fi
        ;;
    *-review)
        { echo "# Review"; echo; for f in lib/*.sh; do echo "- $f: $(tail -n 1 "$f")"; done; } > out/review.md
        # Publishing is the operator's call: ask for it with a gate (agents may open gates, only an
        # operator resolves them) and queue the publish step behind both the review and the gate.
        base=${todo%-review}
        loopx todo add --goal-id "$LOOPX_GOAL_ID" --id "$base-approve" --kind user_gate --blocks-agent "$agent" \
            --title "Approve publishing the statistics report" > /dev/null 2>&1 || true
        loopx todo add --goal-id "$LOOPX_GOAL_ID" --id "$base-publish" --title "Publish the report to public/" \
            --depends-on "$todo" --depends-on "$base-approve" > /dev/null 2>&1 || true
        result completed "reviewed lib/*.sh; publishing waits for the operator's approval" "out/review.md; gate $base-approve opened"
        ;;
    *-publish)
        { echo "# Statistics of data/numbers.txt"; echo;
          for t in sum max count mean; do echo "- $t: $(sh "lib/$t.sh" data/numbers.txt)"; done; } > public/report.md
        result completed "published public/report.md" "public/report.md written from lib/*.sh"
        ;;
    *)
        result replan_required "this agent has no recipe for $todo" "unknown todo"
        ;;
esac
