//! An open-addressing table whose lookups take no lock: the storage under
//! [`LockFree`](super::LockFree).
//!
//! # Implementation details
//!
//! A table is an array of buckets, each holding one `(key, cell)` pair
//! **inline** (no allocation per key), plus a parallel array of one-byte
//! control words, probed linearly from the key's hash:
//!
//! | control byte | the slot |
//! |---|---|
//! | `EMPTY` (`0x80`) | never written; ends every probe sequence it is in |
//! | `0x00..=0x7F` (`h2`, the hash's top 7 bits) | holds a key and its cell |
//! | `DELETED` (`0xFE`) | evicted: its cell is retired; key and cell are dropped with the table |
//!
//! A control byte only moves forward: `EMPTY → h2 → DELETED`. A slot is
//! **never reused** within one table, and that is what makes a lookup that
//! takes no lock safe against inserters. A key present in the table is
//! reachable from its home bucket through slots that can only stay non-empty,
//! so a lookup that reaches `EMPTY` has proved the key absent at that moment.
//! Deleted slots are reclaimed by rebuilding the table, never in place.
//!
//! A slot is written exactly once, before its control byte leaves `EMPTY`,
//! and its key and cell are dropped exactly once, with the table. In between
//! they are only read. A rebuild **clones** each key into the new table and
//! leaves the old table's copy where it is, for readers that may still be
//! comparing against it; the old table drops its own copies when it is
//! reclaimed. No key's bytes are ever copied while another thread can hold a
//! reference to them, so a key with interior mutability (a lock, a cached
//! hash) is as safe here as in any `HashMap`.
//!
//! Writers (insertion, eviction, rebuilds) are serialised by the owning
//! shard's mutex. Readers synchronise with a writer through one
//! release/acquire pair only: a writer fills the slot and then stores the
//! control byte (`Release`), and a reader loads the control byte (`Acquire`)
//! before it touches the slot.

use std::any::Any;
use std::fmt;
use std::mem::MaybeUninit;

use crate::store::{Lookup, drop_pair};
use crate::sync::canary::{self, Canary};
use crate::sync::{AtomicU8, Ordering, UnsafeCell};

const EMPTY: u8 = 0x80;
const DELETED: u8 = 0xFE;

/// The fewest buckets a table has.
pub(crate) const MIN_BUCKETS: usize = 8;

/// Whether a control byte marks a live slot (`h2`).
#[inline]
const fn is_live(control: u8) -> bool {
    control & 0x80 == 0
}

/// The control byte for a hash: its top 7 bits.
#[inline]
const fn h2(hash: u64) -> u8 {
    (hash >> 57) as u8
}

/// The most slots (live and deleted) a table of `buckets` fills before it
/// is rebuilt: 15/16, and at least one bucket fewer than the table has, so
/// that every probe sequence meets an `EMPTY` bucket. (`hashbrown` stops at
/// 7/8; a higher load costs longer probes: `notes/06`.)
#[inline]
pub(crate) const fn max_used(buckets: usize) -> usize {
    buckets - buckets.div_ceil(16)
}

/// How much of [`max_used`] a rebuild may fill with the keys it keeps: the
/// rest is the headroom left for new keys before the next rebuild.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Headroom {
    /// 9/10: a table that only grows gets one growth step
    /// ([`GROWTH_NUMERATOR`] / [`GROWTH_DENOMINATOR`]), so that it stays
    /// between 15/16 and 82 % full, at the price of a rebuild every tenth
    /// of the table.
    Growing,
    /// 3/4: a table whose slots are being deleted (eviction, a cap) gets a
    /// quarter of its capacity free, so that clearing its tombstones
    /// copies at most three keys for each key inserted.
    Churning,
}

impl Headroom {
    /// The fraction, as `(numerator, denominator)`.
    const fn fraction(self) -> (usize, usize) {
        match self {
            Self::Growing => (9, 10),
            Self::Churning => (3, 4),
        }
    }
}

/// One growth step multiplies the bucket count by 9/8 (rounded up): small
/// steps keep a growing table full, where doubling leaves it between 7/16
/// and 7/8 full.
const GROWTH_NUMERATOR: usize = 9;
/// See [`GROWTH_NUMERATOR`].
const GROWTH_DENOMINATOR: usize = 8;

/// Where a shard's table sizes sit within a growth step, so that the shards
/// of one store, which fill at the same rate, do not all grow at the same
/// key count: shard `index` of `count` scales every size by
/// `1 + index / (8 * count)`, spreading the shards evenly over one 9/8
/// step. The store's bytes per key are then close to their average over a
/// step at every key count, rather than swinging with each step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stagger {
    index: usize,
    count: usize,
}

impl Stagger {
    /// Shard `index` of `count` (`index < count`).
    pub(crate) fn new(index: usize, count: usize) -> Self {
        debug_assert!(index < count);
        Self { index, count }
    }

    /// `base` scaled into this shard's place in the step, rounded up.
    fn scale(self, base: usize) -> usize {
        let parts = (GROWTH_DENOMINATOR as u128) * (self.count as u128);
        let scaled = (base as u128 * (parts + self.index as u128)).div_ceil(parts);
        usize::try_from(scaled).unwrap_or(usize::MAX)
    }
}

/// The buckets a rebuild gives `live` keys: the fewest of the shard's
/// sizes (the 9/8 steps up from [`MIN_BUCKETS`], scaled by its
/// [`Stagger`]) that hold them with `headroom` left below [`max_used`].
pub(crate) fn buckets_for(live: usize, headroom: Headroom, stagger: Stagger) -> usize {
    let (numerator, denominator) = headroom.fraction();
    let fits = |buckets: usize| {
        live.saturating_mul(denominator) <= max_used(buckets).saturating_mul(numerator)
    };
    let mut base = MIN_BUCKETS;
    loop {
        let buckets = stagger.scale(base);
        if fits(buckets) || buckets == usize::MAX {
            return buckets;
        }
        base = base
            .saturating_mul(GROWTH_NUMERATOR)
            .div_ceil(GROWTH_DENOMINATOR)
            .max(base.saturating_add(1));
    }
}

/// Mixes a key's hash before the table uses it: a folded multiply (the
/// 128-bit product with an odd constant, its halves xored), which spreads
/// every bit of the hash into every bit of the result. The table takes two
/// independent choices from the result: [`h2`] (the top 7 bits) and the
/// home bucket (the low 32, see [`home`]). A `BuildHasher` whose hashes
/// differ only in a few bits (an identity hash of small integers differs
/// only in its low ones) would otherwise give every key one `h2` and one
/// home, where linear probing makes every operation linear in the keys.
/// (The store picks the shard from the unmixed hash, `store::shard_index`.)
#[inline]
fn mix(hash: u64) -> u64 {
    let wide = u128::from(hash) * 0x9E37_79B9_7F4A_7C15;
    // The halves, each truncated on purpose.
    #[allow(clippy::cast_possible_truncation)]
    let mixed = (wide as u64) ^ ((wide >> 64) as u64);
    mixed
}

/// The home bucket of a [`mix`]ed hash among `buckets`, for any bucket
/// count: the hash rotated so that its low 32 bits lead, times `buckets`,
/// divided by 2^64 (a multiply-shift reduction, where a mask would need a
/// power of two). Below 2^32 buckets the home depends on the low 32 bits,
/// which `h2` does not use.
#[inline]
fn home(hash: u64, buckets: usize) -> usize {
    let spread = u128::from(hash.rotate_left(32)) * buckets as u128;
    // The product's high word is below `buckets`: the cast is exact.
    #[allow(clippy::cast_possible_truncation)]
    let home = (spread >> 64) as usize;
    home
}

/// A bucket's key and cell, written once while its control byte is `EMPTY`.
type Slot<K, V> = UnsafeCell<MaybeUninit<(K, V)>>;

/// Invariant: `slots.len() == control.len()`, from `with_buckets`, its only
/// constructor; no method reassigns either field.
pub(crate) struct RawTable<K, V, M> {
    control: Box<[AtomicU8]>,
    slots: Box<[Slot<K, V>]>,
    /// What the table's values are read by (the store's generation).
    meta: M,
    /// Under loom, a replaced table is poisoned instead of freed
    /// (`shard::Retired`), and a check asserts, before it leaves its read
    /// section, that the table it read was not: a free that overtook a
    /// reader fails that assertion. A std atomic: loom runs a model's
    /// threads one at a time, so it tells the order they ran in, which is
    /// what a free before a read's end is, and adds no scheduling point.
    #[cfg(feature = "loom")]
    freed: std::sync::atomic::AtomicBool,
}

// SAFETY: the table hands out `&K` and `&V` to any thread that finds them,
// and drops `K` and `V` on whichever thread reclaims it, so it is Send and
// Sync exactly when they are.
unsafe impl<K: Send + Sync, V: Send + Sync, M: Send + Sync> Sync for RawTable<K, V, M> {}
// SAFETY: as above.
unsafe impl<K: Send + Sync, V: Send + Sync, M: Send + Sync> Send for RawTable<K, V, M> {}

impl<K, V, M> RawTable<K, V, M> {
    /// An empty table of `buckets` buckets (at least [`MIN_BUCKETS`]),
    /// whose values are read by `meta`.
    pub(crate) fn with_buckets(buckets: usize, meta: M) -> Self {
        debug_assert!(buckets >= MIN_BUCKETS);
        Self {
            control: (0..buckets).map(|_| AtomicU8::new(EMPTY)).collect(),
            slots: (0..buckets)
                .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
                .collect(),
            meta,
            #[cfg(feature = "loom")]
            freed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Under loom, marks the table freed (`shard::Retired`'s drop).
    #[cfg(feature = "loom")]
    pub(crate) fn poison(&self) {
        // A free writes the memory it frees: a tracked write to every slot,
        // so that a read of a slot that does not happen before the free is
        // a causality violation (the schedule-order assertion below cannot
        // see a missing Acquire/Release edge).
        for slot in &self.slots {
            slot.with_mut(|_| ());
        }
        self.freed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Under loom, fails if the table was freed: a reader calls it before it
    /// leaves the read section it read the table in. Nothing elsewhere.
    #[inline]
    #[cfg_attr(not(feature = "loom"), allow(clippy::unused_self))]
    pub(crate) fn assert_not_freed(&self) {
        #[cfg(feature = "loom")]
        assert!(
            !self.freed.load(std::sync::atomic::Ordering::SeqCst),
            "a check read a table freed before it left its read section"
        );
    }

    /// What the table's values are read by.
    #[inline]
    pub(crate) const fn meta(&self) -> &M {
        &self.meta
    }

    pub(crate) fn buckets(&self) -> usize {
        self.control.len()
    }

    /// The probe sequence of `hash`: every bucket once, from its home
    /// (see [`home`]).
    #[inline]
    fn probe(&self, hash: u64) -> impl Iterator<Item = usize> + '_ {
        let buckets = self.buckets();
        let home = home(hash, buckets);
        // One counter and a wrap, rather than `(home..buckets).chain(0..home)`,
        // whose `next` also tests which half it is in. `home + buckets`
        // cannot overflow: `home < buckets`, and `buckets` is the length of
        // an allocated slice of bytes, at most `isize::MAX`.
        (home..home + buckets).map(move |index| {
            if index < buckets {
                index
            } else {
                index - buckets
            }
        })
    }

    /// The written slot at `index`.
    ///
    /// # Safety
    ///
    /// `index < self.buckets()`: the caller indexed `control[index]` (a
    /// checked index) and either loaded a byte other than `EMPTY`, with
    /// `Acquire` or under the writers' lock, or stored one itself
    /// (`insert`, lock held).
    #[inline]
    unsafe fn slot(&self, index: usize) -> &(K, V) {
        debug_assert!(index < self.slots.len());
        // SAFETY: `index < buckets()`, the length of `control`, and `slots`
        // is as long (the struct's invariant).
        let slot = unsafe { self.slots.get_unchecked(index) };
        slot.with(|slot| {
            // SAFETY: a non-empty control byte is stored (Release) only after
            // the slot was written, the caller's load synchronised with that
            // store, and a written slot is never written again, nor dropped,
            // while the table is reachable through `&self`.
            unsafe { (*slot).assume_init_ref() }
        })
    }

    /// The cell of `key`, if the table holds it live. Takes no lock.
    #[inline]
    pub(crate) fn find<Q: Lookup<K> + ?Sized>(&self, hash: u64, key: &Q) -> Option<&V> {
        let hash = mix(hash);
        let tag = h2(hash);
        for index in self.probe(hash) {
            // Acquire: pairs with the Release store in `insert`, so that the
            // slot's key and cell are visible before we read them.
            let control = self.control[index].load(Ordering::Acquire);
            if control == EMPTY {
                return None;
            }
            if control == tag {
                // SAFETY: a non-empty control byte, loaded with Acquire.
                let (stored, cell) = unsafe { self.slot(index) };
                if key.matches(stored) {
                    return Some(cell);
                }
            }
        }
        None
    }

    /// Writes `(key, value)` into the first empty bucket of the key's probe
    /// sequence, publishes it, and returns the bucket and the value.
    ///
    /// Writers only: the caller holds the writers' lock, or owns the table
    /// before it is published. The key is absent, and the table holds fewer
    /// than [`max_used`] slots, so an empty bucket exists.
    pub(crate) fn insert(&self, hash: u64, key: K, value: V) -> (usize, &V) {
        let hash = mix(hash);
        let index = self
            .probe(hash)
            // Relaxed: only writers store control bytes, and they hold the
            // lock, whose acquisition orders us after every earlier writer.
            .find(|&index| self.control[index].load(Ordering::Relaxed) == EMPTY)
            .expect("a table below max_used has an empty bucket");
        self.slots[index].with_mut(|slot| {
            // SAFETY: the bucket is EMPTY, so no reader touches its slot
            // (readers read a slot only after seeing a non-empty control
            // byte), and writers are serialised by the lock we hold.
            unsafe { (*slot).write((key, value)) };
        });
        // Release: publishes the slot written above to readers that load
        // this byte with Acquire.
        let publish = if canary::planted(Canary::RelaxedPublish) {
            Ordering::Relaxed
        } else {
            Ordering::Release
        };
        self.control[index].store(h2(hash), publish);
        // SAFETY: we just stored a live control byte, and hold the lock.
        (index, &unsafe { self.slot(index) }.1)
    }

    /// The live slots, for writers (lock held). Under the
    /// `RebuildCopiesTombstone` canary, deleted slots too.
    pub(crate) fn live(&self) -> impl Iterator<Item = (usize, &K, &V)> + '_ {
        let copies_tombstones = canary::planted(Canary::RebuildCopiesTombstone);
        (0..self.buckets())
            .filter(move |&index| {
                // Relaxed: writers' lock held (see `insert`).
                let control = self.control[index].load(Ordering::Relaxed);
                is_live(control) || (copies_tombstones && control == DELETED)
            })
            .map(move |index| {
                // SAFETY: a non-empty control byte, read under the writers'
                // lock.
                let (key, value) = unsafe { self.slot(index) };
                (index, key, value)
            })
    }

    /// The value of a written slot in a table not yet published (so
    /// `&mut self`).
    pub(crate) fn written_value(&mut self, index: usize) -> &V {
        debug_assert!(self.control[index].load(Ordering::Relaxed) != EMPTY);
        // SAFETY: the slot was written (its control byte is not EMPTY), and
        // `&mut self` excludes every other access.
        unsafe { &self.slot(index).1 }
    }

    /// Replaces what the values of a table not yet published are read by.
    pub(crate) fn set_meta(&mut self, meta: M) {
        self.meta = meta;
    }

    /// Replaces the value of a written slot in a table not yet published (so
    /// `&mut self`), dropping the old value.
    pub(crate) fn set_value(&mut self, index: usize, value: V) {
        debug_assert!(self.control[index].load(Ordering::Relaxed) != EMPTY);
        self.slots[index].with_mut(|slot| {
            // SAFETY: the slot was written (its control byte is not EMPTY),
            // and `&mut self` excludes every other access.
            unsafe { (*slot).assume_init_mut().1 = value };
        });
    }

    /// Replaces the value of a written slot in a table not yet published (so
    /// `&mut self`), returning the old value.
    pub(crate) fn replace_value(&mut self, index: usize, value: V) -> V {
        debug_assert!(self.control[index].load(Ordering::Relaxed) != EMPTY);
        self.slots[index].with_mut(|slot| {
            // SAFETY: the slot was written (its control byte is not EMPTY),
            // and `&mut self` excludes every other access.
            std::mem::replace(unsafe { &mut (*slot).assume_init_mut().1 }, value)
        })
    }

    /// Marks a live slot evicted; its cell must be retired first. Writers'
    /// lock held.
    pub(crate) fn mark_deleted(&self, index: usize) {
        // Relaxed: the byte publishes nothing. A reader that sees it skips the
        // slot; one that still sees the live byte finds a retired cell and
        // takes the writers' lock, which orders it after this writer.
        self.control[index].store(DELETED, Ordering::Relaxed);
    }

    /// Drops every written slot, each on its own: a panic in one key's or
    /// cell's `Drop` does not stop the others, nor abort the process when
    /// another follows. Each slot is marked `EMPTY` before it is dropped, so
    /// none is dropped twice. Returns the first panic's payload.
    fn drop_slots(&mut self) -> Option<Box<dyn Any + Send>> {
        // Nothing to run (`u64` keys and atomic cells): the buckets go with
        // their boxes, without a pass over a table that may be far larger
        // than the cache. Not under loom, where the pass's writes to every
        // written slot are what shows a free racing a reader (a free is a
        // write to the memory it frees; loom sees only tracked accesses).
        if !cfg!(feature = "loom") && !std::mem::needs_drop::<(K, V)>() {
            return None;
        }
        let mut first_panic = None;
        for index in 0..self.buckets() {
            // Relaxed: `&mut self`, no other access.
            if self.control[index].swap(EMPTY, Ordering::Relaxed) == EMPTY {
                continue;
            }
            let (key, value) = self.slots[index].with_mut(|slot| {
                // SAFETY: the slot was written (its control byte was not
                // EMPTY), is read out only here, once (the byte is EMPTY
                // now), and `&mut self` excludes readers.
                unsafe { (*slot).assume_init_read() }
            });
            if let Some(panic) = drop_pair(key, value) {
                first_panic.get_or_insert(panic);
            }
        }
        first_panic
    }

    /// Drops a table its store discarded (replaced, or abandoned by a
    /// panicking rebuild): a panic in a key's `Drop` is discarded, as
    /// `store::Discarded` discards it. (Under loom a replaced table is
    /// poisoned and kept instead: `shard::Retired`.)
    #[cfg_attr(feature = "loom", allow(dead_code))]
    pub(crate) fn discard(mut self) {
        drop(self.drop_slots());
    }
}

impl<K, V, M> Drop for RawTable<K, V, M> {
    /// With the store: the first panic in a key's `Drop` goes on to whoever
    /// dropped the store, once every slot is dropped (unless a panic is
    /// unwinding already: then it is discarded, as a second would abort).
    fn drop(&mut self) {
        crate::store::resume_first_panic(self.drop_slots());
    }
}

impl<K, V, M> fmt::Debug for RawTable<K, V, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawTable")
            .field("buckets", &self.buckets())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    /// The sizes a table grows through when keys only arrive, from
    /// `MIN_BUCKETS` to `up_to` buckets: each rebuild comes when the key
    /// after `max_used` arrives.
    fn growth(stagger: Stagger, up_to: usize) -> Vec<usize> {
        let mut sizes = vec![MIN_BUCKETS];
        while *sizes.last().unwrap() < up_to {
            let live = max_used(*sizes.last().unwrap()) + 1;
            sizes.push(buckets_for(live, Headroom::Growing, stagger));
        }
        sizes
    }

    /// The table bytes a key (17 a bucket, `u64` keys and GCRA) of a store
    /// of 8 shards growing one key at a time, keys dealt to the shards in
    /// turn (as an even hash spreads them), at its worst over every count
    /// from 100 000 to 2 000 000 keys: the count just after some shard
    /// grew: at most 20, the store's target. The lab's `--growth` measures
    /// the same with real hashing and the whole heap.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe size arithmetic, minutes under Miri: the ordinary tests run it"
    )]
    fn eight_staggered_shards_stay_under_20_bytes_a_key() {
        const SHARDS: usize = 8;
        let sizes: Vec<Vec<usize>> = (0..SHARDS)
            .map(|index| growth(Stagger::new(index, SHARDS), 1 << 20))
            .collect();
        // The buckets of a shard holding `keys`.
        let buckets = |shard: usize, keys: usize| {
            let step = sizes[shard].partition_point(|&size| max_used(size) < keys);
            sizes[shard][step]
        };
        let bytes_a_key = |keys: usize| {
            let total: usize = (0..SHARDS)
                .map(|shard| buckets(shard, (keys + SHARDS - 1 - shard) / SHARDS))
                .sum();
            #[allow(clippy::cast_precision_loss)]
            let per_key = (17 * total) as f64 / keys as f64;
            per_key
        };
        let mut worst = (0.0, 0);
        for (shard, shard_sizes) in sizes.iter().enumerate() {
            for &size in shard_sizes {
                // The store's count when this shard gets the key that
                // grows it out of `size`: the shard's `max_used(size) + 1`th.
                let keys = max_used(size) * SHARDS + shard + 1;
                if (100_000..=2_000_000).contains(&keys) && bytes_a_key(keys) > worst.0 {
                    worst = (bytes_a_key(keys), keys);
                }
            }
        }
        assert!(worst.0 <= 20.0, "{worst:?}");
        assert_eq!(
            (format!("{:.2}", worst.0), worst.1),
            ("19.41".into(), 104_185)
        );
    }

    #[test]
    fn a_table_grows_by_ninths() {
        assert_eq!(
            growth(Stagger::new(0, 1), 60),
            [8, 11, 15, 20, 26, 30, 39, 50, 57, 65]
        );
    }

    #[test]
    fn max_used_leaves_an_empty_bucket_and_a_sixteenth() {
        assert_eq!(max_used(8), 7);
        assert_eq!(max_used(16), 15);
        assert_eq!(max_used(17), 15);
        assert_eq!(max_used(1_600), 1_500);
        for buckets in MIN_BUCKETS..2_000 {
            assert!(max_used(buckets) < buckets);
            assert!(max_used(buckets) * 16 >= buckets * 15 - 15);
        }
    }

    /// Right after growing, a table is at least 82 % full, once past its
    /// first few sizes (where one bucket is a large share); doubling leaves
    /// 44 %. This is what keeps a store near 17 / 0.89 bytes a key.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe size arithmetic, minutes under Miri: the ordinary tests run it"
    )]
    fn a_grown_table_is_at_least_82_percent_full() {
        for index in 0..8 {
            let stagger = Stagger::new(index, 8);
            let sizes = growth(stagger, 1 << 22);
            for pair in sizes.windows(2).filter(|pair| pair[0] >= 128) {
                let live = max_used(pair[0]) + 1;
                #[allow(clippy::cast_precision_loss)]
                let load = live as f64 / pair[1] as f64;
                assert!(
                    (0.82..0.9375).contains(&load),
                    "shard {index}: {} -> {} buckets at {live} keys: {load}",
                    pair[0],
                    pair[1]
                );
            }
        }
    }

    /// The shards of a store sit at evenly spread places within one step:
    /// at the size each first reaches past 10 000 buckets, their sizes
    /// spread over one ninth-step, each in its own place.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe size arithmetic, minutes under Miri: the ordinary tests run it"
    )]
    fn shards_are_staggered_over_one_step() {
        let sizes: Vec<usize> = (0..8)
            .map(|index| {
                let stagger = Stagger::new(index, 8);
                stagger.scale(*growth(Stagger::new(0, 1), 10_000).last().unwrap())
            })
            .collect();
        for pair in sizes.windows(2) {
            assert!(pair[0] < pair[1], "{sizes:?}");
        }
        assert!(sizes[7] * 8 < sizes[0] * 9, "{sizes:?}");
        assert!(sizes[7] * 64 > sizes[0] * 71, "{sizes:?}");
    }

    #[test]
    fn headrooms_leave_a_tenth_and_a_quarter() {
        let stagger = Stagger::new(0, 1);
        let growing = buckets_for(1_000, Headroom::Growing, stagger);
        let churning = buckets_for(1_000, Headroom::Churning, stagger);
        assert!(max_used(growing) * 9 >= 10_000);
        assert!(max_used(churning) * 3 >= 4_000);
        assert!(growing < churning);
        assert_eq!(buckets_for(0, Headroom::Growing, stagger), MIN_BUCKETS);
        assert_eq!(buckets_for(7, Headroom::Churning, Stagger::new(3, 4)), 13);
    }

    #[test]
    fn homes_fall_in_the_table_for_every_size() {
        let hashes = [0, 1, u64::MAX, 0xDEAD_BEEF, 1 << 63, u64::MAX >> 1];
        for buckets in [8, 9, 11, 1_000, usize::MAX / 3, usize::MAX] {
            for hash in hashes {
                assert!(home(hash, buckets) < buckets);
            }
        }
        assert_eq!(home(0, 11), 0);
    }

    /// The longest probe `keys` hashes need when inserted in turn into a
    /// table of `buckets`, as `RawTable::insert` probes.
    fn longest_probe(hashes: impl Iterator<Item = u64>, buckets: usize) -> usize {
        let mut used = vec![false; buckets];
        let mut longest = 0;
        for hash in hashes {
            let start = home(hash, buckets);
            let step = (0..buckets)
                .find(|step| !used[(start + step) % buckets])
                .expect("room");
            used[(start + step) % buckets] = true;
            longest = longest.max(step);
        }
        longest
    }

    /// Hashes that differ only in their low bits (an identity hash of
    /// small integers), only in their high bits, or only from bit 32 up
    /// still spread once mixed: over the table (no probe longer than 5
    /// buckets in a table 90 % full) and over `h2` (most of its 128
    /// values). Unmixed, the first set would all have home 0 (its longest
    /// probe 899) and `h2` 0.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe size arithmetic, minutes under Miri: the ordinary tests run it"
    )]
    fn weak_hashes_spread_once_mixed() {
        type Set = (&'static str, fn(u64) -> u64, usize);
        let sets: [Set; 3] = [
            ("low bits", |key| key, 3),
            ("high bits", |key| key << 48, 5),
            ("bits 32 up", |key| key << 32, 2),
        ];
        for (name, hash, longest) in sets {
            let mixed = || (0..900).map(hash).map(mix);
            assert_eq!(longest_probe(mixed(), 1_000), longest, "{name}: probe");
            let tags: std::collections::HashSet<u8> = mixed().map(h2).collect();
            assert!(tags.len() >= 100, "{name}: {} tags", tags.len());
        }
        assert_eq!(longest_probe(0..900, 1_000), 899, "unmixed");
    }
}
