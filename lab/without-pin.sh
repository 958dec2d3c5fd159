#!/usr/bin/env bash
# Issue 12 item 2: what the lock-free store's keyed denial would cost with
# no read-side protection at all, the bound that no reclamation scheme
# (asymmetric fences, quiescent states, hazard pointers) can beat.
#
# Builds this tree twice: as it is ("pinned"), and with two edits to
# src/store/lock_free.rs ("no pin"): a check's probe runs under
# crossbeam-epoch's `unprotected()` guard instead of a pin, and a replaced
# table is never freed (leaked), so that the variant stays memory-safe
# under any workload, at the price of its replaced tables' memory. It is
# an experiment, not a store: nothing in the library ships it. Then runs
# ROUNDS (default 2) rounds of "--perf" (or "--perf --full" with FULL=1),
# alternating the two binaries (pinned, no pin, pinned, ...), and prints
# the rows of the deny table and the judged ratios a read path can move.
#
#   lab/without-pin.sh              (two builds: about 6 minutes on 2 cores)
#   ROUNDS=3 FULL=1 lab/without-pin.sh
set -euo pipefail
root=$(git rev-parse --show-toplevel)
rounds=${ROUNDS:-2}
full=()
[ "${FULL:-0}" = 1 ] && full=(--full)
variant=$(mktemp -d)
git -C "$root" worktree add --detach "$variant" HEAD >/dev/null 2>&1
trap 'git -C "$root" worktree remove --force "$variant"' EXIT
# The working tree's uncommitted changes to tracked files too, so that both
# sides are this tree.
git -C "$root" diff HEAD | git -C "$variant" apply --allow-empty
file="$variant/src/store/lock_free.rs"
perl -0pi -e 's/let guard = epoch::pin\(\);\n(\s*)if let Some\(cell\) = shard\.table\(&guard\)\.find\(hash, key\) \{\n(\s*)if let Some\(decision\) = cell\.check\(/let guard = unsafe { epoch::unprotected() };\n$1if let Some(cell) = shard.table(guard).find(hash, key) {\n$2if let Some(decision) = cell.check(/' "$file"
perl -0pi -e 's/(impl<K, C> Drop for Retired<K, C> \{\n\s*fn drop\(&mut self\) \{\n)/$1        if true { return; } \/\/ the variant leaks replaced tables\n/' "$file"
# Both edits must have applied, once each: otherwise the comparison would
# quietly compare the store with itself.
[ "$(grep -c 'let guard = unsafe { epoch::unprotected() };' "$file")" = 1 ] ||
    { echo "without-pin.sh: the check's pin was not found in $file" >&2; exit 1; }
[ "$(grep -c 'the variant leaks replaced tables' "$file")" = 1 ] ||
    { echo "without-pin.sh: Retired's drop was not found in $file" >&2; exit 1; }
cp "$root/Cargo.lock" "$variant/Cargo.lock"
(cd "$root" && cargo build --release --locked --quiet -p tollgate-lab)
# A target directory of its own under this tree's, kept between runs, so
# that the dependencies are built once.
(cd "$variant" && cargo build --release --locked --quiet -p tollgate-lab \
    --target-dir "$root/target/without-pin")
pinned_lab="$root/target/release/tollgate-lab"
no_pin_lab="$root/target/without-pin/release/tollgate-lab"
# The deny table's keyed GCRA, bare-map, direct and governor rows, and the
# judged ratios of the keyed denial.
pick() {
    awk '/^## /{section=$0}
        section ~ /^## Deny on a drained hot key/ &&
            /^(GCRA  |GCRA cell|the same, |GCRA direct|governor keyed)/ {print}
        section ~ /^## Targets/ && /keyed GCRA deny/ {print}'
}
for round in $(seq "$rounds"); do
    for side in pinned no_pin; do
        lab="${side}_lab"
        echo "=== round $round, ${side/_/ }: --perf ${full[*]}"
        "${!lab}" --perf "${full[@]}" --out "$variant/plots" | pick
    done
done
