//! Holds kept beside the words ([`Leases::with_holds`](super::Leases::with_holds)).
//!
//! A key's word holds a lease or a floor, not both and a hold, so a hold
//! decided by a call that left a node some units, or the floor a hold's
//! raised word hides, has no place there. This table keeps both for the
//! keys a node holds off: a slot a key's hash picks, with the hold's end
//! (the raised floor to install once the key's units run out) and the
//! floor the node knew after its latest call (a lower bound of the TAT,
//! from which the next call's estimate of the key's sharers starts).
//!
//! The table is a hint and only ever denies: a slot is overwritten by
//! another key's hold, its two fields are written apart, and a key's
//! `Borrow` may hash otherwise than the key. Each of these loses a hold or
//! lengthens one, never more than a hold's own cap (a tolerance), and no
//! hold admits anything: a raised floor only denies. Each field carries a
//! print of the key's hash, and a field whose print differs is not this
//! key's.

use std::hash::{BuildHasher, DefaultHasher, Hash, Hasher, RandomState};

use crate::sync::{AtomicU64, Ordering};

/// Slots in a view's table: 256, 4 KiB beside a view with holds (none
/// without). Few keys are held at once: those many nodes want beyond
/// their limit.
const SLOTS: usize = 256;

/// The bits of a field that carry the hash's print; the rest is an
/// instant in µs (below 2^52, as a word's `end`).
const PRINT_BITS: u32 = 12;
const PRINT_MASK: u64 = (1 << PRINT_BITS) - 1;

/// A key's slot: its index and its hash's print.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spot {
    index: usize,
    print: u64,
}

/// One slot's fields.
struct Slot {
    /// The raised floor that holds the key off, once its units run out.
    until: AtomicU64,
    /// The floor the node knew after its latest call for the key.
    floor: AtomicU64,
}

/// A view's table of holds.
pub(crate) struct Holds {
    /// Hashed before each key: the slots an attacker's keys take are not
    /// known to them.
    salt: u64,
    slots: Box<[Slot]>,
}

impl Holds {
    /// A table whose keys' slots are drawn from `salt` (a random one
    /// without).
    pub(crate) fn new(salt: Option<u64>) -> Self {
        Self {
            salt: salt.unwrap_or_else(|| RandomState::new().hash_one(0_u64)),
            slots: std::iter::repeat_with(|| Slot {
                until: AtomicU64::new(0),
                floor: AtomicU64::new(0),
            })
            .take(SLOTS)
            .collect(),
        }
    }

    /// The slot of `key` (its `Hash` runs: a panic there propagates).
    pub(crate) fn spot<Q: Hash + ?Sized>(&self, key: &Q) -> Spot {
        let mut hasher = DefaultHasher::new();
        hasher.write_u64(self.salt);
        key.hash(&mut hasher);
        let hash = hasher.finish();
        Spot {
            // The low bits pick the slot, the high bits are its print.
            #[allow(clippy::cast_possible_truncation)]
            index: hash as usize % SLOTS,
            print: hash >> (u64::BITS - PRINT_BITS),
        }
    }

    /// The raised floor that holds `spot`'s key off (0: none recorded).
    pub(crate) fn until_us(&self, spot: Spot) -> u64 {
        Self::read(&self.slots[spot.index].until, spot)
    }

    /// The floor known after the latest call for `spot`'s key, if recorded.
    pub(crate) fn floor_us(&self, spot: Spot) -> Option<u64> {
        Some(Self::read(&self.slots[spot.index].floor, spot)).filter(|&floor_us| floor_us > 0)
    }

    /// Whether `spot`'s slot is its key's.
    pub(crate) fn has(&self, spot: Spot) -> bool {
        self.floor_us(spot).is_some()
    }

    /// Records, for `spot`'s key, the floor its latest call taught at the
    /// remote's `now_us` and the raised floor that holds it off (0 for
    /// none); not over another key's hold still running then.
    pub(crate) fn note(&self, spot: Spot, now_us: u64, floor_us: u64, until_us: u64) {
        let fields = &self.slots[spot.index];
        let other = fields.until.load(Ordering::Relaxed);
        if other & PRINT_MASK != spot.print && other >> PRINT_BITS > now_us {
            return;
        }
        fields
            .until
            .store(until_us << PRINT_BITS | spot.print, Ordering::Relaxed);
        fields
            .floor
            .store(floor_us << PRINT_BITS | spot.print, Ordering::Relaxed);
    }

    /// A share of `hold_us` drawn from `draw` (the reply's instant), from
    /// half to all of it: nodes that called together hold off for
    /// different times, and call again apart. (Held off all alike, a key's
    /// sharers would call in waves, and between waves the key could rest
    /// full.)
    pub(crate) fn spread(&self, hold_us: u64, draw: u64) -> u64 {
        let mut hasher = DefaultHasher::new();
        hasher.write_u64(self.salt);
        hasher.write_u64(draw);
        let share = (u128::from(hold_us / 2) * u128::from(hasher.finish())) >> u64::BITS;
        // Below `hold_us / 2`: the shift leaves 64 bits.
        #[allow(clippy::cast_possible_truncation)]
        let share = share as u64;
        hold_us - hold_us / 2 + share
    }

    fn read(field: &AtomicU64, spot: Spot) -> u64 {
        let value = field.load(Ordering::Relaxed);
        if value & PRINT_MASK == spot.print {
            value >> PRINT_BITS
        } else {
            0
        }
    }
}

#[cfg(all(test, not(any(feature = "loom", feature = "shuttle"))))]
mod tests {
    use super::Holds;

    #[test]
    fn a_key_reads_its_own_slot_and_not_another_s() {
        let holds = Holds::new(None);
        let (a, b) = (holds.spot("a"), holds.spot("b"));
        assert_eq!((holds.until_us(a), holds.floor_us(a)), (0, None));
        holds.note(a, 900, 1_000, 5_000);
        assert_eq!((holds.until_us(a), holds.floor_us(a)), (5_000, Some(1_000)));
        assert!(holds.has(a));
        // A key whose print differs reads nothing of the slot, whichever
        // it is.
        let other = super::Spot {
            print: a.print ^ 1,
            ..a
        };
        assert_eq!((holds.until_us(other), holds.floor_us(other)), (0, None));
        holds.note(b, 900, 2_000, 0);
        assert_eq!(holds.floor_us(b), Some(2_000));
        assert_eq!(holds.until_us(b), 0);
    }

    #[test]
    fn a_running_hold_keeps_its_slot_from_other_keys() {
        let holds = Holds::new(Some(7));
        let key = holds.spot("hot");
        holds.note(key, 1_000, 2_000, 5_000);
        let other = super::Spot {
            print: key.print ^ 1,
            ..key
        };
        holds.note(other, 4_999, 3_000, 9_000);
        assert_eq!(
            (holds.until_us(key), holds.floor_us(key)),
            (5_000, Some(2_000))
        );
        // Ended, it gives way.
        holds.note(other, 5_000, 3_000, 9_000);
        assert_eq!((holds.until_us(key), holds.floor_us(key)), (0, None));
        assert_eq!(holds.until_us(other), 9_000);
        // The same salt, the same slots.
        assert_eq!(Holds::new(Some(7)).spot("hot").index, key.index);
    }

    #[test]
    fn a_hold_is_spread_over_its_second_half() {
        let holds = Holds::new(Some(7));
        let spread: Vec<u64> = (0..1_000).map(|draw| holds.spread(1_000, draw)).collect();
        assert!(spread.iter().all(|hold| (500..1_000).contains(hold)));
        // Over the whole of it, not bunched.
        let early = spread.iter().filter(|&&hold| hold < 750).count();
        assert!((400..600).contains(&early), "{early} of 1 000 early");
        assert_eq!((holds.spread(0, 3), holds.spread(1, 3)), (0, 1));
        assert!(holds.spread(u64::MAX, 3) >= u64::MAX / 2);
    }
}
