//! The three maps, as [`ConcurrentMap`]s, and the stores named after them.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use tollgate::store::{Key, Lookup};

use crate::map_store::{ConcurrentMap, MapFor, OnMap};

/// The store on papaya's lock-free map (`papaya::HashMap`, reclaimed by
/// seize), each cell inline in its entry.
pub type Papaya<P = tollgate::cell::Preferred> = OnMap<PapayaMap, P>;

/// The store on `scc::HashIndex`, whose lookups take no lock (reclaimed by
/// `scc`'s epochs). Its entries are copied when it resizes, so each cell is
/// behind an `Arc`: a copy then shares the one cell, and no admission can
/// land in a copy the next lookup does not find. `scc::HashMap` would hold
/// the cell inline, but its lookups take a bucket's shared lock, a write to
/// a shared word on every check.
pub type SccIndex<P = tollgate::cell::Preferred> = OnMap<SccIndexMap, P>;

/// The store on flurry's map (a port of Java's `ConcurrentHashMap`,
/// reclaimed by seize), for keys that are `Ord` too, as flurry requires.
/// flurry looks keys up through `K: Borrow<Q>`, which tollgate's sealed
/// [`Lookup`] does not expose to outside code, so a check on a borrowed form
/// (`&str` for `String` keys) makes an owned key first: free for integers,
/// an allocation for strings.
pub type Flurry<P = tollgate::cell::Preferred> = OnMap<FlurryMap, P>;

/// Names papaya's map for [`OnMap`].
#[derive(Debug)]
pub enum PapayaMap {}

/// Names `scc::HashIndex` for [`OnMap`].
#[derive(Debug)]
pub enum SccIndexMap {}

/// Names flurry's map for [`OnMap`].
#[derive(Debug)]
pub enum FlurryMap {}

impl<K: Key, C: Send + Sync + 'static> MapFor<K, C> for PapayaMap {
    type Map = papaya::HashMap<K, C>;
}

impl<K: Key, C: Send + Sync + 'static> MapFor<K, C> for SccIndexMap {
    type Map = scc::HashIndex<K, Arc<C>>;
}

impl<K: Key + Ord, C: Send + Sync + 'static> MapFor<K, C> for FlurryMap {
    type Map = flurry::HashMap<K, C>;
}

/// A borrowed key as papaya and `scc` look it up: hashes as the key does
/// (`Lookup` borrows consistently with `Hash`) and compares with
/// [`Lookup::matches`].
struct ByLookup<'a, Q: ?Sized>(&'a Q);

impl<Q: Hash + ?Sized> Hash for ByLookup<'_, Q> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl<K, Q: Lookup<K> + ?Sized> papaya::Equivalent<K> for ByLookup<'_, Q> {
    fn equivalent(&self, key: &K) -> bool {
        self.0.matches(key)
    }
}

impl<K, Q: Lookup<K> + ?Sized> scc::Equivalent<K> for ByLookup<'_, Q> {
    fn equivalent(&self, key: &K) -> bool {
        self.0.matches(key)
    }
}

impl<K: Key, C: Send + Sync + 'static> ConcurrentMap<K, C> for papaya::HashMap<K, C> {
    fn empty() -> Self {
        Self::new()
    }

    #[inline]
    fn read<Q: Lookup<K> + ?Sized, R>(&self, key: &Q, read: impl FnOnce(&C) -> R) -> Option<R> {
        self.pin().get(&ByLookup(key)).map(read)
    }

    fn insert(&self, key: K, cell: C) {
        self.pin().insert(key, cell);
    }

    fn remove<Q: Lookup<K> + ?Sized>(&self, key: &Q) {
        self.pin().remove(&ByLookup(key));
    }

    fn for_each(&self, mut visit: impl FnMut(&K, &C)) {
        for (key, cell) in &self.pin() {
            visit(key, cell);
        }
    }
}

impl<K: Key, C: Send + Sync + 'static> ConcurrentMap<K, C> for scc::HashIndex<K, Arc<C>> {
    fn empty() -> Self {
        Self::new()
    }

    #[inline]
    fn read<Q: Lookup<K> + ?Sized, R>(&self, key: &Q, read: impl FnOnce(&C) -> R) -> Option<R> {
        self.peek_with(&ByLookup(key), |_, cell| read(cell))
    }

    fn insert(&self, key: K, cell: C) {
        // The key is absent (the caller holds its stripe and looked it up):
        // refused only for a key whose `Hash` or `Eq` changed while stored,
        // a logic error whose decisions are unspecified; its reservation is
        // then committed for a key not added, one room lost under the cap.
        let _refused = scc::HashIndex::insert(self, key, Arc::new(cell));
    }

    fn remove<Q: Lookup<K> + ?Sized>(&self, key: &Q) {
        scc::HashIndex::remove(self, &ByLookup(key));
    }

    fn for_each(&self, mut visit: impl FnMut(&K, &C)) {
        let guard = scc::ebr::Guard::new();
        for (key, cell) in self.iter(&guard) {
            visit(key, cell);
        }
    }
}

impl<K: Key + Ord, C: Send + Sync + 'static> ConcurrentMap<K, C> for flurry::HashMap<K, C> {
    fn empty() -> Self {
        Self::new()
    }

    #[inline]
    fn read<Q: Lookup<K> + ?Sized, R>(&self, key: &Q, read: impl FnOnce(&C) -> R) -> Option<R> {
        self.pin().get(&key.to_owned()).map(read)
    }

    fn insert(&self, key: K, cell: C) {
        self.pin().insert(key, cell);
    }

    fn remove<Q: Lookup<K> + ?Sized>(&self, key: &Q) {
        self.pin().remove(&key.to_owned());
    }

    fn for_each(&self, mut visit: impl FnMut(&K, &C)) {
        for (key, cell) in &self.pin() {
            visit(key, cell);
        }
    }
}
