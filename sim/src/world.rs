//! The simulated world every design runs in: virtual time, one event queue,
//! the traffic and the faults of a [`Scenario`], the network's delays, and
//! the [`Tally`] of what was decided.
//!
//! Single-threaded and seeded: a run is a function of its scenario.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::rng::{Rng, Zipf};
use crate::scenario::{Fault, Scenario};
use crate::slab::Slab;
use crate::tally::{Contract, Tally};

/// The key every scenario makes hot.
pub const HOT_KEY: u64 = 0;

/// What a design does in the world: answers checks, and its own events.
pub trait Design {
    /// The design's own events (a call reaching a server, a reply, a
    /// periodic report).
    type Event;

    /// A check of one unit on `key` (the hot key, or a background one)
    /// arrived at `instance` now: decide it now or later, through
    /// [`World::decided`].
    fn arrival(&mut self, world: &mut World<Self::Event>, instance: usize, key: u64);

    /// One of the design's own events is due.
    fn event(&mut self, world: &mut World<Self::Event>, event: Self::Event);

    /// `instance` crashed: it loses everything it held, and answers
    /// nothing it was asked.
    fn crash(&mut self, world: &mut World<Self::Event>, instance: usize);

    /// `instance` starts, empty (a restart, or a new instance joining).
    fn start(&mut self, world: &mut World<Self::Event>, instance: usize);

    /// The server behind `master` failed over to a replica that lost the
    /// writes of the last `lost_ns` and whose clock reads `step_ns` off.
    fn failover(
        &mut self,
        world: &mut World<Self::Event>,
        master: usize,
        lost_ns: u64,
        step_ns: i64,
    );

    /// The limit the design promises on a key.
    fn contract(&self) -> Contract;

    /// Drops everything the instances hold (their servers stay): what
    /// this frees is their memory.
    fn release_instances(&mut self);
}

/// An event in the queue.
enum Due<E> {
    /// The next check arrives.
    Arrival,
    /// The scenario's fault of this index.
    Fault(usize),
    /// An instance crashed this long ago restarts.
    Restart(usize),
    /// A partition ends.
    Heal,
    Design(E),
}

/// The world: time, the queue, the traffic, the network, the tally.
pub struct World<E> {
    now_ns: u64,
    /// Read by the instances' clocks.
    clock: Arc<AtomicU64>,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    slab: Slab<Due<E>>,
    sequence: u64,
    /// The traffic's draws: arrivals, keys, instances. Every design of a
    /// scenario sees the same traffic.
    rng: Rng,
    /// The network's draws, which follow the design's calls.
    net_rng: Rng,
    scenario: Arc<Scenario>,
    zipf: Zipf,
    alive: Vec<bool>,
    cut: Vec<bool>,
    /// The share of the traffic the first half of the instances takes.
    first_half_share: f64,
    /// What was decided.
    pub tally: Tally,
}

impl<E> World<E> {
    fn new(scenario: Arc<Scenario>, tally: Tally) -> Self {
        let total = scenario.instances + scenario.joining;
        let mut alive = vec![false; total];
        alive[..scenario.instances].fill(true);
        Self {
            now_ns: 0,
            clock: Arc::new(AtomicU64::new(0)),
            queue: BinaryHeap::new(),
            slab: Slab::default(),
            sequence: 0,
            rng: Rng::new(scenario.seed),
            net_rng: Rng::new(scenario.seed ^ 0x6e65_7477_6f72_6b00),
            zipf: Zipf::new(scenario.keys, scenario.zipf_exponent),
            alive,
            cut: vec![false; total],
            first_half_share: 0.5,
            scenario,
            tally,
        }
    }

    /// Now, ns since the run began.
    #[must_use]
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// The time source every instance's clock reads.
    #[must_use]
    pub fn clock(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.clock)
    }

    /// The scenario being run.
    #[must_use]
    pub fn scenario(&self) -> &Scenario {
        &self.scenario
    }

    /// Schedules `event` `after_ns` from now.
    pub fn after(&mut self, after_ns: u64, event: E) {
        self.push(self.now_ns + after_ns, Due::Design(event));
    }

    fn push(&mut self, at_ns: u64, due: Due<E>) {
        let index = self.slab.insert(due);
        self.sequence += 1;
        // Ties go in the order scheduled.
        self.queue
            .push(Reverse((at_ns, (self.sequence << 24) | index as u64)));
        debug_assert!(index < 1 << 24, "more than 2^24 events pending");
    }

    fn pop(&mut self) -> Option<(u64, Due<E>)> {
        let Reverse((at_ns, tagged)) = self.queue.pop()?;
        let index = (tagged & ((1 << 24) - 1)) as usize;
        Some((at_ns, self.slab.take(index)))
    }

    /// A one-way network delay between `instance` and a server, ns: half
    /// a round trip drawn from the scenario's distribution (instances in
    /// the cross-region share are the farther ones).
    pub fn one_way_ns(&mut self, instance: usize) -> u64 {
        let net = &self.scenario.net;
        let total = self.alive.len();
        let far = (instance as f64) >= (total as f64) * (1.0 - net.cross_region_share);
        let median_us = if far {
            net.cross_region_median_us
        } else {
            net.in_zone_median_us
        };
        let rtt_us = self.net_rng.log_normal(median_us, net.sigma);
        (rtt_us * 500.0) as u64
    }

    /// Sends a call from `instance` (for the hot key, or carrying it):
    /// `arrives` is scheduled when it reaches its server, or `times_out`
    /// after the scenario's timeout when a partition cuts the instance off
    /// (a call sent before a partition still arrives).
    pub fn send(&mut self, instance: usize, hot: bool, arrives: E, times_out: E) {
        self.called(hot);
        if self.reachable(instance) {
            let delay = self.one_way_ns(instance);
            self.after(delay, arrives);
        } else {
            let timeout = self.scenario.timeout_ns;
            self.after(timeout, times_out);
        }
    }

    /// Answers a call: records `operations` run on `server`, and schedules
    /// `reply` when it reaches `instance`, one one-way delay from now.
    pub fn answer(&mut self, server: usize, operations: u64, instance: usize, reply: E) {
        self.operated(server, operations);
        let delay = self.one_way_ns(instance);
        self.after(delay, reply);
    }

    /// Whether `instance` can reach the servers now (no partition between).
    #[must_use]
    pub fn reachable(&self, instance: usize) -> bool {
        !self.cut[instance]
    }

    /// Whether `instance` runs now.
    #[must_use]
    pub fn is_alive(&self, instance: usize) -> bool {
        self.alive[instance]
    }

    /// The master serving `key`: its Cluster slot (a hash of the key mod
    /// 16 384) over the masters' equal ranges.
    #[must_use]
    pub fn master_of(&self, key: u64) -> usize {
        master_of(key, self.scenario.masters)
    }

    /// Records a check of `key` that arrived at `arrival_ns`, decided now.
    pub fn decided(&mut self, key: u64, arrival_ns: u64, admitted: bool) {
        let now_ns = self.now_ns;
        self.decided_at(key, arrival_ns, now_ns, admitted);
    }

    /// Records a check of `key` that arrived at `arrival_ns`, decided at
    /// `decided_ns` (by a server: its admission counts at that instant)
    /// and answered now.
    pub fn decided_at(&mut self, key: u64, arrival_ns: u64, decided_ns: u64, admitted: bool) {
        let now_ns = self.now_ns;
        self.tally
            .decided(key == HOT_KEY, arrival_ns, decided_ns, now_ns, admitted);
    }

    /// Records a call to a server or a peer, for the hot key or carrying it
    /// (`hot`).
    pub fn called(&mut self, hot: bool) {
        self.tally.called(hot, self.now_ns);
    }

    /// Records `operations` run on `server` (a master's commands, a peer's
    /// work).
    pub fn operated(&mut self, server: usize, operations: u64) {
        self.tally.operated(server, operations, self.now_ns);
    }

    /// Picks the instance a check goes to: the first or second half by
    /// their shares, a uniform one within it, never a dead one while any
    /// runs (a load balancer routes around them).
    fn pick_instance(&mut self) -> Option<usize> {
        let total = self.alive.len();
        let half = total.div_ceil(2);
        for _ in 0..64 {
            let (start, len) = if self.rng.unit() < self.first_half_share {
                (0, half)
            } else {
                (half, total - half)
            };
            if len == 0 {
                continue;
            }
            let instance = start + self.rng.below(len as u64) as usize;
            if self.alive[instance] {
                return Some(instance);
            }
        }
        (0..total).find(|&instance| self.alive[instance])
    }
}

/// The master of `masters` serving `key`: its Cluster slot (a hash of the
/// key mod 16 384) over the masters' equal ranges.
#[must_use]
pub fn master_of(key: u64, masters: usize) -> usize {
    let slot = mix(key) % 16_384;
    (slot as usize * masters) / 16_384
}

/// Spreads a key's bits (SplitMix64's finaliser): Cluster slots and owners.
#[must_use]
pub fn mix(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// How many timeouts a run goes on after its end, for the checks still
/// waiting then.
const DRAIN_TIMEOUTS: u64 = 5;

/// Runs `scenario` on `design` to its end and returns the tally; with
/// `live_bytes` (the bytes a counting allocator holds live), the instances'
/// memory is measured at the end as what releasing them frees.
pub fn run<D: Design>(
    scenario: Arc<Scenario>,
    design: &mut D,
    live_bytes: Option<fn() -> u64>,
) -> Tally {
    let tally = Tally::new(&scenario, design.contract());
    let mut world = World::<D::Event>::new(Arc::clone(&scenario), tally);
    for instance in 0..scenario.instances {
        design.start(&mut world, instance);
    }
    for (index, fault) in scenario.faults.iter().enumerate() {
        world.push(fault.at_ns(), Due::Fault(index));
    }
    let rate_per_ns = scenario.checks_per_s() / 1e9;
    let hot_share = scenario.hot_per_s() / scenario.checks_per_s();
    let first = world.rng.exponential(1.0 / rate_per_ns) as u64;
    world.push(first, Due::Arrival);
    while let Some((at_ns, due)) = world.pop() {
        // No check arrives after the run's end; the calls in flight land
        // (or time out) for five timeouts more, so that a check that waits
        // behind its key's claimed calls (at most four) is decided too.
        if at_ns
            >= scenario
                .duration_ns
                .saturating_add(DRAIN_TIMEOUTS * scenario.timeout_ns)
        {
            break;
        }
        if at_ns >= scenario.duration_ns && matches!(due, Due::Arrival) {
            continue;
        }
        world.now_ns = at_ns;
        world.clock.store(at_ns, Ordering::Relaxed);
        match due {
            Due::Arrival => {
                let key = if world.rng.unit() < hot_share {
                    HOT_KEY
                } else {
                    world.zipf.sample(&mut world.rng)
                };
                if let Some(instance) = world.pick_instance() {
                    world.tally.arrived(key, key == HOT_KEY, at_ns);
                    design.arrival(&mut world, instance, key);
                }
                let gap = world.rng.exponential(1.0 / rate_per_ns) as u64;
                world.push(at_ns + gap.max(1), Due::Arrival);
            }
            Due::Fault(index) => match scenario.faults[index] {
                Fault::Crash { share, down_ns, .. } => {
                    let mut alive: Vec<usize> =
                        (0..world.alive.len()).filter(|&i| world.alive[i]).collect();
                    let count = ((alive.len() as f64) * share).round() as usize;
                    // `count` distinct instances, in a seeded order.
                    alive.sort_unstable_by_key(|&instance| mix(instance as u64 ^ at_ns));
                    for &chosen in &alive[..count] {
                        world.alive[chosen] = false;
                        design.crash(&mut world, chosen);
                        world.push(at_ns + down_ns, Due::Restart(chosen));
                    }
                }
                Fault::Shift {
                    first_half_share, ..
                } => world.first_half_share = first_half_share,
                Fault::Join { .. } => {
                    for instance in scenario.instances..world.alive.len() {
                        if !world.alive[instance] {
                            world.alive[instance] = true;
                            design.start(&mut world, instance);
                        }
                    }
                }
                Fault::Failover {
                    master,
                    lost_ns,
                    step_ns,
                    ..
                } => {
                    world.tally.failover(at_ns);
                    design.failover(&mut world, master, lost_ns, step_ns);
                }
                Fault::Partition {
                    share, until_ns, ..
                } => {
                    let running: Vec<usize> =
                        (0..world.alive.len()).filter(|&i| world.alive[i]).collect();
                    let count = ((running.len() as f64) * share).round() as usize;
                    // The last of them: the far ones when some are.
                    for &instance in &running[running.len() - count..] {
                        world.cut[instance] = true;
                    }
                    world.tally.failover(at_ns);
                    world.push(until_ns, Due::Heal);
                }
            },
            Due::Restart(instance) => {
                world.alive[instance] = true;
                design.start(&mut world, instance);
            }
            Due::Heal => world.cut.fill(false),
            Due::Design(event) => design.event(&mut world, event),
        }
    }
    if let Some(live_bytes) = live_bytes {
        let before = live_bytes();
        design.release_instances();
        world.tally.instance_bytes = Some(before.saturating_sub(live_bytes()));
    }
    world.tally
}
