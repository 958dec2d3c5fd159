//! gubernator's `GLOBAL` behaviour, as its source has it (gubernator-io,
//! `gubernator.go`, `global.go`, `algorithms.go`, `config.go`):
//!
//! - Each key has an owner among the peers (here: a hash of the key over
//!   the fleet's first instances). The owner decides on its own bucket.
//! - Any other peer answers from its cached copy of the key's status, taking
//!   the hit off it (`getGlobalRateLimit`; a key it has not cached starts
//!   from the full limit, `tokenBucketNewItem`), and queues the hit.
//! - Queued hits go to the owner, summed per key, in one call per owner
//!   when `GlobalSyncWait` (100 ms) has passed since the first was queued
//!   (`runAsyncHits`); a failed send is dropped. The owner applies them,
//!   draining the bucket when they exceed it (`DRAIN_OVER_LIMIT`), and
//!   queues the key for a broadcast.
//! - Every 100 ms after the first queued update, the owner sends each
//!   other peer the keys' statuses in one call (`runBroadcasts`,
//!   `UpdatePeerGlobals`), which overwrite their copies.
//! - State lives in memory only: a crashed owner's counts are lost.
//!
//! `GLOBAL` is for hot keys: the background keys take gubernator's default
//! behaviour, each check forwarded to the key's owner and decided there
//! (`BATCHING`, whose 500 µs batches hold one check at these rates). An
//! owner that is down is replaced by the next peer running, which starts
//! with nothing (gubernator rehashes its ring), and a call cut off by a
//! partition fails: the check is denied.
//!
//! Its default algorithm is a bucket refilled whole when its duration has
//! passed; here its windows are aligned to the second, so that the same
//! fixed-window contract judges it as envoyproxy/ratelimit.

use std::collections::HashMap;
use std::rc::Rc;

use crate::scenario::{Limit, Scenario};
use crate::slab::Slab;
use crate::tally::Contract;
use crate::world::{Design, HOT_KEY, World, mix};

/// `GlobalSyncWait`'s default.
const SYNC_WAIT_NS: u64 = 100_000_000;

/// A key's bucket: what is left in its window, and the window (its second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    remaining: u32,
    second: u64,
}

impl Bucket {
    /// The bucket in `second`: refilled whole when its window passed.
    fn at(self, second: u64, limit: u32) -> Self {
        if second == self.second {
            self
        } else {
            Self {
                remaining: limit,
                second,
            }
        }
    }
}

/// One peer's state.
#[derive(Default)]
struct Peer {
    /// The buckets it owns, and its copies of the others'.
    buckets: HashMap<u64, Bucket>,
    /// Hits queued for each owner, summed by key.
    hits: HashMap<usize, HashMap<u64, u32>>,
    /// Whether a send of the hits is scheduled.
    sending: bool,
    /// Keys whose status is queued for a broadcast.
    updated: Vec<u64>,
    /// Whether a broadcast is scheduled.
    broadcasting: bool,
}

/// The design's events.
#[derive(Debug, Clone)]
pub enum Event {
    /// A peer sends its queued hits (at most one call per owner).
    SendHits { peer: usize, epoch: u64 },
    /// Hits reach their owner.
    Hits {
        owner: usize,
        hits: Rc<Vec<(u64, u32)>>,
    },
    /// An owner broadcasts its queued statuses.
    Broadcast { owner: usize, epoch: u64 },
    /// A broadcast reaches a peer.
    Update {
        peer: usize,
        statuses: Rc<Vec<(u64, Bucket)>>,
    },
    /// A forwarded check reaches its owner.
    Forward(usize),
    /// Its answer reaches the peer that forwarded it.
    Answer(usize),
    /// It could not be sent.
    Failed(usize),
}

/// A check forwarded to its owner.
struct Forwarded {
    peer: usize,
    epoch: u64,
    owner: usize,
    key: u64,
    arrival_ns: u64,
    admitted: bool,
    decided_ns: u64,
}

/// gubernator's `GLOBAL` behaviour on a fleet whose instances are its peers.
pub struct Gubernator {
    limits: [Limit; 2],
    owners: usize,
    peers: Vec<Option<Peer>>,
    epochs: Vec<u64>,
    forwarded: Slab<Forwarded>,
}

impl Gubernator {
    /// The design for `scenario`.
    #[must_use]
    pub fn new(scenario: &Scenario) -> Self {
        let total = scenario.instances + scenario.joining;
        Self {
            limits: [scenario.hot, scenario.background],
            owners: scenario.instances,
            peers: (0..total).map(|_| None).collect(),
            epochs: vec![0; total],
            forwarded: Slab::default(),
        }
    }

    fn limit(&self, key: u64) -> u32 {
        self.limits[usize::from(key != HOT_KEY)].per_s
    }

    /// The key's owner: its place on the ring of the fleet's first
    /// instances, or the next one running.
    fn owner(&self, key: u64) -> usize {
        let home = (mix(key ^ 0x6775_6265) % self.owners as u64) as usize;
        (0..self.owners)
            .map(|step| (home + step) % self.owners)
            .find(|&owner| self.peers[owner].is_some())
            .unwrap_or(home)
    }

    /// Takes `count` hits from `key`'s bucket in `peer`'s map at `second`
    /// (draining it when they exceed it); whether they fitted.
    fn hit(&mut self, peer: usize, key: u64, second: u64, count: u32) -> bool {
        let limit = self.limit(key);
        let Some(state) = self.peers[peer].as_mut() else {
            return false;
        };
        let bucket = state
            .buckets
            .get(&key)
            .copied()
            .unwrap_or(Bucket {
                remaining: limit,
                second,
            })
            .at(second, limit);
        state.buckets.insert(
            key,
            Bucket {
                remaining: bucket.remaining.saturating_sub(count),
                ..bucket
            },
        );
        bucket.remaining >= count
    }

    /// Queues `key` for `owner`'s next broadcast.
    fn queue_update(&mut self, world: &mut World<Event>, owner: usize, key: u64) {
        let epoch = self.epochs[owner];
        let Some(peer) = self.peers[owner].as_mut() else {
            return;
        };
        peer.updated.push(key);
        if !peer.broadcasting {
            peer.broadcasting = true;
            world.after(SYNC_WAIT_NS, Event::Broadcast { owner, epoch });
        }
    }
}

impl Design for Gubernator {
    type Event = Event;

    fn arrival(&mut self, world: &mut World<Event>, instance: usize, key: u64) {
        let owner = self.owner(key);
        let now_ns = world.now_ns();
        let second = now_ns / 1_000_000_000;
        let epoch = self.epochs[instance];
        if key != HOT_KEY && owner != instance {
            let id = self.forwarded.insert(Forwarded {
                peer: instance,
                epoch,
                owner,
                key,
                arrival_ns: now_ns,
                admitted: false,
                decided_ns: 0,
            });
            world.send(instance, false, Event::Forward(id), Event::Failed(id));
            return;
        }
        let admitted = self.hit(instance, key, second, 1);
        world.decided(key, now_ns, admitted);
        if owner == instance {
            if key == HOT_KEY {
                self.queue_update(world, owner, key);
            }
            return;
        }
        let Some(peer) = self.peers[instance].as_mut() else {
            return;
        };
        *peer.hits.entry(owner).or_default().entry(key).or_default() += 1;
        if !peer.sending {
            peer.sending = true;
            world.after(
                SYNC_WAIT_NS,
                Event::SendHits {
                    peer: instance,
                    epoch,
                },
            );
        }
    }

    fn event(&mut self, world: &mut World<Event>, event: Event) {
        match event {
            Event::SendHits { peer, epoch } => {
                if self.epochs[peer] != epoch {
                    return;
                }
                let Some(state) = self.peers[peer].as_mut() else {
                    return;
                };
                state.sending = false;
                let reachable = world.reachable(peer);
                for (owner, hits) in std::mem::take(&mut state.hits) {
                    let hot = hits.contains_key(&HOT_KEY);
                    world.called(hot);
                    if reachable && world.reachable(owner) {
                        let delay = world.one_way_ns(peer);
                        let hits = Rc::new(hits.into_iter().collect());
                        world.after(delay, Event::Hits { owner, hits });
                    }
                }
            }
            Event::Hits { owner, hits } => {
                if !world.is_alive(owner) {
                    return;
                }
                let second = world.now_ns() / 1_000_000_000;
                world.operated(owner, hits.len() as u64);
                for &(key, count) in hits.iter() {
                    // DRAIN_OVER_LIMIT: hits beyond what is left empty it.
                    self.hit(owner, key, second, count);
                    self.queue_update(world, owner, key);
                }
            }
            Event::Broadcast { owner, epoch } => {
                if self.epochs[owner] != epoch {
                    return;
                }
                let Some(state) = self.peers[owner].as_mut() else {
                    return;
                };
                state.broadcasting = false;
                let mut keys = std::mem::take(&mut state.updated);
                keys.sort_unstable();
                keys.dedup();
                let statuses: Rc<Vec<(u64, Bucket)>> = Rc::new(
                    keys.iter()
                        .filter_map(|key| state.buckets.get(key).map(|bucket| (*key, *bucket)))
                        .collect(),
                );
                let hot = keys.binary_search(&HOT_KEY).is_ok();
                if !world.reachable(owner) {
                    return;
                }
                world.operated(owner, self.peers.len() as u64);
                for peer in 0..self.peers.len() {
                    if peer == owner || self.peers[peer].is_none() {
                        continue;
                    }
                    world.called(hot);
                    if world.reachable(peer) {
                        let delay = world.one_way_ns(peer);
                        let statuses = Rc::clone(&statuses);
                        world.after(delay, Event::Update { peer, statuses });
                    }
                }
            }
            Event::Forward(id) => {
                let now_ns = world.now_ns();
                let call = self.forwarded.get_mut(id);
                let (owner, key, peer) = (call.owner, call.key, call.peer);
                let admitted = self.hit(owner, key, now_ns / 1_000_000_000, 1);
                let call = self.forwarded.get_mut(id);
                call.admitted = admitted;
                call.decided_ns = now_ns;
                world.answer(owner, 1, peer, Event::Answer(id));
            }
            Event::Answer(id) | Event::Failed(id) => {
                let call = self.forwarded.take(id);
                if self.epochs[call.peer] == call.epoch && world.is_alive(call.peer) {
                    let admitted = call.admitted && matches!(event, Event::Answer(_));
                    world.decided_at(call.key, call.arrival_ns, call.decided_ns, admitted);
                }
            }
            Event::Update { peer, statuses } => {
                if let Some(state) = self.peers[peer].as_mut() {
                    for &(key, bucket) in statuses.iter() {
                        state.buckets.insert(key, bucket);
                    }
                }
            }
        }
    }

    fn crash(&mut self, _world: &mut World<Event>, instance: usize) {
        self.epochs[instance] += 1;
        self.peers[instance] = None;
    }

    fn start(&mut self, _world: &mut World<Event>, instance: usize) {
        self.peers[instance] = Some(Peer::default());
    }

    fn contract(&self) -> Contract {
        Contract::FixedWindow
    }

    fn failover(
        &mut self,
        _world: &mut World<Event>,
        _master: usize,
        _lost_ns: u64,
        _step_ns: i64,
    ) {
        // No Redis: its owners are its peers, and their crashes are the
        // scenario's.
    }

    fn release_instances(&mut self) {
        self.peers = Vec::new();
    }
}
