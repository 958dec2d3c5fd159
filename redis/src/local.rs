//! How much a GCRA limiter decides without Redis: every check on Redis
//! (exact), denials cached exactly, or leases of Redis's budget spent
//! locally (`tollgate::remote` holds the local half; the design notes
//! argue the bounds).

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tollgate::clock::Clock;
use tollgate::remote::{Leases, LocalView, RemoteClock, RemoteQuota};

#[cfg(doc)]
use crate::RedisLimiter;
use crate::error::ConfigError;
use crate::limiter::Current;
use crate::script::ScriptLimit;

/// How much a limiter decides locally. GCRA only (a denial writes nothing
/// and other instances only move a key's arrival time later, which is what
/// makes local knowledge stay true). On a Redis Cluster deciding on its
/// masters' own clocks, a mode other than `Exact` needs the most those
/// clocks differ ([`Builder::cluster_clock_skew`](crate::Builder::cluster_clock_skew)).
///
/// ```no_run
/// use tollgate::Quota;
/// use tollgate::remote::Leases;
/// use tollgate_redis::{Connection, Mode, RedisLimiter};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let connection = Connection::open("redis://127.0.0.1:6379/").await?;
/// let limiter = RedisLimiter::builder("api", Quota::per_second(1_000)?)
///     .mode(Mode::Leased(Leases::new()))
///     .build(connection)?;
/// // Most checks now take no round trip; Debug prints the bound.
/// println!("{limiter:?}");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mode {
    /// Every check is one round trip (the default).
    #[default]
    Exact,
    /// Denials are cached: a request that what Redis last told this
    /// instance already denies is denied here, as Redis would at that
    /// instant. Admissions are Redis's, so the limiter admits exactly what
    /// Redis alone admits; a drained hot key costs Redis about one call per
    /// instance per refilled unit instead of one per check. A check
    /// carrying its own quota ([`check_with`](RedisLimiter::check_with)) is
    /// denied by that quota's numbers, as Redis would. (Exceptions, never
    /// an admission: when units are given back on a key, a cancelled
    /// [reservation](RedisLimiter::reserve_n) or another instance's lease,
    /// a denial cached before can outlast Redis's by at most those units'
    /// intervals; and when another instance carries a key to a changed
    /// quota, by at most a tolerance.) A check of a key that misses while
    /// another check's ask for it is in flight waits for that reply (at
    /// most a call's timeout) and decides from it rather than asking too,
    /// and waits for the next reply as well while Redis denies (at most
    /// four): a hot key over its limit then takes a few calls per refilled
    /// unit, not one per check arriving during a round trip. It does not
    /// wait on a key with more than half its burst free by what this
    /// instance knows: the reply would most likely admit, and teach
    /// nothing that decides here. (In [`Mode::Leased`], it always waits:
    /// the reply may bring a lease.)
    DenyCached,
    /// Denials cached, and leases: a check that asks Redis also takes up to
    /// a lease's units of the key's budget, spent here by later checks
    /// without a round trip. No window of length `W` admits more than
    /// `burst + ⌊W / interval⌋ + slack` (the slack is zero unless chosen):
    /// with no slack, never more than Redis alone. Units a lease holds when
    /// its instance stops asking, or that expire unspent, are admitted by
    /// no one: under-admission, at most the units of the leases held.
    /// Leases serve the limiter's own quota: a check carrying another
    /// ([`check_with`](RedisLimiter::check_with)) spends none, is denied
    /// locally as the deny cache would, and otherwise asks Redis. A quota
    /// change ([`set_quota`](RedisLimiter::set_quota)) drops the leases
    /// held; a window near a key's change may also admit the units other
    /// instances, still on the old quota, held on it (see `set_quota`).
    Leased(Leases),
}

impl fmt::Debug for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Exact => f.write_str("Exact"),
            Mode::DenyCached => f.write_str("DenyCached"),
            Mode::Leased(leases) => f
                .debug_struct("Leased")
                .field("max_units", &leases.max_units())
                .field("slack", &leases.slack())
                .finish(),
        }
    }
}

impl Mode {
    /// What [`Mode::Exact`] promises.
    pub(crate) const EXACT_BOUND: &'static str = "exact: every check decided by Redis";

    /// Says what this mode promises for `quota`, in words (the limiter's
    /// `Debug` prints it).
    pub(crate) fn bound(self, limit: &ScriptLimit) -> String {
        let rate = format!("{} + ⌊W / {} µs⌋", limit.burst, limit.span_us);
        match self {
            Mode::Exact => Self::EXACT_BOUND.to_owned(),
            Mode::DenyCached => format!(
                "exact: admits what Redis alone admits (at most {rate} in any window W); \
                 denials cached until Redis's own end"
            ),
            Mode::Leased(leases) => format!(
                "at most {rate}{} in any window W{}; under-admission at most the unspent \
                 units of leases held (up to {} per instance and key)",
                if leases.slack() == 0 {
                    String::new()
                } else {
                    format!(" + {}", leases.slack())
                },
                if leases.slack() == 0 {
                    " (as Redis alone)"
                } else {
                    ""
                },
                leases.max_units()
            ),
        }
    }
}

/// A limiter's local half: the view (with the clock its instants come
/// from), each of its quotas with the limiter's quota and stamp attached,
/// and the mode it was built for.
pub(crate) struct Hybrid {
    pub(crate) view: LocalView<Vec<u8>, Option<Current>>,
    pub(crate) mode: Mode,
    /// The keys whose claimed ask is in flight (until its [`Flight`] is
    /// dropped, or replaced by the next claim's): a check that misses
    /// meanwhile waits on it and decides again from what the reply taught,
    /// rather than asking too.
    pub(crate) flights: Flights,
}

/// The claimed asks in flight, by key.
#[derive(Default)]
pub(crate) struct Flights(Mutex<HashMap<Vec<u8>, Arc<InFlight>>>);

/// A claimed ask in flight, as the checks waiting on it see it: whether
/// its flight is over, whether Redis denied it (a key over its limit: a
/// waiter may wait for the next reply too; after an admission, a failure
/// or a dropped caller it asks itself), and what wakes them.
#[derive(Default)]
pub(crate) struct InFlight {
    over: AtomicBool,
    denied: AtomicBool,
    landed: tokio::sync::Notify,
}

/// A claimed ask in flight, registered in [`Hybrid::flights`] until
/// dropped or replaced by the next claim's. Dropped (after its reply was
/// installed, or its call failed, or its caller went away), it
/// unregisters itself if still registered, then wakes every check waiting
/// on it at once: each decides again from what the view knows then, which
/// a later waker could find expired.
pub(crate) struct Flight<'a> {
    flights: &'a Flights,
    key: Vec<u8>,
    state: Arc<InFlight>,
}

impl Flight<'_> {
    /// Records whether Redis admitted the ask, for the checks waiting on
    /// it.
    pub(crate) fn answered(&self, allowed: bool) {
        // Published to the waiters by `over`'s store.
        self.state.denied.store(!allowed, Ordering::Relaxed);
    }
}

impl InFlight {
    /// Waits until the flight is over, for at most `timeout`; returns
    /// whether a waiter may wait for the next one too (the reply denied).
    pub(crate) async fn wait(&self, timeout: Duration) -> bool {
        let landed = self.landed.notified();
        tokio::pin!(landed);
        // Registered before `over` is read: a flight that ends after the
        // read wakes this waiter.
        landed.as_mut().enable();
        // Acquire: pairs with the Release store, so `denied` is the reply's.
        if !self.over.load(Ordering::Acquire)
            && tokio::time::timeout(timeout, landed).await.is_err()
        {
            return false;
        }
        // Woken: the notification orders the stores before it.
        self.denied.load(Ordering::Relaxed)
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        {
            let mut flights = self
                .flights
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // Only this flight's entry: the next claim may have replaced it.
            if flights
                .get(&self.key)
                .is_some_and(|registered| Arc::ptr_eq(registered, &self.state))
            {
                flights.remove(&self.key);
            }
        }
        self.state.over.store(true, Ordering::Release);
        self.state.landed.notify_waiters();
    }
}

impl Flights {
    /// Registers `key`'s claimed ask as in flight, in place of any ask
    /// registered before it: that one's claim is over (its reply was
    /// installed or its call failed, and its flight is about to end; or
    /// its claim went stale and was taken over), and a check that misses
    /// now must wait on this one.
    pub(crate) fn fly(&self, key: &[u8]) -> Flight<'_> {
        let state = Arc::new(InFlight::default());
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.to_vec(), Arc::clone(&state));
        Flight {
            flights: self,
            key: key.to_vec(),
            state,
        }
    }

    /// `key`'s claimed ask in flight, if one is.
    pub(crate) fn in_flight(&self, key: &[u8]) -> Option<Arc<InFlight>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }
}

impl Hybrid {
    /// Makes the local half for `mode` (a deny cache for [`Mode::Exact`] too,
    /// which is never built), its instants read from `clock`, the remote
    /// deciding on `remote`.
    pub(crate) fn new(
        mode: Mode,
        quota: RemoteQuota,
        current: Current,
        clock: Arc<dyn Clock>,
        remote: RemoteClock,
        max_keys: NonZeroUsize,
        claim_timeout: Duration,
    ) -> Result<Self, ConfigError> {
        let leases = match mode {
            Mode::Exact | Mode::DenyCached => None,
            Mode::Leased(leases) => Some(leases),
        };
        let view = LocalView::with_payload(
            quota,
            Some(current),
            remote,
            clock,
            leases,
            max_keys,
            claim_timeout,
        )
        .map_err(ConfigError::Local)?;
        Ok(Self {
            view,
            mode,
            flights: Flights::default(),
        })
    }
}

/// The local clock beside a server's `TIME`: nanoseconds of
/// `CLOCK_BOOTTIME` since the limiter was built. It counts the time a
/// suspended system sleeps, as the server's clock goes on counting it; a
/// monotonic clock that stops meanwhile would put every lease's deadline
/// that much later on resume, and spend units past them.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[derive(Debug)]
pub(crate) struct BootClock {
    origin_ns: u64,
}

#[cfg(any(target_os = "linux", target_os = "android"))]
impl BootClock {
    pub(crate) fn new() -> Self {
        Self {
            origin_ns: Self::read(),
        }
    }

    fn read() -> u64 {
        let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        u64::try_from(now.tv_sec)
            .unwrap_or(0)
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::try_from(now.tv_nsec).unwrap_or(0))
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
impl Clock for BootClock {
    fn now_ns(&self) -> u64 {
        Self::read().saturating_sub(self.origin_ns)
    }
}

/// Elsewhere, the monotonic clock (which on some systems stops while the
/// system is suspended, as the design notes discuss).
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(crate) type BootClock = tollgate::clock::MonotonicClock;

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    use super::Flights;

    fn poll<F: Future>(future: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        future.poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn a_flight_that_ends_leaves_the_next_one_registered() {
        let flights = Flights::default();
        let first = flights.fly(b"key");
        // The next claim, taken before the first flight was dropped.
        let second = flights.fly(b"key");
        drop(first);
        let registered = flights.in_flight(b"key").expect("the second flight");
        assert!(Arc::ptr_eq(&registered, &second.state));
        drop(second);
        assert!(flights.in_flight(b"key").is_none());
    }

    #[test]
    fn every_waiter_wakes_when_the_flight_lands() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _entered = runtime.enter();
        let flights = Flights::default();
        let flight = flights.fly(b"key");
        flight.answered(false);
        let state = flights.in_flight(b"key").unwrap();
        let mut waiters: Vec<_> = (0..3)
            .map(|_| Box::pin(state.wait(Duration::from_secs(60))))
            .collect();
        for waiter in &mut waiters {
            assert!(poll(waiter.as_mut()).is_pending());
        }
        drop(flight);
        // The last waiter first: none waits for another to run.
        for waiter in waiters.iter_mut().rev() {
            assert_eq!(poll(waiter.as_mut()), Poll::Ready(true), "told: denied");
        }
        // After the landing, at once.
        assert_eq!(
            poll(pin!(state.wait(Duration::from_secs(60)))),
            Poll::Ready(true)
        );
    }
}
