//! The limits a service decides by, on whichever backend it runs.

use tollgate::algorithm::Carry;

use crate::config::Config;
use crate::limits::{Capacity, Descriptor, Limits, Reloaded, Request, Status, Unenforceable};
use crate::memory::Memory;
use crate::remote::Redis;

/// A configuration's limits, in memory or on Redis.
#[derive(Debug)]
pub enum Service {
    /// In this process.
    Memory(Limits<Memory>),
    /// On Redis, shared by every process on it.
    Redis(Limits<Redis>),
}

/// Where a service keeps its limits.
#[derive(Debug, Clone)]
pub enum Store {
    /// In this process.
    Memory,
    /// On Redis.
    Redis(Redis),
}

impl Service {
    /// The limits of `config` in `store`, every rule fresh.
    ///
    /// # Errors
    ///
    /// The first rule the store cannot enforce.
    pub fn new(config: Config, store: Store, capacity: Capacity) -> Result<Self, Unenforceable> {
        Ok(match store {
            Store::Memory => Service::Memory(Limits::new(config, Memory, capacity)?),
            Store::Redis(redis) => Service::Redis(Limits::new(config, redis, capacity)?),
        })
    }

    /// Decides `request` (see [`Limits::decide`]).
    ///
    /// # Errors
    ///
    /// On Redis, when it cannot decide and the failure policy is to say
    /// so; never in memory.
    pub async fn decide<D: Descriptor + Sync>(
        &self,
        request: &Request<'_, D>,
    ) -> Result<Vec<Status>, tollgate_redis::Error> {
        match self {
            Service::Memory(limits) => Ok(limits.decide(request)),
            Service::Redis(limits) => limits.decide(request).await,
        }
    }

    /// The limits of `config`, carrying `self`'s (see [`Limits::reload`]).
    ///
    /// # Errors
    ///
    /// The first rule the store cannot enforce: nothing changed.
    pub fn reload(
        &self,
        config: Config,
        carry: Carry,
    ) -> Result<(Self, Vec<Reloaded>), Unenforceable> {
        Ok(match self {
            Service::Memory(limits) => {
                let (limits, report) = limits.reload(config, carry)?;
                (Service::Memory(limits), report)
            }
            Service::Redis(limits) => {
                let (limits, report) = limits.reload(config, carry)?;
                (Service::Redis(limits), report)
            }
        })
    }

    /// Whether a rule's change is still to be carried.
    #[must_use]
    pub fn pending(&self) -> bool {
        match self {
            Service::Memory(limits) => limits.pending(),
            Service::Redis(limits) => limits.pending(),
        }
    }

    /// Removes idle keys held in this process; returns how many.
    #[must_use = "the keys removed, for the log"]
    pub fn evict_idle(&self) -> usize {
        match self {
            Service::Memory(limits) => limits.evict_idle(),
            Service::Redis(limits) => limits.evict_idle(),
        }
    }

    /// Hands the `metrics` recorder what the backend counted (on Redis:
    /// each rule's checks, local decisions, round trips, errors and
    /// breaker; nothing in memory).
    pub fn publish_metrics(&self) {
        if let Service::Redis(limits) = self {
            limits.publish_metrics();
        }
    }
}
