//! One key's local knowledge of a remote GCRA key, packed in one word, and
//! the pure decision a check takes on it.
//!
//! ```text
//!  63                                             12 11         3 2      0
//! +-------------------------------------------------+------------+--------+
//! | end: remote microseconds (52 bits)               | units (9)  | tag    |
//! +-------------------------------------------------+------------+--------+
//! ```
//!
//! | field | meaning |
//! |---|---|
//! | `end` | a lower bound of the remote key's TAT, on the deciding clock, in whole µs (a hold's floor, without units, may stand above it: it only denies) |
//! | `units` 0..=510 | lease units held: the slots `end − (units − 1)·I`, …, `end` |
//! | `tag`, units 0..=510 | the size class of the next lease: `4 << class` units, at most the configured maximum |
//! | `units` = 511 ([`CLAIMED`]) | one caller is asking the remote (its ask keeps the size class) |
//! | `tag`, claimed | the claim's epoch: `⌊now / claim timeout⌋ mod 8` when it was made |
//!
//! A claim keeps `end`, the floor: it is a lower bound of the TAT, and only
//! such a bound may be compared with a reading. (A claim that wrote its
//! own instant there would deny, to a thread holding an older reading, a
//! request the remote admits.) Its age is the epoch:
//! it stands while the current epoch is its own, the next, or (a reading
//! older than the claim) the one before, and is stale after that, between
//! one and two claim timeouts on; a claim stuck for eight epochs or more
//! stands again for three of every eight, so it is taken over in the
//! others. A claimed word is never idle: three bits cannot date a claim
//! from an instant far from now, and a growth sweep judges idleness a
//! whole rest time in the past (a claim in flight evicted that way would
//! lose its lease). A stuck claim is taken over by the key's
//! next check, and its word is then evicted as any other.
//!
//! `end` never exceeds [`MAX_END_US`], so no word is `u64::MAX`, the value
//! the atomic cell reserves for a retired cell.

use super::{LeaseReply, RemoteQuota};
use crate::algorithm::to_u32;
use crate::decision::Decision;

/// The `units` value of a claimed word.
pub(crate) const CLAIMED: u32 = (1 << UNITS_BITS) - 1;

/// The most units a lease can hold (`CLAIMED` − 1).
pub const MAX_LEASE_UNITS: u32 = CLAIMED - 1;

/// The largest `end` a word holds: 2^52 − 2 µs. The remote's instants are
/// below 2^52 µs plus one span; a later one is kept as this floor (lower:
/// only ever a weaker claim) with no units.
pub(crate) const MAX_END_US: u64 = (1 << END_BITS) - 2;

/// The largest size class, and the epochs' modulus less one.
pub(crate) const MAX_TAG: u32 = (1 << TAG_BITS) - 1;

const END_BITS: u32 = 52;
const UNITS_BITS: u32 = 9;
const TAG_BITS: u32 = 3;
const UNITS_SHIFT: u32 = TAG_BITS;
const END_SHIFT: u32 = TAG_BITS + UNITS_BITS;

/// A word's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Word {
    pub(crate) end_us: u64,
    pub(crate) units: u32,
    /// The size class, or a claim's epoch.
    pub(crate) tag: u32,
}

impl Word {
    /// Packs the fields; `end_us` is clamped to [`MAX_END_US`], `units` and
    /// `tag` must fit their fields.
    pub(crate) const fn pack(self) -> u64 {
        debug_assert!(self.units <= CLAIMED && self.tag <= MAX_TAG);
        let end_us = if self.end_us > MAX_END_US {
            MAX_END_US
        } else {
            self.end_us
        };
        (end_us << END_SHIFT) | ((self.units as u64) << UNITS_SHIFT) | self.tag as u64
    }

    /// The floor without this word's own units (the top slots up to
    /// `end`), which a claim would give back: a lower bound of the remote's
    /// TAT whether or not they are.
    pub(crate) fn floor_us(self, interval_us: u64) -> u64 {
        match self.units {
            CLAIMED => self.end_us,
            units => self.end_us.saturating_sub(u64::from(units) * interval_us),
        }
    }

    /// This word held off until `hold_end_us` under a quota of tolerance
    /// `tolerance_us` and interval `interval_us`: no units, and a floor
    /// raised (never lowered) so that it denies a check of one unit until
    /// then. It stands above the TAT then, and only denies.
    pub(crate) fn held(self, hold_end_us: u64, tolerance_us: u64, interval_us: u64) -> Self {
        Self {
            end_us: self
                .end_us
                .max(hold_end_us.saturating_add(tolerance_us - interval_us)),
            units: 0,
            ..self
        }
    }

    /// The fields of a packed word.
    pub(crate) const fn unpack(word: u64) -> Self {
        // The masks keep each field within its bits: truncation is the point.
        #[allow(clippy::cast_possible_truncation)]
        Self {
            end_us: word >> END_SHIFT,
            units: ((word >> UNITS_SHIFT) & CLAIMED as u64) as u32,
            tag: (word & MAX_TAG as u64) as u32,
        }
    }
}

/// The constants a decision needs, in remote microseconds.
///
/// A check decides by its quota (`interval_us`, `burst`, `tolerance_us`):
/// the view's own, or one a check carries. Lease units belong to the
/// view's own quota, which granted them (`lease_interval_us`,
/// `lease_tolerance_us`): a check of another quota spends none of them and
/// claims no word that holds some (`max_units` is zero in its rules), but
/// its floor is read with their interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    pub(crate) interval_us: u64,
    pub(crate) burst: u32,
    pub(crate) tolerance_us: u64,
    /// The interval of the lease units' slots: the own quota's.
    pub(crate) lease_interval_us: u64,
    /// The tolerance of the quota that granted the lease units.
    pub(crate) lease_tolerance_us: u64,
    /// How long past its slot's deadline a lease unit may still be spent
    /// (`slack × interval`); zero keeps the remote limiter's bound exactly.
    pub(crate) slack_us: u64,
    /// How long a claim stands before another caller may take it over.
    pub(crate) claim_us: u64,
    /// The most units a lease asks for; zero: no leases (the deny cache),
    /// or a check of a quota other than the view's own.
    pub(crate) max_units: u32,
}

/// What a check does, decided on one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Admitted from the lease: write `word` (the lease less the cost).
    Spend { decision: Decision, word: u64 },
    /// Denied: the remote would deny it too. Writes nothing.
    Deny(Decision),
    /// Not decided here: ask the remote.
    Ask(Miss),
}

/// A check this node cannot decide: it asks the remote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Miss {
    /// Ask holding the key's claim: write `word` (claimed; its floor
    /// leaves out the `back` units the old word held, which the ask gives
    /// back). The next lease is of size `class`.
    Claim { word: u64, class: u32, back: u32 },
    /// Ask without a claim. Writes nothing. `behind`: when another
    /// caller holds the key's claim (fresh), the most units the remote can
    /// have free now by this node's knowledge (what it would have once
    /// this node's units were back); `None` when no claim stands (a check
    /// of another quota on a word holding lease units).
    Unclaimed { behind: Option<u32> },
}

impl Rules {
    /// The quota these rules decide by.
    pub(crate) fn quota(&self) -> RemoteQuota {
        RemoteQuota {
            interval_us: self.interval_us,
            burst: self.burst,
        }
    }

    /// These rules for checks of `quota`: decided by it, spending no lease
    /// unit and asking for none.
    pub(crate) fn decided_by(&self, quota: RemoteQuota) -> Self {
        Self {
            interval_us: quota.interval_us,
            burst: quota.burst,
            tolerance_us: quota.tolerance_us(),
            max_units: 0,
            ..*self
        }
    }

    /// Units of `word` that a spend at `now_us` may still use: the lease's
    /// top `units` slots, each until its slot less one interval (plus the
    /// slack). A unit at slot `s` serves while `now + interval <= s +
    /// slack`, so the count is `min(units, ⌊(end + slack − now) / interval⌋)`.
    /// None for a check of another quota than the lease's (`max_units` of
    /// zero).
    #[inline]
    pub(crate) fn usable(&self, word: Word, now_us: u64) -> u32 {
        if word.units == CLAIMED || word.units == 0 || self.max_units == 0 {
            return 0;
        }
        let interval_us = self.lease_interval_us;
        let mut slack_us = self.slack_us;
        if crate::sync::canary::planted(crate::sync::canary::Canary::LeaseOneLate) {
            slack_us += interval_us;
        }
        let horizon_us = (word.end_us + slack_us).saturating_sub(now_us);
        // A lease far from its deadlines (a drained key's) needs no division.
        if horizon_us >= u64::from(word.units) * interval_us {
            word.units
        } else {
            to_u32(horizon_us / interval_us)
        }
    }

    /// The earliest instant (ns, on the remote's axis) at which `packed`
    /// can hold: a word with lease units was granted them by an admission
    /// at some remote instant `s` with `end − tolerance ≤ s` (GCRA's
    /// conformance test), so it exists no earlier than that; 0 for a word
    /// without units. A decision on the word is taken no earlier: this
    /// holds even for a reading taken before a sibling installed the
    /// lease, which the view's floor from its latest round trip cannot
    /// cover (that floor is read before the word is loaded).
    pub(crate) fn granted_ns(&self, packed: u64) -> u64 {
        let word = Word::unpack(packed);
        if word.units == 0 || word.units == CLAIMED {
            return 0;
        }
        word.end_us
            .saturating_sub(self.lease_tolerance_us)
            .saturating_mul(1_000)
    }

    /// The decision for `cost` units (already validated: 1 to the burst) at
    /// `now_ns` on the deciding clock's axis (an upper bound of the remote's
    /// reading), on `packed`.
    #[inline]
    pub(crate) fn outcome(&self, packed: u64, reading_ns: u64, cost: u32) -> Outcome {
        let word = Word::unpack(packed);
        let now_us = reading_ns / 1_000;
        let usable = self.usable(word, now_us);
        if crate::sync::canary::planted(crate::sync::canary::Canary::LeaseNeverExpires)
            && word.units != CLAIMED
            && self.max_units > 0
            && word.units >= cost
        {
            return self.spend(word, word.units, reading_ns, cost);
        }
        if cost <= usable {
            return self.spend(word, usable, reading_ns, cost);
        }
        // The remote's debt is at least `end − now`: its TAT only moves
        // later (admissions move it on, denials write nothing, time pays it
        // back one for one), so a cost it already exceeds is denied there.
        // (A hold's floor stands above the TAT on purpose: denied here
        // though the remote might admit, for as long as the hold lasts.)
        // Not counting this node's own units: asked for, it would give them
        // back, and the remote would decide without them.
        let floor_us = word.floor_us(self.lease_interval_us);
        let debt_us = floor_us.saturating_sub(now_us);
        let mut max_debt_us = self.tolerance_us - u64::from(cost) * self.interval_us;
        if crate::sync::canary::planted(crate::sync::canary::Canary::DenyCacheOutlives) {
            max_debt_us = max_debt_us.saturating_sub(self.interval_us);
        }
        // What the remote would have free once this node's units were back
        // (which counts them: not added again).
        let free = to_u32((self.tolerance_us - debt_us.min(self.tolerance_us)) / self.interval_us)
            .min(self.burst);
        let at_the_boundary = debt_us == max_debt_us
            && debt_us > 0
            && crate::sync::canary::planted(crate::sync::canary::Canary::DenyAtTheBoundary);
        if debt_us > max_debt_us || at_the_boundary {
            let end_ns = floor_us * 1_000;
            let conforms_ns = (floor_us - max_debt_us) * 1_000;
            return Outcome::Deny(Decision::deny(
                self.burst,
                free,
                // Positive (the debt exceeds its most), but for a canary's.
                conforms_ns.saturating_sub(reading_ns).max(1),
                end_ns - reading_ns,
            ));
        }
        if word.units == CLAIMED && self.stands(word.tag, now_us) {
            return Outcome::Ask(Miss::Unclaimed { behind: Some(free) });
        }
        if self.max_units == 0
            && word.units != CLAIMED
            && word.units != 0
            && !crate::sync::canary::planted(crate::sync::canary::Canary::TierClaimsLease)
        {
            // A check of another quota than the lease's: a claim would give
            // the units back at its own interval, not theirs.
            return Outcome::Ask(Miss::Unclaimed { behind: None });
        }
        let (claimed, class) = self.claim(word, usable, now_us);
        Outcome::Ask(Miss::Claim {
            word: claimed,
            class,
            back: match word.units {
                CLAIMED => 0,
                units => units,
            },
        })
    }

    /// The spend of `cost` of `usable` units.
    fn spend(&self, word: Word, usable: u32, now_ns: u64, cost: u32) -> Outcome {
        let left = usable - cost;
        Outcome::Spend {
            decision: Decision::allow(
                self.burst,
                left,
                (word.end_us * 1_000).saturating_sub(now_ns),
            ),
            word: Word {
                units: left,
                ..word
            }
            .pack(),
        }
    }

    /// The claimed word a miss writes (the floor without the units it gives
    /// back, the claim's epoch), and the next lease's size class: larger
    /// after a lease that ran out, smaller after one whose units expired
    /// unspent.
    pub(crate) fn claim(&self, word: Word, usable: u32, now_us: u64) -> (u64, u32) {
        let class = if word.units == CLAIMED {
            // A stale claim taken over: its class is lost with its ask.
            0
        } else if self.max_units == 0 {
            // No lease asked for: the next lease's size stays as it was.
            word.tag
        } else if word.units == 0 {
            (word.tag + 1).min(MAX_TAG)
        } else if usable < word.units {
            word.tag.saturating_sub(1)
        } else {
            word.tag
        };
        // The units go back with the claim's call: whether the remote takes
        // them (the TAT moves back by them) or not (someone was admitted
        // after them, and the TAT is higher still), the floor without them
        // is a lower bound of the TAT.
        let claimed = Word {
            end_us: word.floor_us(self.lease_interval_us),
            units: CLAIMED,
            tag: self.epoch(now_us),
        };
        (claimed.pack(), class)
    }

    /// The claim epoch of `now_us`.
    fn epoch(&self, now_us: u64) -> u32 {
        // The mask keeps the epoch within its bits: truncation is the point.
        #[allow(clippy::cast_possible_truncation)]
        let epoch = ((now_us / self.claim_us) & u64::from(MAX_TAG)) as u32;
        epoch
    }

    /// Whether a claim of `epoch` still stands at `now_us`: its epoch, the
    /// next, or the one before.
    fn stands(&self, epoch: u32, now_us: u64) -> bool {
        let age = self.epoch(now_us).wrapping_sub(epoch) & MAX_TAG;
        age <= 1 || age == MAX_TAG
    }

    /// The units a claim of `class` asks for beyond its own cost.
    pub(crate) fn want(&self, class: u32) -> u32 {
        (4_u32 << class).min(self.max_units)
    }

    /// Whether `packed` decides as no knowledge at all at `now_ns` and
    /// after: a floor at or before now, no unit left (with the slack), and
    /// no claim (see the module documentation).
    pub(crate) fn is_idle(&self, packed: u64, reading_ns: u64) -> bool {
        let word = Word::unpack(packed);
        word.units != CLAIMED && word.end_us.saturating_add(self.slack_us) <= reading_ns / 1_000
    }
}

/// How long a node that asked `want` lease units beside its own holds off
/// asking again (once the units `reply` granted are spent) for a key it
/// had known at the floor `floor_us` after its previous call, when other
/// nodes take from the key too
/// ([`Leases::with_holds`](super::Leases::with_holds)).
///
/// The TAT moved from the floor to `reply.end_us` by every admission since,
/// `taken` of them this node's (the call's cost and the units granted: its
/// previous lease lies below the floor). Their ratio estimates how many
/// nodes share the key, as if each took what this node did; holding off
/// for as many times a lease's refill time (`sharers × want × interval`)
/// leaves the key, on average, a lease's worth of units for each sharer's
/// call. Sharers that took larger leases than this node's cost are counted
/// several times, so the hold never outlasts the key's debt after the
/// reply (`reply.end_us − reply.now_us`, the time until the key would be
/// fully rested if nobody took from it again): the key never rests full
/// during a hold, whatever the sharers do. No hold while the remote has
/// half its burst free or more (the key has room), when the floor is older
/// than a tolerance or unknown, or with fewer than two sharers. A hold only
/// denies here what the remote might admit: it never admits.
pub(crate) fn hold_us(
    quota: &RemoteQuota,
    floor_us: u64,
    reply: &LeaseReply,
    taken: u32,
    want: u32,
) -> u64 {
    let (interval_us, tolerance_us) = (quota.interval_us, quota.tolerance_us());
    if want == 0
        || reply.remaining >= quota.burst / 2
        || floor_us == 0
        || floor_us.saturating_add(tolerance_us) < reply.now_us
    {
        return 0;
    }
    let admitted = reply.end_us.saturating_sub(floor_us) / interval_us;
    let sharers = admitted / u64::from(taken.max(1));
    if sharers < 2 {
        return 0;
    }
    sharers
        .saturating_mul(u64::from(want))
        .saturating_mul(interval_us)
        .min(reply.end_us.saturating_sub(reply.now_us))
}

#[cfg(all(test, not(any(feature = "loom", feature = "shuttle"))))]
mod tests {
    use super::{
        CLAIMED, MAX_END_US, MAX_LEASE_UNITS, MAX_TAG, Miss, Outcome, Rules, Word, hold_us,
    };
    use crate::remote::{LeaseReply, RemoteQuota};

    fn rules(interval_us: u64, burst: u32, max_units: u32) -> Rules {
        Rules {
            interval_us,
            burst,
            tolerance_us: interval_us * u64::from(burst),
            lease_interval_us: interval_us,
            lease_tolerance_us: interval_us * u64::from(burst),
            slack_us: 0,
            claim_us: 1_000_000,
            max_units,
        }
    }

    #[test]
    fn packs_and_unpacks_every_field_at_its_edges() {
        for word in [
            Word::default(),
            Word {
                end_us: MAX_END_US,
                units: CLAIMED,
                tag: MAX_TAG,
            },
            Word {
                end_us: 1,
                units: MAX_LEASE_UNITS,
                tag: 0,
            },
            Word {
                end_us: 1_764_831_234_567_891,
                units: 1,
                tag: 5,
            },
        ] {
            assert_eq!(Word::unpack(word.pack()), word);
        }
        // The largest word is not the retired marker.
        let top = Word {
            end_us: u64::MAX,
            units: CLAIMED,
            tag: MAX_TAG,
        };
        assert_ne!(top.pack(), u64::MAX);
        assert_eq!(Word::unpack(top.pack()).end_us, MAX_END_US);
    }

    #[test]
    fn a_unit_serves_until_its_slot_less_one_interval() {
        // Interval 10 µs; a lease of 3 units at slots 80, 90, 100.
        let rules = rules(10, 10, 8);
        let lease = Word {
            end_us: 100,
            units: 3,
            tag: 0,
        };
        assert_eq!(rules.usable(lease, 0), 3);
        assert_eq!(rules.usable(lease, 70), 3, "slot 80 serves until 70");
        assert_eq!(rules.usable(lease, 71), 2);
        assert_eq!(rules.usable(lease, 90), 1);
        assert_eq!(rules.usable(lease, 91), 0);
        // In nanoseconds: 70 999 ns reads 70 µs.
        assert!(matches!(
            rules.outcome(lease.pack(), 70_999, 3),
            Outcome::Spend { .. }
        ));
        assert!(!matches!(
            rules.outcome(lease.pack(), 71_000, 3),
            Outcome::Spend { .. }
        ));
    }

    #[test]
    fn the_floor_denies_exactly_what_the_remote_would() {
        // Burst 10 at 10 µs: tolerance 100. A floor at 1 100 µs, now 1 000:
        // the remote owes at least 100 µs, so nothing fits until 1 010.
        let rules = rules(10, 10, 0);
        let floor = Word {
            end_us: 1_100,
            units: 0,
            tag: 0,
        }
        .pack();
        let Outcome::Deny(denied) = rules.outcome(floor, 1_000_000, 1) else {
            panic!("the floor denies");
        };
        assert_eq!(denied.retry_after().as_nanos(), 10_000);
        assert_eq!(denied.reset_after().as_nanos(), 100_000);
        // From 1 010 µs a unit may fit there: ask.
        assert!(matches!(
            rules.outcome(floor, 1_010_000, 1),
            Outcome::Ask(Miss::Claim { .. })
        ));
        // A cost of 3 waits 20 µs more.
        let Outcome::Deny(denied) = rules.outcome(floor, 1_010_000, 3) else {
            panic!("the floor denies a larger cost longer");
        };
        assert_eq!(denied.retry_after().as_nanos(), 20_000);
    }

    #[test]
    fn a_nodes_own_units_deny_nothing_that_giving_them_back_admits() {
        // 10 ms, burst 10 (tolerance 100 000 µs): a lease of 4 units up to
        // +60 ms. A request of 6 units cannot be spent from it; the remote
        // would owe 60 ms with the units, 20 ms once they are given back,
        // and 6 units fit below 40 ms of debt: ask, giving them back.
        let rules = rules(10_000, 10, 8);
        let lease = Word {
            end_us: 1_060_000,
            units: 4,
            tag: 1,
        };
        assert!(matches!(
            rules.outcome(lease.pack(), 1_000_000_000, 6),
            Outcome::Ask(Miss::Claim { .. })
        ));
        // A request of 9 units would need the debt at 10 ms: denied here,
        // its wait counted without the units (10 ms), as the remote would
        // count it once they are back.
        let Outcome::Deny(denied) = rules.outcome(lease.pack(), 1_000_000_000, 9) else {
            panic!("denied");
        };
        assert_eq!(denied.retry_after().as_millis(), 10);
    }

    #[test]
    fn a_claim_s_floor_leaves_out_the_units_it_gives_back() {
        // A lease of 3 units up to 1 100 µs (interval 10): the claim gives
        // them back, and its floor is 1 070 whether the remote takes them
        // or not.
        let rules = rules(10, 10, 8);
        let lease = Word {
            end_us: 1_100,
            units: 3,
            tag: 2,
        };
        let Outcome::Ask(Miss::Claim { word, back, .. }) =
            rules.outcome(lease.pack(), 1_095_000, 5)
        else {
            panic!("a claim")
        };
        assert_eq!(back, 3);
        assert_eq!(Word::unpack(word).end_us, 1_070);
    }

    #[test]
    fn a_fresh_claim_stands_and_a_stale_one_is_taken_over() {
        // Claims of 1 s: epochs of 1 000 000 µs.
        let rules = rules(10, 10, 8);
        let floor = Word {
            end_us: 2_500_000,
            units: 0,
            tag: 0,
        };
        let (claimed, class) = rules.claim(floor, 0, 2_400_000);
        assert_eq!(class, 1);
        let word = Word::unpack(claimed);
        assert_eq!((word.end_us, word.units, word.tag), (2_500_000, CLAIMED, 2));
        // The floor still denies what it denied; a miss does not claim.
        assert!(matches!(
            rules.outcome(claimed, 2_400_000_000, 1),
            Outcome::Deny(_)
        ));
        // 50 µs before the floor, of its 100: at most 5 units free.
        assert_eq!(
            rules.outcome(claimed, 2_499_950_000, 1),
            Outcome::Ask(Miss::Unclaimed { behind: Some(5) })
        );
        assert_eq!(
            rules.outcome(claimed, 2_900_000_000, 1),
            Outcome::Ask(Miss::Unclaimed { behind: Some(10) })
        );
        // Epochs 1 (an older reading), 2 and 3 stand; from 4 it is stale.
        assert_eq!(
            rules.outcome(claimed, 1_999_999_000, 1),
            Outcome::Deny(match rules.outcome(floor.pack(), 1_999_999_000, 1) {
                Outcome::Deny(decision) => decision,
                other => panic!("{other:?}"),
            })
        );
        assert_eq!(
            rules.outcome(claimed, 3_999_999_000, 1),
            Outcome::Ask(Miss::Unclaimed { behind: Some(10) })
        );
        assert!(matches!(
            rules.outcome(claimed, 4_000_000_000, 1),
            Outcome::Ask(Miss::Claim { class: 0, .. })
        ));
        // Never idle, whenever it is judged: a sweep judges a rest time in
        // the past, where the epochs alias.
        for reading_ns in [0, 1_000_000_000, 4_000_000_000, u64::MAX] {
            assert!(!rules.is_idle(claimed, reading_ns));
        }
    }

    #[test]
    fn lease_sizes_grow_when_spent_and_shrink_when_units_expire() {
        let rules = rules(10, 1_000, 300);
        let spent = Word {
            end_us: 500,
            units: 0,
            tag: 2,
        };
        assert_eq!(rules.claim(spent, 0, 400).1, 3);
        let expired = Word {
            end_us: 500,
            units: 5,
            tag: 2,
        };
        assert_eq!(rules.claim(expired, rules.usable(expired, 480), 480).1, 1);
        assert_eq!(rules.want(0), 4);
        assert_eq!(rules.want(6), 256);
        assert_eq!(rules.want(7), 300, "capped by the configured maximum");
    }

    #[test]
    fn a_hold_lasts_a_lease_s_refill_for_each_sharer() {
        // 10 µs, burst 1 000 (tolerance 10 ms). A call of cost 1 wanting
        // 16 units, admitted with none leased at 50 ms, 100 units free
        // after it: the TAT at 59 ms, a debt of 9 ms.
        let quota = RemoteQuota::new(10, 1_000).unwrap();
        let reply = |remaining| LeaseReply::new(true, remaining, 0, 9_000, 0, 59_000, 50_000, 0);
        // Three units admitted since the floor, one of them this call's:
        // three sharers, 3 × 16 × 10 µs.
        let near = 59_000 - 3 * 10;
        assert_eq!(hold_us(&quota, near, &reply(100), 1, 16), 480);
        // A call of cost 2: one sharer and a half, none held.
        assert_eq!(hold_us(&quota, near, &reply(100), 2, 16), 0);
        // 64 units: 10.24 ms, cut to the debt.
        let far = 59_000 - 64 * 10;
        assert_eq!(hold_us(&quota, far, &reply(100), 1, 16), 9_000);
        // None: half the burst free, no lease wanted, no known floor, or a
        // floor older than a tolerance.
        assert_eq!(hold_us(&quota, near, &reply(500), 1, 16), 0);
        assert_eq!(hold_us(&quota, near, &reply(100), 1, 0), 0);
        assert_eq!(hold_us(&quota, 0, &reply(100), 1, 16), 0);
        assert_eq!(hold_us(&quota, 39_999, &reply(100), 1, 16), 0);
        // A denial took nothing: every unit since was a sharer's, three of
        // them.
        assert_eq!(hold_us(&quota, near, &reply(100), 0, 16), 480);
    }
}
