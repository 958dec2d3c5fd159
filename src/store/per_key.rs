//! Each key's cell behind an `Arc` in one mutex map: the map's lock is held
//! only to find or insert the cell.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;

use super::{Checked, Key, KeyCap, Population, Room, Store, StoreKind, retry_after_sweep};
use crate::algorithm::Algorithm;
use crate::cell::Cell;
use crate::decision::Decision;
use crate::error::CheckError;
use crate::sync::{Arc, Mutex, lock};

/// Every key's [`Cell`] in an `Arc`, inside one `Mutex<HashMap>`. The lock is
/// held only to find a key's cell (or insert a new one); the check runs on
/// the cell after the lock is released, which for GCRA and the fixed window
/// is a compare-and-swap with no lock at all.
///
/// This is the seed's "per-key" strategy. It pays an allocation per key (the
/// `Arc`) and one shared lock per lookup. It is also the **model checkers'
/// stand-in** for the lock-free store: it uses the same retire-then-unlink
/// eviction protocol, and it is built only from `crate::sync` primitives, so
/// loom and shuttle see every step of it. They cannot see inside the
/// lock-free table, whose memory reclamation runs on `crossbeam-epoch`. Under
/// `--features loom` or `--features shuttle` it is the default store.
#[derive(Debug, Clone, Copy, Default)]
pub struct PerKey;

impl StoreKind for PerKey {
    type Store<K: Key, A: Algorithm> = PerKeyStore<K, A>;

    fn build<K: Key, A: Algorithm>(&self, cap: Option<KeyCap>) -> PerKeyStore<K, A> {
        PerKeyStore {
            map: Mutex::new(HashMap::new()),
            population: Population::new(cap),
        }
    }
}

/// The store [`PerKey`] builds.
pub struct PerKeyStore<K, A: Algorithm> {
    map: Mutex<HashMap<K, Arc<A::Cell>>>,
    population: Population,
}

/// What a lookup under the lock found.
enum Found<C> {
    Cell(Arc<C>),
    /// The key was absent and the check needs no cell: decided already (a
    /// new key past the cap), or a sweep comes first.
    Checked(Checked),
}

impl<K: Key, A: Algorithm> PerKeyStore<K, A> {
    /// Retires and unlinks the cells idle at `idle_at_ns`. Retiring first is
    /// the protocol: a check that already holds the cell's `Arc` finds it
    /// retired and looks again, so its admission cannot land in a cell no
    /// lookup can reach.
    fn sweep(&self, cells: &mut HashMap<K, Arc<A::Cell>>, algorithm: &A, idle_at_ns: u64) -> usize {
        let before = cells.len();
        cells.retain(|_, cell| !cell.retire_if_idle(algorithm, idle_at_ns));
        let removed = before - cells.len();
        self.population.release(removed);
        removed
    }

    /// The key's cell, inserting a fresh one for a new key (map lock held);
    /// `swept`: the store was just swept for this check.
    fn find_or_insert<Q>(
        &self,
        map: &mut HashMap<K, Arc<A::Cell>>,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
        swept: bool,
    ) -> Result<Found<A::Cell>, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(cell) = map.get(key) {
            return Ok(Found::Cell(Arc::clone(cell)));
        }
        // A new key: a fresh state has its whole burst, so a valid cost is
        // admitted; an invalid one returns here, before anything is stored.
        let fresh = algorithm
            .decide(&A::State::default(), now_ns, cost)?
            .decision();
        if map.len() == map.capacity() {
            let idle_at_ns = now_ns.saturating_sub(algorithm.rest_ns());
            self.sweep(map, algorithm, idle_at_ns);
        }
        match self.population.make_room(swept) {
            Room::Reserved => {}
            Room::Full(cap) => {
                return cap
                    .when_full(fresh)
                    .map(|decision| Found::Checked(Checked::Done(decision)));
            }
            Room::SweepFirst => return Ok(Found::Checked(Checked::SweepFirst)),
        }
        let cell = Arc::new(A::Cell::new(algorithm));
        map.insert(key.to_owned(), Arc::clone(&cell));
        Ok(Found::Cell(cell))
    }
}

impl<K: Key, A: Algorithm> Store<K, A> for PerKeyStore<K, A> {
    fn check<Q>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let attempt = |swept| loop {
            let found =
                self.find_or_insert(&mut lock(&self.map), key, algorithm, now_ns, cost, swept)?;
            let cell = match found {
                Found::Cell(cell) => cell,
                Found::Checked(checked) => return Ok(checked),
            };
            // The lock is released: the check runs on the cell alone.
            if let Some(decision) = cell.check(algorithm, now_ns, cost)? {
                return Ok(Checked::Done(decision));
            }
            // Retired by an eviction after we found it: look again.
        };
        retry_after_sweep(&self.population, attempt, || {
            self.evict_idle(algorithm, now_ns)
        })
    }

    fn peek<Q>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let cell = lock(&self.map).get(key).cloned();
        if let Some(decision) = cell
            .map(|cell| cell.peek(algorithm, now_ns, cost))
            .transpose()?
            .flatten()
        {
            return Ok(decision);
        }
        // Absent, or retired (evicted: idle, so as good as fresh).
        Ok(algorithm
            .decide(&A::State::default(), now_ns, cost)?
            .decision())
    }

    fn evict_idle(&self, algorithm: &A, now_ns: u64) -> usize {
        self.sweep(&mut lock(&self.map), algorithm, now_ns)
    }

    fn len(&self) -> usize {
        self.population.len()
    }
}

impl<K, A: Algorithm> fmt::Debug for PerKeyStore<K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerKeyStore")
            .field("population", &self.population)
            .finish_non_exhaustive()
    }
}
