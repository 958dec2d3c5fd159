//! The one door for concurrency primitives.
//!
//! Every atomic, `Mutex` and `Arc` whose behaviour a model checker must see is
//! imported from here and from nowhere else, so that the model-checking builds
//! (loom and shuttle, added with the model tests) can swap the whole crate onto
//! their instrumented primitives by changing this file alone.
//!
//! Today this is std. [`lock`] is the only way the crate takes a mutex: it
//! ignores poisoning, which is sound here because no code in the crate panics
//! while holding a lock with a half-written state (every critical section
//! computes the new state first and stores it with one assignment).

pub(crate) use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

/// Locks `mutex`, recovering the guard if a previous holder panicked.
///
/// See the module documentation for why ignoring poison is sound here.
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
