//! Dropping what user code may panic in: values held across user code,
//! and what a store discards (evicted keys, replaced tables), dropped after
//! its locks are released and each on its own.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// A value held across user code that may panic. If it does, the value is
/// dropped with any panic of its own `Drop` caught and discarded: a second
/// panic while the first unwinds would abort the process.
#[derive(Debug)]
pub struct Held<T>(Option<T>);

impl<T> Held<T> {
    /// Holds `value`.
    pub const fn new(value: T) -> Self {
        Self(Some(value))
    }

    /// Returns the value.
    ///
    /// # Panics
    ///
    /// Never: only `take` empties the holder, and it consumes it.
    #[must_use]
    pub fn get(&self) -> &T {
        self.0.as_ref().expect("held until taken")
    }

    /// Returns the value, to change.
    ///
    /// # Panics
    ///
    /// Never: only `take` empties the holder, and it consumes it.
    pub fn get_mut(&mut self) -> &mut T {
        self.0.as_mut().expect("held until taken")
    }

    /// Takes the value out, no longer held.
    ///
    /// # Panics
    ///
    /// Never: only `take` empties the holder, and it consumes it.
    #[must_use]
    pub fn take(mut self) -> T {
        self.0.take().expect("held until taken")
    }
}

impl<T> Drop for Held<T> {
    fn drop(&mut self) {
        if let Some(value) = self.0.take() {
            drop(catch_unwind(AssertUnwindSafe(move || drop(value))));
        }
    }
}

/// What a store discarded (evicted keys, replaced tables), dropped when this
/// is, after the store's locks are released: declared before a lock is
/// taken, it is dropped after the lock's guard even when a panic unwinds.
/// Each item is dropped on its own, in parts ([`Discard`]), and a panic in
/// a `Drop` is caught and discarded: the store's state is consistent, the request that triggered
/// the eviction was decided already, and there is no caller the panic
/// belongs to (see "User code" above). Caught one item at a time, two
/// panicking `Drop`s, or one during another panic's unwinding, do not abort
/// the process.
pub(super) struct Discarded<T: Discard>(Vec<T>);

/// Something a store discards: dropped in parts, each under its own
/// `catch_unwind`, so that two panicking parts (a key's `Drop` and its
/// state's) cannot abort the process, as drop glue would, dropping the
/// second while the first unwinds. Returns the first panic.
pub(super) trait Discard {
    fn discard(self) -> Option<Box<dyn Any + Send>>;
}

impl<T: Discard> Discarded<T> {
    pub(super) const fn new() -> Self {
        Self(Vec::new())
    }

    pub(super) fn push(&mut self, item: T) {
        self.0.push(item);
    }

    // The lock-free store's: shuttle builds only the mutex stores.
    #[cfg(not(feature = "shuttle"))]
    pub(super) fn extend(&mut self, items: impl IntoIterator<Item = T>) {
        self.0.extend(items);
    }
}

impl<T: Discard> Drop for Discarded<T> {
    fn drop(&mut self) {
        for item in self.0.drain(..) {
            // The payload of a caught panic is dropped here too; a payload
            // whose own `Drop` panics aborts, as a double panic does anywhere.
            drop(item.discard());
        }
    }
}

/// Drops a key and the value stored beside it, each on its own: if the
/// key's `Drop` panics, the value is still dropped, and a panic in its
/// `Drop` too cannot abort the process (drop glue would drop the value
/// while the key's panic unwinds). Returns the first panic.
pub(super) fn drop_pair<K, V>(key: K, value: V) -> Option<Box<dyn Any + Send>> {
    let key = catch_unwind(AssertUnwindSafe(move || drop(key)));
    let value = catch_unwind(AssertUnwindSafe(move || drop(value)));
    key.err().or(value.err())
}

/// Drops `items` one at a time, each under its own `catch_unwind`, and
/// discards their panics: what a change replaced (the store is consistent
/// and the change done; no caller the panic belongs to).
pub(super) fn discard_each<T>(items: Vec<T>) {
    for item in items {
        drop(catch_unwind(AssertUnwindSafe(move || drop(item))));
    }
}

/// Resumes the first panic a store caught while dropping its keys, once
/// every key is dropped: it reaches whoever dropped the store. Unless a panic
/// is unwinding already: a second would abort, so this one is discarded.
pub(super) fn resume_first_panic(first_panic: Option<Box<dyn Any + Send>>) {
    if let Some(panic) = first_panic {
        if !std::thread::panicking() {
            std::panic::resume_unwind(panic);
        }
    }
}
