//! Waiting on tokio's timer (feature `tokio`): the limiters' `until_ready`
//! and the future of [`Reservation::ready`].

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep, sleep_until};

use super::queue::Standing;
use super::{Ledger, Reservation, WaitError};
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
    /// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter: RateLimiter<String> = RateLimiter::keyed(Quota::per_second(100)?.with_burst(1)?);
    /// limiter.until_ready("upstream", Duration::from_secs(1)).await?;
    /// // The next one sleeps about 10 ms.
    /// limiter.until_ready("upstream", Duration::from_secs(1)).await?;
    /// # Ok(())
    /// # }
    /// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
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
    pub async fn until_n_ready(&self, n: u32, max_wait: Duration) -> Result<Decision, WaitError> {
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
            let Standing::WaitsFor(slot_ns) = this.reservation.standing(Some(cx.waker())) else {
                return Poll::Ready(());
            };
            if this.armed_for != Some(slot_ns) {
                // The limiter's clock first, then the timer's: the
                // deadline is never earlier than the slot.
                let wait = Duration::from_nanos(slot_ns.saturating_sub(this.reservation.now_ns()));
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
