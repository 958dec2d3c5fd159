//! Each key's cell behind an `Arc` in one mutex-guarded table: the table's
//! lock is held only to find or insert the cell.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc as StdArc;

use super::kit::{
    Attempt, Held, NewKey, Population, admit_new_key, carry_for, check_carries, decide_fresh,
    rested_at, retry_after_sweep,
};
use super::mutex::{Entry, Table};
use super::{
    ChangeError, Discarded, Generation, Key, KeyCap, Lookup, Store, StoreKind, Under, discard_each,
    resume_first_panic,
};
use crate::algorithm::{Algorithm, Carry, CarryAt};
use crate::cell::{Cell, CellFor, Preferred};
use crate::decision::Decision;
use crate::error::CheckError;
use crate::sync::canary::{self, Canary};
use crate::sync::{Arc, Mutex, lock};

/// Every key's [`Cell`] in an `Arc`, inside one mutex-guarded hash table.
/// The lock is held only to find a key's cell (or insert a new one); the
/// check runs on the cell after the lock is released, which for GCRA and
/// the fixed window is a compare-and-swap with no lock at all.
///
/// It pays an allocation per key (the `Arc`) and one shared lock per
/// lookup: a baseline between [`Sharded`](super::Sharded), whose checks
/// run under the lock, and [`LockFree`](super::LockFree), whose lookups
/// take none.
// It evicts with the lock-free store's retire-then-unlink protocol, built
// only from `crate::sync` primitives, so it is also the shuttle tests'
// stand-in for the lock-free store (whose table and read-copy-update
// compile out under shuttle): under `--features shuttle` it is the default
// store.
pub struct PerKey<P = Preferred> {
    cells: PhantomData<fn() -> P>,
}

impl PerKey {
    /// The per-key store with the [`Preferred`] cells.
    #[must_use]
    pub const fn new() -> Self {
        Self { cells: PhantomData }
    }
}

impl<P> PerKey<P> {
    /// The same store keeping each key's state in the cells `P2` chooses
    /// (see [`LockFree::cells`](super::LockFree::cells)).
    #[must_use]
    pub const fn cells<P2>(self) -> PerKey<P2> {
        PerKey { cells: PhantomData }
    }
}

impl Default for PerKey {
    fn default() -> Self {
        Self::new()
    }
}

impl<P> Clone for PerKey<P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P> Copy for PerKey<P> {}

impl<P> fmt::Debug for PerKey<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerKey")
            .field("cells", &std::any::type_name::<P>())
            .finish()
    }
}

impl<K: Key, A: Algorithm, P: CellFor<A> + 'static> StoreKind<K, A> for PerKey<P> {
    type Store = PerKeyStore<K, A, P::Cell>;

    fn build(&self, generation: StdArc<Generation<A>>, cap: Option<KeyCap>) -> Self::Store {
        PerKeyStore {
            table: Mutex::new(InTable {
                generation,
                table: Table::default(),
            }),
            hasher: RandomState::new(),
            population: Population::new(cap),
            changing: Mutex::new(()),
        }
    }
}

/// The store [`PerKey`] builds.
pub struct PerKeyStore<K, A, C> {
    table: Mutex<InTable<K, A, C>>,
    hasher: RandomState,
    population: Population,
    /// Held by a change for its whole pass: changes follow one another.
    changing: Mutex<()>,
}

/// What the table's lock guards: the keys' cells, and the generation new
/// keys are made in.
struct InTable<K, A, C> {
    generation: StdArc<Generation<A>>,
    table: Table<K, Arc<Keyed<A, C>>>,
}

/// A key's cell and the generation its state is in: a check holding the
/// cell's `Arc` decides by that generation, and a change retires the cell
/// before it moves the state to another.
struct Keyed<A, C> {
    cell: C,
    generation: StdArc<Generation<A>>,
}

/// What a lookup under the lock found.
enum Found<A, C> {
    Cell(Arc<Keyed<A, C>>),
    /// The key was absent and the check needs no cell: decided already (a
    /// new key, stored or past the cap), or a sweep comes first.
    NoCell(Attempt),
}

impl<K: Key, A: Algorithm, C: Cell<A>> PerKeyStore<K, A, C> {
    /// Retires and unlinks the cells idle at `idle_at_ns` into `evicted`,
    /// to be dropped with the lock released; returns how many. Retiring
    /// first is the protocol: a check that already holds the cell's `Arc`
    /// finds it retired and looks again, so its admission cannot land in a
    /// cell no lookup can reach.
    fn sweep(
        &self,
        table: &mut Table<K, Arc<Keyed<A, C>>>,
        evicted: &mut Discarded<Entry<K, Arc<Keyed<A, C>>>>,
        idle_at_ns: u64,
    ) -> usize {
        table.sweep(&self.population, evicted, |entry| {
            let keyed = &entry.value;
            keyed
                .cell
                .retire_if_idle(keyed.generation.algorithm(), idle_at_ns)
        })
    }

    /// The key's cell, inserting a fresh one for a new key (table lock
    /// held); `swept`: the store was just swept for this check. What a
    /// growth sweep evicts goes to `evicted`, which the caller declared
    /// before it took the lock, so that it is dropped after the lock is
    /// released even when a panic unwinds. A new key's decision is handed
    /// to `finish`.
    #[allow(clippy::too_many_arguments)]
    fn find_or_insert<Q: Lookup<K> + ?Sized, U: Under<A>>(
        &self,
        in_table: &mut InTable<K, A, C>,
        evicted: &mut Discarded<Entry<K, Arc<Keyed<A, C>>>>,
        hash: u64,
        key: &Q,
        under: &U,
        now_ns: u64,
        cost: u32,
        swept: bool,
        finish: impl FnOnce(&Generation<A>, &A, Decision),
    ) -> Result<Found<A, C>, CheckError> {
        let InTable { generation, table } = in_table;
        if let Some(entry) = table.find_mut(hash, key) {
            return Ok(Found::Cell(Arc::clone(&entry.value)));
        }
        // A new key is decided here, under the lock, on its unshared cell.
        let algorithm = under.choose(generation)?;
        let own = generation.algorithm();
        let attempt = admit_new_key(
            &self.population,
            &*algorithm,
            key,
            now_ns,
            cost,
            swept,
            NewKey::new(
                (table, evicted),
                |(table, evicted)| {
                    table.make_room(&self.hasher, |table| {
                        self.sweep(table, evicted, rested_at(own, now_ns));
                    });
                    Ok(())
                },
                |state| {
                    Arc::new(Keyed {
                        cell: C::with_state(&algorithm, state),
                        generation: StdArc::clone(generation),
                    })
                },
                |(table, _), key, value| table.insert(hash, Entry { key, value }, &self.hasher),
            ),
        )?;
        if let Attempt::Done(decision) = attempt {
            finish(generation, &algorithm, decision);
        }
        Ok(Found::NoCell(attempt))
    }

    /// The key's cell, if stored (table lock held only to find it).
    fn find(&self, hash: u64, key: &(impl Lookup<K> + ?Sized)) -> Option<Held<Arc<Keyed<A, C>>>> {
        // Held, as in `check_then`.
        lock(&self.table)
            .table
            .find_mut(hash, key)
            .map(|entry| Held::new(Arc::clone(&entry.value)))
    }
}

impl<K: Key, A: Algorithm, C: Cell<A>> Store<K, A> for PerKeyStore<K, A, C> {
    fn check_then<Q: Lookup<K> + ?Sized, U: Under<A>, R>(
        &self,
        key: &Q,
        under: &U,
        now_ns: u64,
        cost: u32,
        finish: impl Fn(&Generation<A>, &A, Decision) -> R,
    ) -> Result<R, CheckError> {
        let hash = self.hasher.hash_one(key);
        let mut finished = None;
        let attempt = |swept| loop {
            let mut evicted = Discarded::new();
            let found = self.find_or_insert(
                &mut lock(&self.table),
                &mut evicted,
                hash,
                key,
                under,
                now_ns,
                cost,
                swept,
                |generation, algorithm, decision| {
                    finished = Some(finish(generation, algorithm, decision));
                },
            );
            drop(evicted);
            // Held: if an eviction unlinked the cell meanwhile, this may be
            // its last reference, and dropping it drops the evicted state
            // (user code), whose panic is the store's to discard.
            let keyed = Held::new(match found? {
                Found::Cell(keyed) => keyed,
                Found::NoCell(checked) => return Ok(checked),
            });
            let Keyed { cell, generation } = &**keyed.get();
            let algorithm = under.choose(generation)?;
            // The lock is released: the check runs on the cell alone.
            if let Some(decision) = cell.check(&algorithm, now_ns, cost)? {
                finished = Some(finish(generation, &algorithm, decision));
                return Ok(Attempt::Done(decision));
            }
            // Retired by an eviction or a change after we found it: look
            // again.
        };
        retry_after_sweep(&self.population, attempt, || self.evict_idle(now_ns))
            .map(|_| finished.expect("a decided check is finished"))
    }

    fn peek<Q: Lookup<K> + ?Sized, U: Under<A>>(
        &self,
        key: &Q,
        under: &U,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        let hash = self.hasher.hash_one(key);
        loop {
            let Some(keyed) = self.find(hash, key) else {
                // Absent (or evicted: idle, so as good as fresh).
                let generation = self.generation();
                let algorithm = under.choose(&generation)?;
                return Ok(decide_fresh(&*algorithm, now_ns, cost)?.decision());
            };
            let Keyed { cell, generation } = &**keyed.get();
            let algorithm = under.choose(generation)?;
            if let Some(decision) = cell.peek(&algorithm, now_ns, cost)? {
                return Ok(decision);
            }
            // Retired: evicted, or moved by a change; look again.
        }
    }

    fn update<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        change: impl Fn(&Generation<A>, &A::State) -> Option<A::State>,
    ) -> bool {
        let hash = self.hasher.hash_one(key);
        loop {
            // Absent: never admitted, or evicted (idle, as good as fresh),
            // and left alone.
            let Some(keyed) = self.find(hash, key) else {
                return false;
            };
            let Keyed { cell, generation } = &**keyed.get();
            if let Some(changed) =
                cell.update(generation.algorithm(), |state| change(generation, state))
            {
                return changed;
            }
            // Retired: evicted, or moved by a change; look again.
        }
    }

    fn generation(&self) -> StdArc<Generation<A>> {
        StdArc::clone(&lock(&self.table).generation)
    }

    fn change(
        &self,
        to: Generation<A>,
        carry: Carry,
        at: &dyn Fn() -> CarryAt,
    ) -> Result<(), ChangeError> {
        let _changing = lock(&self.changing);
        let from = self.generation();
        check_carries(&from, &to, carry, at())?;
        let mut in_table = lock(&self.table);
        let to = StdArc::new(to.carried_from(&from));
        let InTable { generation, table } = &mut *in_table;
        // Every cell retired into an unshared one first (no user code): a
        // check holding a cell's `Arc` finds it retired and looks again,
        // under the lock we hold.
        let moved: Vec<C> = table
            .values_mut()
            .map(|keyed| {
                if canary::planted(Canary::ChangeWithoutRetire) {
                    let algorithm = generation.algorithm();
                    return keyed
                        .cell
                        .carried(algorithm, algorithm, Carry::Unchanged, at())
                        .expect("the crate's algorithms carry every state");
                }
                keyed
                    .cell
                    .retire_into_new()
                    .expect("under the lock, a stored cell is live")
            })
            .collect();
        // Every cell is retired: the states are frozen, and the instant and
        // the strategy are read now. The clock's and the algorithm's code: a
        // panic keeps every moved state in its generation.
        let carried = catch_unwind(AssertUnwindSafe(|| {
            let carry = carry_for(generation, &to, carry);
            let at = at();
            moved
                .iter()
                .map(|cell| {
                    cell.carried(generation.algorithm(), to.algorithm(), carry, at)
                        .expect("`Algorithm::carry` returned None after carrying a fresh state")
                })
                .collect::<Vec<C>>()
        }));
        // On success the old states stay in `moved`, dropped below.
        let (cells, old, in_generation, panic) = match carried {
            Ok(carried) => (carried, moved, StdArc::clone(&to), None),
            Err(panic) => (moved, Vec::new(), StdArc::clone(generation), Some(panic)),
        };
        let replaced: Vec<Arc<Keyed<A, C>>> = table
            .values_mut()
            .zip(cells)
            .map(|(keyed, cell)| {
                let generation = StdArc::clone(&in_generation);
                std::mem::replace(keyed, Arc::new(Keyed { cell, generation }))
            })
            .collect();
        if let Some(panic) = panic {
            drop(in_table);
            drop(replaced);
            resume_unwind(panic);
        }
        *generation = to;
        drop(in_table);
        // The old states (moved out of the retired cells), each on its own:
        // a panic in a state's `Drop` changes nothing.
        discard_each(old);
        discard_each(replaced);
        Ok(())
    }

    fn evict_idle(&self, now_ns: u64) -> usize {
        // Declared before the lock: dropped after it, even if `tidy` panics.
        let mut evicted = Discarded::new();
        let mut in_table = lock(&self.table);
        let removed = self.sweep(&mut in_table.table, &mut evicted, now_ns);
        in_table.table.tidy(&self.hasher);
        removed
    }

    fn len(&self) -> usize {
        self.population.len()
    }
}

impl<K, A, C> Drop for PerKeyStore<K, A, C> {
    fn drop(&mut self) {
        resume_first_panic(lock(&self.table).table.clear());
    }
}

impl<K, A, C> fmt::Debug for PerKeyStore<K, A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerKeyStore")
            .field("population", &self.population)
            .finish_non_exhaustive()
    }
}
