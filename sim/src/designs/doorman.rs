//! Doorman's capacity leases, as its design and source have them
//! (youtube/doorman, `doc/design.md`, `doc/algorithms.md`,
//! `go/server/doorman/server.go`, `go/client/doorman/client.go`,
//! `go/ratelimiter/ratelimiter.go`):
//!
//! - a client asks the server for a share of a resource's capacity,
//!   stating what it wants; the server divides the capacity by fair
//!   share (water-filling: every client gets the same, capped by what it
//!   wants, the rest going to those that want more), never handing out
//!   more than is free, and leases the share for 20 s (the template of
//!   intermediate servers);
//! - the client limits itself to its share (released evenly, a share of
//!   more than ten a second in slices of at least 20 ms), refreshes every
//!   5 s (the server ignores requests closer together), and is blocked
//!   (capacity 0) until its first lease;
//! - a server that fails over starts in learning mode for a lease's length,
//!   granting each client what it says it has, new ones nothing.
//!
//! Here every key is a resource on its master. A client wants the checks a
//! second it saw since it last asked (at least one): its first request
//! goes 100 ms after the key's first check, so that it has seen some.

use std::collections::HashMap;

use crate::scenario::{Limit, Scenario};
use crate::slab::Slab;
use crate::tally::Contract;
use crate::world::{Design, HOT_KEY, World};

const LEASE_NS: u64 = 20_000_000_000;
const REFRESH_NS: u64 = 5_000_000_000;
/// How long a client watches a key before it first asks for it.
const FIRST_ASK_NS: u64 = 100_000_000;

/// A client's hold on a resource.
#[derive(Debug, Clone, Copy, Default)]
struct Share {
    /// Checks a second granted.
    capacity: f64,
    /// Its limiter: the next instant a check may be released, ns.
    next_ns: u64,
    /// Checks seen since the last request, and when that was.
    seen: u64,
    asked_ns: u64,
    /// Whether a request is in flight or scheduled.
    asking: bool,
}

/// One client.
#[derive(Default)]
struct Client {
    shares: HashMap<u64, Share>,
}

/// A resource on the server: each client's wants, grant and lease end.
#[derive(Debug, Clone, Default)]
struct Resource {
    clients: HashMap<usize, (f64, f64, u64)>,
}

/// A request in flight.
struct Request {
    instance: usize,
    epoch: u64,
    key: u64,
    wants: f64,
    has: f64,
    granted: f64,
}

/// The design's events.
#[derive(Debug, Clone, Copy)]
pub enum Event {
    /// A client's refresh of a resource is due.
    Refresh {
        instance: usize,
        epoch: u64,
        key: u64,
    },
    /// A request reaches the server.
    AtServer(usize),
    /// Its answer reaches the client.
    Answer(usize),
    /// It could not be sent: the client keeps its lease.
    Failed(usize),
}

/// Doorman on a fleet.
pub struct Doorman {
    limits: [Limit; 2],
    clients: Vec<Option<Client>>,
    epochs: Vec<u64>,
    requests: Slab<Request>,
    /// Resources by master, and until when each master learns.
    resources: Vec<HashMap<u64, Resource>>,
    learning_until_ns: Vec<u64>,
}

impl Doorman {
    /// The design for `scenario`.
    #[must_use]
    pub fn new(scenario: &Scenario) -> Self {
        let total = scenario.instances + scenario.joining;
        Self {
            limits: [scenario.hot, scenario.background],
            clients: (0..total).map(|_| None).collect(),
            epochs: vec![0; total],
            requests: Slab::default(),
            resources: vec![HashMap::new(); scenario.masters],
            learning_until_ns: vec![0; scenario.masters],
        }
    }

    /// Sends `instance`'s request for `key`.
    fn request(&mut self, world: &mut World<Event>, instance: usize, key: u64) {
        let now_ns = world.now_ns();
        let Some(client) = self.clients[instance].as_mut() else {
            return;
        };
        let share = client.shares.entry(key).or_default();
        let elapsed_s = (now_ns.saturating_sub(share.asked_ns) as f64 / 1e9).max(0.1);
        let wants = (share.seen as f64 / elapsed_s).max(1.0);
        share.seen = 0;
        share.asked_ns = now_ns;
        share.asking = true;
        let id = self.requests.insert(Request {
            instance,
            epoch: self.epochs[instance],
            key,
            wants,
            has: share.capacity,
            granted: 0.0,
        });
        world.send(
            instance,
            key == HOT_KEY,
            Event::AtServer(id),
            Event::Failed(id),
        );
    }
}

/// Water-filling: the share of `client` when `wants` divide `capacity`.
fn fair_share(capacity: f64, client: usize, wants: &HashMap<usize, (f64, f64, u64)>) -> f64 {
    let mut sorted: Vec<(f64, usize)> = wants.iter().map(|(&c, &(w, _, _))| (w, c)).collect();
    sorted.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut left = capacity;
    let count = sorted.len();
    for (index, &(want, who)) in sorted.iter().enumerate() {
        let even = left / (count - index) as f64;
        let given = want.min(even);
        if who == client {
            return given;
        }
        left -= given;
    }
    0.0
}

impl Design for Doorman {
    type Event = Event;

    fn arrival(&mut self, world: &mut World<Event>, instance: usize, key: u64) {
        let now_ns = world.now_ns();
        let Some(client) = self.clients[instance].as_mut() else {
            return;
        };
        let share = client.shares.entry(key).or_default();
        share.seen += 1;
        let first = !share.asking;
        if first {
            // Watched from now; asked in 100 ms.
            share.asking = true;
            share.asked_ns = now_ns;
        }
        // The client's limiter: evenly spaced releases, in slices of 20 ms
        // above ten a second.
        let admitted = share.capacity > 0.0 && {
            let gap_ns = (1e9 / share.capacity) as u64;
            let slice_ns = if share.capacity > 10.0 {
                20_000_000
            } else {
                gap_ns
            };
            let allowance_ns = slice_ns.saturating_sub(gap_ns);
            let start = share.next_ns.max(now_ns.saturating_sub(allowance_ns));
            if start <= now_ns {
                share.next_ns = start + gap_ns;
                true
            } else {
                false
            }
        };
        world.decided(key, now_ns, admitted);
        if first {
            let epoch = self.epochs[instance];
            world.after(
                FIRST_ASK_NS,
                Event::Refresh {
                    instance,
                    epoch,
                    key,
                },
            );
        }
    }

    fn event(&mut self, world: &mut World<Event>, event: Event) {
        match event {
            Event::Refresh {
                instance,
                epoch,
                key,
            } => {
                if self.epochs[instance] == epoch {
                    self.request(world, instance, key);
                }
            }
            Event::AtServer(id) => {
                let now_ns = world.now_ns();
                let request = self.requests.get_mut(id);
                let master = world.master_of(request.key);
                let capacity = f64::from(self.limits[usize::from(request.key != HOT_KEY)].per_s);
                let resource = self.resources[master].entry(request.key).or_default();
                resource.clients.retain(|_, &mut (_, _, end)| end > now_ns);
                let granted = if now_ns < self.learning_until_ns[master] {
                    // Learning: what the client says it has.
                    request.has
                } else {
                    resource
                        .clients
                        .insert(request.instance, (request.wants, 0.0, now_ns + LEASE_NS));
                    let others: f64 = resource
                        .clients
                        .iter()
                        .filter(|&(&c, _)| c != request.instance)
                        .map(|(_, &(_, has, _))| has)
                        .sum();
                    fair_share(capacity, request.instance, &resource.clients)
                        .min((capacity - others).max(0.0))
                };
                resource.clients.insert(
                    request.instance,
                    (request.wants, granted, now_ns + LEASE_NS),
                );
                request.granted = granted;
                let instance = request.instance;
                world.answer(master, 1, instance, Event::Answer(id));
            }
            Event::Answer(id) | Event::Failed(id) => {
                let request = self.requests.take(id);
                let answered = matches!(event, Event::Answer(_));
                if self.epochs[request.instance] != request.epoch {
                    return;
                }
                let Some(client) = self.clients[request.instance].as_mut() else {
                    return;
                };
                let share = client.shares.entry(request.key).or_default();
                if answered {
                    share.capacity = request.granted;
                }
                world.after(
                    REFRESH_NS,
                    Event::Refresh {
                        instance: request.instance,
                        epoch: request.epoch,
                        key: request.key,
                    },
                );
            }
        }
    }

    fn crash(&mut self, _world: &mut World<Event>, instance: usize) {
        self.epochs[instance] += 1;
        self.clients[instance] = None;
    }

    fn start(&mut self, _world: &mut World<Event>, instance: usize) {
        self.clients[instance] = Some(Client::default());
    }

    fn contract(&self) -> Contract {
        Contract::Gcra
    }

    fn failover(&mut self, world: &mut World<Event>, master: usize, _lost_ns: u64, _step_ns: i64) {
        // Doorman's servers keep nothing durable: the new master learns.
        self.resources[master].clear();
        self.learning_until_ns[master] = world.now_ns() + LEASE_NS;
    }

    fn release_instances(&mut self) {
        self.clients = Vec::new();
    }
}
