//! The queues behind [`Reservation`](super::Reservation): each key's
//! pending reservations, in slot order, and how one is given back.
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

use crate::store::Lookup;
use crate::sync::canary::{self, Canary};
use crate::sync::{Arc, Mutex, lock};

/// Shards of the table of queues: reservations of different keys rarely
/// meet on a lock.
const QUEUE_SHARDS: usize = 8;

/// The capacity below which a queue or a shard of queues is not shrunk: a
/// few entries cost less than reallocating for them again and again.
const MIN_CAPACITY: usize = 8;

/// The capacity to shrink to when `len` entries use a quarter of
/// `capacity` or less (halving then keeps the cost amortised), or `None`.
fn shrunk_capacity(len: usize, capacity: usize) -> Option<usize> {
    let held = len.max(MIN_CAPACITY);
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
pub(super) struct Queue<K> {
    /// The key, for the refunds (the queue is found by it too).
    pub(super) key: K,
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
    /// The generation its TAT was written in (`Booked::stamp`).
    stamp: u64,
    waker: Option<Waker>,
}

/// What a reservation that waits wrote: its slot, the TAT after it, its
/// cost and the generation of the key's state it was written in (its
/// number; 0 for a direct limiter, which has one).
pub(super) struct Booked {
    pub(super) slot_ns: u64,
    pub(super) tat_ns: u64,
    pub(super) cost_ns: u64,
    pub(super) stamp: u64,
}

/// Where a reservation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Standing {
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
    pub(super) fn reserve<Q, E>(
        &self,
        key: &Q,
        reserve: impl FnOnce() -> Result<(u64, Option<Booked>), E>,
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
            let booked = match catch_unwind(AssertUnwindSafe(reserve)) {
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
            state.tail_tat_ns = booked.tat_ns;
            let id = state.next_id;
            state.next_id += 1;
            state.pending.push_back(Pending {
                id,
                cost_ns: booked.cost_ns,
                slot_ns: booked.slot_ns,
                stamp: booked.stamp,
                waker: None,
            });
            drop(state);
            return Ok(Some(Ticket { queue, id }));
        }
    }

    /// Removes `queue` from the table if it has no pending reservation.
    pub(super) fn remove_if_empty(&self, queue: &Arc<Queue<K>>) {
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
            // As a queue does: the shard's capacity follows the keys
            // waiting now, not the most that ever waited at once.
            if let Some(capacity) = shrunk_capacity(shard.len(), shard.capacity()) {
                shard.shrink_to(capacity);
            }
        }
    }
}

/// A pending reservation: its queue and its place in it.
pub(super) struct Ticket<K> {
    pub(super) queue: Arc<Queue<K>>,
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

    /// Gives back the capacity of entries that left, once the queue uses a
    /// quarter of it: the queue's memory follows the reservations held, not
    /// the most it ever held (halving keeps the cost amortised).
    fn shrink(&mut self) {
        if let Some(capacity) = shrunk_capacity(self.pending.len(), self.pending.capacity()) {
            self.pending.shrink_to(capacity);
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
    pub(super) fn standing(&self, now: impl FnOnce() -> u64, waker: Option<&Waker>) -> Standing {
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
    /// `refund(tail_tat, restored_tat, stamp)` (a compare-and-exchange of
    /// the key's TAT, if it is still in the generation `stamp` the
    /// reservation was written in) and moves every later slot earlier by
    /// its cost, waking their waiters; at or after it, keeps it (it was
    /// admitted).
    pub(super) fn cancel(
        &self,
        now: impl FnOnce() -> u64,
        refund: impl FnOnce(u64, u64, u64) -> bool,
    ) {
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
        let Pending { cost_ns, stamp, .. } = state.pending[index];
        // A refund that fails (which nothing in process makes happen while
        // a reservation is pending) keeps the units: the schedule stays as
        // it was, conservative.
        let tail = state.tail_tat_ns;
        let refunded = !canary::planted(Canary::CancelWithoutRefund)
            && refund(tail, tail.saturating_sub(cost_ns), stamp);
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
        // canary leaves it queued until it reaches the front, so that the
        // queue holds reservations no caller holds).
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
    pub(super) fn forget(&self) {
        let mut state = lock(&self.queue.state);
        if let Some(index) = state.index(self.id) {
            state.remove(index);
        }
    }

    /// The slot, or `Due`, at `now_ns` (read under the queue's lock by the
    /// caller's closure); a reading that finds it due makes it due for
    /// good (see `QueueState::seen_ns`).
    pub(super) fn peek(&self, now: impl FnOnce() -> u64) -> Standing {
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
    pub(super) fn len(&self) -> usize {
        self.tables.get().map_or(0, |tables| {
            tables
                .shards
                .iter()
                .map(|shard| lock(shard).values().map(Vec::len).sum::<usize>())
                .sum()
        })
    }

    /// How many reservations wait for their slot, over every key.
    pub(super) fn reservations(&self) -> usize {
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
