//! tollgate on a fleet: every instance runs the real local half
//! (`tollgate::remote::LocalView`: the deny cache, leases, the clocks'
//! offset), every master the script's Rust twin (`tollgate::remote::lease`),
//! and each instance holds checks behind its key's claimed call as
//! `tollgate-redis` does (`Ask::may_learn`, at most four waits).

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate::clock::Clock;
use tollgate::remote::{
    Ask, LeaseReply, LeaseRequest, Leases, Local, LocalView, RemoteClock, RemoteQuota, lease,
};

use crate::scenario::Limit;
use crate::server::{self, Master};
use crate::slab::Slab;
use crate::tally::Contract;
use crate::world::{Design, HOT_KEY, World, mix};

/// How many times a check is held behind its key's claimed call, as
/// `tollgate-redis`'s.
const MAX_WAITS: u8 = 4;

/// The keys an instance's view holds, as `tollgate-redis`'s default.
const LOCAL_KEYS: usize = 100_000;

/// An instance's clock: the simulation's time from an origin of its own.
#[derive(Debug)]
struct InstanceClock {
    now_ns: Arc<AtomicU64>,
    origin_ns: u64,
}

impl Clock for InstanceClock {
    fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::Relaxed) + self.origin_ns
    }
}

type View = LocalView<u64>;

/// An ask in flight, with the view it borrows.
struct Held {
    // Declared first, so dropped first: the ask borrows `_view`.
    ask: Ask<'static, u64>,
    _view: Arc<View>,
}

impl Held {
    /// Holds `ask`, made by `view`.
    fn new(ask: Ask<'_, u64>, view: Arc<View>) -> Self {
        // SAFETY: the ask borrows the view `view` points to, which the Arc
        // kept here keeps alive and in place (an Arc's value never moves)
        // until after the ask is dropped: fields drop in declaration
        // order, and `ask` is only ever taken out by `Held::complete`,
        // which consumes it while `_view` is still held.
        let ask = unsafe { std::mem::transmute::<Ask<'_, u64>, Ask<'static, u64>>(ask) };
        Self { ask, _view: view }
    }

    fn complete(self, reply: &LeaseReply) {
        let Self { ask, _view } = self;
        ask.complete(reply);
    }
}

/// A call from an instance to a master.
struct Call {
    instance: usize,
    epoch: u64,
    view: usize,
    key: u64,
    request: LeaseRequest,
    quota: RemoteQuota,
    /// `None` once its instance crashed.
    held: Option<Held>,
    arrival_ns: u64,
    /// Checks held behind it: their arrival and the waits they made.
    waiters: Vec<(u64, u8)>,
    reply: Option<LeaseReply>,
    /// When the master decided it.
    decided_ns: u64,
}

/// One instance: a view for the hot key's quota and one for the
/// background keys', and the claimed calls in flight by key.
struct Instance {
    views: [Arc<View>; 2],
    flights: HashMap<(usize, u64), usize>,
}

/// The design's events.
#[derive(Debug, Clone, Copy)]
pub enum Event {
    /// A call reaches its master.
    AtMaster(usize),
    /// Its reply reaches the instance.
    Reply(usize),
    /// It timed out (its instance was cut off).
    Timeout(usize),
}

/// tollgate's leased or deny-cached mode on a fleet.
pub struct Tollgate {
    leases: Option<Leases>,
    quotas: [RemoteQuota; 2],
    remote: RemoteClock,
    instances: Vec<Option<Instance>>,
    epochs: Vec<u64>,
    calls: Slab<Call>,
    masters: Vec<Master<u64>>,
}

impl Tollgate {
    /// tollgate with `leases` (`None`: the deny cache alone) for the
    /// scenario's quotas, masters and clocks.
    #[must_use]
    pub fn new(scenario: &crate::scenario::Scenario, leases: Option<Leases>) -> Self {
        let quota = |limit: Limit| {
            RemoteQuota::new(limit.interval_ns() / 1_000, limit.burst).expect("a valid quota")
        };
        let total = scenario.instances + scenario.joining;
        let remote = if scenario.masters == 1 {
            RemoteClock::One
        } else {
            RemoteClock::Several {
                skew: Duration::from_nanos(scenario.skew_ns),
            }
        };
        Self {
            leases,
            quotas: [quota(scenario.hot), quota(scenario.background)],
            remote,
            instances: (0..total).map(|_| None).collect(),
            epochs: vec![0; total],
            calls: Slab::default(),
            masters: server::masters(scenario),
        }
    }

    fn check(
        &mut self,
        world: &mut World<Event>,
        instance: usize,
        key: u64,
        arrival_ns: u64,
        waits: u8,
    ) {
        let index = usize::from(key != HOT_KEY);
        let Some(state) = &self.instances[instance] else {
            return;
        };
        let view = Arc::clone(&state.views[index]);
        let ask = match view.check(&key, 1).expect("a cost of one fits") {
            Local::Decided(decision) => {
                world.decided(key, arrival_ns, decision.is_allowed());
                return;
            }
            Local::Ask(ask) => ask,
        };
        if !ask.is_claim() && waits < MAX_WAITS && ask.may_learn(false) {
            if let Some(&flight) = state.flights.get(&(index, key)) {
                drop(ask);
                let call = self.calls.get_mut(flight);
                call.waiters.push((arrival_ns, waits + 1));
                return;
            }
        }
        let claim = ask.is_claim();
        let call = Call {
            instance,
            epoch: self.epochs[instance],
            view: index,
            key,
            request: *ask.request(),
            quota: *ask.quota(),
            held: Some(Held::new(ask, Arc::clone(&view))),
            arrival_ns,
            waiters: Vec::new(),
            reply: None,
            decided_ns: 0,
        };
        let id = self.calls.insert(call);
        if claim {
            if let Some(state) = self.instances[instance].as_mut() {
                state.flights.insert((index, key), id);
            }
        }
        world.send(
            instance,
            key == HOT_KEY,
            Event::AtMaster(id),
            Event::Timeout(id),
        );
    }

    /// Ends call `id` at its instance: its flight is over.
    fn land(&mut self, id: usize) -> Call {
        let call = self.calls.take(id);
        if let Some(state) = self.instances[call.instance].as_mut() {
            if state.flights.get(&(call.view, call.key)) == Some(&id) {
                state.flights.remove(&(call.view, call.key));
            }
        }
        call
    }
}

impl Design for Tollgate {
    type Event = Event;

    fn arrival(&mut self, world: &mut World<Event>, instance: usize, key: u64) {
        let now_ns = world.now_ns();
        self.check(world, instance, key, now_ns, 0);
    }

    fn event(&mut self, world: &mut World<Event>, event: Event) {
        match event {
            Event::AtMaster(id) => {
                let call = self.calls.get_mut(id);
                let master_index = world.master_of(call.key);
                let master = &mut self.masters[master_index];
                let now_ns = world.now_ns();
                let (reply, written) = lease(
                    master.get(call.key).copied(),
                    master.time_us(now_ns),
                    &call.quota,
                    &call.request,
                )
                .expect("a request the script takes");
                if let Some(tat_us) = written {
                    master.set(now_ns, call.key, tat_us);
                }
                call.reply = Some(reply);
                call.decided_ns = now_ns;
                let instance = call.instance;
                world.answer(master_index, 1, instance, Event::Reply(id));
            }
            Event::Reply(id) => {
                let call = self.land(id);
                let reply = call.reply.expect("a reply");
                let Some(held) = call.held else {
                    // Its instance crashed: the reply is lost.
                    return;
                };
                if self.epochs[call.instance] != call.epoch {
                    return;
                }
                held.complete(&reply);
                world.decided_at(call.key, call.arrival_ns, call.decided_ns, reply.allowed);
                // As tollgate-redis's: waiting again only while the remote
                // denies.
                for (arrival_ns, waits) in call.waiters {
                    let waits = if reply.allowed { MAX_WAITS } else { waits };
                    self.check(world, call.instance, call.key, arrival_ns, waits);
                }
            }
            Event::Timeout(id) => {
                let call = self.land(id);
                let Some(held) = call.held else {
                    return;
                };
                drop(held);
                // The failure policy: deny.
                world.decided(call.key, call.arrival_ns, false);
                for (arrival_ns, _) in call.waiters {
                    self.check(world, call.instance, call.key, arrival_ns, MAX_WAITS);
                }
            }
        }
    }

    fn crash(&mut self, _world: &mut World<Event>, instance: usize) {
        for call in self.calls.iter_mut() {
            if call.instance == instance {
                call.held = None;
                call.waiters.clear();
            }
        }
        self.instances[instance] = None;
    }

    fn start(&mut self, world: &mut World<Event>, instance: usize) {
        self.epochs[instance] += 1;
        let views = self.quotas.map(|quota| {
            let clock = InstanceClock {
                now_ns: world.clock(),
                // A clock of its own: an origin 0 to 1 000 s before the run.
                origin_ns: mix(instance as u64 ^ (self.epochs[instance] << 32)) % 1_000_000_000_000,
            };
            Arc::new(
                View::new(
                    quota,
                    self.remote,
                    clock,
                    self.leases,
                    NonZeroUsize::new(LOCAL_KEYS).expect("nonzero"),
                    Duration::from_nanos(2 * world.scenario().timeout_ns),
                )
                .expect("a valid view")
                .with_hold_salt(mix(instance as u64 ^ 0x5a17)),
            )
        });
        self.instances[instance] = Some(Instance {
            views,
            flights: HashMap::new(),
        });
    }

    fn contract(&self) -> Contract {
        Contract::Gcra
    }

    fn failover(&mut self, world: &mut World<Event>, master: usize, lost_ns: u64, step_ns: i64) {
        self.masters[master].fail_over(world.now_ns(), lost_ns, step_ns);
    }

    fn release_instances(&mut self) {
        for call in self.calls.iter_mut() {
            call.held = None;
            call.waiters = Vec::new();
        }
        self.instances = Vec::new();
    }
}
