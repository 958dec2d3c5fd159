//! The view: a node's knowledge of a remote GCRA limiter's keys
//! ([`LocalView`]), and the calls a check needs ([`Ask`]).
//!
//! Each key's knowledge is one `AtomicU64` in the crate's lock-free table
//! (`word.rs` documents the layout): a lower bound `end` of the remote TAT
//! (or, with holds, a floor raised past it that only denies), the lease
//! units held (the top slots up to `end`), and the next lease's size. A
//! check is the table's check with an algorithm of this module's:
//! a spend from the lease is one compare-and-swap; a denial (the floor
//! `end` denies) is a load and a compare and writes nothing; a miss
//! **claims** the key (one compare-and-swap) and asks the remote, so one
//! caller at a time asks for a key's lease, and others that miss meanwhile
//! ask without a claim. A miss (claimed or not) is a `Miss`; the table
//! returns a [`Decision`] for every algorithm, so a miss crosses it encoded
//! as a decision no algorithm makes, and is decoded as soon as it is out
//! (`impl Miss` below: nothing else reads the encoding).
//!
//! Times: a check's instant is the local clock's, **read after the key's
//! word is loaded** (so that no knowledge is acted on at an instant older
//! than itself); the remote decides on its own. `offset.rs` keeps an upper
//! bound of the remote's reading at a local instant, measured from each
//! round trip's send, so that a unit is spent before its deadline on the
//! remote's clock and a cached denial ends no later than the remote's (a
//! hold's, on purpose, later).
//!
//! A reply installs the new knowledge with a compare-and-exchange from the
//! claimed word. A claim whose caller never completes (its future dropped:
//! [`Ask`]'s `Drop` releases it; or a panic) stands one to two claim
//! timeouts and is then taken over by the key's next check. Releasing a
//! claim drops the units it held, and never puts them back (the remote may
//! have taken them back already), unless the call was never sent
//! ([`Ask::not_sent`]).
//!
//! Memory is the table's: a key's word is evicted when it knows nothing
//! useful (its floor has passed, no unit is left and it is not claimed), the
//! key cap rejects new keys (they are then asked without a claim), and so
//! memory is bounded at every instant as in every store.

use std::cell::Cell;
use std::fmt;
use std::num::{NonZeroU64, NonZeroUsize};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, TryLockError};
use std::time::Duration;

use super::holds::{Holds, Spot};
use super::offset::{Offset, RemoteClock};
use super::word::{MAX_END_US, Miss, Outcome, Rules, Word, hold_us};
use super::{GiveBack, LeaseReply, LeaseRequest, Leases, MAX_SPAN_US, RemoteError, RemoteQuota};
use crate::algorithm::{Algorithm, Carry, CarryAt, PackedAlgorithm, Verdict, validate_cost};
use crate::cell::{Atomic, CellFor, Preferred};
use crate::clock::{Clock, MonotonicClock, saturating_nanos};
use crate::decision::Decision;
use crate::error::{CheckError, LayoutError};
use crate::quota::Quota;
use crate::store::{
    DefaultStore, Generation, Key, KeyCap, Lookup, Own, Store, StoreKind, Under, WhenFull,
};
use crate::sync::canary::{self, Canary};

/// The word the table stores for a key (`word.rs` documents its layout).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Knowledge(u64);

/// The clocks every generation of a view decides on: the local clock, and
/// the offset that bounds the remote's reading at a local one.
struct Clocks {
    clock: Box<dyn Clock>,
    offset: Offset,
}

impl Clocks {
    /// An upper bound of the remote's instant now, ns; `None` before the
    /// first round trip.
    fn remote_now(&self) -> Option<u64> {
        self.offset.remote_ns(self.clock.now_ns())
    }
}

/// How many quotas other than its own a generation's checks may carry
/// with local decisions; checks of any further quota are asked.
pub(crate) const TIERS: usize = 16;

/// The table's algorithm: the rules, the clocks a decision reads, what the
/// view's user attached to the generation (`payload`), and the judges of
/// the other quotas its checks carried.
///
/// **A decision reads its instant after the cell loaded the key's word**
/// (in `decide`), never before: knowledge is only ever acted on at an
/// instant no older than itself. (A reading taken before the load could
/// predate a lease a sibling thread installed meanwhile; spent "at" that
/// reading, a unit's slot would lie more than a tolerance after it, which
/// the remote never admits.) So this is the
/// one algorithm whose `decide` is not a pure function of its arguments:
/// it is `Rules::outcome`, which is, at the instant read there. The
/// `now_ns` the table passes (the remote's instant at the latest round
/// trip, for its sweeps: no clock read on the hot path but this one) is a
/// floor, and so is the earliest instant the word's lease can have been
/// granted at (`Rules::granted_ns`): the table's floor is read before the
/// word is loaded, so a lease a sibling installs in between is not under
/// it, but the word itself always is.
pub(crate) struct Judge<P> {
    rules: Rules,
    clocks: Arc<Clocks>,
    payload: P,
    /// The judges of other quotas, each made by the first check that
    /// carries its quota, in the first free slot (empty in those judges).
    tiers: Box<[OnceLock<Judge<P>>]>,
    /// Held, by `try_lock` only, by the check making a judge: no check
    /// waits on another's making one (a check runs inside the table's read
    /// section, where a wait would hold reclamation back); one that finds
    /// a judge being made asks the remote instead.
    making: Mutex<()>,
}

impl<P: Copy> Judge<P> {
    /// The judge of `quota` for checks of this generation: its own, or
    /// one of the other quotas' (`None` when every slot holds another, or
    /// while another check makes one).
    fn for_tier(&self, quota: RemoteQuota) -> Option<&Self> {
        if self.rules.quota() == quota {
            return Some(self);
        }
        for slot in &self.tiers {
            let judge = if let Some(judge) = slot.get() {
                judge
            } else {
                let _making = match self.making.try_lock() {
                    Ok(making) => making,
                    Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                    Err(TryLockError::WouldBlock) => return None,
                };
                // No other check initializes a slot without the lock: this
                // never waits.
                slot.get_or_init(|| Judge {
                    rules: self.rules.decided_by(quota),
                    clocks: Arc::clone(&self.clocks),
                    payload: self.payload,
                    tiers: Box::new([]),
                    making: Mutex::new(()),
                })
            };
            if judge.rules.quota() == quota {
                return Some(judge);
            }
        }
        None
    }
}

impl<P: Copy + Default + Send + Sync + 'static> Algorithm for Judge<P> {
    type State = Knowledge;
    type Admission = Knowledge;

    /// The deny cache's rules for `quota`, on the monotonic clock, deciding
    /// on it (not used by the view, which builds its own).
    fn from_quota(quota: &Quota) -> Self {
        let interval_us = quota.emission_interval_ns().div_ceil(1_000);
        let tolerance_us = interval_us * u64::from(quota.burst());
        Judge {
            rules: Rules {
                interval_us,
                burst: quota.burst(),
                tolerance_us,
                lease_interval_us: interval_us,
                lease_tolerance_us: tolerance_us,
                slack_us: 0,
                claim_us: 1_000_000,
                max_units: 0,
            },
            clocks: Arc::new(Clocks {
                clock: Box::new(MonotonicClock::new()),
                offset: Offset::new(RemoteClock::Local),
            }),
            payload: P::default(),
            tiers: Box::new([]),
            making: Mutex::new(()),
        }
    }

    fn capacity(&self) -> u32 {
        self.rules.burst
    }

    /// Every key's knowledge is forgotten: what the remote told of a key
    /// stays true under any quota, but a change of quota is carried on the
    /// remote too, which may move a key's arrival time back; and lease
    /// units are of the quota that granted them.
    fn carry(&self, to: &Self, carry: Carry, state: &Knowledge, at: CarryAt) -> Option<Knowledge> {
        let _ = (to, carry, state, at);
        Some(Knowledge::default())
    }

    #[inline]
    fn decide(
        &self,
        state: &Knowledge,
        now_ns: u64,
        cost: u32,
    ) -> Result<Verdict<Knowledge>, CheckError> {
        validate_cost(cost, self.rules.burst)?;
        let remote_ns = self
            .clocks
            .remote_now()
            .map_or(now_ns, |fresh| fresh.max(now_ns))
            .max(self.rules.granted_ns(state.0));
        Ok(match self.rules.outcome(state.0, remote_ns, cost) {
            Outcome::Spend { decision, word } => Verdict::Allow {
                decision,
                admission: Knowledge(word),
            },
            Outcome::Deny(decision) => Verdict::Deny(decision),
            Outcome::Ask(miss) => miss.verdict(),
        })
    }

    #[inline]
    fn admit(&self, state: &mut Knowledge, admission: Knowledge) {
        *state = admission;
    }

    fn is_idle(&self, state: &Knowledge, now_ns: u64) -> bool {
        self.rules.is_idle(state.0, now_ns)
    }

    fn rest_ns(&self) -> u64 {
        self.rules
            .tolerance_us
            .saturating_add(self.rules.slack_us.max(self.rules.claim_us))
            .saturating_mul(1_000)
    }
}

/// A peek under the generation's own quota, noting the payload of the
/// generation it was last chosen in: the one that decided.
struct Noting<P> {
    payload: Cell<Option<P>>,
}

impl<P: Copy + Default + Send + Sync + 'static> Under<Judge<P>> for Noting<P> {
    type Chosen<'g> = &'g Judge<P>;

    #[inline]
    fn choose<'g>(&self, generation: &'g Generation<Judge<P>>) -> Result<&'g Judge<P>, CheckError> {
        let judge = generation.algorithm();
        self.payload.set(Some(judge.payload));
        Ok(judge)
    }
}

/// A check under a quota of its own: decided by its generation's judge of
/// that quota ([`Judge::for_tier`]). Without one, it notes the
/// generation's payload, for the ask that the check becomes.
struct Tier<P> {
    quota: RemoteQuota,
    unjudged: Cell<Option<P>>,
}

impl<P: Copy + Default + Send + Sync + 'static> Under<Judge<P>> for Tier<P> {
    type Chosen<'g> = &'g Judge<P>;

    #[inline]
    fn choose<'g>(&self, generation: &'g Generation<Judge<P>>) -> Result<&'g Judge<P>, CheckError> {
        let own = generation.algorithm();
        own.for_tier(self.quota).ok_or_else(|| {
            self.unjudged.set(Some(own.payload));
            CheckError::Layout(LayoutError::Unsupported)
        })
    }
}

impl<P: Copy + Default + Send + Sync + 'static> PackedAlgorithm for Judge<P> {
    /// The word itself; never `u64::MAX` (see `word.rs`).
    #[inline]
    fn pack(&self, state: &Knowledge) -> u64 {
        state.0
    }

    #[inline]
    fn unpack(&self, word: u64) -> Knowledge {
        Knowledge(word)
    }
}

impl<P: Copy + Default + Send + Sync + 'static> CellFor<Judge<P>> for Preferred {
    type Cell = Atomic<Judge<P>>;
}

impl<P> fmt::Debug for Judge<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Judge")
            .field("rules", &self.rules)
            .field("offset", &self.clocks.offset)
            .finish_non_exhaustive()
    }
}

/// The limit of the decisions that carry a [`Miss`] out of the table: no
/// algorithm's (every quota's burst is at least 1).
const MARKER: u32 = 0;

/// The bits of a carried claim's size class.
const TAG_BITS: u32 = 3;

/// How a [`Miss`] crosses the table. The table answers every check with a
/// [`Decision`] (its `Store::check` is every algorithm's), so a miss leaves
/// it as a decision no algorithm makes, with a limit of [`MARKER`], and is
/// a `Miss` again as soon as it is out ([`Miss::carried_by`]): nothing else
/// reads the encoding. A claim is admitted (the table writes its claimed
/// word), its reset field carrying the claimed word and its remaining field
/// the units it gives back (shifted) and the next lease's size class; an
/// unclaimed miss is denied, and writes nothing.
impl Miss {
    /// The verdict that carries this miss out of the table.
    fn verdict(self) -> Verdict<Knowledge> {
        match self {
            Miss::Claim { word, class, back } => Verdict::Allow {
                decision: Decision::allow(MARKER, (back << TAG_BITS) | class, word),
                admission: Knowledge(word),
            },
            // Behind a claim: its free units, and a reset of 1 ns; behind
            // none, a reset of 2 ns.
            Miss::Unclaimed { behind } => Verdict::Deny(match behind {
                Some(free) => Decision::deny(MARKER, free, 1, 1),
                None => Decision::deny(MARKER, 0, 1, 2),
            }),
        }
    }

    /// The miss `decision` carries out of the table, or `None` for a
    /// decision taken here.
    fn carried_by(decision: &Decision) -> Option<Self> {
        if decision.limit() != MARKER {
            return None;
        }
        if !decision.is_allowed() {
            return Some(Miss::Unclaimed {
                behind: (decision.reset_after().as_nanos() == 1).then(|| decision.remaining()),
            });
        }
        let carried = decision.remaining();
        Some(Miss::Claim {
            word: saturating_nanos(decision.reset_after()),
            class: carried & ((1 << TAG_BITS) - 1),
            back: carried >> TAG_BITS,
        })
    }
}

/// A node's knowledge of a remote GCRA limiter's keys, in the crate's
/// lock-free table: its exact deny cache, and its leases when it leases
/// (see the `remote` module's guarantees).
///
/// It reads its instants from the clock it is given, after loading a key's
/// word (see [`Ask::sent_ns`] for the instant an ask is sent at).
///
/// ```
/// use std::num::NonZeroUsize;
/// use std::time::Duration;
/// use tollgate::clock::ManualClock;
/// use tollgate::remote::{lease, Leases, Local, LocalView, RemoteClock, RemoteQuota};
///
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // 100 a second (10 ms), bursts of 100; the remote is simulated by the
/// // script's Rust twin, deciding on the node's readings (its clock).
/// let quota = RemoteQuota::new(10_000, 100)?;
/// let clock = ManualClock::new();
/// clock.set(Duration::from_secs(1));
/// let view: LocalView<String> = LocalView::new(
///     quota,
///     RemoteClock::Local,
///     clock.clone(),
///     Some(Leases::new()),
///     NonZeroUsize::new(10_000).unwrap(),
///     Duration::from_secs(1),
/// )?;
/// let (mut tat_us, mut round_trips, mut admitted) = (None, 0, 0);
/// for _ in 0..20 {
///     match view.check("alice", 1)? {
///         Local::Decided(decision) => admitted += u32::from(decision.is_allowed()),
///         Local::Ask(ask) => {
///             round_trips += 1;
///             let now_us = ask.sent_ns() / 1_000;
///             let (reply, stored) = lease(tat_us, now_us, &quota, ask.request())?;
///             tat_us = stored.or(tat_us);
///             admitted += u32::from(reply.allowed);
///             ask.complete(&reply);
///         }
///     }
/// }
/// assert_eq!(admitted, 20);
/// // The first round trip leases 8 units, the second 16 (a lease spent in
/// // full doubles the next).
/// assert_eq!(round_trips, 2);
/// # Ok(())
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
#[doc(hidden)]
pub struct LocalView<K: Key, P = ()>
where
    P: Copy + Default + Send + Sync + 'static,
{
    /// The clocks every generation decides on.
    clocks: Arc<Clocks>,
    /// What the rules of a new quota are made with.
    leases: Option<Leases>,
    claim_us: u64,
    /// The holds beside the words, with [`Leases::with_holds`].
    holds: Option<Holds>,
    /// Held by [`set_quota`](LocalView::set_quota): one change at a time.
    changing: Mutex<()>,
    store: <DefaultStore as StoreKind<K, Judge<P>>>::Store,
}

/// The answer of [`LocalView::check`] (`R`: the decision) and of
/// [`LocalView::check_then`] (`R`: what its closure made of the decision
/// and its quota's payload). Small: a local decision, the hot path, is
/// returned through it.
#[doc(hidden)]
#[derive(Debug)]
#[must_use = "an ask must be sent to the remote, or dropped"]
pub enum Local<'a, K: Key, P = (), R = Decision>
where
    P: Copy + Default + Send + Sync + 'static,
{
    /// A decision taken here: spent from the lease, or denied by what the
    /// remote told.
    Decided(R),
    /// A call the remote must answer before the check is decided.
    Ask(Ask<'a, K, P>),
}

/// A call to the remote that a check needs: send [`request`](Ask::request)
/// under [`quota`](Ask::quota) (deciding at [`sent_ns`](Ask::sent_ns) when
/// the remote decides on the local clock's readings), then
/// [`complete`](Ask::complete) it with the reply. Dropping it (the call
/// failed, or its future was dropped) releases the key's claim.
#[doc(hidden)]
pub struct Ask<'a, K: Key, P = ()>
where
    P: Copy + Default + Send + Sync + 'static,
{
    view: &'a LocalView<K, P>,
    /// Boxed: an ask is followed by a round trip, and a check's answer
    /// stays small.
    asked: Box<Asked<K, P>>,
}

/// An ask's own part.
struct Asked<K, P> {
    /// The key, the word it was claimed with and the word to put back if
    /// the call is never sent, if this ask holds the key's claim; and the
    /// number of the generation it was claimed in (only that generation's
    /// word is ever written back).
    claim: Option<(K, Knowledge, Knowledge, NonZeroU64)>,
    /// The size class of the lease asked for (kept in the key's word
    /// again when this ask ends).
    class: u32,
    request: LeaseRequest,
    quota: RemoteQuota,
    payload: P,
    sent_ns: u64,
    /// For an ask made while another caller holds the key's claim, the
    /// most units the remote can have free, by what this node knew when
    /// the check missed.
    behind: Option<u32>,
    /// The claimed key's slot in the view's holds, with holds.
    spot: Option<Spot>,
}

/// What a check's generation tells an ask: the number of the generation,
/// the rules it decided by, and their payload.
#[derive(Clone, Copy)]
struct Decided<P> {
    number: NonZeroU64,
    rules: Rules,
    payload: P,
}

/// What a check's table returns: a decision taken here (what the caller's
/// closure made of it), or a miss with its generation's part (boxed: the
/// hot path returns the first).
enum Finished<P, R> {
    Decided(R),
    Missed(Miss, Box<Decided<P>>),
}

impl<K: Key, P: Copy + Default + Send + Sync + 'static> LocalView<K, P> {
    /// A view of the remote limiter `quota`, deciding on `remote` and
    /// reading local instants from `clock`: a deny cache, with `leases`
    /// when given; at most `max_keys` keys held (a new key beyond them is
    /// asked without a claim); a claim stands one to two `claim_timeout`s
    /// before another caller takes it over (twice the remote call's
    /// timeout is right). Its payload is `P`'s default.
    ///
    /// # Errors
    ///
    /// [`RemoteError::SpanTooLong`] when the slack's intervals exceed 2^51
    /// µs.
    pub fn new(
        quota: RemoteQuota,
        remote: RemoteClock,
        clock: impl Clock + 'static,
        leases: Option<Leases>,
        max_keys: NonZeroUsize,
        claim_timeout: Duration,
    ) -> Result<Self, RemoteError> {
        Self::with_payload(
            quota,
            P::default(),
            remote,
            clock,
            leases,
            max_keys,
            claim_timeout,
        )
    }

    /// [`new`](LocalView::new), with `payload` attached to `quota`: every
    /// decision and ask of that quota hands it back (and after a
    /// [`set_quota`](LocalView::set_quota), the new quota's payload).
    ///
    /// # Errors
    ///
    /// As [`new`](LocalView::new).
    pub fn with_payload(
        quota: RemoteQuota,
        payload: P,
        remote: RemoteClock,
        clock: impl Clock + 'static,
        leases: Option<Leases>,
        max_keys: NonZeroUsize,
        claim_timeout: Duration,
    ) -> Result<Self, RemoteError> {
        let clocks = Arc::new(Clocks {
            clock: Box::new(clock),
            offset: Offset::new(remote),
        });
        let claim_us = saturating_nanos(claim_timeout)
            .div_ceil(1_000)
            .clamp(1, MAX_SPAN_US);
        let judge = Self::judge_of(&clocks, leases, claim_us, quota, payload)?;
        // No receipts.
        let generation = Arc::new(Generation::new(judge).with_receipts(false));
        Ok(Self {
            store: DefaultStore::default()
                .build(generation, Some(KeyCap::new(max_keys, WhenFull::Reject))),
            clocks,
            leases,
            claim_us,
            holds: leases
                .is_some_and(|leases| leases.holds)
                .then(|| Holds::new(None)),
            changing: Mutex::new(()),
        })
    }

    /// The judge of a generation of `quota`.
    fn judge_of(
        clocks: &Arc<Clocks>,
        leases: Option<Leases>,
        claim_us: u64,
        quota: RemoteQuota,
        payload: P,
    ) -> Result<Judge<P>, RemoteError> {
        let (max_units, slack) = leases.map_or((0, 0), |leases| (leases.max_units, leases.slack));
        let slack_us = quota
            .interval_us
            .checked_mul(u64::from(slack))
            .filter(|&slack_us| slack_us <= MAX_SPAN_US)
            .ok_or(RemoteError::SpanTooLong)?;
        Ok(Judge {
            rules: Rules {
                interval_us: quota.interval_us,
                burst: quota.burst,
                tolerance_us: quota.tolerance_us(),
                lease_interval_us: quota.interval_us,
                lease_tolerance_us: quota.tolerance_us(),
                slack_us,
                claim_us,
                max_units,
            },
            clocks: Arc::clone(clocks),
            payload,
            tiers: std::iter::repeat_with(OnceLock::new).take(TIERS).collect(),
            making: Mutex::new(()),
        })
    }

    /// Replaces the quota every later check decides by (and its payload):
    /// every key's knowledge is forgotten, its lease units with it (they
    /// are the old quota's; the remote keeps them as spent), and a reply to
    /// an ask made before is not installed. Checks that begin after it
    /// returns decide by `quota`.
    ///
    /// # Errors
    ///
    /// [`RemoteError::SpanTooLong`] as for [`new`](LocalView::new), and
    /// [`RemoteError::Change`] when the table cannot change now (a check
    /// stalled inside it): nothing changed.
    pub fn set_quota(&self, quota: RemoteQuota, payload: P) -> Result<(), RemoteError> {
        let _changing = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        let judge = Self::judge_of(&self.clocks, self.leases, self.claim_us, quota, payload)?;
        let now_ns = self.clocks.clock.now_ns();
        self.store
            .change(
                Generation::new(judge).with_receipts(false),
                Carry::Unchanged,
                &|| CarryAt {
                    now_ns,
                    disorder_ns: 0,
                },
            )
            .map_err(RemoteError::Change)
    }

    /// Checks `cost` units for `key` now under the view's quota: decided
    /// here (spent from the lease, or denied as the remote would), or an
    /// [`Ask`] to send.
    ///
    /// # Errors
    ///
    /// [`CheckError::ZeroCost`] and [`CheckError::InsufficientCapacity`].
    ///
    /// # Panics
    ///
    /// Only if user code panics: the key's `Hash`, `Eq`, `Borrow` or
    /// `ToOwned`, or the clock, as in
    /// [`RateLimiter::check`](crate::RateLimiter::check). A panic after the
    /// key was claimed leaves the claim to go stale.
    #[inline]
    pub fn check<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        cost: u32,
    ) -> Result<Local<'_, K, P>, CheckError> {
        self.check_then(key, cost, |decision, _| decision)
    }

    /// [`check`](LocalView::check), a decision taken here handed to
    /// `decided` with the payload of the generation that took it (the
    /// payload of the view's quota then: a check under another quota,
    /// [`check_under_then`](LocalView::check_under_then), gets it too).
    ///
    /// # Errors
    ///
    /// As [`check`](LocalView::check).
    ///
    /// # Panics
    ///
    /// As [`check`](LocalView::check), and if `decided` panics.
    #[inline]
    pub fn check_then<Q: Lookup<K> + ?Sized, R>(
        &self,
        key: &Q,
        cost: u32,
        decided: impl Fn(Decision, &P) -> R,
    ) -> Result<Local<'_, K, P, R>, CheckError> {
        self.decide(key, cost, &Own, decided)
    }

    /// [`check_then`](LocalView::check_then) under `quota` rather than the
    /// view's own: denied here when what the remote told denies it under
    /// `quota`, else asked (claiming the key for its floor, never for a
    /// lease: leases are the view's own quota's, and such a check spends
    /// none of them). The first [`TIERS`] quotas other than its own that
    /// checks carry are decided here; checks of any further quota are
    /// always asked.
    ///
    /// # Errors
    ///
    /// As [`check`](LocalView::check), against `quota`'s burst.
    ///
    /// # Panics
    ///
    /// As [`check_then`](LocalView::check_then).
    #[inline]
    pub fn check_under_then<Q: Lookup<K> + ?Sized, R>(
        &self,
        key: &Q,
        cost: u32,
        quota: RemoteQuota,
        decided: impl Fn(Decision, &P) -> R,
    ) -> Result<Local<'_, K, P, R>, CheckError> {
        validate_cost(cost, quota.burst)?;
        let tier = Tier {
            quota,
            unjudged: Cell::new(None),
        };
        match self.decide(key, cost, &tier, decided) {
            // No judge of its quota (every slot holds another, or one is
            // being made): asked, under the payload the check found.
            Err(CheckError::Layout(_)) => {
                let payload = tier
                    .unjudged
                    .get()
                    .unwrap_or_else(|| self.store.generation().algorithm().payload);
                Ok(Local::Ask(self.ask(None, cost, 0, 0, quota, payload)))
            }
            decided => decided,
        }
    }

    /// A check under `under`'s quota.
    #[inline]
    fn decide<Q: Lookup<K> + ?Sized, U: Under<Judge<P>>, R>(
        &self,
        key: &Q,
        cost: u32,
        under: &U,
        decided: impl Fn(Decision, &P) -> R,
    ) -> Result<Local<'_, K, P, R>, CheckError> {
        self.decide_held(key, cost, under, decided, true)
    }

    /// [`decide`](LocalView::decide), a claim (with holds) first looking
    /// (`look`) for a hold of its key that the key's latest call decided:
    /// one that still denies the check is written into the word (its raised
    /// floor), and the check is decided again without looking.
    fn decide_held<Q: Lookup<K> + ?Sized, U: Under<Judge<P>>, R>(
        &self,
        key: &Q,
        cost: u32,
        under: &U,
        decided: impl Fn(Decision, &P) -> R,
        look: bool,
    ) -> Result<Local<'_, K, P, R>, CheckError> {
        let Some(recent_ns) = self.recent_ns() else {
            // Nothing is known before the first round trip: ask.
            return self.unclaimed_under(cost, under);
        };
        let finished = match self.store.check_then(
            key,
            under,
            recent_ns,
            cost,
            |generation, judge, decision| match Miss::carried_by(&decision) {
                None => Finished::Decided(decided(decision, &judge.payload)),
                Some(miss) => Finished::Missed(
                    miss,
                    Box::new(Decided {
                        number: generation.number(),
                        rules: judge.rules,
                        payload: judge.payload,
                    }),
                ),
            },
        ) {
            Ok(finished) => finished,
            // A key the table cannot hold now is asked without a claim.
            Err(CheckError::StoreFull { .. } | CheckError::Reclaiming) => {
                return self.unclaimed_under(cost, under);
            }
            Err(error) => return Err(error),
        };
        Ok(match finished {
            Finished::Decided(decided) => Local::Decided(decided),
            Finished::Missed(Miss::Unclaimed { behind }, decided) => {
                let mut ask = self.ask(None, cost, 0, 0, decided.rules.quota(), decided.payload);
                ask.asked.behind = behind;
                Local::Ask(ask)
            }
            Finished::Missed(Miss::Claim { word, class, back }, judged) => {
                let mut ask = self.claimed(key, cost, word, class, back, *judged);
                if let Some(holds) = &self.holds {
                    let spot = holds.spot(key);
                    ask.asked.spot = Some(spot);
                    // Units to give back go with the call.
                    if look && back == 0 && ask.hold_found(holds, spot, &judged.rules) {
                        return self.decide_held(key, cost, under, decided, false);
                    }
                }
                Local::Ask(ask)
            }
        })
    }

    /// The decision [`check`](LocalView::check) would take here now,
    /// consuming nothing, with its quota's payload; `None` when it would
    /// ask the remote (or, with holds, when its claim would find a hold
    /// that denies it: `check` then denies).
    ///
    /// # Errors
    ///
    /// As [`check`](LocalView::check).
    pub fn peek<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        cost: u32,
    ) -> Result<Option<(Decision, P)>, CheckError> {
        let Some(recent_ns) = self.recent_ns() else {
            return Ok(None);
        };
        let noting = Noting {
            payload: Cell::new(None),
        };
        let decision = self.store.peek(key, &noting, recent_ns, cost)?;
        Ok(match (Miss::carried_by(&decision), noting.payload.get()) {
            (None, Some(payload)) => Some((decision, payload)),
            _ => None,
        })
    }

    /// How many keys the view holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether the view holds no key.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }

    /// Forgets every key that knows nothing useful now, and gives their
    /// memory back; returns how many.
    ///
    /// "Now" is a fresh bound of the remote's instant (so keys go after a
    /// quiet spell with no round trip), widened by the drift allowance:
    /// a lease's last units within that allowance of their deadlines may
    /// go with their word, units a decision could still have spent. That
    /// is under-admission only, never a decision Redis would not make.
    pub fn evict_idle(&self) -> usize {
        self.clocks
            .remote_now()
            .map_or(0, |remote_ns| self.store.evict_idle(remote_ns))
    }

    /// Records that a call deciding on `reading_ns`, a reading of this
    /// view's clock, is about to be sent to the remote other than through
    /// an [`Ask`] (a plain check, a reservation, a refund): when the remote
    /// decides on the local clock's readings ([`RemoteClock::Local`]), no
    /// local decision is then taken at an older instant. Asks record their
    /// own reading.
    pub fn record_sent(&self, reading_ns: u64) {
        self.clocks.offset.sending(reading_ns);
    }

    /// This view with its holds' slots drawn from `salt` rather than a
    /// random one, so that a simulation runs alike each time (a node
    /// facing untrusted keys keeps the random one).
    #[must_use]
    pub fn with_hold_salt(mut self, salt: u64) -> Self {
        if self.holds.is_some() {
            self.holds = Some(Holds::new(Some(salt)));
        }
        self
    }

    /// The most units a lease holds (zero: a deny cache only).
    #[must_use]
    pub fn max_lease_units(&self) -> u32 {
        self.leases.map_or(0, |leases| leases.max_units)
    }

    /// The instant the table is given (its sweeps'), read without a clock:
    /// the remote's at the latest round trip (0 on the local clock before
    /// any); `None` while the remote's clock is unknown. The decision reads
    /// its own instant (see [`Judge`]).
    fn recent_ns(&self) -> Option<u64> {
        let offset = &self.clocks.offset;
        offset.recent_ns().or_else(|| offset.known().then_some(0))
    }

    /// A check asked without the key's claim under `under`'s quota, of the
    /// generation new checks decide by.
    fn unclaimed_under<U: Under<Judge<P>>, R>(
        &self,
        cost: u32,
        under: &U,
    ) -> Result<Local<'_, K, P, R>, CheckError> {
        // Before the first round trip, or a key the table cannot hold:
        // the generation's lock is taken.
        let generation = self.store.generation();
        let judge = under.choose(&generation)?;
        validate_cost(cost, judge.rules.burst)?;
        let (quota, payload) = (judge.rules.quota(), judge.payload);
        Ok(Local::Ask(self.ask(None, cost, 0, 0, quota, payload)))
    }

    /// An ask of `cost` units under `quota` (with its generation's
    /// `payload`), holding `claim` (made in the generation it numbers)
    /// when given, for a lease of size `class` (of `want` units beyond
    /// the cost).
    fn ask(
        &self,
        claim: Option<(K, Knowledge, Knowledge, NonZeroU64)>,
        cost: u32,
        class: u32,
        want: u32,
        quota: RemoteQuota,
        payload: P,
    ) -> Ask<'_, K, P> {
        Ask {
            view: self,
            asked: Box::new(Asked {
                claim,
                class,
                request: LeaseRequest {
                    cost,
                    want,
                    give_back: None,
                },
                quota,
                payload,
                // Read after the claim: the ask is sent no earlier.
                sent_ns: self.sending(),
                behind: None,
                spot: None,
            }),
        }
    }

    /// The local reading an ask is sent with, recorded as sent (on the
    /// local clock the remote decides on it: no check may then decide at
    /// an older instant).
    fn sending(&self) -> u64 {
        let sent_ns = self.clocks.clock.now_ns();
        self.record_sent(sent_ns);
        sent_ns
    }

    /// The ask of the check that claimed `key` with the word `claimed`,
    /// giving back `back` units, for a lease of size `class`, in the
    /// generation `decided`.
    fn claimed<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        cost: u32,
        claimed: u64,
        class: u32,
        back: u32,
        decided: Decided<P>,
    ) -> Ask<'_, K, P> {
        let rules = &decided.rules;
        // The lease the claim replaced: its units at the top slots up to
        // its end, which the claim's floor left out.
        let end_us = Word::unpack(claimed).end_us + u64::from(back) * rules.lease_interval_us;
        let replaced = Word {
            end_us,
            units: back,
            tag: class,
        };
        let units = if back > 0 && canary::planted(Canary::GiveBackSpent) {
            back + 1
        } else {
            back
        };
        let want = if rules.max_units == 0 {
            0
        } else {
            rules.want(class).min(rules.burst - cost)
        };
        let mut ask = self.ask(
            Some((
                key.to_owned(),
                Knowledge(claimed),
                Knowledge(replaced.pack()),
                decided.number,
            )),
            cost,
            class,
            want,
            rules.quota(),
            decided.payload,
        );
        ask.asked.request.give_back = (units > 0).then_some(GiveBack { end_us, units });
        ask
    }

    /// Writes `new` as `key`'s word if it holds `current` in the generation
    /// numbered `number`; returns whether it did.
    fn exchange(&self, key: &K, number: NonZeroU64, current: Knowledge, new: Knowledge) -> bool {
        let any_generation = canary::planted(Canary::ReplyAcrossChange);
        self.store.update(key, |generation, state| {
            ((any_generation || generation.number() == number) && *state == current).then_some(new)
        })
    }
}

impl<K: Key, P: Copy + Default + Send + Sync + 'static> Ask<'_, K, P> {
    /// Returns the request to send.
    #[must_use]
    pub fn request(&self) -> &LeaseRequest {
        &self.asked.request
    }

    /// Returns the quota to send the request under: the quota of the check
    /// (the view's, as its generation was when the check decided, or the
    /// one the check carried).
    #[must_use]
    pub fn quota(&self) -> &RemoteQuota {
        &self.asked.quota
    }

    /// Returns the payload of the view's quota when the check decided.
    #[must_use]
    pub fn payload(&self) -> P {
        self.asked.payload
    }

    /// A local reading taken before the call is sent: the instant to send
    /// the remote when it decides on the local clock's readings.
    #[must_use]
    pub fn sent_ns(&self) -> u64 {
        self.asked.sent_ns
    }

    /// Whether this ask holds the key's claim (its reply installs a lease
    /// or a floor); others are plain checks.
    #[must_use]
    pub fn is_claim(&self) -> bool {
        self.asked.claim.is_some()
    }

    /// For an ask made because another caller holds the key's claim (a
    /// call of its own in flight, whose reply this check might wait for):
    /// the most units the remote can have free for the key, by what this
    /// node knows (the key's floor, at an upper bound of the remote's
    /// clock; a key it holds nothing of yet, its whole burst). Other
    /// callers may have taken some since. `None` when the ask holds the
    /// claim, or when no claim stood: a check the table did not judge
    /// (before the first round trip, a key it cannot hold now, a quota
    /// beyond its judges) or of another quota on a key holding a lease.
    #[must_use]
    pub fn behind_claim(&self) -> Option<u32> {
        self.asked.behind
    }

    /// Whether this check (without the claim; under the view's own quota
    /// or, `tier`, one it carried) may be decided here by the reply to its
    /// key's claimed ask, and so is worth holding until that reply lands
    /// rather than sent: only when another caller holds the claim
    /// ([`behind_claim`](Ask::behind_claim)); then, with leases the check
    /// may spend (the view's own quota's), always: the reply may bring
    /// one. Otherwise not when by what this node knows the key has more
    /// than half its burst free, and more than the check's cost: the reply
    /// then most likely admits, which teaches nothing that decides here.
    #[must_use]
    pub fn may_learn(&self, tier: bool) -> bool {
        let Some(free) = self.asked.behind else {
            return false;
        };
        self.view.leases.is_some() && !tier
            || free <= (self.asked.quota.burst() / 2).max(self.asked.request.cost)
    }

    /// Ends this claim without a call if the key's latest call decided a
    /// hold (kept in `holds` at `spot`) that still denies this check under
    /// `rules` (the view's own quota's: a check carrying another asks),
    /// and the key's word stands where that call left it (its floor): the
    /// hold's raised floor is written into the word. Returns whether it
    /// was.
    fn hold_found(&mut self, holds: &Holds, spot: Spot, rules: &Rules) -> bool {
        let view = self.view;
        // Holds are the view's own quota's (only its calls ask for leases
        // and decide one): a check carrying another quota asks.
        if rules.max_units == 0 {
            return false;
        }
        let Some((key, claimed, _, number)) = &self.asked.claim else {
            return false;
        };
        let floor = Word::unpack(claimed.0);
        if holds.floor_us(spot) != Some(floor.end_us) {
            return false;
        }
        let held = Word {
            tag: self.asked.class,
            ..floor
        }
        .held(holds.end_us(spot), rules.tolerance_us, rules.interval_us);
        // Judged at the remote's instant bounded at the ask's own reading
        // (no clock read again), as the check would be on the held word.
        let Some(now_ns) = view.clocks.offset.remote_ns(self.asked.sent_ns) else {
            return false;
        };
        if !matches!(
            rules.outcome(held.pack(), now_ns, self.asked.request.cost),
            Outcome::Deny(_)
        ) || !view.exchange(key, *number, *claimed, Knowledge(held.pack()))
        {
            return false;
        }
        self.asked.claim = None;
        canary::held(true);
        true
    }

    /// Installs what the remote's `reply` teaches: the clocks' offset, and
    /// for a claim, the key's new floor and lease. Returns whether a lease
    /// or floor was installed (not when another caller took the claim over
    /// after it went stale, nor after a change of quota: the reply's units
    /// are then unspent).
    // Callers may well not care: the reply's decision stands either way.
    #[allow(clippy::must_use_candidate)]
    pub fn complete(mut self, reply: &LeaseReply) -> bool {
        let view = self.view;
        view.clocks
            .offset
            .observe(reply.now_us, self.asked.sent_ns, view.clocks.clock.now_ns());
        let Some((key, claimed, _, number)) = self.asked.claim.take() else {
            return false;
        };
        let installed = Word {
            end_us: reply.end_us,
            units: if reply.allowed && reply.end_us <= MAX_END_US {
                // Never more than asked, whatever the reply says.
                reply.granted.min(self.asked.request.want)
            } else {
                0
            },
            tag: self.asked.class,
        };
        let Some(holds) = view.holds.as_ref().zip(self.asked.spot) else {
            return view.exchange(&key, number, claimed, Knowledge(installed.pack()));
        };
        let (installed, hold_end_us) =
            self.decide_hold(holds, Word::unpack(claimed.0), reply, installed);
        // Recorded once installed: a reply that is not (the claim taken
        // over, the quota changed) leaves the record of the call that was.
        let done = view.exchange(&key, number, claimed, Knowledge(installed.pack()));
        match hold_end_us {
            Some(hold_end_us) if done => {
                let (holds, spot) = holds;
                holds.note(spot, reply.now_us, reply.end_us, hold_end_us);
                if hold_end_us > 0 {
                    canary::held(false);
                }
            }
            _ => {}
        }
        done
    }

    /// The word to install after `reply` (`installed` without a hold) on a
    /// key claimed with `claimed`, and what to record in `holds` for it
    /// once installed: the end of the hold it decided (0 for none), or
    /// nothing when there is none and no record of the key to keep up. A
    /// hold is written into the word now when the call left no units,
    /// else by the key's next claim once they are spent
    /// ([`hold_found`](Ask::hold_found)).
    fn decide_hold(
        &self,
        (holds, spot): (&Holds, Spot),
        claimed: Word,
        reply: &LeaseReply,
        installed: Word,
    ) -> (Word, Option<u64>) {
        let (request, quota) = (&self.asked.request, &self.asked.quota);
        // The floor the node knew after its latest call: a hold's raised
        // floor hides it from the word.
        let recorded_us = holds.floor_us(spot);
        let floor_us = recorded_us.map_or(claimed.end_us, |floor_us| floor_us.min(claimed.end_us));
        // What this node took since: its cost and the units granted.
        let taken = if reply.allowed {
            request.cost + installed.units
        } else {
            0
        };
        let hold_end_us = match hold_us(quota, floor_us, reply, taken, request.want) {
            0 if recorded_us.is_none() => return (installed, None),
            0 => return (installed, Some(0)),
            hold => reply.now_us + holds.spread(hold, reply.now_us),
        };
        let held = installed.held(hold_end_us, quota.tolerance_us(), quota.interval_us);
        let word = if installed.units == 0 {
            held
        } else if canary::planted(Canary::HoldMovesLease) {
            Word {
                units: installed.units,
                ..held
            }
        } else {
            installed
        };
        (word, Some(hold_end_us))
    }

    /// Ends an ask whose call was never sent (the caller knows it: a
    /// circuit breaker kept it back): the key's word is put back as the
    /// claim found it, its lease's units included, since nothing of them
    /// reached the remote. Returns whether it was (not when another caller
    /// took the claim over meanwhile, nor after a change of quota). A call
    /// that may have been sent (a timeout, a connection lost) must be
    /// dropped instead: its units may have been given back.
    #[allow(clippy::must_use_candidate)]
    pub fn not_sent(mut self) -> bool {
        let Some((key, claimed, replaced, number)) = self.asked.claim.take() else {
            return false;
        };
        self.view.exchange(&key, number, claimed, replaced)
    }
}

impl<K: Key, P: Copy + Default + Send + Sync + 'static> Drop for Ask<'_, K, P> {
    /// Releases an uncompleted claim: keeps its floor, drops its units (the
    /// remote may have taken them back). A panic in the key's `Hash` or
    /// `Eq` here is caught: the claim then stands until it is stale.
    fn drop(&mut self) {
        let Some((key, claimed, _, number)) = self.asked.claim.take() else {
            return;
        };
        let view = self.view;
        let released = Word {
            units: 0,
            tag: self.asked.class,
            ..Word::unpack(claimed.0)
        };
        drop(catch_unwind(AssertUnwindSafe(|| {
            view.exchange(&key, number, claimed, Knowledge(released.pack()))
        })));
        drop(catch_unwind(AssertUnwindSafe(move || drop(key))));
    }
}

impl<K: Key, P: Copy + Default + Send + Sync + 'static> fmt::Debug for LocalView<K, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let generation = self.store.generation();
        let rules = &generation.algorithm().rules;
        f.debug_struct("LocalView")
            .field("interval_us", &rules.interval_us)
            .field("burst", &rules.burst)
            .field("max_lease_units", &rules.max_units)
            .field("slack_us", &rules.slack_us)
            .field("keys", &self.store.len())
            .finish_non_exhaustive()
    }
}

impl<K: Key, P: Copy + Default + Send + Sync + 'static> fmt::Debug for Ask<'_, K, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ask")
            .field("request", &self.asked.request)
            .field("quota", &self.asked.quota)
            .field("sent_ns", &self.asked.sent_ns)
            .field("claim", &self.asked.claim.is_some())
            .finish_non_exhaustive()
    }
}
