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

use super::{Lookup, drop_pair};
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
/// is rebuilt: 7/8, as `hashbrown` does.
#[inline]
pub(crate) const fn max_used(buckets: usize) -> usize {
    buckets - buckets / 8
}

/// The buckets a rebuild gives `live` keys: the fewest (a power of two, at
/// least [`MIN_BUCKETS`]) that hold them at no more than 3/4 of
/// [`max_used`], so that the next rebuild is at least a quarter of the table
/// away. When nothing was evicted, this doubles, as `hashbrown` does.
pub(crate) fn buckets_for(live: usize) -> usize {
    let mut buckets = MIN_BUCKETS;
    while live.saturating_mul(4) > max_used(buckets).saturating_mul(3) {
        buckets *= 2;
    }
    buckets
}

/// A bucket's key and cell, written once while its control byte is `EMPTY`.
type Slot<K, V> = UnsafeCell<MaybeUninit<(K, V)>>;

pub(crate) struct RawTable<K, V> {
    control: Box<[AtomicU8]>,
    slots: Box<[Slot<K, V>]>,
    mask: usize,
}

// SAFETY: the table hands out `&K` and `&V` to any thread that finds them,
// and drops `K` and `V` on whichever thread reclaims it, so it is Send and
// Sync exactly when they are.
unsafe impl<K: Send + Sync, V: Send + Sync> Sync for RawTable<K, V> {}
// SAFETY: as above.
unsafe impl<K: Send + Sync, V: Send + Sync> Send for RawTable<K, V> {}

impl<K, V> RawTable<K, V> {
    /// An empty table of `buckets` buckets, a power of two.
    pub(crate) fn with_buckets(buckets: usize) -> Self {
        debug_assert!(buckets.is_power_of_two() && buckets >= MIN_BUCKETS);
        Self {
            control: (0..buckets).map(|_| AtomicU8::new(EMPTY)).collect(),
            slots: (0..buckets)
                .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
                .collect(),
            mask: buckets - 1,
        }
    }

    pub(crate) fn buckets(&self) -> usize {
        self.mask + 1
    }

    /// The probe sequence of `hash`: every bucket once, from its home.
    #[inline]
    fn probe(&self, hash: u64) -> impl Iterator<Item = usize> + '_ {
        // Truncation picks the low bits, which the mask keeps anyway.
        #[allow(clippy::cast_possible_truncation)]
        let home = hash as usize;
        (0..=self.mask).map(move |step| home.wrapping_add(step) & self.mask)
    }

    /// The written slot at `index`.
    ///
    /// # Safety
    ///
    /// The caller loaded `control[index]` and saw a byte other than `EMPTY`,
    /// with `Acquire` or under the writers' lock.
    #[inline]
    unsafe fn slot(&self, index: usize) -> &(K, V) {
        self.slots[index].with(|slot| {
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

    /// The value of a live slot, for writers (lock held).
    pub(crate) fn value(&self, index: usize) -> &V {
        // Relaxed: writers' lock held (see `insert`).
        debug_assert!(self.control[index].load(Ordering::Relaxed) != EMPTY);
        // SAFETY: the caller found `index` through `live` or `insert`, so its
        // control byte is not EMPTY, and holds the writers' lock.
        &unsafe { self.slot(index) }.1
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
    /// `store::Discarded` discards it.
    pub(crate) fn discard(mut self) {
        drop(self.drop_slots());
    }
}

impl<K, V> Drop for RawTable<K, V> {
    /// With the store: the first panic in a key's `Drop` goes on to whoever
    /// dropped the store, once every slot is dropped (unless a panic is
    /// unwinding already: then it is discarded, as a second would abort).
    fn drop(&mut self) {
        super::resume_first_panic(self.drop_slots());
    }
}

impl<K, V> fmt::Debug for RawTable<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawTable")
            .field("buckets", &self.buckets())
            .finish_non_exhaustive()
    }
}
