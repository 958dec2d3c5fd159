//! Periodic local counting, as Databricks describes its rate limiter
//! ("High Performance Ratelimiting at Databricks", 2025): each instance
//! decides on its own, and reports its counts every 100 ms to the service
//! that owns the key, which answers with a rejection rate. The post's
//! details beyond that (what exactly is reported and returned) are not
//! public; this model takes the simplest reading:
//!
//! - an instance admits a check with probability `1 − p`, `p` the key's
//!   latest rejection rate (0 before any answer);
//! - every 100 ms it sends each master the checks it saw per key since its
//!   last report, in one call;
//! - the master sums every instance's checks of a key per 100 ms period,
//!   and answers `p = 1 − limit / rate` from the last whole period's rate
//!   (0 when under the limit).

use std::collections::HashMap;
use std::rc::Rc;

use crate::rng::Rng;
use crate::scenario::{Limit, Scenario};
use crate::server::{self, Master};
use crate::tally::Contract;
use crate::world::{Design, HOT_KEY, World};

/// The reporting period.
const PERIOD_NS: u64 = 100_000_000;

/// A key on a master: the period it counts and its count, and the last
/// whole period's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    period: u64,
    current: u64,
    last: u64,
}

/// One instance: each key's rejection rate and checks since its report.
#[derive(Default)]
struct Instance {
    rejection: HashMap<u64, f64>,
    seen: HashMap<u64, u64>,
}

/// The design's events.
#[derive(Debug, Clone)]
pub enum Event {
    /// An instance reports.
    Report { instance: usize, epoch: u64 },
    /// A report reaches its master.
    AtMaster {
        instance: usize,
        master: usize,
        counts: Rc<Vec<(u64, u64)>>,
    },
    /// The answer reaches the instance.
    Answer {
        instance: usize,
        epoch: u64,
        rates: Rc<Vec<(u64, f64)>>,
    },
    /// A report that could not be sent.
    Lost,
}

/// Local decisions, reports every 100 ms, rejection rates back.
pub struct Databricks {
    limits: [Limit; 2],
    instances: Vec<Option<Instance>>,
    epochs: Vec<u64>,
    masters: Vec<Master<Counts>>,
    rng: Rng,
}

impl Databricks {
    /// The design for `scenario`.
    #[must_use]
    pub fn new(scenario: &Scenario) -> Self {
        let total = scenario.instances + scenario.joining;
        Self {
            limits: [scenario.hot, scenario.background],
            instances: (0..total).map(|_| None).collect(),
            epochs: vec![0; total],
            masters: server::masters(scenario),
            rng: Rng::new(scenario.seed ^ 0x6461_7461),
        }
    }
}

impl Design for Databricks {
    type Event = Event;

    fn arrival(&mut self, world: &mut World<Event>, instance: usize, key: u64) {
        let Some(state) = self.instances[instance].as_mut() else {
            return;
        };
        *state.seen.entry(key).or_default() += 1;
        let rejection = state.rejection.get(&key).copied().unwrap_or(0.0);
        let admitted = rejection == 0.0 || self.rng.unit() >= rejection;
        let now_ns = world.now_ns();
        world.decided(key, now_ns, admitted);
    }

    fn event(&mut self, world: &mut World<Event>, event: Event) {
        match event {
            Event::Report { instance, epoch } => {
                if self.epochs[instance] != epoch {
                    return;
                }
                world.after(PERIOD_NS, Event::Report { instance, epoch });
                let Some(state) = self.instances[instance].as_mut() else {
                    return;
                };
                let mut by_master: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
                for (key, count) in state.seen.drain() {
                    by_master
                        .entry(world.master_of(key))
                        .or_default()
                        .push((key, count));
                }
                let mut by_master: Vec<_> = by_master.into_iter().collect();
                by_master.sort_unstable_by_key(|&(master, _)| master);
                for (master, counts) in by_master {
                    let hot = counts.iter().any(|&(key, _)| key == HOT_KEY);
                    let counts = Rc::new(counts);
                    world.send(
                        instance,
                        hot,
                        Event::AtMaster {
                            instance,
                            master,
                            counts,
                        },
                        Event::Lost,
                    );
                }
            }
            Event::AtMaster {
                instance,
                master,
                counts,
            } => {
                let now_ns = world.now_ns();
                let period = now_ns / PERIOD_NS;
                let server = &mut self.masters[master];
                let mut rates = Vec::with_capacity(counts.len());
                for &(key, count) in counts.iter() {
                    let mut entry = server.get(key).copied().unwrap_or_default();
                    if entry.period != period {
                        entry.last = if entry.period + 1 == period {
                            entry.current
                        } else {
                            0
                        };
                        entry.current = 0;
                        entry.period = period;
                    }
                    entry.current += count;
                    server.set(now_ns, key, entry);
                    let limit = self.limits[usize::from(key != HOT_KEY)];
                    let allowed = f64::from(limit.per_s) * PERIOD_NS as f64 / 1e9;
                    let rate = entry.last as f64;
                    let rejection = if rate > allowed {
                        1.0 - allowed / rate
                    } else {
                        0.0
                    };
                    rates.push((key, rejection));
                }
                let epoch = self.epochs[instance];
                let rates = Rc::new(rates);
                let answer = Event::Answer {
                    instance,
                    epoch,
                    rates,
                };
                world.answer(master, counts.len() as u64, instance, answer);
            }
            Event::Answer {
                instance,
                epoch,
                rates,
            } => {
                if self.epochs[instance] != epoch {
                    return;
                }
                if let Some(state) = self.instances[instance].as_mut() {
                    for &(key, rejection) in rates.iter() {
                        state.rejection.insert(key, rejection);
                    }
                }
            }
            Event::Lost => {}
        }
    }

    fn crash(&mut self, _world: &mut World<Event>, instance: usize) {
        self.epochs[instance] += 1;
        self.instances[instance] = None;
    }

    fn start(&mut self, world: &mut World<Event>, instance: usize) {
        self.epochs[instance] += 1;
        self.instances[instance] = Some(Instance::default());
        // Instances report on their own phase.
        let phase = self.rng.below(PERIOD_NS);
        let epoch = self.epochs[instance];
        world.after(phase, Event::Report { instance, epoch });
    }

    fn contract(&self) -> Contract {
        Contract::Gcra
    }

    fn failover(&mut self, world: &mut World<Event>, master: usize, lost_ns: u64, step_ns: i64) {
        self.masters[master].fail_over(world.now_ns(), lost_ns, step_ns);
    }

    fn release_instances(&mut self) {
        self.instances = Vec::new();
    }
}
