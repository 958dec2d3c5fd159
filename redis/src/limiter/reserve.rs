//! Reservations: an admission decided now for a future slot, waited for on
//! this process's timer, and given back when dropped before it.

use std::sync::Arc;
use std::time::Duration;

use tollgate::Decision;
use tollgate::algorithm::{Gcra, validate_cost};
use tollgate::wait::WaitError;

use super::RedisLimiter;
use super::time::Time;
use super::wire::{Call, Op, Script, evaluate, malformed, refund_arguments, reserved};
use crate::connection::Connection;
use crate::error::Error;
use crate::script::MAX_SPAN_US;

impl RedisLimiter<Gcra> {
    /// Reserves `cost` units for `key` at the earliest slot after every
    /// reservation already made on it, by any instance, if that slot is at
    /// most `max_wait` away: one round trip, in which the script admits the
    /// request now for its future slot. Reservations of one key are served
    /// in the order Redis runs them, whichever instance made them.
    ///
    /// # Errors
    ///
    /// [`Error::Wait`] ([`WaitError::TooLong`]) when the slot is further
    /// than `max_wait` (nothing is reserved), [`Error::Check`] for a cost
    /// of zero or above the burst, and [`Error::Unavailable`] when Redis
    /// cannot answer, whatever the failure policy (a reservation is
    /// Redis's or none).
    pub async fn reserve_n(
        &self,
        key: impl AsRef<[u8]>,
        cost: u32,
        max_wait: Duration,
    ) -> Result<RedisReservation, Error> {
        let core = &self.core;
        let stamp = core.quota.load().stamp;
        let limit = stamp.limit;
        validate_cost(cost, limit.burst)?;
        let tolerance_us = u64::from(limit.burst) * limit.span_us;
        // Whole microseconds, rounded down: never longer than asked.
        let max_wait_us = u64::try_from(max_wait.as_micros())
            .unwrap_or(u64::MAX)
            .min(MAX_SPAN_US.saturating_sub(tolerance_us));
        let now = core.time.now();
        let redis_key = core.namespace.key(key.as_ref());
        let entry = core.entry(redis_key.clone(), cost, &now, stamp);
        let reply: Vec<i64> = Call::new(Op::Reserve(max_wait_us), std::slice::from_ref(&entry))
            .send(&core.connection, &core.script)
            .await?;
        let (counts, tat_us) = reserved(&reply)?;
        if !counts.allowed {
            return Err(Error::Wait(WaitError::TooLong {
                wait: now.after(counts.retry_us.saturating_add(max_wait_us)),
                max_wait,
            }));
        }
        let wait_us = counts.reset_us.saturating_sub(tolerance_us);
        // At its slot the key owes exactly the tolerance; admitted at once,
        // what the script said.
        let decision = if wait_us > 0 {
            Decision::from_parts(limit.burst, 0, Duration::ZERO, now.after(tolerance_us))
        } else {
            Decision::from_parts(
                limit.burst,
                counts.remaining,
                Duration::ZERO,
                now.after(counts.reset_us),
            )
        }
        .ok_or_else(|| malformed(&reply))?;
        Ok(RedisReservation {
            refund: Some(Refund {
                connection: core.connection.clone(),
                script: Arc::clone(&core.script),
                time: core.time.clone(),
                key: redis_key,
                written_us: tat_us,
                restored_us: tat_us.saturating_sub(u64::from(cost) * limit.span_us),
                tolerance_us,
                stamp: stamp.written(),
            })
            .filter(|_| wait_us > 0),
            deadline: tokio::time::Instant::now() + now.after(wait_us),
            delay: now.after(wait_us),
            decision,
        })
    }

    /// Waits until one unit for `key` is admitted: [`reserve_n`](RedisLimiter::reserve_n)
    /// and a sleep until exactly the slot. Dropping the future before the
    /// slot gives the reservation back if no one reserved after it.
    ///
    /// # Errors
    ///
    /// As [`reserve_n`](RedisLimiter::reserve_n), at once.
    pub async fn until_ready(
        &self,
        key: impl AsRef<[u8]>,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        self.until_n_ready(key, 1, max_wait).await
    }

    /// Waits until `cost` units for `key` are admitted, as
    /// [`until_ready`](RedisLimiter::until_ready).
    ///
    /// # Errors
    ///
    /// As [`reserve_n`](RedisLimiter::reserve_n), at once.
    pub async fn until_n_ready(
        &self,
        key: impl AsRef<[u8]>,
        cost: u32,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        let mut reservation = self.reserve_n(key, cost, max_wait).await?;
        reservation.ready().await;
        Ok(reservation.decision())
    }
}

/// A reservation of a future admission in Redis ([`RedisLimiter::reserve_n`]).
///
/// Dropped before its slot, it is given back (in a task spawned on the
/// current tokio runtime) if no one has reserved or been admitted on the
/// key since, and kept otherwise: moving the slots of reservations made
/// after it, possibly by other instances, would need to tell their
/// waiters, nor if the key was carried over to another quota since.
/// [`cancel`](RedisReservation::cancel) gives it back now and says whether
/// it could. Refunds use `SET … KEEPTTL`: Redis 6.0 or later.
///
/// What is not given back: a reservation whose round trip was cut short
/// (the `reserve_n` future dropped while the script ran, or a call
/// timeout: the script may have reserved, and no one holds the slot; its
/// units are lost, never over-admitted), and one dropped outside a tokio
/// runtime, or on a runtime that stops before the spawned refund runs.
/// The slot is waited for on this process's timer, counted from the
/// reply's arrival: with tokio's clock paused, or a client clock that runs
/// slower than tokio's, `ready` can return before the deciding clock
/// reaches the slot.
#[must_use = "dropping a reservation before its slot gives it back"]
#[derive(Debug)]
pub struct RedisReservation {
    /// What gives it back; `None` once due, admitted at once, or given back.
    refund: Option<Refund>,
    deadline: tokio::time::Instant,
    delay: Duration,
    decision: Decision,
}

/// Everything a refund needs, owned, so that a dropped reservation can
/// send it from a task of its own.
struct Refund {
    connection: Connection,
    script: Arc<Script>,
    time: Time,
    key: Vec<u8>,
    written_us: u64,
    restored_us: u64,
    tolerance_us: u64,
    /// The stamp the reservation wrote with its TAT, if its quota's (a key
    /// stamped since by a later revision is not given back).
    stamp: String,
}

impl Refund {
    /// Restores the TAT if the key still holds the one this reservation
    /// wrote and its slot has not come (the script judges both).
    async fn send(self) -> Result<bool, Error> {
        let now = self.time.now();
        let reply: Vec<i64> = evaluate(&self.connection, &self.script, |name, body| {
            let mut command = redis::cmd(name);
            command.arg(body).arg(1).arg(&self.key);
            refund_arguments(
                &mut command,
                self.written_us,
                self.restored_us,
                &now,
                self.tolerance_us,
                &self.stamp,
            );
            command
        })
        .await?;
        Ok(reply == [1])
    }
}

impl std::fmt::Debug for Refund {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refund")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("written_us", &self.written_us)
            .finish_non_exhaustive()
    }
}

impl RedisReservation {
    /// Returns how long until the slot, on this process's timer (zero when
    /// due).
    #[must_use]
    pub fn wait(&self) -> Duration {
        self.deadline
            .saturating_duration_since(tokio::time::Instant::now())
    }

    /// Returns the decision the units are admitted with.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Returns how far the slot was from the clock reading the reservation
    /// was decided at: exact, where [`wait`](RedisReservation::wait) counts
    /// down on this process's timer from when the reply arrived.
    #[must_use]
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Sleeps until the slot: the units are then admitted.
    pub async fn ready(&mut self) {
        tokio::time::sleep_until(self.deadline).await;
        self.refund = None;
    }

    /// Gives the reservation back now, if no one has reserved or been
    /// admitted on the key since and its slot has not come; returns
    /// whether it did.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when Redis cannot answer in time: the refund
    /// may or may not have run.
    pub async fn cancel(mut self) -> Result<bool, Error> {
        match self.refund.take() {
            Some(refund) => refund.send().await,
            None => Ok(false),
        }
    }
}

impl Drop for RedisReservation {
    fn drop(&mut self) {
        let Some(refund) = self.refund.take() else {
            return;
        };
        if self.deadline <= tokio::time::Instant::now() {
            return;
        }
        // Outside a runtime nothing can be sent: the reservation is kept.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(refund.send());
        }
    }
}
