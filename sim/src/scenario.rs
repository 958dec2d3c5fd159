//! What a run simulates: the fleet, its traffic, its network, and the
//! faults that strike it.

/// A limit: a rate and a burst (the most admitted at once after a rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Admissions a second, sustained.
    pub per_s: u32,
    /// The most admitted at once.
    pub burst: u32,
}

impl Limit {
    /// One unit's refill time, ns.
    #[must_use]
    pub fn interval_ns(&self) -> u64 {
        1_000_000_000 / u64::from(self.per_s)
    }
}

/// Round trips between instances and servers: log-normal, of these medians
/// (µs) and shape; the last `cross_region_share` of the instances are in
/// another region.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Net {
    /// Median round trip within a zone, µs.
    pub in_zone_median_us: f64,
    /// Median round trip across regions, µs.
    pub cross_region_median_us: f64,
    /// The log-normal's shape (σ of the log).
    pub sigma: f64,
    /// The share of instances in the far region.
    pub cross_region_share: f64,
}

impl Net {
    /// In-zone round trips of a median of 250 µs (σ 0.4: p99 650 µs), and
    /// no instance across regions.
    #[must_use]
    pub const fn in_zone() -> Self {
        Self {
            in_zone_median_us: 250.0,
            cross_region_median_us: 60_000.0,
            sigma: 0.4,
            cross_region_share: 0.0,
        }
    }
}

/// Something that happens to the fleet at an instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// A share of the running instances crash, holding what they hold, and
    /// restart empty `down_ns` later.
    Crash {
        /// When.
        at_ns: u64,
        /// The share of running instances.
        share: f64,
        /// How long they stay down.
        down_ns: u64,
    },
    /// The traffic moves: the first half of the instances now takes
    /// `first_half_share` of it (half, before any shift).
    Shift {
        /// When.
        at_ns: u64,
        /// The first half's share from then on.
        first_half_share: f64,
    },
    /// The instances beyond the scenario's first ones start.
    Join {
        /// When.
        at_ns: u64,
    },
    /// A master fails over to a replica that lost its last `lost_ns` of
    /// writes, and whose clock reads `step_ns` later (negative: earlier).
    Failover {
        /// When.
        at_ns: u64,
        /// Which master.
        master: usize,
        /// The writes lost: those of this long before the failover.
        lost_ns: u64,
        /// The new master's clock against the old one's.
        step_ns: i64,
    },
    /// The last `share` of the running instances cannot reach any server
    /// until `until_ns`: their calls time out.
    Partition {
        /// When.
        at_ns: u64,
        /// Until when.
        until_ns: u64,
        /// The share of instances cut off.
        share: f64,
    },
}

impl Fault {
    /// When it happens.
    #[must_use]
    pub fn at_ns(&self) -> u64 {
        match *self {
            Fault::Crash { at_ns, .. }
            | Fault::Shift { at_ns, .. }
            | Fault::Join { at_ns }
            | Fault::Failover { at_ns, .. }
            | Fault::Partition { at_ns, .. } => at_ns,
        }
    }
}

/// A run: a fleet, a hot key and background keys, a network, faults.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Every draw follows from it.
    pub seed: u64,
    /// Instances running from the start.
    pub instances: usize,
    /// Instances that start at a [`Fault::Join`].
    pub joining: usize,
    /// Virtual time simulated, ns.
    pub duration_ns: u64,
    /// Admissions before this are not judged (the fleet starts cold).
    pub warmup_ns: u64,
    /// The hot key's limit.
    pub hot: Limit,
    /// The hot key's traffic, in multiples of its limit.
    pub hot_load: f64,
    /// Background keys, drawn by Zipf's law.
    pub keys: u64,
    /// Zipf's exponent.
    pub zipf_exponent: f64,
    /// Background checks a second, all keys together.
    pub background_per_s: f64,
    /// Every background key's limit.
    pub background: Limit,
    /// The network.
    pub net: Net,
    /// Servers the keys are spread over (Redis Cluster masters).
    pub masters: usize,
    /// The most two masters' clocks differ (each is set within it).
    pub skew_ns: u64,
    /// A server call's timeout.
    pub timeout_ns: u64,
    /// What strikes the fleet.
    pub faults: Vec<Fault>,
}

impl Scenario {
    /// The hot key's checks a second.
    #[must_use]
    pub fn hot_per_s(&self) -> f64 {
        self.hot_load * f64::from(self.hot.per_s)
    }

    /// Every check a second.
    #[must_use]
    pub fn checks_per_s(&self) -> f64 {
        self.hot_per_s() + self.background_per_s
    }

    /// The steady fleet: `instances` instances, a hot key of 20 000 a
    /// second (burst 20 000) at ten times its limit, a background of
    /// 50 000 checks a second over a million keys (Zipf, s = 1.0; each key
    /// 10 a second, burst 10), three masters, in-zone round trips, for
    /// `duration_ns` with the first second a warm-up; no fault.
    #[must_use]
    pub fn steady(instances: usize, duration_ns: u64, seed: u64) -> Self {
        Self {
            seed,
            instances,
            joining: 0,
            duration_ns,
            warmup_ns: 1_000_000_000,
            hot: Limit {
                per_s: 20_000,
                burst: 20_000,
            },
            hot_load: 10.0,
            keys: 1_000_000,
            zipf_exponent: 1.0,
            background_per_s: 50_000.0,
            background: Limit {
                per_s: 10,
                burst: 10,
            },
            net: Net::in_zone(),
            masters: 3,
            skew_ns: 2_000_000,
            timeout_ns: 250_000_000,
            faults: Vec::new(),
        }
    }

    /// The steady fleet of [`steady`](Scenario::steady), struck in turn
    /// (times from the run's start): at 1.2 s the first half of the
    /// instances takes 80 % of the traffic; at 1.5 s a tenth of them crash
    /// and restart 0.5 s later; at 1.8 s a tenth more join; at 3.0 s the
    /// hot key's master fails over to a replica that lost 50 ms of writes
    /// and whose clock is 20 ms ahead; from 3.5 s to 3.7 s the last 5 % of
    /// the running instances are cut off from every server. Needs at least
    /// 4 s; the crashes, the join and the shift are judged away from the
    /// failover's reach (two tolerances) until 3 s.
    #[must_use]
    pub fn struck(instances: usize, duration_ns: u64, seed: u64) -> Self {
        const MS: u64 = 1_000_000;
        let mut scenario = Self::steady(instances, duration_ns, seed);
        scenario.joining = instances.div_ceil(10);
        scenario.faults = vec![
            Fault::Shift {
                at_ns: 1_200 * MS,
                first_half_share: 0.8,
            },
            Fault::Crash {
                at_ns: 1_500 * MS,
                share: 0.1,
                down_ns: 500 * MS,
            },
            Fault::Join { at_ns: 1_800 * MS },
            Fault::Failover {
                at_ns: 3_000 * MS,
                master: crate::world::master_of(crate::world::HOT_KEY, scenario.masters),
                lost_ns: 50 * MS,
                step_ns: 20 * MS as i64,
            },
            Fault::Partition {
                at_ns: 3_500 * MS,
                until_ns: 3_700 * MS,
                share: 0.05,
            },
        ];
        scenario
    }
}
