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
//! | `MOVED` (`0xFF`) | migrated: key and cell live on in the next table |
//!
//! A control byte only moves forward: `EMPTY → h2 → DELETED | MOVED`. A slot
//! is **never reused** within one table, and that is what makes a lookup that
//! takes no lock safe against inserters. A key present in the table is
//! reachable from its home bucket through slots that can only stay non-empty,
//! so a lookup that reaches `EMPTY` has proved the key absent at that moment.
//! Deleted slots are reclaimed by rebuilding the table (see
//! `LockFreeStore`), never in place.
//!
//! Writers (insertion, eviction, migration) are serialised by the owning
//! shard's mutex. Readers synchronise with a writer through one release/acquire
//! pair only: a writer fills the slot and then stores the control byte
//! (`Release`), and a reader loads the control byte (`Acquire`) before it
//! touches the slot.

use std::borrow::Borrow;
use std::cell::UnsafeCell;
use std::fmt;
use std::mem::MaybeUninit;

use crate::sync::{AtomicU8, Ordering};

const EMPTY: u8 = 0x80;
const DELETED: u8 = 0xFE;
const MOVED: u8 = 0xFF;

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

/// A bucket's key and cell, written once while its control byte is `EMPTY`.
type Slot<K, V> = UnsafeCell<MaybeUninit<(K, V)>>;

pub(crate) struct RawTable<K, V> {
    control: Box<[AtomicU8]>,
    slots: Box<[Slot<K, V>]>,
    mask: usize,
}

// SAFETY: the table hands out `&K` and `&V` to any thread that finds them,
// and moves `K` and `V` between threads when it migrates or drops them, so it
// is Send and Sync exactly when they are.
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

    /// The live slot at `index`.
    ///
    /// # Safety
    ///
    /// The caller loaded `control[index]` and saw a live byte, with `Acquire`
    /// or under the writers' lock.
    #[inline]
    unsafe fn slot(&self, index: usize) -> &(K, V) {
        // SAFETY: a live control byte is stored (Release) only after the slot
        // was written, the caller's load synchronised with that store, and a
        // written slot is never written again while the table exists.
        unsafe { (*self.slots[index].get()).assume_init_ref() }
    }

    /// The cell of `key`, if the table holds it. Takes no lock.
    #[inline]
    pub(crate) fn find<Q>(&self, hash: u64, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.find_index(hash, key).map(|index| {
            // SAFETY: find_index saw a live control byte with Acquire.
            &unsafe { self.slot(index) }.1
        })
    }

    /// The bucket holding `key`, if any. Takes no lock.
    #[inline]
    pub(crate) fn find_index<Q>(&self, hash: u64, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let tag = h2(hash);
        for index in self.probe(hash) {
            // Acquire: pairs with the Release store in `insert`, so that the
            // slot's key and cell are visible before we read them.
            let control = self.control[index].load(Ordering::Acquire);
            if control == EMPTY {
                return None;
            }
            if control == tag {
                // SAFETY: a live control byte, loaded with Acquire.
                if unsafe { self.slot(index) }.0.borrow() == key {
                    return Some(index);
                }
            }
        }
        None
    }

    /// Puts `(key, value)` in the first empty bucket of the key's probe
    /// sequence and returns the value. Writers' lock held; the key is absent
    /// and the table has an empty bucket (it never fills past `max_used`).
    pub(crate) fn insert(&self, hash: u64, key: K, value: V) -> &V {
        let index = self
            .probe(hash)
            // Relaxed: only writers store control bytes, and they hold the
            // lock, whose acquisition orders us after every earlier writer.
            .find(|&index| self.control[index].load(Ordering::Relaxed) == EMPTY)
            .expect("a table below max_used has an empty bucket");
        // SAFETY: the bucket is EMPTY, so no reader touches its slot (readers
        // read a slot only after seeing a live control byte), and writers are
        // serialised by the lock we hold.
        let slot = unsafe { (*self.slots[index].get()).write((key, value)) };
        // Release: publishes the slot written above to readers that load
        // this byte with Acquire.
        self.control[index].store(h2(hash), Ordering::Release);
        &slot.1
    }

    /// The live slots, for writers (lock held).
    pub(crate) fn live(&self) -> impl Iterator<Item = (usize, &K, &V)> + '_ {
        (0..self.buckets())
            // Relaxed: writers' lock held (see `insert`).
            .filter(move |&index| is_live(self.control[index].load(Ordering::Relaxed)))
            .map(move |index| {
                // SAFETY: a live control byte, read under the writers' lock.
                let (key, value) = unsafe { self.slot(index) };
                (index, key, value)
            })
    }

    /// Marks a live slot evicted; its cell must be retired. Writers' lock
    /// held.
    pub(crate) fn mark_deleted(&self, index: usize) {
        // Relaxed: the byte publishes nothing. A reader that sees it skips the
        // slot; one that still sees the live byte finds a retired cell and
        // takes the writers' lock, which orders it after this writer.
        self.control[index].store(DELETED, Ordering::Relaxed);
    }

    /// Moves a live slot's key out, leaving the slot `MOVED`; its cell must
    /// be retired (it is dropped with this table). Writers' lock held.
    pub(crate) fn take_key(&self, index: usize) -> K {
        debug_assert!(is_live(self.control[index].load(Ordering::Relaxed)));
        // Relaxed: as in `mark_deleted`.
        self.control[index].store(MOVED, Ordering::Relaxed);
        // SAFETY: the slot is live (caller), and marking it MOVED hands the
        // key's ownership to the caller: `Drop` drops only the cell of a MOVED
        // slot. Readers may still compare the key's bytes through an old
        // reference until this table is reclaimed, which happens only after
        // they unpin; the new owner cannot drop the key before then, because
        // it drops keys only when its own table is reclaimed, later still.
        unsafe { std::ptr::read(&raw const (*self.slots[index].get()).assume_init_ref().0) }
    }
}

impl<K, V> Drop for RawTable<K, V> {
    fn drop(&mut self) {
        for (control, slot) in self.control.iter_mut().zip(self.slots.iter_mut()) {
            let slot = slot.get_mut();
            match *control.get_mut() {
                EMPTY => {}
                // SAFETY: the key was moved out (`take_key`); the cell is
                // still ours, initialised, and dropped once.
                MOVED => unsafe { std::ptr::drop_in_place(&raw mut (*slot.as_mut_ptr()).1) },
                // SAFETY: live or deleted: the slot was written and still owns
                // both halves; dropped once.
                _ => unsafe { slot.assume_init_drop() },
            }
        }
    }
}

impl<K, V> fmt::Debug for RawTable<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawTable")
            .field("buckets", &self.buckets())
            .finish_non_exhaustive()
    }
}
