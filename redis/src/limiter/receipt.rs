//! Receipts: what gives a check's admission back when another limit
//! refuses the same request (the layer's rules), by undoing its write if
//! nothing was written on the key since.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::wire::{Script, evaluate, give_back_arguments};
use crate::connection::Connection;
use crate::error::Error;

/// What gives an admission back ([`RedisLimiter::check_n_receipt`](crate::RedisLimiter::check_n_receipt)):
/// the value the admission wrote and the one it replaced.
///
/// A refund undoes the admission if the key still holds what it wrote:
/// every later decision is then the one it would have been without the
/// admission. Once anything else was written on the key (an admission,
/// a unit given back, most carries to another quota) nothing is given
/// back: decisions were made counting it, and moving them could admit
/// more than the quota. Until a refund reaches Redis, the key holds the
/// admission: other requests may be denied by it meanwhile (over-denial,
/// never over-admission).
///
/// A receipt gives back once: [`refund`](RedisReceipt::refund) takes it,
/// and it cannot be copied. (The undo compares values: sent twice, a
/// refund could undo another request's admission that wrote the same
/// value after the first.)
pub struct RedisReceipt {
    connection: Connection,
    script: Arc<Script>,
    key: Vec<u8>,
    /// Whether the key is a sliding log's list (the write undone is its
    /// newest run).
    list: bool,
    written: Vec<u8>,
    /// Empty: the key (or the log's run) was new.
    previous: Vec<u8>,
    /// Refunds of this limiter in flight in tasks of their own.
    in_flight: Arc<AtomicUsize>,
}

/// The most refunds of one limiter in flight in tasks of their own
/// ([`RedisReceipt::refund_later`]); past them an admission stays charged.
const MAX_IN_FLIGHT: usize = 1_024;

impl RedisReceipt {
    pub(super) fn new(
        connection: &Connection,
        script: &Arc<Script>,
        in_flight: &Arc<AtomicUsize>,
        key: Vec<u8>,
        list: bool,
        written: Vec<u8>,
        previous: Vec<u8>,
    ) -> Self {
        Self {
            connection: connection.clone(),
            script: Arc::clone(script),
            key,
            list,
            written,
            previous,
            in_flight: Arc::clone(in_flight),
        }
    }

    /// Gives the admission back if nothing was written on its key since;
    /// returns whether it did.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when Redis cannot answer in time (the refund
    /// may or may not have run), [`Error::Script`] when the script fails.
    pub async fn refund(self) -> Result<bool, Error> {
        let reply: Vec<i64> = evaluate(&self.connection, &self.script, |name, body| {
            let mut command = redis::cmd(name);
            command.arg(body).arg(1).arg(&self.key);
            give_back_arguments(&mut command, self.list, &self.written, &self.previous);
            command
        })
        .await?;
        Ok(reply == [1])
    }

    /// [`refund`](RedisReceipt::refund) in a task spawned on the current
    /// tokio runtime, for a caller that cannot wait (a request refused or
    /// dropped). Each task ends within the connection's call timeout, and
    /// a limiter has at most 1 024 in flight: past them, and outside a
    /// runtime, nothing is sent and the admission stays charged (a flood
    /// of refused requests against a slow Redis keeps no more).
    pub fn refund_later(self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // Relaxed: a cap on tasks, ordered with nothing else.
        let slot = Slot(Arc::clone(&self.in_flight));
        if slot.0.fetch_add(1, Ordering::Relaxed) >= MAX_IN_FLIGHT {
            return;
        }
        runtime.spawn(async move {
            // Held until the task ends or is dropped (a runtime shutting
            // down), which gives the slot back either way.
            let _slot = slot;
            // Nothing to tell anyone: a refund that fails leaves the
            // admission charged, as one that finds the key moved on.
            let _ = self.refund().await;
        });
    }
}

/// One refund in flight, counted until dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for RedisReceipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisReceipt")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("written", &String::from_utf8_lossy(&self.written))
            .finish_non_exhaustive()
    }
}
