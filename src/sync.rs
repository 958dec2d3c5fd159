//! The one door for concurrency primitives.
//!
//! Every atomic, `Mutex` and `Arc` whose behaviour a model checker must see is
//! imported from here and from nowhere else. This file alone knows which
//! implementation is in use:
//!
//! * std, normally;
//! * loom's under `--features loom`, so that loom models explore every
//!   interleaving of the crate's own code (`model-tests/loom.rs`);
//! * shuttle's under `--features shuttle` (`model-tests/shuttle.rs`).
//!
//! [`lock`] is the only way the crate takes a mutex. It ignores poisoning,
//! which is sound here because no code in the crate panics while holding a
//! lock with a half-written state (every critical section computes the new
//! state first and stores it with one assignment).

#[cfg(all(feature = "loom", feature = "shuttle"))]
compile_error!(
    "the `loom` and `shuttle` features exclude each other: \
     each replaces the crate's primitives with its own model checker's"
);

// std also when both features are on, so that the compile_error above is the
// only error reported.
#[cfg(any(
    not(any(feature = "loom", feature = "shuttle")),
    all(feature = "loom", feature = "shuttle")
))]
mod primitives {
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
    pub(crate) use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
}

// The byte-wide atomics serve only the lock-free table, which compiles out
// under the model checkers (see `store`).
#[cfg(all(feature = "loom", not(feature = "shuttle")))]
mod primitives {
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};
    pub(crate) use std::sync::PoisonError;
}

#[cfg(all(feature = "shuttle", not(feature = "loom")))]
mod primitives {
    pub(crate) use shuttle::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    pub(crate) use shuttle::sync::{Arc, Mutex, MutexGuard};
    pub(crate) use std::sync::PoisonError;
}

#[cfg(not(any(feature = "loom", feature = "shuttle")))]
pub(crate) use primitives::AtomicU8;
pub(crate) use primitives::{Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering};

/// Locks `mutex`, recovering the guard if a previous holder panicked.
///
/// See the module documentation for why ignoring poison is sound here.
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(primitives::PoisonError::into_inner)
}
