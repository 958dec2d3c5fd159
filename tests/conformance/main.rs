//! Runs the conformance suite (`suite.rs`) over every algorithm
//! on every store. A new store or algorithm is one `conformance!` line.

// Ordinary tests use std's primitives; under the model-checking features the
// crate's primitives are loom's or shuttle's, usable only inside a model.
#![cfg(not(any(feature = "loom", feature = "shuttle")))]

#[path = "../support/contention.rs"]
mod contention;
mod mixed;
mod suite;
#[macro_use]
mod store_suite;

use tollgate::algorithm::{FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket};
use tollgate::store::{GlobalMutex, LockFree, PerKey, Sharded};

conformance!(fixed_window_global, FixedWindow, GlobalMutex);
conformance!(token_bucket_global, TokenBucket, GlobalMutex);
conformance!(sliding_log_global, SlidingWindowLog, GlobalMutex);
conformance!(sliding_counter_global, SlidingWindowCounter, GlobalMutex);
conformance!(gcra_global, Gcra, GlobalMutex);

conformance!(fixed_window_sharded, FixedWindow, Sharded::new(4));
conformance!(token_bucket_sharded, TokenBucket, Sharded::new(4));
conformance!(sliding_log_sharded, SlidingWindowLog, Sharded::new(4));
conformance!(
    sliding_counter_sharded,
    SlidingWindowCounter,
    Sharded::new(4)
);
conformance!(gcra_sharded, Gcra, Sharded::new(4));

conformance!(fixed_window_lock_free, FixedWindow, LockFree::default());
conformance!(token_bucket_lock_free, TokenBucket, LockFree::default());
conformance!(sliding_log_lock_free, SlidingWindowLog, LockFree::default());
conformance!(
    sliding_counter_lock_free,
    SlidingWindowCounter,
    LockFree::default()
);
conformance!(gcra_lock_free, Gcra, LockFree::default());

conformance!(fixed_window_per_key, FixedWindow, PerKey::new());
conformance!(token_bucket_per_key, TokenBucket, PerKey::new());
conformance!(sliding_log_per_key, SlidingWindowLog, PerKey::new());
conformance!(sliding_counter_per_key, SlidingWindowCounter, PerKey::new());
conformance!(gcra_per_key, Gcra, PerKey::new());

// A caller-chosen hasher (seeded foldhash) on the lock-free store.
conformance!(
    gcra_lock_free_foldhash,
    Gcra,
    LockFree::new(2).with_hasher(foldhash::fast::RandomState::default())
);

// One shard: every key in one table, so the 10 000-key test rebuilds it
// from 8 buckets to 16 384 while checking.
conformance!(gcra_lock_free_one_shard, Gcra, LockFree::new(1));
conformance!(
    fixed_window_lock_free_one_shard,
    FixedWindow,
    LockFree::new(1)
);
conformance!(
    sliding_log_lock_free_one_shard,
    SlidingWindowLog,
    LockFree::new(1)
);
conformance!(
    sliding_counter_lock_free_one_shard,
    SlidingWindowCounter,
    LockFree::new(1)
);

// The sliding counter behind a `Locked` cell (`AlwaysLocked`), the
// discipline of the `Adaptive` cell's boxed form, on the lock-free store:
// every test quota here packs, so the default rows above run the packed
// form. The boxed form itself, through growth and eviction:
// `tests/stores.rs`.
conformance!(
    sliding_counter_lock_free_locked_form,
    SlidingWindowCounter,
    LockFree::default().cells::<tollgate::cell::AlwaysLocked>()
);

// Mixed quotas: each limiter built with another quota than the test's,
// every check carrying the test's own (`check_n_with`).
conformance!(mixed fixed_window_global_mixed, FixedWindow, GlobalMutex);
conformance!(mixed token_bucket_sharded_mixed, TokenBucket, Sharded::new(4));
conformance!(mixed gcra_lock_free_mixed, Gcra, LockFree::default());
conformance!(mixed fixed_window_lock_free_mixed, FixedWindow, LockFree::default());
conformance!(mixed token_bucket_lock_free_mixed, TokenBucket, LockFree::default());
conformance!(mixed sliding_log_lock_free_mixed, SlidingWindowLog, LockFree::default());
conformance!(
    mixed sliding_counter_lock_free_mixed,
    SlidingWindowCounter,
    LockFree::default()
);
conformance!(mixed sliding_log_per_key_mixed, SlidingWindowLog, PerKey::new());
conformance!(mixed sliding_counter_sharded_mixed, SlidingWindowCounter, Sharded::new(4));
conformance!(mixed gcra_global_mixed, Gcra, GlobalMutex);
conformance!(
    mixed sliding_counter_lock_free_locked_form_mixed,
    SlidingWindowCounter,
    LockFree::default().cells::<tollgate::cell::AlwaysLocked>()
);
