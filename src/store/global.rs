//! The baseline: one mutex around one map.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;

use super::{Key, Store, StoreKind};
use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::CheckError;
use crate::sync::{Mutex, lock};

/// Every key in one `HashMap` behind one `Mutex`: correct, simple, and the
/// baseline the other stores are measured against. Every check on every key
/// serialises on the one lock, so it slows down as threads are added.
///
/// The map's hasher is std's `RandomState`, seeded randomly per map, so an
/// attacker who chooses keys cannot precompute collisions.
#[derive(Debug, Clone, Copy, Default)]
pub struct GlobalMutex;

impl StoreKind for GlobalMutex {
    type Store<K: Key, A: Algorithm> = GlobalMutexStore<K, A>;

    fn build<K: Key, A: Algorithm>(&self) -> GlobalMutexStore<K, A> {
        GlobalMutexStore {
            map: Mutex::new(HashMap::new()),
        }
    }
}

/// The store [`GlobalMutex`] builds.
pub struct GlobalMutexStore<K, A: Algorithm> {
    map: Mutex<HashMap<K, A::State>>,
}

impl<K: Key, A: Algorithm> Store<K, A> for GlobalMutexStore<K, A> {
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
        // Lookup, decision and write all happen under the one lock.
        let mut map = lock(&self.map);
        if let Some(state) = map.get_mut(key) {
            return algorithm.check(state, now_ns, cost);
        }
        // A new key: its state is the default, which has its whole burst, so
        // any valid cost is admitted and the state to store is the admitted
        // one. An invalid cost returns before anything is stored.
        let mut state = A::State::default();
        let decision = algorithm.check(&mut state, now_ns, cost)?;
        map.insert(key.to_owned(), state);
        Ok(decision)
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
        let map = lock(&self.map);
        let verdict = match map.get(key) {
            Some(state) => algorithm.decide(state, now_ns, cost)?,
            None => algorithm.decide(&A::State::default(), now_ns, cost)?,
        };
        Ok(verdict.decision())
    }

    fn len(&self) -> usize {
        lock(&self.map).len()
    }
}

impl<K, A: Algorithm> fmt::Debug for GlobalMutexStore<K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GlobalMutexStore")
            .field("keys", &lock(&self.map).len())
            .finish()
    }
}
