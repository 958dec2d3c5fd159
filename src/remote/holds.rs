//! Holds kept beside the words ([`Leases::with_holds`](super::Leases::with_holds)).
//!
//! A key's word holds a lease or a floor, not both and a hold, so a hold
//! decided by a call that granted a node units, and the floor a hold's
//! raised word hides, have no place there. This table keeps both for the
//! keys a node holds off: a slot a key's hash picks, with the hold's end
//! (0 for none) and the floor the node's latest call for the key left
//! (`reply.end`, a lower bound of the TAT then, from which the next call's
//! estimate of the key's sharers starts).
//!
//! A claim applies a hold it finds only while the key's word still stands
//! where that call left it (its floor is the slot's floor, no units left):
//! a word forgotten since (a change of quota, an eviction), moved by a
//! later call, or another key whose hash falls on the same slot and print
//! finds a floor of its own and no hold. So the table is a hint that only
//! ever denies, and (but for a key whose hash meets the same slot, print
//! and floor) only the key it was decided for: a slot is overwritten
//! by another key's call (never while that key's hold runs), and its two
//! fields are written apart; each loses a hold or, for the estimate, a
//! floor, which costs calls. No hold admits anything: a raised floor only
//! denies.

use std::hash::{BuildHasher, DefaultHasher, Hash, Hasher, RandomState};

use crate::sync::{AtomicU64, Ordering};

/// Slots in a view's table: 256, 4 KiB beside a view with holds (none
/// without). Few keys are held at once: those many nodes want beyond
/// their limit.
const SLOTS: usize = 256;

/// The bits of a field that carry the hash's print; the rest is an
/// instant in µs (clamped to [`MAX_US`]):
///
/// ```text
///  63                                                  12 11          0
/// +------------------------------------------------------+-------------+
/// | instant: remote microseconds (52 bits; 0 for none)    | print (12)  |
/// +------------------------------------------------------+-------------+
/// ```
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
    /// The end of the key's hold: the remote's instant until which it
    /// denies a check of one unit.
    end: AtomicU64,
    /// The floor the node's latest call for the key left.
    floor: AtomicU64,
}

/// The largest instant a field holds, µs (above any the remote gives).
const MAX_US: u64 = u64::MAX >> PRINT_BITS;

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
                end: AtomicU64::new(0),
                floor: AtomicU64::new(0),
            })
            .take(SLOTS)
            .collect(),
        }
    }

    /// The slot of `key` (its `Hash` runs: a panic there propagates).
    pub(crate) fn spot<Q: Hash + ?Sized>(&self, key: &Q) -> Spot {
        let hash = self.salted(key);
        Spot {
            // The low bits pick the slot, the high bits are its print.
            #[allow(clippy::cast_possible_truncation)]
            index: hash as usize % SLOTS,
            print: hash >> (u64::BITS - PRINT_BITS),
        }
    }

    /// The end of `spot`'s key's hold (0: none recorded).
    pub(crate) fn end_us(&self, spot: Spot) -> u64 {
        Self::read(&self.slots[spot.index].end, spot)
    }

    /// The floor the latest call for `spot`'s key left, if recorded.
    pub(crate) fn floor_us(&self, spot: Spot) -> Option<u64> {
        Some(Self::read(&self.slots[spot.index].floor, spot)).filter(|&floor_us| floor_us > 0)
    }

    /// Records, for `spot`'s key, the floor its latest call left at the
    /// remote's `now_us` and the end of the hold it decided (0 for none);
    /// not over another key's hold still running then.
    pub(crate) fn note(&self, spot: Spot, now_us: u64, floor_us: u64, end_us: u64) {
        let fields = &self.slots[spot.index];
        // Relaxed, here and in `read`: each field is whole in its word
        // (its print beside its instant) and publishes nothing else, and
        // no read of it can make a hold admit. A claim may read fields
        // older than the key's word it claimed (whose cell is relaxed
        // too): an older floor is not the word's, and no hold is applied;
        // a newer floor beside an older end applies the hold this key's
        // previous call decided, which only denies, for no longer than
        // that hold's own cap. Another key writing the slot meanwhile
        // leaves a print that is not this key's.
        let other = fields.end.load(Ordering::Relaxed);
        if other & PRINT_MASK != spot.print && other >> PRINT_BITS > now_us {
            return;
        }
        let field = |value_us: u64| value_us.min(MAX_US) << PRINT_BITS | spot.print;
        fields.end.store(field(end_us), Ordering::Relaxed);
        fields.floor.store(field(floor_us), Ordering::Relaxed);
    }

    /// A share of `hold_us` drawn from `draw` (the reply's instant), from
    /// half of it up to all: nodes that called together hold off for
    /// different times, and call again apart. (Held off all alike, a key's
    /// sharers would call in waves, and between waves the key could rest
    /// full.)
    pub(crate) fn spread(&self, hold_us: u64, draw: u64) -> u64 {
        let share = (u128::from(hold_us / 2) * u128::from(self.salted(&draw))) >> u64::BITS;
        // Below `hold_us / 2`: the shift leaves 64 bits.
        #[allow(clippy::cast_possible_truncation)]
        let share = share as u64;
        hold_us - hold_us / 2 + share
    }

    /// `value`'s hash after the salt's.
    fn salted<T: Hash + ?Sized>(&self, value: &T) -> u64 {
        let mut hasher = DefaultHasher::new();
        hasher.write_u64(self.salt);
        value.hash(&mut hasher);
        hasher.finish()
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
        assert_eq!((holds.end_us(a), holds.floor_us(a)), (0, None));
        holds.note(a, 900, 1_000, 5_000);
        assert_eq!((holds.end_us(a), holds.floor_us(a)), (5_000, Some(1_000)));
        // A key whose print differs reads nothing of the slot, whichever
        // it is.
        let other = super::Spot {
            print: a.print ^ 1,
            ..a
        };
        assert_eq!((holds.end_us(other), holds.floor_us(other)), (0, None));
        holds.note(b, 900, 2_000, 0);
        assert_eq!((holds.end_us(b), holds.floor_us(b)), (0, Some(2_000)));
        // An instant beyond the fields' is kept as their largest.
        holds.note(b, 900, u64::MAX, 0);
        assert_eq!(holds.floor_us(b), Some(super::MAX_US));
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
            (holds.end_us(key), holds.floor_us(key)),
            (5_000, Some(2_000))
        );
        // Ended, it gives way.
        holds.note(other, 5_000, 3_000, 9_000);
        assert_eq!((holds.end_us(key), holds.floor_us(key)), (0, None));
        assert_eq!(holds.end_us(other), 9_000);
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
