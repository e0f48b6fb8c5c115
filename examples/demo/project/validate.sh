#!/bin/sh
# The turn validator: proves the work of the todo in LOOPX_TODO_ID, independently of what the agent
# claimed. Exit 0 = proven. (LoopX passes the agent's result JSON on stdin; this check ignores it.)
set -u
cd "$(dirname "$0")"
cat > /dev/null
todo=${LOOPX_TODO_ID:?}
case "$todo" in
    *-feasibility) test -s notes/feasibility.md && grep -q FAIL notes/feasibility.md ;;
    *-patch-*)
        name=${todo##*-patch-}
        sh run-tests.sh "${name%-*}" > /dev/null
        ;;
    *-checks) sh run-tests.sh > /dev/null ;;
    *-review) test -s out/review.md ;;
    *-publish) grep -q "sum: 58" public/report.md && grep -q "max: 25" public/report.md ;;
    *) echo "validate.sh: no check for $todo" >&2; exit 1 ;;
esac
