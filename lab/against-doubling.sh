#!/usr/bin/env bash
# The lock-free table's growth (issue 12 item 4: 15/16 load, 9/8 steps,
# staggered shards) against the power-of-two doubling it replaced (7/8
# load; the library at commit b353319), with this tree's lab built against
# each library: the lab's "--growth" table, then ROUNDS (default 2) rounds of
# "--perf" alternating the two binaries (new, old, new, old, ...), printed
# side by side for the rows the sizing can move.
#
#   lab/against-doubling.sh             (builds the old tree: about 3 minutes)
#   ROUNDS=4 lab/against-doubling.sh
set -euo pipefail
root=$(git rev-parse --show-toplevel)
rounds=${ROUNDS:-2}
old=$(mktemp -d)
git -C "$root" worktree add --detach "$old" b353319 >/dev/null 2>&1
trap 'git -C "$root" worktree remove --force "$old"' EXIT
# This tree's lab (and the test support it includes) on the old library.
rm -rf "$old/lab" "$old/tests/support"
cp -r "$root/lab" "$old/lab"
cp -r "$root/tests/support" "$old/tests/support"
cp "$root/Cargo.lock" "$old/Cargo.lock"
(cd "$root" && cargo build --release --locked --quiet -p tollgate-lab)
(cd "$old" && cargo build --release --locked --quiet -p tollgate-lab)
new_lab="$root/target/release/tollgate-lab"
old_lab="$old/target/release/tollgate-lab"
rows='^(lock-free|governor keyed|GCRA  |keyed GCRA|GCRA admit|## )'
for side in new old; do
    lab="${side}_lab"
    echo "=== $side: --growth"
    "${!lab}" --growth | grep -E '^(lock-free|governor)'
done
for round in $(seq "$rounds"); do
    for side in new old; do
        lab="${side}_lab"
        echo "=== round $round, $side: --perf"
        "${!lab}" --perf --out "$old/plots" | grep -E "$rows"
    done
done
