//! Waiting for an admission: reservations served in arrival order, each at
//! its own instant, given back when abandoned.
//!
//! # Implementation details
//!
//! GCRA can admit a request *in the future*: a check whose tolerance is
//! widened by the longest wait the caller accepts admits it at once and
//! moves the key's theoretical arrival time (TAT) on by its cost, exactly as
//! an admission now would; the request's **slot**, the instant from which
//! it conforms, is the new TAT minus the quota's tolerance. Later requests
//! (waiting or not) are decided against that TAT, so they queue behind it:
//! slots are handed out in the order the reservations reach the key's
//! cell, each one its cost's intervals after the one before, and a waiter
//! sleeps until exactly its slot. No waiter polls, and none is woken for
//! another's slot.
//!
//! A reservation abandoned before its slot (its future dropped) gives its
//! units back, so that cancellation loses no capacity. That cannot be done
//! by moving the TAT back alone: the reservations behind it were given
//! slots counting it, and would then be served later than the TAT says,
//! beside requests that the earlier TAT admits: more than the quota in some
//! window. So each key with waiters has a [`Queue`] of its pending
//! reservations, in slot order, and abandoning one does, under the queue's
//! lock:
//!
//! 1. move the TAT back by its cost, with a compare-and-exchange from the
//!    TAT the queue's last reservation wrote (which nothing else can have
//!    changed while a reservation is pending: a TAT more than the tolerance
//!    in the future denies every check, and other reservations of the key
//!    go through this queue);
//! 2. move every later reservation's slot earlier by the same amount, and
//!    wake its waiter to sleep until its new slot.
//!
//! The result is exactly the schedule the limiter would have made had the
//! abandoned request never arrived: each later reservation was made while
//! the abandoned one was pending, so against a TAT at least a tolerance
//! ahead, and so back to back with the one before it. A reservation whose
//! slot has come is **due**: it was admitted then, and is never given back
//! (giving back an admission that others were decided after could admit
//! more than the quota). `notes/11-http.md` has the argument in full.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::OnceLock;
use std::task::Waker;
use std::time::Duration;

use crate::algorithm::{Algorithm, Gcra, GcraState, validate_cost};
use crate::cell::{Cell, CellFor};
use crate::clock::{Clock, clamp_time, saturating_nanos};
use crate::decision::Decision;
use crate::error::CheckError;
use crate::store::{Key, Lookup, Store, StoreKind};
use crate::sync::canary::{self, Canary};
use crate::sync::{Arc, Mutex, lock};
use crate::{DirectLimiter, RateLimiter};

/// Why a request cannot wait for an admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The cost is invalid (zero, above the burst: no wait admits it), or
    /// a new key found the store full.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// The request would have to wait longer than the most it accepts.
    /// Nothing was reserved.
    #[error("the request would wait {wait:?}, more than its maximum of {max_wait:?}")]
    TooLong {
        /// How long it would have waited.
        wait: Duration,
        /// The most it accepted.
        max_wait: Duration,
    },
}

/// Shards of the table of queues: reservations of different keys rarely
/// meet on a lock.
const QUEUE_SHARDS: usize = 8;

/// The room below which a queue or a shard of queues is not shrunk: a few
/// entries cost less than reallocating for them again and again.
const MIN_ROOM: usize = 8;

/// The room to shrink to when `len` entries use a quarter of `capacity` or
/// less (halving then keeps the cost amortised), or `None`.
fn shrunk_room(len: usize, capacity: usize) -> Option<usize> {
    let held = len.max(MIN_ROOM);
    (capacity > 4 * held).then_some(2 * held)
}

/// The queues of the keys that have pending reservations, found by the
/// key's hash. A key's queue exists while it has pending reservations and
/// is removed with its last.
///
/// Made on the first reservation: a limiter that never waits allocates
/// nothing for it and draws no random hasher keys (which, under Miri,
/// would also move the interpreter's random choices for every test).
pub(crate) struct Queues<K> {
    tables: OnceLock<Tables<K>>,
}

/// The sharded tables and the hasher that finds a key's shard and entry.
struct Tables<K> {
    shards: Box<[Mutex<Shard<K>>]>,
    hasher: RandomState,
}

/// One shard of [`Queues`]: the queues by their key's hash (colliding keys
/// share the hash's list).
type Shard<K> = HashMap<u64, Vec<Arc<Queue<K>>>>;

/// One key's pending reservations, in slot order.
pub(crate) struct Queue<K> {
    /// The key, for the refunds (the queue is found by it too).
    pub(crate) key: K,
    hash: u64,
    state: Mutex<QueueState>,
}

/// What a queue's lock guards.
struct QueueState {
    /// Pending reservations, in slot order (and so in ticket order). An
    /// abandoned one leaves at once, wherever it stands, so that the queue
    /// holds only the reservations callers hold.
    pending: VecDeque<Pending>,
    /// The ticket the next reservation gets.
    next_id: u64,
    /// The TAT the last reservation made through this queue wrote, moved
    /// back by every refund since.
    tail_tat_ns: u64,
    /// The latest clock reading any operation of the queue has made: a
    /// slot at or before it is due for good, whatever a later (or slower)
    /// reading says, so that an admission once due is never given back.
    seen_ns: u64,
    /// Removed from the table: a reservation that finds this looks again.
    removed: bool,
}

struct Pending {
    /// Its ticket: increasing along the queue.
    id: u64,
    cost_ns: u64,
    slot_ns: u64,
    waker: Option<Waker>,
}

/// Where a reservation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Its slot has come (or it was popped as due): admitted.
    Due,
    /// Its slot is this instant, in the limiter's clock.
    WaitsFor(u64),
}

impl<K> Tables<K> {
    fn new() -> Self {
        Self {
            shards: (0..QUEUE_SHARDS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, hash: u64) -> &Mutex<Shard<K>> {
        // The low bits pick the shard; the map hashes the whole word.
        #[allow(clippy::cast_possible_truncation)]
        &self.shards[hash as usize % QUEUE_SHARDS]
    }
}

impl<K> Queues<K> {
    pub(crate) const fn new() -> Self {
        Self {
            tables: OnceLock::new(),
        }
    }

    fn tables(&self) -> &Tables<K> {
        self.tables.get_or_init(Tables::new)
    }

    /// Runs `reserve` under `key`'s queue lock (creating the queue if it
    /// has none), so that reservations of one key are made, and queued, in
    /// one order. `reserve` returns the clock reading it decided at, and
    /// the reservation's slot and the TAT it wrote, or `None` for an
    /// admission due at once (nothing queued).
    ///
    /// Runs the key's `Hash` before any lock, its `Eq` and `Borrow` under
    /// the table's shard lock (changing nothing), and its `ToOwned` before
    /// a new queue is inserted; `reserve` (the store's check: user code
    /// too) under the queue's lock, and a panic there leaves no queue
    /// behind.
    pub(crate) fn reserve<Q, E>(
        &self,
        key: &Q,
        cost_ns: u64,
        reserve: impl FnOnce() -> Result<(u64, Option<(u64, u64)>), E>,
    ) -> Result<Option<Ticket<K>>, E>
    where
        Q: Lookup<K> + ?Sized,
    {
        let tables = self.tables();
        let hash = tables.hasher.hash_one(key);
        let mut reserve = Some(reserve);
        loop {
            let queue = {
                let mut shard = lock(tables.shard(hash));
                let found = shard
                    .get(&hash)
                    .and_then(|queues| queues.iter().find(|queue| key.matches(&queue.key)))
                    .cloned();
                found.unwrap_or_else(|| {
                    let queue = Arc::new(Queue {
                        key: key.to_owned(),
                        hash,
                        state: Mutex::new(QueueState {
                            pending: VecDeque::new(),
                            next_id: 0,
                            tail_tat_ns: 0,
                            seen_ns: 0,
                            removed: false,
                        }),
                    });
                    shard.entry(hash).or_default().push(Arc::clone(&queue));
                    queue
                })
            };
            let mut state = lock(&queue.state);
            // Emptied and removed between the lookup and the lock: a new
            // queue takes its place.
            if state.removed {
                continue;
            }
            let reserve = reserve.take().expect("reserved once: the loop ends here");
            let (slot_ns, tat_ns) = match catch_unwind(AssertUnwindSafe(reserve)) {
                Ok(Ok((now_ns, Some(reserved)))) => {
                    state.seen_ns = state.seen_ns.max(now_ns);
                    reserved
                }
                outcome => {
                    drop(state);
                    self.remove_if_empty(&queue);
                    return match outcome {
                        Ok(Ok(_)) => Ok(None),
                        Ok(Err(error)) => Err(error),
                        Err(panic) => resume_unwind(panic),
                    };
                }
            };
            state.tail_tat_ns = tat_ns;
            let id = state.next_id;
            state.next_id += 1;
            state.pending.push_back(Pending {
                id,
                cost_ns,
                slot_ns,
                waker: None,
            });
            drop(state);
            return Ok(Some(Ticket { queue, id }));
        }
    }

    /// Removes `queue` from the table if it has no pending reservation.
    pub(crate) fn remove_if_empty(&self, queue: &Arc<Queue<K>>) {
        let mut shard = lock(self.tables().shard(queue.hash));
        remove_locked(&mut shard, queue);
    }
}

/// Removes `queue` from its shard (lock held) if it has no pending
/// reservation, marking it removed.
fn remove_locked<K>(shard: &mut Shard<K>, queue: &Arc<Queue<K>>) {
    let mut state = lock(&queue.state);
    if !state.pending.is_empty() || state.removed {
        return;
    }
    state.removed = true;
    drop(state);
    if let Some(queues) = shard.get_mut(&queue.hash) {
        queues.retain(|other| !Arc::ptr_eq(other, queue));
        if queues.is_empty() {
            shard.remove(&queue.hash);
            // As a queue does: the shard's room follows the keys waiting
            // now, not the most that ever waited at once.
            if let Some(room) = shrunk_room(shard.len(), shard.capacity()) {
                shard.shrink_to(room);
            }
        }
    }
}

/// A pending reservation: its queue and its place in it.
pub(crate) struct Ticket<K> {
    pub(crate) queue: Arc<Queue<K>>,
    id: u64,
}

impl QueueState {
    /// The clock reading `now`, never older than any the queue has seen.
    fn advance(&mut self, now_ns: u64) -> u64 {
        self.seen_ns = self.seen_ns.max(now_ns);
        self.seen_ns
    }

    /// The pending entry of ticket `id`, if it has not left.
    fn index(&self, id: u64) -> Option<usize> {
        self.pending
            .binary_search_by_key(&id, |pending| pending.id)
            .ok()
    }

    /// Ticket `index` is due: it and every entry before it (earlier slots)
    /// leave.
    fn leave_through(&mut self, index: usize) {
        self.pending.drain(..=index);
        self.shrink();
    }

    /// Gives back the room of entries that left, once the queue uses a
    /// quarter of it: the queue's memory follows the reservations held, not
    /// the most it ever held (halving keeps the cost amortised).
    fn shrink(&mut self) {
        if let Some(room) = shrunk_room(self.pending.len(), self.pending.capacity()) {
            self.pending.shrink_to(room);
        }
    }

    /// Entry `index` leaves, alone.
    fn remove(&mut self, index: usize) {
        self.pending.remove(index);
        self.shrink();
    }
}

impl<K> Ticket<K> {
    /// Where the reservation stands at `now()` (read under the queue's
    /// lock); while it waits, `waker` is woken when its slot moves. A due
    /// reservation leaves the queue.
    pub(crate) fn standing(&self, now: impl FnOnce() -> u64, waker: Option<&Waker>) -> Standing {
        let mut state = lock(&self.queue.state);
        let now_ns = state.advance(now());
        let Some(index) = state.index(self.id) else {
            return Standing::Due;
        };
        let entry = &mut state.pending[index];
        if entry.slot_ns <= now_ns {
            state.leave_through(index);
            return Standing::Due;
        }
        if let Some(waker) = waker {
            if !entry
                .waker
                .as_ref()
                .is_some_and(|stored| stored.will_wake(waker))
            {
                entry.waker = Some(waker.clone());
            }
        }
        Standing::WaitsFor(entry.slot_ns)
    }

    /// Abandons the reservation at `now()` (read under the queue's lock):
    /// before its slot, gives its units back with
    /// `refund(tail_tat, restored_tat)` (a compare-and-exchange of the
    /// key's TAT) and moves every later slot earlier by its cost, waking
    /// their waiters; at or after it, keeps it (it was admitted).
    pub(crate) fn cancel(&self, now: impl FnOnce() -> u64, refund: impl FnOnce(u64, u64) -> bool) {
        let mut woken = Vec::new();
        let mut state = lock(&self.queue.state);
        let now_ns = state.advance(now());
        let Some(index) = state.index(self.id) else {
            return;
        };
        if state.pending[index].slot_ns <= now_ns {
            state.leave_through(index);
            return;
        }
        let cost_ns = state.pending[index].cost_ns;
        let tail = state.tail_tat_ns;
        // A refund that fails (which nothing in process makes happen while
        // a reservation is pending) keeps the units: the schedule stays as
        // it was, conservative.
        let refunded =
            !canary::planted(Canary::CancelWithoutRefund) && refund(tail, tail - cost_ns);
        if refunded {
            state.tail_tat_ns = tail - cost_ns;
            // Every later slot (none, for the canary that forgets them).
            let shifted = if canary::planted(Canary::CancelWithoutShift) {
                0
            } else {
                usize::MAX
            };
            for later in state.pending.iter_mut().skip(index + 1).take(shifted) {
                // A slot before the clock's origin is due at once: the
                // schedule without the abandoned request would have
                // admitted it already.
                later.slot_ns = later.slot_ns.saturating_sub(cost_ns);
                woken.extend(later.waker.take());
            }
        }
        // It leaves now, refunded or not: nothing waits for it, and the
        // TAT, not the queue, holds the units of one that kept them (the
        // canary leaves it queued, as the first version did until it
        // reached the front).
        if !canary::planted(Canary::CancelKeepsEntry) {
            state.remove(index);
        }
        drop(state);
        // Woken once the schedule is whole and the lock released: a waker is
        // user code (an executor's), and one that panics, polls inline or
        // reserves on this key again must find the queue consistent and
        // free. Every waiter is woken; the first panic goes on after.
        let mut first_panic = None;
        for waker in woken {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| waker.wake())) {
                first_panic.get_or_insert(panic);
            }
        }
        if let Some(panic) = first_panic {
            resume_unwind(panic);
        }
    }

    /// Removes the reservation from its queue, reading no clock and giving
    /// nothing back (its units stay in the TAT: conservative): what a drop
    /// whose cancel panicked (the key's `Hash` or `Eq` in the refund, or
    /// the clock) does, so that no reservation outlives its caller.
    pub(crate) fn forget(&self) {
        let mut state = lock(&self.queue.state);
        if let Some(index) = state.index(self.id) {
            state.remove(index);
        }
    }

    /// The slot, or `Due`, at `now_ns` (read under the queue's lock by the
    /// caller's closure); a reading that finds it due makes it due for
    /// good (see `QueueState::seen_ns`).
    fn peek(&self, now: impl FnOnce() -> u64) -> Standing {
        let mut state = lock(&self.queue.state);
        let now_ns = state.advance(now());
        match state.index(self.id) {
            Some(index) if state.pending[index].slot_ns > now_ns => {
                Standing::WaitsFor(state.pending[index].slot_ns)
            }
            _ => Standing::Due,
        }
    }
}

impl<K> Queues<K> {
    /// How many keys have a queue.
    pub(crate) fn len(&self) -> usize {
        self.tables.get().map_or(0, |tables| {
            tables
                .shards
                .iter()
                .map(|shard| lock(shard).values().map(Vec::len).sum::<usize>())
                .sum()
        })
    }
}

impl<K> Queues<K> {
    /// How many reservations wait for their slot, over every key.
    pub(crate) fn reservations(&self) -> usize {
        self.tables.get().map_or(0, |tables| {
            tables
                .shards
                .iter()
                .map(|shard| {
                    lock(shard)
                        .values()
                        .flatten()
                        .map(|queue| lock(&queue.state).pending.len())
                        .sum::<usize>()
                })
                .sum()
        })
    }
}

impl<K> fmt::Debug for Queues<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queues")
            .field("queues", &self.len())
            .finish_non_exhaustive()
    }
}

impl<K> fmt::Debug for Ticket<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// A limiter that can reserve future admissions: GCRA, keyed
/// ([`RateLimiter`]) or direct ([`DirectLimiter`]). Sealed: its methods
/// are the crate's.
pub trait Ledger: private::Sealed {}

// The sealed trait's methods are the crate's, and so are the types they
// name: no user can call or implement them.
#[allow(private_interfaces)]
mod private {
    use super::Queues;

    /// What a [`Reservation`](super::Reservation) needs of its limiter.
    pub trait Sealed {
        /// The key a queue is kept for (`()` for a direct limiter).
        type Key;

        /// The limiter's clock.
        fn now_ns(&self) -> u64;

        /// Moves `key`'s TAT from `tail_ns` to `restored_ns` if it still
        /// is `tail_ns`.
        fn refund(&self, key: &Self::Key, tail_ns: u64, restored_ns: u64) -> bool;

        /// The queues of its keys.
        fn queues(&self) -> &Queues<Self::Key>;
    }
}

/// A reserved admission of a GCRA limiter ([`RateLimiter::reserve_n`],
/// [`DirectLimiter::reserve_n`]): admitted now, or at its slot, for which
/// it waits in line.
///
/// Dropping a reservation before its slot gives its units back, and moves
/// every reservation behind it on the same key forward; at or after its
/// slot it was admitted, and dropping it changes nothing.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Builder, Quota};
/// use tollgate::clock::ManualClock;
///
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = ManualClock::new();
/// let limiter = Builder::new(Quota::per_second(2)?.with_burst(1)?)
///     .clock(clock.clone())
///     .build::<String>();
/// let mut now = limiter.reserve_n("k", 1, Duration::from_secs(1))?;
/// assert!(now.is_ready());
/// let next = limiter.reserve_n("k", 1, Duration::from_secs(1))?;
/// let mut after = limiter.reserve_n("k", 1, Duration::from_secs(1))?;
/// assert_eq!(next.wait(), Duration::from_millis(500));
/// assert_eq!(after.wait(), Duration::from_millis(1000));
/// // A third would wait 1.5 s, more than it accepts: refused, nothing reserved.
/// assert!(limiter.reserve_n("k", 1, Duration::from_secs(1)).is_err());
/// // Abandoning `next` moves `after` into its slot.
/// drop(next);
/// assert_eq!(after.wait(), Duration::from_millis(500));
/// clock.advance(Duration::from_millis(500));
/// assert!(after.is_ready());
/// # Ok(())
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
#[must_use = "dropping a reservation before its slot gives it back"]
pub struct Reservation<'a, L: Ledger> {
    limiter: &'a L,
    /// `None` once due (or admitted at once).
    ticket: Option<Ticket<L::Key>>,
    decision: Decision,
}

/// Reserves through `queues` for `key`: the widened check `check(gcra,
/// now, n)` on the key's state, under its queue's lock.
#[allow(clippy::too_many_arguments)]
fn reserve<'a, L, Q>(
    limiter: &'a L,
    gcra: &Gcra,
    key: &Q,
    n: u32,
    max_wait: Duration,
    check: impl FnOnce(&Gcra, u64, u32) -> Result<Decision, CheckError>,
) -> Result<Reservation<'a, L>, WaitError>
where
    L: Ledger,
    Q: Lookup<L::Key> + ?Sized,
{
    validate_cost(n, gcra.capacity())?;
    let widened = gcra.widened(saturating_nanos(max_wait));
    let tolerance_ns = gcra.tolerance_ns();
    let mut decision = None;
    let ticket = limiter.queues().reserve(key, gcra.cost_ns(n), || {
        let now_ns = clamp_time(limiter.now_ns());
        let reserved = check(&widened, now_ns, n)?;
        if !reserved.is_allowed() {
            // It would fit at `retry_after` with the widened tolerance,
            // which is that much further than the quota's.
            let extra = Duration::from_nanos(widened.tolerance_ns() - tolerance_ns);
            return Err(WaitError::TooLong {
                wait: reserved.retry_after().saturating_add(extra),
                max_wait,
            });
        }
        // The debt this admission leaves; the slot is when it is down to
        // the tolerance.
        let debt_ns = saturating_nanos(reserved.reset_after());
        let tat_ns = now_ns + debt_ns;
        if debt_ns <= tolerance_ns {
            decision = Some(gcra.allowed(debt_ns));
            return Ok((now_ns, None));
        }
        // At its slot, the key owes exactly the tolerance.
        decision = Some(gcra.allowed(tolerance_ns));
        Ok((now_ns, Some((tat_ns - tolerance_ns, tat_ns))))
    })?;
    Ok(Reservation {
        limiter,
        ticket,
        decision: decision.expect("set by every reservation that returns"),
    })
}

impl<K: Key, C: Clock, S: StoreKind<K, Gcra>> Ledger for RateLimiter<K, Gcra, C, S> {}

#[allow(private_interfaces)] // see `private`
impl<K: Key, C: Clock, S: StoreKind<K, Gcra>> private::Sealed for RateLimiter<K, Gcra, C, S> {
    type Key = K;

    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    fn refund(&self, key: &K, tail_ns: u64, restored_ns: u64) -> bool {
        self.store.compare_exchange(
            key,
            &self.algorithm,
            &GcraState::at(tail_ns),
            &GcraState::at(restored_ns),
        )
    }

    fn queues(&self) -> &Queues<K> {
        &self.queues
    }
}

impl<C: Clock, P: CellFor<Gcra>> Ledger for DirectLimiter<Gcra, C, P> {}

#[allow(private_interfaces)] // see `private`
impl<C: Clock, P: CellFor<Gcra>> private::Sealed for DirectLimiter<Gcra, C, P> {
    type Key = ();

    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    fn refund(&self, (): &(), tail_ns: u64, restored_ns: u64) -> bool {
        // A direct limiter never retires its cell.
        self.cell
            .compare_exchange(
                &self.algorithm,
                &GcraState::at(tail_ns),
                &GcraState::at(restored_ns),
            )
            .unwrap_or(false)
    }

    fn queues(&self) -> &Queues<()> {
        &self.queues
    }
}

impl<K: Key, C: Clock, S: StoreKind<K, Gcra>> RateLimiter<K, Gcra, C, S> {
    /// Reserves `n` units for `key` at the earliest slot after every
    /// reservation already made on it, if that slot is at most `max_wait`
    /// away. The reservation is ready at once when the key has the units
    /// now.
    ///
    /// # Errors
    ///
    /// [`WaitError::Check`] for a cost of zero or above the burst, or a
    /// new key past a rejecting key cap; [`WaitError::TooLong`] when the
    /// slot is further than `max_wait`. Nothing is reserved on error.
    ///
    /// # Panics
    ///
    /// As [`check`](RateLimiter::check), for this key's user code.
    pub fn reserve_n<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        n: u32,
        max_wait: Duration,
    ) -> Result<Reservation<'_, Self>, WaitError> {
        reserve(
            self,
            &self.algorithm,
            key,
            n,
            max_wait,
            |widened, now_ns, n| self.store.check(key, widened, now_ns, n),
        )
    }

    /// How many keys have reservations waiting for their slot (each such
    /// key holds a queue): zero once every reservation is due or dropped.
    #[must_use]
    pub fn waiting_keys(&self) -> usize {
        self.queues.len()
    }

    /// How many reservations, over every key, wait for their slot: those
    /// callers hold whose slot has not been seen to come. A dropped
    /// reservation leaves at once, so this (and the memory the queues
    /// hold) follows what callers hold, whatever order they drop in.
    #[must_use]
    pub fn waiting_reservations(&self) -> usize {
        self.queues.reservations()
    }
}

impl<C: Clock, P: CellFor<Gcra>> DirectLimiter<Gcra, C, P> {
    /// Reserves `n` units at the earliest slot after every reservation
    /// already made, if that slot is at most `max_wait` away, as
    /// [`RateLimiter::reserve_n`].
    ///
    /// # Errors
    ///
    /// [`WaitError::Check`] for a cost of zero or above the burst;
    /// [`WaitError::TooLong`] when the slot is further than `max_wait`.
    #[allow(clippy::missing_panics_doc)] // a direct limiter's cell is never retired
    pub fn reserve_n(
        &self,
        n: u32,
        max_wait: Duration,
    ) -> Result<Reservation<'_, Self>, WaitError> {
        reserve(
            self,
            &self.algorithm,
            &(),
            n,
            max_wait,
            |widened, now_ns, n| {
                Ok(self
                    .cell
                    .check(widened, now_ns, n)?
                    .expect("a direct limiter never retires its cell"))
            },
        )
    }

    /// How many reservations wait for their slot, as
    /// [`RateLimiter::waiting_reservations`].
    #[must_use]
    pub fn waiting_reservations(&self) -> usize {
        self.queues.reservations()
    }
}

impl<L: Ledger> Reservation<'_, L> {
    /// Whether the slot has come: the units are admitted.
    pub fn is_ready(&mut self) -> bool {
        matches!(self.standing(None), Standing::Due)
    }

    /// How long until the slot, on the limiter's clock (zero when ready).
    /// Only ever shrinks: a reservation ahead that is given back moves this
    /// one forward.
    #[must_use]
    pub fn wait(&self) -> Duration {
        let Some(ticket) = &self.ticket else {
            return Duration::ZERO;
        };
        let mut now_ns = 0;
        match ticket.peek(|| {
            now_ns = self.limiter.now_ns();
            now_ns
        }) {
            Standing::Due => Duration::ZERO,
            Standing::WaitsFor(slot_ns) => Duration::from_nanos(slot_ns.saturating_sub(now_ns)),
        }
    }

    /// The decision the units are admitted with: at the slot, the key owes
    /// its whole tolerance (nothing remains) unless admitted at once.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Where the reservation stands now; `waker` is woken when its slot
    /// moves. Once due, the ticket is gone.
    pub(crate) fn standing(&mut self, waker: Option<&Waker>) -> Standing {
        let Some(ticket) = &self.ticket else {
            return Standing::Due;
        };
        let limiter = self.limiter;
        let standing = ticket.standing(|| limiter.now_ns(), waker);
        if standing == Standing::Due {
            let ticket = self.ticket.take().expect("checked above");
            limiter.queues().remove_if_empty(&ticket.queue);
        }
        standing
    }

    /// The limiter's clock.
    #[cfg(feature = "tokio")]
    pub(crate) fn now_ns(&self) -> u64 {
        self.limiter.now_ns()
    }
}

impl<L: Ledger> Drop for Reservation<'_, L> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        let limiter = self.limiter;
        let now = || limiter.now_ns();
        // The refund runs the key's `Hash` and `Eq` (user code); a panic
        // there keeps the units (the reservation is still cancelled), and
        // is not raised from a drop, which may run while another unwinds.
        let cancelled = catch_unwind(AssertUnwindSafe(|| {
            ticket.cancel(now, |tail_ns, restored_ns| {
                limiter.refund(&ticket.queue.key, tail_ns, restored_ns)
            });
        }));
        if cancelled.is_err() {
            // Whatever was done before the panic (a refund and its shift are
            // made whole before any waker runs), the entry leaves, with no
            // clock read and nothing more given back.
            ticket.forget();
        }
        limiter.queues().remove_if_empty(&ticket.queue);
    }
}

impl<L: Ledger> fmt::Debug for Reservation<'_, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("ticket", &self.ticket)
            .field("decision", &self.decision)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "tokio")]
mod sleep {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use tokio::time::{Instant, Sleep, sleep_until};

    use super::{Ledger, Reservation, Standing, WaitError};
    use crate::algorithm::Gcra;
    use crate::cell::CellFor;
    use crate::clock::Clock;
    use crate::decision::Decision;
    use crate::store::{Key, Lookup, StoreKind};
    use crate::{DirectLimiter, RateLimiter};

    impl<K: Key, C: Clock, S: StoreKind<K, Gcra>> RateLimiter<K, Gcra, C, S> {
        /// Waits until one unit for `key` is admitted: reserves the next
        /// slot (see [`reserve_n`](RateLimiter::reserve_n)) and sleeps,
        /// on tokio's timer, until exactly it. Waiters on one key are
        /// admitted in the order they reserved; dropping the future before
        /// its slot gives the slot back (feature `tokio`).
        ///
        /// ```
        /// use std::time::Duration;
        /// use tollgate::{Quota, RateLimiter};
        ///
        /// # #[tokio::main(flavor = "current_thread")]
        /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
        /// let limiter: RateLimiter<String> = RateLimiter::keyed(Quota::per_second(100)?.with_burst(1)?);
        /// limiter.until_ready("upstream", Duration::from_secs(1)).await?;
        /// // The next one sleeps about 10 ms.
        /// limiter.until_ready("upstream", Duration::from_secs(1)).await?;
        /// # Ok(())
        /// # }
        /// ```
        ///
        /// # Errors
        ///
        /// As [`reserve_n`](RateLimiter::reserve_n), at once: a wait
        /// beyond `max_wait` waits for nothing.
        pub async fn until_ready<Q: Lookup<K> + ?Sized>(
            &self,
            key: &Q,
            max_wait: Duration,
        ) -> Result<Decision, WaitError> {
            self.until_n_ready(key, 1, max_wait).await
        }

        /// Waits until `n` units for `key` are admitted, as
        /// [`until_ready`](RateLimiter::until_ready).
        ///
        /// # Errors
        ///
        /// As [`reserve_n`](RateLimiter::reserve_n), at once.
        pub async fn until_n_ready<Q: Lookup<K> + ?Sized>(
            &self,
            key: &Q,
            n: u32,
            max_wait: Duration,
        ) -> Result<Decision, WaitError> {
            let mut reservation = self.reserve_n(key, n, max_wait)?;
            reservation.ready().await;
            Ok(reservation.decision())
        }
    }

    impl<C: Clock, P: CellFor<Gcra>> DirectLimiter<Gcra, C, P> {
        /// Waits until `n` units are admitted, as
        /// [`RateLimiter::until_ready`] (feature `tokio`).
        ///
        /// # Errors
        ///
        /// As [`reserve_n`](DirectLimiter::reserve_n), at once.
        pub async fn until_n_ready(
            &self,
            n: u32,
            max_wait: Duration,
        ) -> Result<Decision, WaitError> {
            let mut reservation = self.reserve_n(n, max_wait)?;
            reservation.ready().await;
            Ok(reservation.decision())
        }

        /// Waits until one unit is admitted, as
        /// [`RateLimiter::until_ready`] (feature `tokio`).
        ///
        /// # Errors
        ///
        /// As [`reserve_n`](DirectLimiter::reserve_n), at once.
        pub async fn until_ready(&self, max_wait: Duration) -> Result<Decision, WaitError> {
            self.until_n_ready(1, max_wait).await
        }
    }

    impl<'a, L: Ledger> Reservation<'a, L> {
        /// Sleeps, on tokio's timer, until the slot (feature `tokio`).
        /// Woken early only when a reservation ahead is given back and
        /// this one moves forward.
        pub fn ready(&mut self) -> Ready<'_, 'a, L> {
            Ready {
                reservation: self,
                sleep: None,
                armed_for: None,
            }
        }
    }

    /// The future of [`Reservation::ready`].
    #[must_use = "futures do nothing unless polled"]
    pub struct Ready<'r, 'a, L: Ledger> {
        reservation: &'r mut Reservation<'a, L>,
        sleep: Option<Pin<Box<Sleep>>>,
        /// The slot the timer is set for.
        armed_for: Option<u64>,
    }

    impl<L: Ledger> Future for Ready<'_, '_, L> {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let this = &mut *self;
            loop {
                let Standing::WaitsFor(slot_ns) = this.reservation.standing(Some(cx.waker()))
                else {
                    return Poll::Ready(());
                };
                if this.armed_for != Some(slot_ns) {
                    // The limiter's clock first, then the timer's: the
                    // deadline is never earlier than the slot.
                    let wait =
                        Duration::from_nanos(slot_ns.saturating_sub(this.reservation.now_ns()));
                    let deadline = Instant::now() + wait;
                    match &mut this.sleep {
                        Some(sleep) => sleep.as_mut().reset(deadline),
                        None => this.sleep = Some(Box::pin(sleep_until(deadline))),
                    }
                    this.armed_for = Some(slot_ns);
                }
                let sleep = this.sleep.as_mut().expect("armed above");
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                // The timer fired: the limiter's clock decides.
                this.armed_for = None;
            }
        }
    }

    impl<L: Ledger> std::fmt::Debug for Ready<'_, '_, L> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Ready")
                .field("reservation", &self.reservation)
                .field("armed_for", &self.armed_for)
                .finish_non_exhaustive()
        }
    }
}

#[cfg(feature = "tokio")]
pub use sleep::Ready;
