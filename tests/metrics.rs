//! The counts a limiter hands the `metrics` facade (feature `metrics`):
//! exact under 16 threads, for checks and units admitted and denied, key-cap
//! refusals, evictions and keys stored; nothing for a limiter built without
//! `Builder::metrics`. Read back through a recorder of the test's own.
#![cfg(all(feature = "metrics", not(any(feature = "loom", feature = "shuttle"))))]

#[path = "support/contention.rs"]
mod contention;

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use contention::admitted_under_contention;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use tollgate::clock::ManualClock;
use tollgate::store::WhenFull;
use tollgate::{Builder, Quota};

/// Every counter and gauge registered, by name and sorted labels.
#[derive(Default)]
struct Captured(Mutex<HashMap<String, Arc<AtomicU64>>>);

impl Captured {
    fn slot(&self, key: &Key) -> Arc<AtomicU64> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|label| format!("{}={}", label.key(), label.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        Arc::clone(self.0.lock().unwrap().entry(name).or_default())
    }

    /// The counter `name{labels}`, which must have been published.
    fn counter(&self, name: &str) -> u64 {
        let slots = self.0.lock().unwrap();
        let Some(slot) = slots.get(name) else {
            panic!("no {name} in {:?}", slots.keys().collect::<Vec<_>>());
        };
        slot.load(Ordering::Relaxed)
    }

    /// The gauge `name{labels}` (an `f64`'s bits).
    fn gauge(&self, name: &str) -> f64 {
        f64::from_bits(self.counter(name))
    }
}

impl Recorder for Captured {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.slot(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.slot(key))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// 80 threads × 50 checks of 2 units on one key (100 units an hour, the
/// clock frozen): exactly 50 admitted and 3 950 denied, the first 64
/// threads counting in slots of their own and the others in the shared
/// one.
#[test]
fn every_thread_s_checks_are_counted_exactly() {
    let limiter = Builder::new(Quota::per_hour(100).unwrap())
        .clock(ManualClock::new())
        .metrics("api")
        .build::<u64>();
    let admitted =
        admitted_under_contention(80, 50, || limiter.check_n(&1, 2).unwrap().is_allowed());
    assert_eq!(admitted, 50);
    let captured = Captured::default();
    metrics::with_local_recorder(&captured, || limiter.publish_metrics());
    let named = |name: &str, outcome: &str| format!("{name}{{limiter=api,outcome={outcome}}}");
    assert_eq!(
        captured.counter(&named("tollgate_checks_total", "admitted")),
        50
    );
    assert_eq!(
        captured.counter(&named("tollgate_checks_total", "denied")),
        3_950
    );
    assert_eq!(
        captured.counter(&named("tollgate_units_total", "admitted")),
        100
    );
    assert_eq!(
        captured.counter(&named("tollgate_units_total", "denied")),
        7_900
    );
    assert_eq!(captured.gauge("tollgate_keys{limiter=api}"), 1.0);
}

/// A full store's refusals and `evict_idle`'s evictions are counted; a
/// peek is not a check.
#[test]
fn refusals_and_evictions_are_counted() {
    let clock = ManualClock::new();
    let limiter = Builder::new(Quota::per_second(1).unwrap())
        .clock(clock.clone())
        .max_keys(NonZeroUsize::new(1).unwrap(), WhenFull::Reject)
        .metrics("capped")
        .build::<u64>();
    assert!(limiter.check(&1).unwrap().is_allowed());
    assert!(limiter.check(&2).is_err());
    assert!(limiter.check(&3).is_err());
    let _ = limiter.peek(&1);
    clock.advance(Duration::from_secs(1));
    assert_eq!(limiter.evict_idle(), 1);
    let captured = Captured::default();
    metrics::with_local_recorder(&captured, || limiter.publish_metrics());
    assert_eq!(
        captured.counter("tollgate_new_key_refusals_total{limiter=capped,reason=full}"),
        2
    );
    assert_eq!(
        captured.counter("tollgate_new_key_refusals_total{limiter=capped,reason=reclaiming}"),
        0
    );
    assert_eq!(
        captured.counter("tollgate_evictions_total{limiter=capped}"),
        1
    );
    assert_eq!(
        captured.counter("tollgate_checks_total{limiter=capped,outcome=admitted}"),
        1
    );
    assert_eq!(
        captured.counter("tollgate_checks_total{limiter=capped,outcome=denied}"),
        0
    );
    assert_eq!(captured.gauge("tollgate_keys{limiter=capped}"), 0.0);
}

/// Limiters of one name add up, each publication hands on only what was
/// counted since the last, and a limiter built again under a name goes on
/// from where the old one left it (a recorder's counters only add).
#[test]
fn limiters_of_one_name_add_up() {
    let captured = Captured::default();
    let build = || {
        Builder::new(Quota::per_hour(100).unwrap())
            .clock(ManualClock::new())
            .metrics("api")
            .build::<u64>()
    };
    let (first, second) = (build(), build());
    for _ in 0..5 {
        assert!(first.check(&1).unwrap().is_allowed());
    }
    for _ in 0..3 {
        assert!(second.check(&1).unwrap().is_allowed());
    }
    metrics::with_local_recorder(&captured, || {
        first.publish_metrics();
        second.publish_metrics();
        first.publish_metrics();
    });
    let admitted = "tollgate_checks_total{limiter=api,outcome=admitted}";
    assert_eq!(captured.counter(admitted), 8);
    assert_eq!(captured.gauge("tollgate_keys{limiter=api}"), 2.0);
    drop(first);
    let again = build();
    for _ in 0..2 {
        assert!(again.check(&2).unwrap().is_allowed());
    }
    metrics::with_local_recorder(&captured, || again.publish_metrics());
    assert_eq!(captured.counter(admitted), 10);
}

/// A limiter built without `Builder::metrics` publishes nothing.
#[test]
fn a_limiter_without_a_name_counts_nothing() {
    let limiter = Builder::new(Quota::per_second(1).unwrap()).build::<u64>();
    assert!(limiter.check(&1).unwrap().is_allowed());
    let captured = Captured::default();
    metrics::with_local_recorder(&captured, || limiter.publish_metrics());
    assert!(captured.0.lock().unwrap().is_empty());
}

/// A recorder that panics part-way through a publication loses it rather
/// than handing the next publication its counts again: `Captured`, whose first registration of `tollgate_evictions_total`
/// panics (a recorder whose registry is momentarily full, a bug, ...).
#[derive(Default)]
struct FailsOnce {
    captured: Captured,
    failed: AtomicBool,
}

impl Recorder for FailsOnce {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, meta: &Metadata<'_>) -> Counter {
        if key.name() == "tollgate_evictions_total" && !self.failed.swap(true, Ordering::SeqCst) {
            panic!("recorder failure");
        }
        self.captured.register_counter(key, meta)
    }
    fn register_gauge(&self, key: &Key, meta: &Metadata<'_>) -> Gauge {
        self.captured.register_gauge(key, meta)
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

#[test]
fn a_recorder_panic_does_not_double_count_the_next_publication() {
    let limiter = Builder::new(Quota::per_hour(100).unwrap())
        .clock(ManualClock::new())
        .metrics("flaky")
        .build::<u64>();
    assert!(limiter.check(&1).unwrap().is_allowed());
    let recorder = FailsOnce::default();
    metrics::with_local_recorder(&recorder, || {
        let first = catch_unwind(AssertUnwindSafe(|| limiter.publish_metrics()));
        assert!(first.is_err());
        limiter.publish_metrics();
    });
    // One check was admitted (the code before handed it over twice), and
    // one key is stored: the gauge, moved by differences, is not left off
    // by the publication the panic cut short.
    assert_eq!(
        recorder
            .captured
            .counter("tollgate_checks_total{limiter=flaky,outcome=admitted}"),
        1
    );
    assert_eq!(recorder.captured.gauge("tollgate_keys{limiter=flaky}"), 1.0);
}
