//! A server's keys as the fleet sees them: a Redis master's, replicated
//! with a lag to a replica that a failover promotes, deciding on a clock
//! of its own.

use std::collections::{HashMap, VecDeque};

use crate::scenario::{Fault, Scenario};

/// A master's keys of values `V`, its clock, and the writes its replica
/// has not yet received.
#[derive(Debug)]
pub struct Master<V> {
    keys: HashMap<u64, V>,
    /// The master's clock against the simulation's, ns.
    offset_ns: i64,
    /// Writes of the last `lag_ns`, each with the value it replaced: what
    /// a failover loses.
    recent: VecDeque<(u64, u64, Option<V>)>,
    lag_ns: u64,
}

impl<V: Clone> Master<V> {
    /// An empty master whose clock reads `offset_ns` off the simulation's,
    /// whose replica trails it by up to `lag_ns` of writes.
    #[must_use]
    pub fn new(offset_ns: i64, lag_ns: u64) -> Self {
        Self {
            keys: HashMap::new(),
            offset_ns,
            recent: VecDeque::new(),
            lag_ns,
        }
    }

    /// The master's clock at the simulation's `now_ns`, µs (as `TIME`).
    #[must_use]
    pub fn time_us(&self, now_ns: u64) -> u64 {
        now_ns.saturating_add_signed(self.offset_ns) / 1_000
    }

    /// `key`'s value.
    #[must_use]
    pub fn get(&self, key: u64) -> Option<&V> {
        self.keys.get(&key)
    }

    /// Writes `key`'s value at `now_ns`.
    pub fn set(&mut self, now_ns: u64, key: u64, value: V) {
        let previous = self.keys.insert(key, value);
        if self.lag_ns > 0 {
            self.recent.push_back((now_ns, key, previous));
            while self
                .recent
                .front()
                .is_some_and(|&(at, _, _)| at + self.lag_ns < now_ns)
            {
                self.recent.pop_front();
            }
        }
    }

    /// Fails over at `now_ns`: the writes of the last `lost_ns` are undone,
    /// the newest first, and the clock steps by `step_ns`.
    pub fn fail_over(&mut self, now_ns: u64, lost_ns: u64, step_ns: i64) {
        while let Some((at, key, previous)) = self.recent.pop_back() {
            if at + lost_ns < now_ns {
                break;
            }
            match previous {
                Some(value) => self.keys.insert(key, value),
                None => self.keys.remove(&key),
            };
        }
        self.recent.clear();
        self.offset_ns += step_ns;
    }
}

/// The masters of `scenario`, their clocks spread evenly over its skew,
/// each replica trailing by the longest write loss of its failovers.
#[must_use]
pub fn masters<V: Clone>(scenario: &Scenario) -> Vec<Master<V>> {
    let lag_ns = scenario
        .faults
        .iter()
        .map(|fault| match *fault {
            Fault::Failover { lost_ns, .. } => lost_ns,
            _ => 0,
        })
        .max()
        .unwrap_or(0);
    let count = scenario.masters;
    (0..count)
        .map(|index| {
            let spread = if count > 1 {
                (scenario.skew_ns as f64) * (index as f64 / (count - 1) as f64 - 0.5)
            } else {
                0.0
            };
            Master::new(spread as i64, lag_ns)
        })
        .collect()
}
