//! How keys find their state.
//!
//! A [`Store`] maps keys to per-key state and applies an algorithm to it
//! under its own discipline. Every store runs the same conformance suite, so
//! a new store is checked by adding one line to `tests/conformance.rs`.
//!
//! A key enters a store only when a request on it is admitted: a denial, an
//! invalid cost or a [`peek`](Store::peek) never allocates, because a fresh
//! key's state is the algorithm's default and can be decided without storing
//! it.
//!
//! [`StoreKind`] names a store without naming its key and algorithm types, so
//! that a [`Builder`](crate::Builder) can choose one before it knows them.

mod global;

use std::borrow::Borrow;
use std::fmt::Debug;
use std::hash::Hash;

pub use global::{GlobalMutex, GlobalMutexStore};

use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::CheckError;

/// A key type a store can hold: hashable, comparable and shareable across
/// threads (integers, `String`, tuples, IP addresses, …).
pub trait Key: Hash + Eq + Send + Sync + 'static {}

impl<K: Hash + Eq + Send + Sync + 'static> Key for K {}

/// A map from keys to per-key state, and the discipline that applies an
/// algorithm to it.
pub trait Store<K: Key, A: Algorithm>: Debug + Send + Sync {
    /// Decides `cost` units for `key` at `now_ns` and, if admitted, consumes
    /// them; read, decide and write are atomic with respect to every other
    /// check on the same key.
    ///
    /// # Errors
    ///
    /// As [`Algorithm::decide`]; nothing is consumed or stored on error.
    fn check<Q>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized;

    /// The decision `check` would return, consuming and storing nothing.
    ///
    /// # Errors
    ///
    /// As [`Algorithm::decide`].
    fn peek<Q>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized;

    /// How many keys are stored.
    fn len(&self) -> usize;

    /// Whether no key is stored.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A kind of store, with its configuration: builds the store for any key and
/// algorithm.
pub trait StoreKind: Debug + Clone + Send + Sync + 'static {
    /// The store this kind builds.
    type Store<K: Key, A: Algorithm>: Store<K, A>;

    /// Builds an empty store.
    fn build<K: Key, A: Algorithm>(&self) -> Self::Store<K, A>;
}
