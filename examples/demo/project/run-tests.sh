#!/bin/sh
# Runs the stats tests (all, or the ones named as arguments), prints PASS/FAIL per test, writes
# the same lines to results/test-results.txt when running all of them, and exits 1 if any test
# fails. Results get their own folder because that folder is all the fs-observe provider is
# granted: a grant of the project itself would contain .loopx/, which LoopX refuses.
set -u
cd "$(dirname "$0")"
expect() {
    case "$1" in
        sum) echo 58 ;;
        max) echo 25 ;;
        count) echo 6 ;;
        mean) echo 9 ;;
    esac
}
tests=${*:-sum max count mean}
failed=0
out=""
for t in $tests; do
    got=$(sh "lib/$t.sh" data/numbers.txt 2>/dev/null)
    if [ "$got" = "$(expect "$t")" ]; then
        line="PASS $t"
    else
        line="FAIL $t"
        failed=1
    fi
    echo "$line"
    out="$out$line
"
done
if [ "$#" -eq 0 ]; then
    mkdir -p results
    printf '%s' "$out" > results/test-results.txt
fi
exit "$failed"
