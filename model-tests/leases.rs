//! shuttle models of the deny cache and the leases (`tollgate::remote`):
//! three nodes, each with its own `LocalView` (the real code, on the store
//! shuttle sees into), over a simulated remote whose every script call is
//! one atomic step (the script's Rust twin, `remote::lease`, under a lock),
//! and a clock that a thread of its own moves while the nodes run.
//!
//! What the models hold, in every explored schedule:
//!
//! * **leases** (`leases_admit_no_more_than_the_remote_limiter`): every
//!   window of every length holds at most `burst + ⌊W / interval⌋`
//!   admissions, those of the remote and of every node's leases together,
//!   while leases expire under the moving clock, units are given back,
//!   a node dies holding a lease, a reply arrives after its lease's
//!   deadlines have passed, and a call is abandoned after the remote ran it;
//! * **the deny cache** (`the_deny_cache_denies_only_what_the_remote_would`):
//!   every local denial is one the remote would have made at that instant,
//!   and the window bound holds;
//! * **other quotas** (`checks_of_other_quotas_and_a_change_keep_the_bound`):
//!   checks carrying a quota of their own beside the view's, and a node
//!   changing its quota while its asks are in flight, with leases and with
//!   the deny cache alone. The remote decides each call by the quota it
//!   carries, on one TAT (a change the remote reads unchanged). The bound
//!   is then in time: the units each admission took, at its quota's
//!   interval, add up to at most the window plus the largest tolerance
//!   (`burst + ⌊W / interval⌋` when every check has one quota). A local
//!   admission is of the view's own quota; a local denial is one the
//!   remote makes by the check's quota.
//!
//! Each node's instants are its clock's readings taken inside the view,
//! after it loads the key's word (recorded per thread, so an admission is
//! counted at the instant it was decided at).
//!
//! Canaries, planted in the real code and run at the same settings: a lease
//! that never expires, a unit spent an interval past its deadline, and a
//! give-back of a unit already spent (each breaks the window bound); a deny
//! cache that outlives the remote's denial, and one that denies a request
//! that just fits (each a denial the remote would not make); a check of
//! another quota that claims a lease, giving it back at its own interval,
//! and a reply installed after a change of quota (each breaks the window
//! bound). Each must be caught.
//!
//! Run: `cargo test --release --features shuttle --test leases`.

#![cfg(feature = "shuttle")]

#[path = "schedules.rs"]
mod schedules;

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::time::Duration;

use shuttle::sync::atomic::{AtomicU64, Ordering};
use shuttle::sync::{Arc, Mutex};
use shuttle::thread;
use tollgate::canary::{self, Canary, plant};
use tollgate::clock::Clock;
use tollgate::remote::{LeaseRequest, Leases, Local, LocalView, RemoteClock, RemoteQuota, lease};

const EXECUTIONS: usize = 5_000;

/// 10 µs an interval, bursts of 4: a lease on a fresh key is its request's
/// unit and 1 more (half of the 3 left), and a request of 2 units can find
/// its node's lease too small while the remote has room: its lease's units
/// are then given back.
const INTERVAL_US: u64 = 10;
const BURST: u32 = 4;
/// The quota some checks carry: a slower one, whose tolerance (60 µs) is
/// the largest.
const TIER: (u64, u32) = (20, 3);
/// The quotas a node changes to: a slower one and a faster one, of the
/// same tolerance as its own.
const SLOWER: (u64, u32) = (20, 2);
const FASTER: (u64, u32) = (5, 8);
/// The remote clock starts here (ns); nodes' clocks lag it by their own
/// offsets, so each node learns a different offset.
const START_NS: u64 = 1_000_000;
/// The key the model checks, and the one each node's first round trip
/// uses.
const KEY: u64 = 0;
const WARM_UP: u64 = 1;

/// The workloads of one quota.
const ONE_QUOTA: &[(&str, &[Plan])] = &[
    ("crowd", CROWD),
    ("give-back", GIVE_BACK),
    ("expiry", EXPIRY),
    ("expiry, bounded clock", EXPIRY_BOUNDED),
    ("the remote's clock steps back", REMOTE_STEPS_BACK),
    ("the client clock steps back", CLIENT_STEPS_BACK),
];

/// The workloads of several quotas.
const QUOTAS: &[(&str, &[Plan])] = &[
    ("tiers", TIERS),
    ("tiers, one node", TIERS_ALONE),
    ("a change", CHANGE),
    ("a change to a faster quota", CHANGE_FASTER),
];

/// Runs the model with each of `workloads` and each of its two clocks,
/// under the random scheduler and then under PCT.
fn both_schedulers(
    name: &str,
    workloads: &[(&'static str, &'static [Plan])],
    leases: Option<Leases>,
    canary: Option<Canary>,
) {
    for &(workload, plans) in workloads {
        for step_us in [INTERVAL_US, 4] {
            schedules::random_then_pct(
                &format!("{name}; {workload}, clock steps of {step_us} µs"),
                EXECUTIONS,
                move || model(plans, leases, canary, step_us),
            );
        }
    }
}

/// A thread's steps, in order, and which node it runs on.
type Plan = (usize, &'static [Step]);

/// One step of a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// A check of this many units; what the node does with the reply.
    Check(u32, Reply),
    /// Moves the clock one step (the node idle while time passes).
    Tick,
    /// Another node takes every unit the remote admits now (plain checks,
    /// on the remote's clock).
    Drain,
    /// A round trip on a key of its own ([`TEACH`]), whose reply teaches
    /// the clocks' offset.
    Teach,
    /// Steps the remote's own clock back [`STEP_BACK_NS`] (an NTP step, a
    /// failover to a master whose clock is behind).
    RemoteBack,
    /// Steps node 0's clock, the one the remote decides on, back
    /// [`STEP_BACK_NS`].
    ClientBack,
    /// A check of this many units carrying the quota [`TIER`].
    Tier(u32, Reply),
    /// The node changes its quota to this interval (µs) and burst.
    Change(u64, u32),
}

use Reply::{Abandon, Complete};
use Step::{Change, Check, ClientBack, Drain, RemoteBack, Teach, Tick, Tier};

const _: () = assert!(SLOWER.0 * SLOWER.1 as u64 == INTERVAL_US * BURST as u64);
const _: () = assert!(FASTER.0 * FASTER.1 as u64 == INTERVAL_US * BURST as u64);

/// The key [`Step::Teach`] checks.
const TEACH: u64 = 2;
/// A clock step back: two intervals.
const STEP_BACK_NS: u64 = 2 * INTERVAL_US * 1_000;

/// Five threads on three nodes:
///
/// * node 0, thread A: a unit; two units (more than a lease of a fresh key
///   holds: its units are given back first); a unit (from a lease,
///   possibly after the lease's deadline);
/// * node 0, thread B: a unit (beside A on one node: it may find A's claim
///   standing, or spend A's lease);
/// * node 1: a unit, then a unit whose call it abandons after the remote
///   ran it;
/// * node 2: a unit, and then it dies, holding what it leased.
const CROWD: &[Plan] = &[
    (
        0,
        &[Check(1, Complete), Check(2, Complete), Check(1, Complete)],
    ),
    (0, &[Check(1, Complete)]),
    (1, &[Check(1, Complete), Check(1, Abandon)]),
    (2, &[Check(1, Complete)]),
];

/// A node's lease that a hold would move (the `HoldMovesLease` canary):
/// node 0 leases and spends; node 1's lease moves the TAT on while the
/// clock passes, so that node 0's next call is granted a unit and held off
/// with it (two sharers, the key short of units); node 0 waits three
/// steps, another node drains the key, and node 0 spends its unit then:
/// past its deadline, and a window too many, if the hold moved it.
const LATE: &[Plan] = &[
    (
        0,
        &[
            Check(1, Complete),
            Check(1, Complete),
            Tick,
            Tick,
            Tick,
            Check(1, Complete),
            Tick,
            Tick,
            Tick,
            Drain,
            Check(1, Complete),
        ],
    ),
    (1, &[Check(1, Complete)]),
];

/// Two nodes taking turns on a key short of units while time moves: a
/// call that leaves a node a lease may hold it off too, and the node's
/// claim once the lease is spent then finds that hold running and writes
/// it into the key's word (`Leases::with_holds`); a check of two units
/// claims with a unit to give back, and another node drains the key.
const TURNS: &[Plan] = &[
    (
        0,
        &[
            Check(1, Complete),
            Tick,
            Check(1, Complete),
            Check(1, Complete),
            Check(1, Complete),
            Check(1, Complete),
            Check(2, Complete),
            Tick,
            Tick,
            Tick,
            Check(1, Complete),
        ],
    ),
    (
        1,
        &[
            Check(1, Complete),
            Check(1, Complete),
            Tick,
            Check(1, Complete),
            Check(1, Complete),
            Drain,
        ],
    ),
];

/// A node alone on the key (the crowd leaves few schedules in which a
/// lease's units come back: another node is admitted between nearly every
/// lease and the request that gives it back): it leases, asks for two
/// units (more than its lease holds: the lease is given back first),
/// spends its new lease and asks once more, while the clock moves.
const GIVE_BACK: &[Plan] = &[(
    0,
    &[
        Check(1, Complete),
        Check(2, Complete),
        Check(1, Complete),
        Check(1, Complete),
    ],
)];

/// A node alone on the key that leases, is idle for two clock steps (with
/// steps of an interval, its lease's units pass their deadlines: exactly,
/// on node 0, whose view knows the remote's instant), and goes on as
/// [`GIVE_BACK`], while the clock thread moves too.
const EXPIRY: &[Plan] = &[(0, EXPIRING)];

/// [`EXPIRY`] on node 1, which bounds the remote's clock from its round
/// trips.
const EXPIRY_BOUNDED: &[Plan] = &[(1, EXPIRING)];

/// A node served on the remote's clock leases and is idle while its
/// units pass their deadlines; another node takes the rested key's burst;
/// the remote's clock steps back two intervals; a round trip teaches it;
/// and the node checks twice. Deciding at the stepped-back reading (the
/// `BoundFallsBack` canary) spends the expired unit: a window of a few µs
/// then holds the burst and one more.
const REMOTE_STEPS_BACK: &[Plan] = &[(
    1,
    &[
        Check(1, Complete),
        Tick,
        Tick,
        Drain,
        RemoteBack,
        Teach,
        Check(1, Complete),
        Check(1, Complete),
    ],
)];

/// The same on node 0, whose clock the remote decides on: the node sends
/// a reading past its units' deadlines, and then its clock steps back.
const CLIENT_STEPS_BACK: &[Plan] = &[(
    0,
    &[
        Check(1, Complete),
        Tick,
        Tick,
        Drain,
        Teach,
        ClientBack,
        Check(1, Complete),
        Check(1, Complete),
    ],
)];

/// Checks of another quota beside the view's, on one key:
///
/// * node 0, thread A: a unit (a lease), a tier unit (the word holds the
///   lease: asked without a claim), two units;
/// * node 0, thread B: two tier units (the second, perhaps, denied by what
///   the first taught);
/// * node 1: a tier unit (claiming the key for its floor, with no lease),
///   then a unit.
const TIERS: &[Plan] = &[
    (
        0,
        &[Check(1, Complete), Tier(1, Complete), Check(2, Complete)],
    ),
    (0, &[Tier(1, Complete), Tier(1, Complete)]),
    (1, &[Tier(1, Complete), Check(1, Complete)]),
];

/// One thread on one node: a unit (a lease of one more), three tier units
/// (the word holds the lease: asked without a claim), and a unit (the
/// lease's, if it is still live).
const TIERS_ALONE: &[Plan] = &[(
    0,
    &[
        Check(1, Complete),
        Tier(1, Complete),
        Tier(1, Complete),
        Tier(1, Complete),
        Check(1, Complete),
    ],
)];

/// A node changes its quota while its own checks run: thread A leases and
/// checks on (its asks in flight across the change are answered under
/// the quota they were made by, and not installed after it), thread B
/// changes the quota and checks by the new one; node 1 checks by the old.
const CHANGE: &[Plan] = &[
    (
        0,
        &[Check(1, Complete), Check(1, Complete), Check(1, Complete)],
    ),
    (
        0,
        &[
            Change(SLOWER.0, SLOWER.1),
            Check(1, Complete),
            Check(2, Complete),
        ],
    ),
    (1, &[Check(1, Complete), Check(1, Complete)]),
];

/// [`CHANGE`] to a faster quota (leases of more units, at shorter
/// intervals).
const CHANGE_FASTER: &[Plan] = &[
    (
        0,
        &[Check(1, Complete), Check(1, Complete), Check(1, Complete)],
    ),
    (
        0,
        &[
            Change(FASTER.0, FASTER.1),
            Check(1, Complete),
            Check(2, Complete),
        ],
    ),
    (1, &[Check(1, Complete), Check(1, Complete)]),
];

const EXPIRING: &[Step] = &[
    Check(1, Complete),
    Tick,
    Tick,
    Check(1, Complete),
    Check(2, Complete),
    Check(1, Complete),
    Check(1, Complete),
];

/// The remote, its clock, and what it and the nodes admitted.
struct World {
    quota: RemoteQuota,
    /// The largest tolerance of the quotas the workload decides by, µs.
    max_tolerance_us: u64,
    /// Real time, ns: the remote's clock and node 0's until they step
    /// back.
    clock_ns: AtomicU64,
    /// How far the remote's own clock has stepped back, ns.
    remote_back_ns: AtomicU64,
    /// The keys' stored TATs, µs.
    tat_us: Mutex<HashMap<u64, u64>>,
    /// Every admission of [`KEY`]: the real µs at which its deciding
    /// reading was taken, and the time its units took (µs: the units times
    /// its quota's interval).
    admitted: Mutex<Vec<(u64, u64)>>,
}

impl World {
    /// Real time and the remote's own clock, µs, at one instant: the real
    /// clock is read once (a tick between two reads would stamp a decision
    /// at another instant than the one it was taken at).
    fn remote_us(&self) -> (u64, u64) {
        let real_ns = self.clock_ns.load(Ordering::SeqCst);
        let back_ns = self.remote_back_ns.load(Ordering::SeqCst);
        (real_ns / 1_000, (real_ns - back_ns) / 1_000)
    }
}

/// What a node does with its ask after the remote ran the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    /// Installs the reply.
    Complete,
    /// Drops the ask unanswered (a timeout after the script ran).
    Abandon,
}

shuttle::thread_local! {
    /// The last reading a node's clock gave this thread, and the real time
    /// it was taken at.
    static LAST_READING: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// A node's clock: real time less the node's lag and its steps back; each
/// reading recorded as the thread's last.
struct NodeClock {
    world: Arc<World>,
    lag_ns: u64,
    back_ns: Arc<AtomicU64>,
}

impl Clock for NodeClock {
    fn now_ns(&self) -> u64 {
        let real_ns = self.world.clock_ns.load(Ordering::SeqCst);
        let reading = real_ns - self.lag_ns - self.back_ns.load(Ordering::SeqCst);
        LAST_READING.with(|last| last.set((reading, real_ns)));
        reading
    }
}

struct Node {
    /// The view; its payload is each quota's interval and burst.
    view: LocalView<u64, (u64, u32)>,
    /// Whether the remote decides on this node's readings (a client clock
    /// sent with each call: its view knows the remote's instant exactly)
    /// rather than on its own clock when the call reaches it.
    client_clock: bool,
    world: Arc<World>,
    /// How far this node's clock has stepped back, ns.
    back_ns: Arc<AtomicU64>,
    /// Whether local denials are checked against the remote (the deny
    /// cache model, where nothing is given back): the remote's TAT is held
    /// still, under its lock, while the node decides, and a local denial
    /// must be one the remote makes on it at the check's instant.
    check_denials: bool,
}

impl Node {
    /// One check of `cost` units for `key` (carrying `carried`, if given),
    /// through the remote when the view asks.
    fn request(&self, key: u64, cost: u32, reply: Reply, carried: Option<RemoteQuota>) {
        let world = &self.world;
        let held = self.check_denials.then(|| world.tat_us.lock().unwrap());
        let decided = |decision, payload: &(u64, u32)| (decision, *payload);
        let local = match carried {
            Some(quota) => self.view.check_under_then(&key, cost, quota, decided),
            None => self.view.check_then(&key, cost, decided),
        }
        .unwrap();
        // The view's last reading (taken after it loaded the key's word,
        // or for an ask before it is sent) and the real time it was taken
        // at: an admission is counted then, and a denial judged on the
        // remote's clock then (or on the reading the remote decides on).
        let (reading_ns, real_ns) = LAST_READING.with(std::cell::Cell::get);
        let real_us = real_ns / 1_000;
        let at_us = if self.client_clock {
            reading_ns / 1_000
        } else {
            (real_ns - world.remote_back_ns.load(Ordering::SeqCst)) / 1_000
        };
        match local {
            Local::Decided((decision, (interval_us, _))) if decision.is_allowed() => {
                drop(held);
                assert!(carried.is_none(), "a lease spent by another quota");
                if key == KEY {
                    let took_us = u64::from(cost) * interval_us;
                    world.admitted.lock().unwrap().push((real_us, took_us));
                }
            }
            Local::Decided((_, (interval_us, burst))) => {
                if let Some(tats) = held {
                    let quota =
                        carried.unwrap_or_else(|| RemoteQuota::new(interval_us, burst).unwrap());
                    let tat_us = tats.get(&key).copied().unwrap_or(0);
                    let debt_us = tat_us.saturating_sub(at_us);
                    let max_debt_us = quota.tolerance_us() - u64::from(cost) * quota.interval_us();
                    assert!(
                        debt_us > max_debt_us,
                        "a denial the remote would not make: {cost} at {at_us} µs, TAT {tat_us} µs"
                    );
                }
            }
            Local::Ask(ask) => {
                drop(held);
                // The call in flight: the clock may move.
                thread::yield_now();
                let answer = {
                    let mut tat_us = world.tat_us.lock().unwrap();
                    // Decided on the reading sent (taken at `real_us`), or
                    // on the remote's clock now.
                    let (stamp_us, now_us) = if self.client_clock {
                        (real_us, ask.sent_ns() / 1_000)
                    } else {
                        world.remote_us()
                    };
                    // Under the quota the ask carries: the check's, or
                    // the view's when the check decided.
                    let quota = *ask.quota();
                    let (answer, stored) =
                        lease(tat_us.get(&key).copied(), now_us, &quota, ask.request()).unwrap();
                    if let Some(stored) = stored {
                        tat_us.insert(key, stored);
                    }
                    if answer.allowed && key == KEY {
                        let took_us = u64::from(cost) * quota.interval_us();
                        world.admitted.lock().unwrap().push((stamp_us, took_us));
                    }
                    answer
                };
                // The reply in flight: the clock may pass the lease's
                // deadlines before it arrives.
                thread::yield_now();
                match reply {
                    Complete => {
                        ask.complete(&answer);
                    }
                    Abandon => drop(ask),
                }
            }
        }
    }
}

impl World {
    /// Another node's plain checks of [`KEY`] on the remote's clock, until
    /// one is denied.
    fn drain(&self) {
        let mut tat_us = self.tat_us.lock().unwrap();
        let plain = LeaseRequest::plain(1);
        loop {
            let (real_us, now_us) = self.remote_us();
            let (answer, stored) =
                lease(tat_us.get(&KEY).copied(), now_us, &self.quota, &plain).unwrap();
            if !answer.allowed {
                return;
            }
            tat_us.insert(KEY, stored.expect("an admission stores its TAT"));
            self.admitted
                .lock()
                .unwrap()
                .push((real_us, self.quota.interval_us()));
        }
    }
}

/// Every window between two admissions holds admissions whose units took
/// at most the window and the largest tolerance: with one quota, at most
/// `burst + ⌊W / interval⌋` units.
fn assert_window_bound(admitted: &mut [(u64, u64)], max_tolerance_us: u64) {
    admitted.sort_unstable();
    for (first, &(from_us, _)) in admitted.iter().enumerate() {
        let mut took_us = 0;
        for &(to_us, took) in &admitted[first..] {
            took_us += took;
            let bound_us = (to_us - from_us) + max_tolerance_us;
            assert!(
                took_us <= bound_us,
                "the window bound: units taking {took_us} µs in [{from_us}, {to_us}] µs, at most {bound_us}: {admitted:?}"
            );
        }
    }
}

/// Three nodes running `plans`, one thread each, and a clock thread that
/// moves the deciding clock two steps of `step_us`, at any point. Each
/// test runs it with steps of an interval (leases expire, floors pass) and
/// of 4 µs (less than one: a lease's units stay live while the others run,
/// so that they are spent and given back).
fn model(plans: &'static [Plan], leases: Option<Leases>, canary: Option<Canary>, step_us: u64) {
    plant(canary);
    let tier = RemoteQuota::new(TIER.0, TIER.1).unwrap();
    let quota = RemoteQuota::new(INTERVAL_US, BURST).unwrap();
    let tiers = plans
        .iter()
        .any(|(_, steps)| steps.iter().any(|step| matches!(step, Tier(..))));
    let world = Arc::new(World {
        quota,
        max_tolerance_us: if tiers {
            tier.tolerance_us()
        } else {
            // The quotas changed to have the same.
            quota.tolerance_us()
        },
        clock_ns: AtomicU64::new(START_NS),
        remote_back_ns: AtomicU64::new(0),
        tat_us: Mutex::new(HashMap::new()),
        admitted: Mutex::new(Vec::new()),
    });
    let node = |lag_ns, client_clock| {
        let back_ns = Arc::new(AtomicU64::new(0));
        let node = Arc::new(Node {
            view: LocalView::with_payload(
                world.quota,
                (INTERVAL_US, BURST),
                if client_clock {
                    RemoteClock::Local
                } else {
                    RemoteClock::One
                },
                NodeClock {
                    world: Arc::clone(&world),
                    lag_ns,
                    back_ns: Arc::clone(&back_ns),
                },
                leases,
                NonZeroUsize::new(16).unwrap(),
                Duration::from_secs(1),
            )
            .unwrap()
            // Holds drawn alike in every run, so that a failing schedule
            // replays.
            .with_hold_salt(lag_ns),
            client_clock,
            world: Arc::clone(&world),
            back_ns,
            check_denials: leases.is_none(),
        });
        // A first round trip, on another key, teaches each node the
        // clocks' offset (a node claims keys only once it knows it).
        node.request(WARM_UP, 1, Complete, None);
        node
    };
    // Node 0 sends its clock (the deciding clock, lag 0: its view knows
    // the remote's instant exactly, so a check can fall on a deadline or a
    // floor's end exactly); nodes 1 and 2 are served on the remote's own
    // clock, which they bound from their round trips.
    let nodes = [node(0, true), node(4_321, false), node(999_999, false)];
    let workers: Vec<_> = plans
        .iter()
        .map(|&(index, plan)| {
            let node = Arc::clone(&nodes[index]);
            thread::spawn(move || {
                for &step in plan {
                    match step {
                        Check(cost, reply) => node.request(KEY, cost, reply, None),
                        Tier(cost, reply) => node.request(KEY, cost, reply, Some(tier)),
                        Change(interval_us, burst) => node
                            .view
                            .set_quota(
                                RemoteQuota::new(interval_us, burst).unwrap(),
                                (interval_us, burst),
                            )
                            .unwrap(),
                        Tick => {
                            node.world
                                .clock_ns
                                .fetch_add(step_us * 1_000, Ordering::SeqCst);
                        }
                        Drain => node.world.drain(),
                        Teach => node.request(TEACH, 1, Complete, None),
                        RemoteBack => {
                            node.world
                                .remote_back_ns
                                .fetch_add(STEP_BACK_NS, Ordering::SeqCst);
                        }
                        ClientBack => {
                            node.back_ns.fetch_add(STEP_BACK_NS, Ordering::SeqCst);
                        }
                    }
                }
            })
        })
        .collect();
    let clock = {
        let world = Arc::clone(&world);
        thread::spawn(move || {
            for _ in 0..2 {
                world.clock_ns.fetch_add(step_us * 1_000, Ordering::SeqCst);
            }
        })
    };
    for worker in workers {
        worker.join().unwrap();
    }
    clock.join().unwrap();
    let mut admitted = world.admitted.lock().unwrap().clone();
    assert_window_bound(&mut admitted, world.max_tolerance_us);
}

#[test]
fn leases_admit_no_more_than_the_remote_limiter() {
    both_schedulers(
        "leases: 3 nodes, give-backs, a death, late replies",
        ONE_QUOTA,
        Some(Leases::new()),
        None,
    );
}

#[test]
fn leases_with_holds_admit_no_more_than_the_remote_limiter() {
    // A hold raises a key's floor, after a call that left a node no units
    // or, found by a later claim, once they ran out: it only denies, so the
    // bound stands with it, with other quotas and a change of quota too.
    // The workloads of one quota and of several decide thousands of holds;
    // two nodes taking turns, and the canary's workload run clean, find
    // thousands at a claim.
    let holds = || Some(Leases::new().with_holds(true));
    let before = canary::holds();
    both_schedulers(
        "leases with holds: 3 nodes, give-backs, a death, late replies",
        ONE_QUOTA,
        holds(),
        None,
    );
    both_schedulers(
        "leases with holds: other quotas, a change",
        QUOTAS,
        holds(),
        None,
    );
    let between = canary::holds();
    both_schedulers(
        "leases with holds",
        &[("turns", TURNS), ("late", LATE)],
        holds(),
        None,
    );
    let after = canary::holds();
    let decided = between.0 - before.0;
    let found = after.1 - between.1;
    eprintln!("{decided} decided, {found} found");
    assert!(
        decided > 1_000 && found > 1_000,
        "{decided} decided, {found} found"
    );
}

#[test]
#[should_panic(expected = "the window bound")]
fn canary_hold_moves_lease_is_caught() {
    both_schedulers(
        "canary: a hold moves the lease its call granted",
        &[("late", LATE)],
        Some(Leases::new().with_holds(true)),
        Some(Canary::HoldMovesLease),
    );
}

#[test]
fn the_deny_cache_denies_only_what_the_remote_would() {
    both_schedulers("deny cache: 3 nodes, a moving clock", ONE_QUOTA, None, None);
}

#[test]
fn checks_of_other_quotas_and_a_change_keep_the_bound() {
    both_schedulers(
        "leases: other quotas, a change",
        QUOTAS,
        Some(Leases::new()),
        None,
    );
    both_schedulers("deny cache: other quotas, a change", QUOTAS, None, None);
}

#[test]
#[should_panic(expected = "the window bound")]
fn canary_tier_claims_lease_is_caught() {
    both_schedulers(
        "canary: a check of another quota claims a lease",
        QUOTAS,
        Some(Leases::new()),
        Some(Canary::TierClaimsLease),
    );
}

#[test]
#[should_panic(expected = "the window bound")]
fn canary_reply_across_change_is_caught() {
    both_schedulers(
        "canary: a reply installed after a change",
        QUOTAS,
        Some(Leases::new()),
        Some(Canary::ReplyAcrossChange),
    );
}

#[test]
#[should_panic(expected = "the window bound")]
fn canary_lease_never_expires_is_caught() {
    both_schedulers(
        "canary: a lease that never expires",
        ONE_QUOTA,
        Some(Leases::new()),
        Some(Canary::LeaseNeverExpires),
    );
}

#[test]
#[should_panic(expected = "the window bound")]
fn canary_give_back_of_a_spent_unit_is_caught() {
    both_schedulers(
        "canary: a give-back of a spent unit",
        ONE_QUOTA,
        Some(Leases::new()),
        Some(Canary::GiveBackSpent),
    );
}

#[test]
#[should_panic(expected = "the window bound")]
fn canary_lease_spent_an_interval_late_is_caught() {
    both_schedulers(
        "canary: a unit spent an interval past its deadline",
        ONE_QUOTA,
        Some(Leases::new()),
        Some(Canary::LeaseOneLate),
    );
}

#[test]
#[should_panic(expected = "the window bound")]
fn canary_bound_falls_back_is_caught() {
    both_schedulers(
        "canary: a bound that falls back with the clock",
        ONE_QUOTA,
        Some(Leases::new()),
        Some(Canary::BoundFallsBack),
    );
}

#[test]
#[should_panic(expected = "a denial the remote would not make")]
fn canary_deny_at_the_boundary_is_caught() {
    both_schedulers(
        "canary: a deny cache that denies a request that just fits",
        ONE_QUOTA,
        None,
        Some(Canary::DenyAtTheBoundary),
    );
}

#[test]
#[should_panic(expected = "a denial the remote would not make")]
fn canary_deny_cache_outlives_is_caught() {
    both_schedulers(
        "canary: a deny cache that outlives the remote's denial",
        ONE_QUOTA,
        None,
        Some(Canary::DenyCacheOutlives),
    );
}
