//! envoyproxy/ratelimit's Redis backend, as its source has it: a fixed
//! window per descriptor, the window's start in the key
//! (`src/limiter/cache_key.go`, `GenerateCacheKey`); every check pipelines
//! `INCRBY` and `EXPIRE` in one round trip, counting even over the limit
//! (`src/redis/fixed_cache_impl.go`, `DoLimit`; the local over-limit cache
//! is off by default, `LOCAL_CACHE_SIZE_IN_BYTES=0`), and is over the limit
//! when the count passes it (`src/limiter/base_limiter.go`). A call that
//! fails lets the request through: Envoy's `failure_mode_deny` is false by
//! default.

use crate::scenario::{Limit, Scenario};
use crate::server::{self, Master};
use crate::slab::Slab;
use crate::tally::Contract;
use crate::world::{Design, HOT_KEY, World};

/// A call in flight.
struct Call {
    instance: usize,
    epoch: u64,
    key: u64,
    arrival_ns: u64,
    admitted: bool,
    decided_ns: u64,
}

/// The design's events.
#[derive(Debug, Clone, Copy)]
pub enum Event {
    /// A call reaches its master.
    AtMaster(usize),
    /// Its reply reaches the instance.
    Reply(usize),
    /// It timed out.
    Timeout(usize),
}

/// One round trip per check, to a fixed-window counter.
pub struct Envoy {
    limits: [Limit; 2],
    epochs: Vec<u64>,
    calls: Slab<Call>,
    /// Each key's window (its second on the master's clock) and count.
    masters: Vec<Master<(u64, u32)>>,
}

impl Envoy {
    /// The design for `scenario`'s limits and masters.
    #[must_use]
    pub fn new(scenario: &Scenario) -> Self {
        Self {
            limits: [scenario.hot, scenario.background],
            epochs: vec![0; scenario.instances + scenario.joining],
            calls: Slab::default(),
            masters: server::masters(scenario),
        }
    }

    fn take(&mut self, id: usize) -> Call {
        self.calls.take(id)
    }
}

impl Design for Envoy {
    type Event = Event;

    fn arrival(&mut self, world: &mut World<Event>, instance: usize, key: u64) {
        let call = Call {
            instance,
            epoch: self.epochs[instance],
            key,
            arrival_ns: world.now_ns(),
            admitted: false,
            decided_ns: 0,
        };
        let id = self.calls.insert(call);
        world.send(
            instance,
            key == HOT_KEY,
            Event::AtMaster(id),
            Event::Timeout(id),
        );
    }

    fn event(&mut self, world: &mut World<Event>, event: Event) {
        match event {
            Event::AtMaster(id) => {
                let call = self.calls.get_mut(id);
                let master_index = world.master_of(call.key);
                let master = &mut self.masters[master_index];
                let now_ns = world.now_ns();
                let second = master.time_us(now_ns) / 1_000_000;
                let count = match master.get(call.key) {
                    Some(&(window, count)) if window == second => count + 1,
                    _ => 1,
                };
                master.set(now_ns, call.key, (second, count));
                let limit = self.limits[usize::from(call.key != HOT_KEY)];
                call.admitted = count <= limit.per_s;
                call.decided_ns = now_ns;
                let instance = call.instance;
                // INCRBY and EXPIRE.
                world.answer(master_index, 2, instance, Event::Reply(id));
            }
            Event::Reply(id) => {
                let call = self.take(id);
                if self.epochs[call.instance] == call.epoch && world.is_alive(call.instance) {
                    world.decided_at(call.key, call.arrival_ns, call.decided_ns, call.admitted);
                }
            }
            Event::Timeout(id) => {
                let call = self.take(id);
                if self.epochs[call.instance] == call.epoch && world.is_alive(call.instance) {
                    // Envoy lets the request through.
                    world.decided(call.key, call.arrival_ns, true);
                }
            }
        }
    }

    fn crash(&mut self, _world: &mut World<Event>, instance: usize) {
        self.epochs[instance] += 1;
    }

    fn start(&mut self, _world: &mut World<Event>, _instance: usize) {}

    fn contract(&self) -> Contract {
        Contract::FixedWindow
    }

    fn failover(&mut self, world: &mut World<Event>, master: usize, lost_ns: u64, step_ns: i64) {
        self.masters[master].fail_over(world.now_ns(), lost_ns, step_ns);
    }

    fn release_instances(&mut self) {}
}
