//! The lock-free store's writers: inserting through a rebuild, evicting,
//! and rebuilding a shard's table (lock held, on `#[cold]` paths).
//!
//! A rebuild runs in two phases. First it hashes and **clones** every live
//! key into a new table, beside vacant cells (which hold no state, so
//! creating and dropping them runs no user code); this is the only user
//! code a rebuild runs, and a panic in it frees the new table, after the
//! lock is released, and leaves the old one untouched. Then, with no user
//! code, it **retires** each old cell (`Cell::retire_into_new`, a swap of
//! the cell's word) into the new table, and publishes the new table. A
//! check that meets a retired cell, whether evicted or moved, goes to the
//! slow path, takes the shard's mutex, and looks the key up again in the
//! current table, so no admission is lost to a concurrent eviction or
//! rebuild. The cost is that checks on moved keys wait for an in-progress
//! rebuild of their shard.
//!
//! A rebuild sizes the new table for the live keys (`table::buckets_for`),
//! so it grows, shrinks, or just clears evicted slots. A table that fills
//! with evicted slots before it needs to grow (keys coming and going) is
//! rebuilt with a quarter of its buckets free instead, so that clearing
//! them copies at most three keys for each new one
//! (`tests/stores.rs::rebuilds_copy_a_bounded_number_of_keys_per_insert`).

use std::hash::BuildHasher;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;

use super::shard::{PROMPT_ROUNDS, Retired, Shard, Writer, may_convert, may_rebuild};
use super::table::{Headroom, RawTable, buckets_for, max_used};
use super::{Gen, LIVE_UNDER_LOCK, LockFreeStore};
use crate::algorithm::{Algorithm, Carry, CarryAt};
use crate::cell::Cell;
use crate::error::CheckError;
use crate::store::kit::{carry_for, rested_at};
use crate::store::{Discarded, Key, discard_each};
use crate::sync::canary::{self, Canary};
use crate::sync::{Ordering, lock};

/// `evict_idle` rebuilds a shard's table smaller when the table has at
/// least this many times the buckets its live keys need (sized with a
/// quarter of its buckets free, `Headroom::Churning`): far enough that a table
/// just grown (9/8 of the size its keys need, or just rebuilt with a
/// quarter free) is never shrunk straight back.
const COMPACT_FACTOR: usize = 4;

impl<K, A, C, H> LockFreeStore<K, A, C, H>
where
    K: Key,
    A: Algorithm,
    C: Cell<A>,
    H: BuildHasher + Send + Sync,
{
    /// Evicts the keys of `table` (the shard's current one, lock held) that
    /// are idle at `idle_at_ns`, and so at every later instant; returns how
    /// many. Runs no user code.
    pub(super) fn sweep(
        &self,
        table: &RawTable<K, C, Gen<A>>,
        writer: &mut Writer<K, C, Gen<A>>,
        idle_at_ns: u64,
    ) -> usize {
        let algorithm = table.meta().algorithm();
        let mut released = self.population.releasing();
        for (index, _, cell) in table.live() {
            // `is_idle` is the algorithm's code: each eviction is counted as
            // it happens, so that a panic there leaves the counts exact.
            let evict = if canary::planted(Canary::EvictWithoutTombstone) {
                cell.is_idle_unretired(algorithm, idle_at_ns)
            } else {
                // The tombstone: retire first, so that a check holding the
                // cell finds it retired and looks again.
                cell.retire_if_idle(algorithm, idle_at_ns)
            };
            if evict {
                table.mark_deleted(index);
                writer.live -= 1;
                released.add();
            }
        }
        released.removed
    }

    /// Rebuilds `shard` without its evicted slots, so that their keys and
    /// states are freed, and smaller if it is far larger than its keys
    /// need (`evict_idle`).
    pub(super) fn compact(&self, shard: &Shard<K, C, Gen<A>>) {
        // Declared before the lock: dropped after it, even if a rebuild's
        // user code panics.
        let mut discarded = Discarded::new();
        let mut writer = lock(&shard.writer);
        // SAFETY: we hold the lock.
        let table = unsafe { shard.table_locked() };
        let needed = buckets_for(writer.live, Headroom::Churning, shard.stagger);
        // A rebuild refused (the last replaced table is still read) leaves
        // the evicted slots in place: their keys stay in this table, which
        // does not grow, until a later compaction or growth.
        let buckets = if table.buckets() >= COMPACT_FACTOR * needed {
            Some(needed)
        } else {
            (writer.used > writer.live).then(|| table.buckets())
        };
        if let Some(buckets) = buckets.filter(|_| may_rebuild(&mut writer, &mut discarded)) {
            self.rebuild(shard, &mut writer, &mut discarded, buckets, None);
        }
        discarded.extend(writer.take_graced());
        drop(writer);
        drop(discarded);
    }

    /// Makes room for one more key in a full table (lock held). When live
    /// keys (not evicted slots) fill it, first evicts the keys idle for at
    /// least the algorithm's rest time: the amortized eviction, since a
    /// table fills only after a number of inserts proportional to its size.
    /// Keys idle for less (in use, between two requests) stay, so a working
    /// set is never evicted only to be re-inserted; and a rebuild that only
    /// clears evicted slots evicts nothing. Then rebuilds for the live keys
    /// and the one being inserted.
    ///
    /// # Errors
    ///
    /// [`CheckError::Reclaiming`] when the rebuild is refused (see
    /// [`rebuild`](Self::rebuild)).
    pub(super) fn grow(
        &self,
        shard: &Shard<K, C, Gen<A>>,
        writer: &mut Writer<K, C, Gen<A>>,
        discarded: &mut Discarded<Retired<K, C, Gen<A>>>,
        now_ns: u64,
    ) -> Result<(), CheckError> {
        // Before the sweep: a rebuild refused would waste it, and the next
        // new key would sweep again, all under the lock.
        if !may_rebuild(writer, discarded) {
            return Err(CheckError::Reclaiming);
        }
        // SAFETY: our caller holds the lock.
        let table = unsafe { shard.table_locked() };
        if (writer.live + 1) * 4 > max_used(table.buckets()) * 3 {
            let idle_at_ns = rested_at(table.meta().algorithm(), now_ns);
            self.sweep(table, writer, idle_at_ns);
        }
        // A table that would not need to grow for its live keys filled up
        // with evicted slots: keys are going as well as coming, and the new
        // table gets the headroom for that (`Headroom::Churning`).
        let growing = buckets_for(writer.live + 1, Headroom::Growing, shard.stagger);
        let buckets = if growing <= table.buckets() {
            buckets_for(writer.live + 1, Headroom::Churning, shard.stagger)
        } else {
            growing
        };
        self.rebuild(shard, writer, discarded, buckets, None);
        Ok(())
    }

    /// Whether every shard may be converted now ([`may_convert`]): asked
    /// before a change touches any, so that one refused leaves every key in
    /// its generation.
    pub(super) fn may_convert_all(&self) -> bool {
        self.shards.iter().all(|shard| {
            let mut discarded = Discarded::new();
            let mut writer = lock(&shard.writer);
            let may = may_convert(&mut writer, &mut discarded);
            drop(writer);
            drop(discarded);
            may
        })
    }

    /// Moves `shard`'s keys to the generation `to`, each state carried by
    /// `carry` at what `at` reads once they are frozen: a rebuild of the
    /// same size whose new table is in `to` (see [`rebuild`](Self::rebuild)).
    /// Its caller asked [`may_convert_all`](Self::may_convert_all) first.
    pub(super) fn convert(
        &self,
        shard: &Shard<K, C, Gen<A>>,
        to: &Gen<A>,
        carry: Carry,
        at: &dyn Fn() -> CarryAt,
    ) {
        // Declared before the lock: dropped after it, even if a rebuild's
        // user code panics.
        let mut discarded = Discarded::new();
        let mut writer = lock(&shard.writer);
        // Frees what it can; a refusal is gone past by one (`may_convert`).
        may_convert(&mut writer, &mut discarded);
        // SAFETY: we hold the lock.
        let buckets = unsafe { shard.table_locked() }.buckets();
        let conversion = Conversion { to, carry, at };
        self.rebuild(
            shard,
            &mut writer,
            &mut discarded,
            buckets,
            Some(conversion),
        );
        discarded.extend(writer.take_graced());
        drop(writer);
        drop(discarded);
        shard.reclaim(PROMPT_ROUNDS);
    }

    /// Replaces the shard's table (lock held) with one of `buckets` buckets
    /// holding its live keys and their states, in the two phases of the
    /// module documentation. A rebuild abandoned by a panic
    /// leaves its unpublished table in `discarded`, which the caller
    /// declared before it took the lock, so that it is freed after the lock
    /// is released.
    ///
    /// Its caller asked [`may_rebuild`] first.
    fn rebuild(
        &self,
        shard: &Shard<K, C, Gen<A>>,
        writer: &mut Writer<K, C, Gen<A>>,
        discarded: &mut Discarded<Retired<K, C, Gen<A>>>,
        buckets: usize,
        conversion: Option<Conversion<'_, A>>,
    ) {
        // SAFETY: our caller holds the lock.
        let old = unsafe { shard.table_locked() };
        // A rebuild that took tombstones for live slots would size for them.
        let buckets = if canary::planted(Canary::RebuildCopiesTombstone) {
            buckets.max(buckets_for(
                old.live().count(),
                Headroom::Growing,
                shard.stagger,
            ))
        } else {
            buckets
        };
        // Phase 1, user code (`BuildHasher`, `Hash`, `Clone`): each key is
        // copied beside a vacant cell, whose creation and drop run no user
        // code. A panic leaves the shard as it was, and `new`, never
        // published, goes with its copies to `discarded`.
        let mut new = RawTable::with_buckets(buckets, Arc::clone(old.meta()));
        // Where each key went, in the order `old.live()` gives them: phase 2
        // walks `old.live()` again, and nothing changes the old table in
        // between (we hold the lock, and only its holders write). One
        // `usize` a key, the list's share of the peak (`notes/06`).
        let mut moves = Vec::with_capacity(writer.live);
        let copied = catch_unwind(AssertUnwindSafe(|| {
            for (_, key, _) in old.live() {
                let hash = self.hasher.hash_one(key);
                let (new_index, _) = new.insert(hash, key.clone(), C::vacant());
                moves.push(new_index);
            }
        }));
        if let Err(panic) = copied {
            discarded.push(Retired::unpublished(new));
            resume_unwind(panic);
        }
        // Phase 2, no user code: retire each old cell into the new table,
        // in place of the vacant one. A check that reaches a retired cell
        // waits for our lock and finds the key in the new table.
        debug_assert_eq!(old.live().count(), moves.len());
        for ((_, _, old_cell), &new_index) in old.live().zip(&moves) {
            let cell = old_cell.retire_into_new().unwrap_or_else(|| {
                assert!(
                    canary::planted(Canary::RebuildCopiesTombstone),
                    "{LIVE_UNDER_LOCK}"
                );
                C::new(old.meta().algorithm())
            });
            new.set_value(new_index, cell);
        }
        // Phase 3, the algorithm's code, on cells no check can reach yet:
        // every state carried to the new generation, or (a panic) none,
        // and the table published as it is, in the old one.
        let carried = conversion.map(|conversion| {
            catch_unwind(AssertUnwindSafe(|| {
                conversion.carry_all(old.meta(), &mut new, &moves);
            }))
        });
        writer.used = moves.len();
        writer.live = moves.len();
        // The canary starts the old table's grace period while checks can
        // still load it.
        let early = canary::planted(Canary::RetireBeforeUnlink)
            .then(|| Retired::before_unlink(shard.table.load(Ordering::Relaxed)));
        // Release: publishes the new table's slots to checks that load the
        // pointer with Acquire (`Shard::table`). Only lock holders replace
        // the table, and we hold the lock; the old table goes to `Retired`,
        // which frees it after its grace period.
        let publish = if canary::planted(Canary::RelaxedTableSwap) {
            Ordering::Relaxed
        } else {
            Ordering::Release
        };
        let replaced = shard.table.swap(Box::into_raw(Box::new(new)), publish);
        if let Some(early) = &early {
            debug_assert_eq!(early.table, replaced);
        }
        // The ticket after the swap (`Retired::unlinked`).
        writer
            .retired
            .push(early.unwrap_or_else(|| Retired::unlinked(replaced)));
        if let Some(Err(panic)) = carried {
            resume_unwind(panic);
        }
    }
}

/// An algorithm that carries a fresh state carries every state
/// ([`Algorithm::carry`]); one that does not abandons the change of the
/// shard, as a panic does.
const CARRIES_EVERY_STATE: &str = "`Algorithm::carry` returned None after carrying a fresh state";

/// A change of generation a rebuild makes ([`LockFreeStore::convert`]).
pub(super) struct Conversion<'a, A> {
    to: &'a Gen<A>,
    carry: Carry,
    at: &'a dyn Fn() -> CarryAt,
}

impl<A: Algorithm> Conversion<'_, A> {
    /// Carries the states of `table`'s cells at `moves` (unpublished) from
    /// `from` to this conversion's generation, and makes it the table's:
    /// all of them, or, if the algorithm's code panics, none.
    fn carry_all<K, C: Cell<A>>(
        &self,
        from: &Gen<A>,
        table: &mut RawTable<K, C, Gen<A>>,
        moves: &[usize],
    ) {
        let (from_algorithm, to_algorithm) = (from.algorithm(), self.to.algorithm());
        // Every cell is retired: the states are frozen, and the instant
        // and the strategy are read now.
        let carry = carry_for(from, self.to, self.carry);
        let at = (self.at)();
        let carried: Vec<C> = moves
            .iter()
            .map(|&index| {
                table
                    .written_value(index)
                    .carried(from_algorithm, to_algorithm, carry, at)
                    .expect(CARRIES_EVERY_STATE)
            })
            .collect();
        let replaced: Vec<C> = moves
            .iter()
            .zip(carried)
            .map(|(&index, cell)| table.replace_value(index, cell))
            .collect();
        table.set_meta(Arc::clone(self.to));
        // The old states' `Drop` (user code) once every key is carried and
        // the table is the new generation's, each on its own: a panic there
        // changes nothing.
        discard_each(replaced);
    }
}
