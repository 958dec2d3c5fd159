#!/usr/bin/env bash
# Issue 12 item 2: what the lock-free store's keyed denial would cost with
# no read-side protection at all, the bound that no reclamation scheme
# (asymmetric fences, quiescent states, hazard pointers) can beat.
#
# Builds this tree twice: as it is ("pinned"), and with two edits to
# src/store/lock_free/shard.rs ("no pin"): a check's probe runs under
# crossbeam-epoch's `unprotected()` guard instead of a pin, and a replaced
# table is never freed (leaked), so that the variant stays memory-safe
# under any workload, at the price of its replaced tables' memory. It is
# an experiment, not a store: nothing in the library ships it, and its
# leaked tables make a "--full" run hold a gigabyte or two more. Then runs
# ROUNDS (default 2) rounds of "--perf" (or "--perf --full" with FULL=1),
# alternating the two binaries, the first of each round alternating too
# (pinned, no pin; no pin, pinned; ...), and prints the rows of the deny
# table and the judged ratios a read path can move.
#
# Two binaries, two processes: each round's figures come from separate
# runs, so placement effects between processes are part of the difference
# (notes/08, "Item 2, a fourth look").
#
#   lab/without-pin.sh              (two builds: about 6 minutes on 2 cores)
#   ROUNDS=3 FULL=1 lab/without-pin.sh
set -euo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
rounds=${ROUNDS:-2}
full=()
[ "${FULL:-0}" = 1 ] && full=(--full)
variant=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$variant" 2>/dev/null || rm -rf "$variant"' EXIT
git -C "$root" worktree add --quiet --detach "$variant" HEAD
# The working tree's uncommitted changes to tracked files too, so that both
# sides are this tree.
git -C "$root" diff --no-color --no-ext-diff --binary HEAD | git -C "$variant" apply --allow-empty
file="$variant/src/store/lock_free/shard.rs"
perl -0pi -e 's/let guard = epoch::pin\(\);\n(\s*)match self\.table\(&guard\)\.find\(hash, key\) \{/let guard = unsafe { epoch::unprotected() };\n$1match self.table(guard).find(hash, key) {/' "$file"
perl -0pi -e 's/(impl<K, C> Drop for Retired<K, C> \{\n\s*fn drop\(&mut self\) \{\n)/$1        if true { return; } \/\/ the variant leaks replaced tables\n/' "$file"
# Both edits must have applied, once each: otherwise the comparison would
# quietly compare the store with itself.
[ "$(grep -c 'let guard = unsafe { epoch::unprotected() };' "$file")" = 1 ] ||
    { echo "without-pin.sh: the check's pin was not found in $file" >&2; exit 1; }
[ "$(grep -c 'the variant leaks replaced tables' "$file")" = 1 ] ||
    { echo "without-pin.sh: Retired's drop was not found in $file" >&2; exit 1; }
cp "$root/Cargo.lock" "$variant/Cargo.lock"
# Target directories of their own under this tree's, named here (never a
# CARGO_TARGET_DIR's stale binary), kept between runs so that the
# dependencies are built once.
(cd "$root" && cargo build --release --locked --quiet -p tollgate-lab \
    --target-dir "$root/target/without-pin/pinned")
(cd "$variant" && cargo build --release --locked --quiet -p tollgate-lab \
    --target-dir "$root/target/without-pin/no-pin")
pinned_lab="$root/target/without-pin/pinned/release/tollgate-lab"
no_pin_lab="$root/target/without-pin/no-pin/release/tollgate-lab"
# The deny table's keyed GCRA (SipHash and foldhash), bare-map, direct and
# governor rows, and the judged ratios of the keyed denial and the map.
pick() {
    awk '/^## /{section=$0}
        section ~ /^## Deny on a drained hot key/ &&
            /^(GCRA  |GCRA, foldhash|GCRA cell|the same, |GCRA direct|governor keyed)/ {print}
        section ~ /^## Targets/ &&
            /keyed GCRA deny|seeded foldhash: × governor keyed|read-only HashMap ÷/ {print}'
}
for round in $(seq "$rounds"); do
    sides=(pinned no_pin)
    [ $((round % 2)) = 0 ] && sides=(no_pin pinned)
    for side in "${sides[@]}"; do
        lab="${side}_lab"
        echo "=== round $round, ${side/_/ }: --perf ${full[*]}"
        "${!lab}" --perf "${full[@]}" --out "$variant/plots" | pick
    done
done
