//! What a run decided, and the figures drawn from it.

use std::collections::HashMap;

use tollgate::remote::{LeaseRequest, RemoteQuota, lease};

use crate::scenario::{Limit, Scenario};

/// The limit a design promises on one key, against which its admissions
/// are judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contract {
    /// GCRA (and a token bucket): any window of length `W` holds at most
    /// `burst + ⌊W / interval⌋` admissions.
    Gcra,
    /// A fixed window of a second: each aligned second holds at most the
    /// limit.
    FixedWindow,
}

/// One limiter deciding every arrival at once, with no delay: what a
/// design is held against. GCRA is the script's Rust twin's, on
/// microseconds; the fixed window counts each second.
#[derive(Debug)]
struct Reference {
    contract: Contract,
    limit: Limit,
    quota: RemoteQuota,
    /// GCRA: the key's TAT, µs; a fixed window: its second and count.
    keys: HashMap<u64, (u64, u32)>,
}

impl Reference {
    fn new(contract: Contract, limit: Limit) -> Self {
        Self {
            contract,
            limit,
            quota: RemoteQuota::new(limit.interval_ns() / 1_000, limit.burst)
                .expect("a valid quota"),
            keys: HashMap::new(),
        }
    }

    /// Whether the reference admits a check of `key` at `at_ns`.
    fn admit(&mut self, key: u64, at_ns: u64) -> bool {
        match self.contract {
            Contract::Gcra => {
                let stored = self.keys.get(&key).map(|&(tat_us, _)| tat_us);
                let (reply, written) =
                    lease(stored, at_ns / 1_000, &self.quota, &LeaseRequest::plain(1))
                        .expect("a valid request");
                if let Some(tat_us) = written {
                    self.keys.insert(key, (tat_us, 0));
                }
                reply.allowed
            }
            Contract::FixedWindow => {
                let second = at_ns / 1_000_000_000;
                let entry = self.keys.entry(key).or_insert((second, 0));
                if entry.0 != second {
                    *entry = (second, 0);
                }
                entry.1 += 1;
                entry.1 <= self.limit.per_s
            }
        }
    }
}

/// Everything recorded during a run: the hot key's admissions for the
/// windows from the start, the rest after the warm-up only (its first
/// calls, when every instance learns every key, are not the fleet's
/// steady cost), and calls and operations before the run's end.
#[derive(Debug)]
pub struct Tally {
    hot: Limit,
    warmup_ns: u64,
    /// The run's end: no check arrives after it, and calls and operations
    /// count before it (those of checks in flight then land later).
    end_ns: u64,
    /// Checks decided, all keys, of those that arrived after the warm-up.
    pub checks: u64,
    /// The hot key's checks decided.
    pub hot_checks: u64,
    /// Calls to servers that checks caused after the warm-up, all keys.
    pub calls: u64,
    /// Calls for the hot key.
    pub hot_calls: u64,
    /// Server-side operations per server (masters, or peers) after the
    /// warm-up.
    pub operations: Vec<u64>,
    /// Checks that waited, ns each (saturated at `u32::MAX`).
    waits_ns: Vec<u32>,
    /// The hot key's checks that waited.
    hot_waits_ns: Vec<u32>,
    /// The hot key's admissions decided after the warm-up, before the end.
    hot_admitted: u64,
    /// The instants the hot key's admissions were decided.
    hot_admissions_ns: Vec<u64>,
    /// Instants a fault began (failovers and partitions).
    faults_ns: Vec<u64>,
    /// The references of the hot key and of the background keys.
    references: [Reference; 2],
    /// Hot checks after the warm-up the reference admits.
    hot_ideal: u64,
    /// Background checks after the warm-up the reference admits.
    pub background_ideal: u64,
    /// Background admissions decided after the warm-up, before the end.
    pub background_admitted: u64,
    /// What the instances held at the end, all together (if measured).
    pub instance_bytes: Option<u64>,
}

impl Tally {
    /// An empty tally for `scenario`.
    #[must_use]
    pub fn new(scenario: &Scenario, contract: Contract) -> Self {
        Self {
            hot: scenario.hot,
            warmup_ns: scenario.warmup_ns,
            end_ns: scenario.duration_ns,
            checks: 0,
            hot_checks: 0,
            calls: 0,
            hot_calls: 0,
            operations: vec![0; scenario.masters],
            waits_ns: Vec::new(),
            hot_waits_ns: Vec::new(),
            hot_admitted: 0,
            hot_admissions_ns: Vec::new(),
            faults_ns: Vec::new(),
            references: [
                Reference::new(contract, scenario.hot),
                Reference::new(contract, scenario.background),
            ],
            hot_ideal: 0,
            background_ideal: 0,
            background_admitted: 0,
            instance_bytes: None,
        }
    }

    pub(crate) fn arrived(&mut self, key: u64, hot: bool, at_ns: u64) {
        let admitted = self.references[usize::from(!hot)].admit(key, at_ns);
        let counted = u64::from(admitted && at_ns >= self.warmup_ns);
        if hot {
            self.hot_ideal += counted;
        } else {
            self.background_ideal += counted;
        }
    }

    pub(crate) fn decided(
        &mut self,
        hot: bool,
        arrival_ns: u64,
        decided_ns: u64,
        now_ns: u64,
        admitted: bool,
    ) {
        // Every admission counts for the windows; against the reference,
        // those decided within the judged span (the reference's are its
        // arrivals within it: a check's round trip moves its decision, and
        // those in flight at either end balance); checks and waits by
        // their arrival after the warm-up.
        if admitted {
            if hot {
                self.hot_admissions_ns.push(decided_ns);
            }
            if (self.warmup_ns..self.end_ns).contains(&decided_ns) {
                if hot {
                    self.hot_admitted += 1;
                } else {
                    self.background_admitted += 1;
                }
            }
        }
        if arrival_ns < self.warmup_ns {
            return;
        }
        self.checks += 1;
        let wait = u32::try_from(now_ns - arrival_ns).unwrap_or(u32::MAX);
        if wait > 0 {
            self.waits_ns.push(wait);
        }
        if hot {
            self.hot_checks += 1;
            if wait > 0 {
                self.hot_waits_ns.push(wait);
            }
        }
    }

    pub(crate) fn called(&mut self, hot: bool, at_ns: u64) {
        if (self.warmup_ns..self.end_ns).contains(&at_ns) {
            self.calls += 1;
            self.hot_calls += u64::from(hot);
        }
    }

    pub(crate) fn operated(&mut self, server: usize, operations: u64, at_ns: u64) {
        if self.operations.len() <= server {
            self.operations.resize(server + 1, 0);
        }
        if (self.warmup_ns..self.end_ns).contains(&at_ns) {
            self.operations[server] += operations;
        }
    }

    pub(crate) fn failover(&mut self, at_ns: u64) {
        self.faults_ns.push(at_ns);
    }

    /// The figures of a run of `duration_ns` whose instances numbered
    /// `instances`, judged by the design's contract.
    #[must_use]
    pub fn figures(&mut self, duration_ns: u64, instances: usize) -> Figures {
        self.hot_admissions_ns.sort_unstable();
        let (over, over_in_faults) = match self.references[0].contract {
            Contract::Gcra => self.gcra_over(),
            Contract::FixedWindow => self.fixed_window_over(),
        };
        let ideal = self.hot_ideal;
        let admitted = self.hot_admitted;
        let seconds = duration_ns.saturating_sub(self.warmup_ns) as f64 / 1e9;
        Figures {
            calls_per_check: self.calls as f64 / self.checks.max(1) as f64,
            hot_calls_per_check: self.hot_calls as f64 / self.hot_checks.max(1) as f64,
            over,
            over_in_faults,
            admitted,
            ideal,
            hot_wait_p50_us: percentile(&mut self.hot_waits_ns, self.hot_checks, 0.50),
            hot_wait_p99_us: percentile(&mut self.hot_waits_ns, self.hot_checks, 0.99),
            wait_p99_us: percentile(&mut self.waits_ns, self.checks, 0.99),
            operations_per_s: self.operations.iter().copied().max().unwrap_or(0) as f64 / seconds,
            bytes_per_instance: self
                .instance_bytes
                .map(|bytes| bytes / instances.max(1) as u64),
            background_admitted: self.background_admitted,
            background_ideal: self.background_ideal,
        }
    }

    /// Whether the window `[start, end)` comes near a fault: from a fault's
    /// instant to two tolerances after it.
    fn near_fault(&self, start_ns: u64, end_ns: u64) -> bool {
        let reach = 2 * self.hot.interval_ns() * u64::from(self.hot.burst);
        self.faults_ns
            .iter()
            .any(|&fault| start_ns < fault + reach && end_ns > fault)
    }

    /// The most admissions any sliding window held beyond GCRA's bound, for
    /// windows of one interval up to two tolerances: outside faults, and
    /// near one.
    fn gcra_over(&self) -> (u64, u64) {
        let interval = self.hot.interval_ns();
        let tolerance = interval * u64::from(self.hot.burst);
        let admissions = &self.hot_admissions_ns;
        let (mut over, mut near) = (0, 0);
        for window in [
            interval,
            10 * interval,
            tolerance / 10,
            tolerance,
            2 * tolerance,
        ] {
            let bound = u64::from(self.hot.burst) + window / interval;
            let mut end = 0;
            for (start, &at) in admissions.iter().enumerate() {
                while end < admissions.len() && admissions[end] < at + window {
                    end += 1;
                }
                let excess = ((end - start) as u64).saturating_sub(bound);
                if excess > 0 {
                    if self.near_fault(at, at + window) {
                        near = near.max(excess);
                    } else {
                        over = over.max(excess);
                    }
                }
            }
        }
        (over, near)
    }

    /// The most admissions any aligned second held beyond the limit.
    fn fixed_window_over(&self) -> (u64, u64) {
        let (mut over, mut near) = (0, 0);
        let mut index = 0;
        let admissions = &self.hot_admissions_ns;
        while index < admissions.len() {
            let second = admissions[index] / 1_000_000_000;
            let start = index;
            while index < admissions.len() && admissions[index] / 1_000_000_000 == second {
                index += 1;
            }
            let excess = ((index - start) as u64).saturating_sub(u64::from(self.hot.per_s));
            let (from, to) = (second * 1_000_000_000, (second + 1) * 1_000_000_000);
            if self.near_fault(from, to) {
                near = near.max(excess);
            } else {
                over = over.max(excess);
            }
        }
        (over, near)
    }
}

/// The `quantile` of `count` waits, of which those recorded in `waits_ns`
/// were positive (the rest zero), in µs.
fn percentile(waits_ns: &mut [u32], count: u64, quantile: f64) -> f64 {
    let zeros = count.saturating_sub(waits_ns.len() as u64);
    let rank = ((count as f64) * quantile).ceil().max(1.0) as u64;
    if rank <= zeros || waits_ns.is_empty() {
        return 0.0;
    }
    let index = ((rank - zeros - 1) as usize).min(waits_ns.len() - 1);
    let (_, &mut wait, _) = waits_ns.select_nth_unstable(index);
    f64::from(wait) / 1_000.0
}

/// A run's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    /// Server calls per check, all keys.
    pub calls_per_check: f64,
    /// Server calls per check on the hot key.
    pub hot_calls_per_check: f64,
    /// The most admissions of the hot key beyond its contract in any window
    /// away from faults.
    pub over: u64,
    /// The same, in windows near a fault.
    pub over_in_faults: u64,
    /// The hot key's admissions after the warm-up.
    pub admitted: u64,
    /// What one limiter with no delay admits of the same arrivals.
    pub ideal: u64,
    /// Median added latency of the hot key's checks, µs.
    pub hot_wait_p50_us: f64,
    /// 99th percentile of it.
    pub hot_wait_p99_us: f64,
    /// 99th percentile of every check's added latency, µs.
    pub wait_p99_us: f64,
    /// Server operations a second on the busiest master, after the
    /// warm-up.
    pub operations_per_s: f64,
    /// What an instance holds at the end, bytes.
    pub bytes_per_instance: Option<u64>,
    /// Background checks admitted after the warm-up.
    pub background_admitted: u64,
    /// What one limiter with no delay admits of them.
    pub background_ideal: u64,
}

impl Figures {
    /// Under-admission: the share of the ideal's admissions not admitted.
    #[must_use]
    pub fn under(&self) -> f64 {
        1.0 - (self.admitted as f64 / self.ideal.max(1) as f64).min(1.0)
    }

    /// The background keys' admissions against the reference's: below 1,
    /// under-admission; above, over.
    #[must_use]
    pub fn background_ratio(&self) -> f64 {
        self.background_admitted as f64 / self.background_ideal.max(1) as f64
    }
}
