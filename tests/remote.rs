//! `tollgate::remote`'s local view against the script's Rust twin
//! (`remote::lease`) as the remote: memory bounded at every instant, claims
//! that stand and go stale, give-backs, readings older than a lease,
//! several remote clocks, user code that panics.

#![cfg(not(any(feature = "loom", feature = "shuttle")))]

use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::num::NonZeroUsize;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use tollgate::clock::{Clock, ManualClock};
use tollgate::remote::{
    GiveBack, LeaseReply, LeaseRequest, Leases, Local, LocalView, RemoteClock, RemoteQuota, lease,
};
use tollgate::store::Key;

/// 100 a second (10 ms), bursts of 10.
fn quota() -> RemoteQuota {
    RemoteQuota::new(10_000, 10).unwrap()
}

const T0: u64 = 5_000_000_000;

/// A remote: the twin over a map of TATs, deciding at the instants it is
/// given.
#[derive(Default)]
struct Remote {
    tats: HashMap<String, u64>,
}

impl Remote {
    fn answer(&mut self, key: &str, now_ns: u64, request: &LeaseRequest) -> LeaseReply {
        self.answer_under(key, now_ns, &quota(), request)
    }

    /// The answer under `quota` (the one an ask carries).
    fn answer_under(
        &mut self,
        key: &str,
        now_ns: u64,
        quota: &RemoteQuota,
        request: &LeaseRequest,
    ) -> LeaseReply {
        let (reply, stored) =
            lease(self.tats.get(key).copied(), now_ns / 1_000, quota, request).unwrap();
        if let Some(stored) = stored {
            self.tats.insert(key.to_owned(), stored);
        }
        reply
    }
}

/// A view and the clock it reads: the remote decides on the view's own
/// readings (it answers at an ask's `sent_ns`), on `remote`.
struct Node<K: Key> {
    view: LocalView<K>,
    clock: ManualClock,
}

impl<K: Key> Node<K> {
    fn new(remote: RemoteClock, leases: Option<Leases>, max_keys: usize) -> Self {
        let clock = ManualClock::new();
        let view = LocalView::new(
            quota(),
            remote,
            clock.clone(),
            leases,
            NonZeroUsize::new(max_keys).unwrap(),
            Duration::from_secs(1),
        )
        .unwrap();
        Self { view, clock }
    }

    fn at(&self, now_ns: u64) -> &LocalView<K> {
        self.clock.set(Duration::from_nanos(now_ns));
        &self.view
    }
}

impl Node<String> {
    /// One check at `now_ns` through the view and, when it asks, through
    /// `remote`; whether it was admitted and whether it took a round trip.
    fn check(&self, remote: &mut Remote, key: &str, cost: u32, now_ns: u64) -> (bool, bool) {
        match self.at(now_ns).check(key, cost).unwrap() {
            Local::Decided(decision) => (decision.is_allowed(), false),
            Local::Ask(ask) => {
                let reply = remote.answer(key, ask.sent_ns(), ask.request());
                ask.complete(&reply);
                (reply.allowed, true)
            }
        }
    }
}

fn leased(max_keys: usize) -> Node<String> {
    Node::new(RemoteClock::One, Some(Leases::new()), max_keys)
}

#[test]
fn a_flood_of_keys_never_holds_more_than_the_cap() {
    let node = leased(8);
    let mut remote = Remote::default();
    // Teach the offset.
    node.check(&mut remote, "warm", 1, T0);
    for index in 0..2_000 {
        let key = format!("flood-{index}");
        // A key the view cannot hold is asked without a claim, and is
        // still admitted: the remote decides it.
        let (admitted, asked) = node.check(&mut remote, &key, 1, T0 + index);
        assert!(admitted && asked, "key {index}");
        assert!(
            node.view.len() <= 8,
            "{} keys held after key {index}",
            node.view.len()
        );
    }
    // Held keys are idle once their floors pass (a tolerance, 100 ms, on):
    // an explicit sweep frees them all.
    let held = node.view.len();
    assert_eq!((held, node.at(T0 + 200_000_000).evict_idle()), (8, 8));
    assert!(node.view.is_empty());
}

#[test]
fn a_claim_stands_until_stale_and_is_then_taken_over() {
    let node = leased(16);
    let mut remote = Remote::default();
    node.check(&mut remote, "warm", 1, T0);
    // A claim whose caller never completes nor drops its ask.
    let Local::Ask(claim) = node.at(T0).check("k", 1).unwrap() else {
        panic!("a new key is asked");
    };
    assert!(claim.is_claim());
    assert_eq!(claim.behind_claim(), None);
    std::mem::forget(claim);
    // Meanwhile others ask without the claim, behind it: plain checks, no
    // lease, and by what the view knows of the key (nothing yet), the
    // whole burst may be free.
    let Local::Ask(other) = node.at(T0 + 1).check("k", 1).unwrap() else {
        panic!("asked")
    };
    assert!(!other.is_claim());
    assert_eq!(other.request().want, 0);
    assert_eq!(other.behind_claim(), Some(10));
    drop(other);
    // Claims of 1 s: epochs of a second; the claim's epoch (5), the next
    // (6) and the one before stand; from epoch 7 it is stale. (The instant
    // the view judges is the reading plus the drift allowance, 1/512 of
    // the 2 s since the last round trip: 3.9 ms.)
    let Local::Ask(still) = node.at(6_990_000_000).check("k", 1).unwrap() else {
        panic!("asked")
    };
    assert!(!still.is_claim());
    drop(still);
    let Local::Ask(taken) = node.at(7_000_000_000).check("k", 1).unwrap() else {
        panic!("asked")
    };
    assert!(taken.is_claim(), "a stale claim is taken over");
}

/// A change of quota forgets every key: a claim in flight across it is
/// not installed, even when the key, claimed again after the change, holds
/// the very same word (a fresh key's claims at one epoch are alike), and
/// the new claim's reply is.
#[test]
fn a_reply_to_an_ask_made_before_a_change_is_not_installed() {
    let node = leased(16);
    let mut remote = Remote::default();
    node.check(&mut remote, "warm", 1, T0);
    let Local::Ask(before) = node.at(T0).check("k", 1).unwrap() else {
        panic!("a new key is asked");
    };
    assert!(before.is_claim());
    let slower = RemoteQuota::new(20_000, 5).unwrap();
    node.view.set_quota(slower, ()).unwrap();
    let Local::Ask(after) = node.at(T0).check("k", 1).unwrap() else {
        panic!("forgotten: asked again");
    };
    assert!(after.is_claim(), "the change dropped the old claim");
    assert_eq!((*before.quota(), *after.quota()), (quota(), slower));
    let old = remote.answer_under("k", before.sent_ns(), before.quota(), before.request());
    assert!(old.allowed && old.granted > 0);
    assert!(
        !before.complete(&old),
        "the old quota's lease is not installed"
    );
    let new = remote.answer_under("k", after.sent_ns(), after.quota(), after.request());
    assert!(after.complete(&new));
    // The key's units are the new lease's: spent under the new quota, up
    // to its grant, and no more.
    let mut spent = 0;
    while let Local::Decided(decision) = node.at(T0).check("k", 1).unwrap() {
        assert!(decision.is_allowed());
        spent += 1;
    }
    assert_eq!(spent, new.granted);
}

/// A check carrying another quota is denied here by what the remote
/// taught, by its own quota's tolerance, and never spends the view's
/// lease: with a lease held, it asks without a claim.
#[test]
fn a_check_of_another_quota_decides_by_it_and_leaves_the_lease() {
    let node = leased(16);
    let mut remote = Remote::default();
    node.check(&mut remote, "warm", 1, T0);
    // 100 a second (10 ms), bursts of 10: a first check leases.
    assert_eq!(node.check(&mut remote, "k", 1, T0), (true, true));
    let tat_us = remote.tats["k"];
    let units = (tat_us - T0 / 1_000) / 10_000 - 1;
    assert_eq!(units, 4, "half of the 9 free beside the check");
    // Another quota, 20 ms and bursts of 5 (a tolerance of 100 ms too):
    // asked without a claim, decided by the remote under it.
    let slower = RemoteQuota::new(20_000, 5).unwrap();
    let mut asked = 0;
    loop {
        let Local::Ask(ask) = node
            .at(T0)
            .check_under_then("k", 1, slower, |decision, ()| decision)
            .unwrap()
        else {
            break;
        };
        assert!(!ask.is_claim(), "the word holds the view's lease");
        assert_eq!(ask.behind_claim(), None, "and no claim stands");
        assert_eq!(*ask.quota(), slower);
        let reply = remote.answer_under("k", ask.sent_ns(), ask.quota(), ask.request());
        assert!(!ask.complete(&reply), "a plain check installs nothing");
        asked += 1;
        if !reply.allowed {
            break;
        }
    }
    // The lease's own units still serve the view's quota.
    let mut spent = 0_u64;
    while let Local::Decided(decision) = node.at(T0).check("k", 1).unwrap() {
        assert!(decision.is_allowed());
        spent += 1;
    }
    assert_eq!(spent, units);
    // Admitted on the remote under the slower quota: of the 100 ms, the
    // view's quota took 50 (a unit and its lease of 4), 2 × 20 fit.
    assert_eq!(asked, 3);
    // The view's quota has 10 ms left: its next check (the lease spent)
    // asks, and takes them; the floor then denies either quota here.
    assert_eq!(node.check(&mut remote, "k", 1, T0), (true, true));
    assert_eq!(node.check(&mut remote, "k", 1, T0), (false, false));
    let Local::Decided(denied) = node
        .at(T0)
        .check_under_then("k", 1, slower, |decision, ()| decision)
        .unwrap()
    else {
        panic!("denied here");
    };
    // 100 ms owed; 80 at most for a unit of 20 ms: 20 ms to wait, from
    // the view's bound of the remote's instant (a microsecond above its
    // reading, for the remote's whole microseconds).
    assert_eq!(
        (denied.is_allowed(), denied.limit(), denied.retry_after()),
        (false, 5, Duration::from_micros(19_999))
    );
}

#[test]
fn a_lease_too_small_for_a_request_is_given_back_first() {
    let node = leased(16);
    let mut remote = Remote::default();
    node.check(&mut remote, "warm", 1, T0);
    // The first claim leases 8 units beside its own... at most half of the
    // 9 left: 4. The key's TAT is then T0 + 5 intervals.
    assert_eq!(node.check(&mut remote, "k", 1, T0), (true, true));
    assert_eq!(remote.tats["k"], T0 / 1_000 + 50_000);
    // Four units are held; a request of 5 gives them back and asks again.
    let Local::Ask(ask) = node.at(T0).check("k", 5).unwrap() else {
        panic!("asked")
    };
    assert_eq!(
        ask.request().give_back,
        Some(GiveBack::new(T0 / 1_000 + 50_000, 4))
    );
    let reply = remote.answer("k", ask.sent_ns(), ask.request());
    assert_eq!(reply.returned, 4);
    assert!(reply.allowed);
    ask.complete(&reply);
    // 1 + 5 admitted, the 4 units back: the key owes 6 intervals and
    // whatever the second lease took.
    assert_eq!(
        remote.tats["k"],
        T0 / 1_000 + 60_000 + u64::from(reply.granted) * 10_000
    );
}

#[test]
fn a_dropped_ask_keeps_the_floor_and_drops_the_units() {
    let node = leased(16);
    let mut remote = Remote::default();
    node.check(&mut remote, "warm", 1, T0);
    // Drain the key through the view: every admission, local or remote.
    let admitted = (0..20)
        .filter(|_| node.check(&mut remote, "k", 1, T0).0)
        .count();
    assert_eq!(admitted, 10);
    // Drained: the floor denies here, with no round trip.
    assert_eq!(node.check(&mut remote, "k", 1, T0), (false, false));
    // A tenth of a tolerance later a unit fits: the view claims and asks;
    // the call fails and the ask is dropped. The floor it knew stays: the
    // next check claims again at once.
    let later = T0 + 10_000_000;
    let Local::Ask(ask) = node.at(later).check("k", 1).unwrap() else {
        panic!("asked")
    };
    assert!(ask.is_claim());
    drop(ask);
    let Local::Ask(again) = node.at(later).check("k", 1).unwrap() else {
        panic!("asked")
    };
    assert!(again.is_claim(), "a released claim is claimed again");
}

/// A key whose `Hash` panics when armed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Touchy(&'static str);

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

impl Hash for Touchy {
    fn hash<H: Hasher>(&self, state: &mut H) {
        assert!(!ARMED.with(Cell::get), "armed Hash");
        self.0.hash(state);
    }
}

#[test]
fn a_key_that_panics_when_its_claim_completes_leaves_a_claim_that_goes_stale() {
    let node = Node::<Touchy>::new(RemoteClock::One, Some(Leases::new()), 16);
    let mut remote = Remote::default();
    let mut ask_and_answer = |key: &'static str, now_ns| {
        let Local::Ask(ask) = node.at(now_ns).check(&Touchy(key), 1).unwrap() else {
            panic!("asked")
        };
        let reply = remote.answer(key, ask.sent_ns(), ask.request());
        (ask, reply)
    };
    let (warm, reply) = ask_and_answer("warm", T0);
    warm.complete(&reply);
    let (claim, reply) = ask_and_answer("k", T0);
    assert!(claim.is_claim());
    ARMED.with(|armed| armed.set(true));
    let panicked = catch_unwind(AssertUnwindSafe(|| claim.complete(&reply))).is_err();
    ARMED.with(|armed| armed.set(false));
    assert!(panicked, "the key's Hash panicked in complete");
    // The claim stands (the ask had taken it out to install the reply:
    // nothing releases it): others ask without it.
    let Local::Ask(other) = node.at(T0).check(&Touchy("k"), 1).unwrap() else {
        panic!("asked")
    };
    assert!(!other.is_claim());
    drop(other);
    // Stale two epochs on: claimed again.
    let Local::Ask(taken) = node.at(T0 + 2_000_000_000).check(&Touchy("k"), 1).unwrap() else {
        panic!("asked")
    };
    assert!(taken.is_claim());
}

/// Claims in flight survive the table's growth: a growth sweep judges
/// idleness a rest time in the past, and a claimed word is never idle.
#[test]
fn claims_in_flight_survive_the_tables_growth() {
    let node = leased(1_000_000);
    let mut remote = Remote::default();
    node.check(&mut remote, "warm", 1, T0);
    let held: Vec<_> = (0..20)
        .map(|index| {
            let key = format!("held-{index}");
            let Local::Ask(ask) = node.at(T0).check(key.as_str(), 1).unwrap() else {
                panic!("a new key is asked")
            };
            assert!(ask.is_claim());
            (key, ask)
        })
        .collect();
    // 20 000 other keys, a second apart on the clock: the table grows, and
    // sweeps the keys that have rested.
    for index in 0..20_000_u64 {
        let now_ns = T0 + index * 1_000_000_000;
        node.check(&mut remote, &format!("other-{index}"), 1, now_ns);
    }
    for (key, ask) in held {
        let reply = remote.answer(&key, ask.sent_ns(), ask.request());
        assert!(ask.complete(&reply), "{key}: its claim was evicted");
    }
}

/// A claim whose call was never sent puts the lease back as it was.
#[test]
fn a_claim_never_sent_keeps_its_lease() {
    let node = leased(16);
    let mut remote = Remote::default();
    node.check(&mut remote, "warm", 1, T0);
    // A lease of 4 units (half of the 9 left beside the request).
    assert_eq!(node.check(&mut remote, "k", 1, T0), (true, true));
    // A request of 5 claims, giving the 4 back; its call is never sent.
    let Local::Ask(ask) = node.at(T0).check("k", 5).unwrap() else {
        panic!("asked")
    };
    assert_eq!(
        ask.request().give_back.map(|give_back| give_back.units),
        Some(4)
    );
    assert!(ask.not_sent());
    // The 4 units serve again, locally.
    for unit in 0..4 {
        assert_eq!(
            node.check(&mut remote, "k", 1, T0),
            (true, false),
            "unit {unit}"
        );
    }
}

/// A clock that reads `stale` once when told to, and `now` otherwise: a
/// thread that read its clock, lost the processor, and read it again.
struct Stale {
    now: ManualClock,
    stale: u64,
    once: AtomicBool,
}

impl Clock for Stale {
    fn now_ns(&self) -> u64 {
        if self.once.swap(false, Ordering::Relaxed) {
            self.stale
        } else {
            self.now.now_ns()
        }
    }
}

/// A reading older than a lease (a thread that read its clock, and lost
/// the processor while a sibling leased) never spends it at that reading:
/// the view decides at its reading after loading the key's word, and
/// never before its latest round trip (which the lease came from). The
/// node leases at T0 + 200 ms (slots up to T0 + 250 ms); a check whose
/// clock reads T0 decides at T0 + 200 ms: the unit spent then owes what a
/// spend then owes (a reset of 50 ms), not what it would at T0 (250 ms,
/// more than the tolerance: a slot more than a tolerance after the
/// instant, which Redis alone never admits).
#[test]
fn a_reading_older_than_a_lease_never_spends_it() {
    let later = T0 + 200_000_000;
    let now = ManualClock::new();
    now.set(Duration::from_nanos(later));
    let clock = std::sync::Arc::new(Stale {
        now,
        stale: T0,
        once: AtomicBool::new(false),
    });
    let view: LocalView<String> = LocalView::new(
        quota(),
        RemoteClock::Local,
        std::sync::Arc::clone(&clock),
        Some(Leases::new()),
        NonZeroUsize::new(16).unwrap(),
        Duration::from_secs(1),
    )
    .unwrap();
    let mut remote = Remote::default();
    // A lease of 4 beside the check's unit: slots up to later + 50 ms.
    let Local::Ask(ask) = view.check("k", 1).unwrap() else {
        panic!("a new key is asked")
    };
    let reply = remote.answer("k", ask.sent_ns(), ask.request());
    assert_eq!(reply.granted, 4);
    ask.complete(&reply);
    // The stale thread's check: its clock reads T0 inside the view.
    clock.once.store(true, Ordering::Relaxed);
    let Local::Decided(spent) = view.check("k", 1).unwrap() else {
        panic!("spent from the lease")
    };
    assert!(spent.is_allowed());
    assert_eq!(
        spent.reset_after(),
        Duration::from_millis(50),
        "decided at the stale reading"
    );
}

thread_local! {
    /// What the next hash of a [`Preempted`] key runs first.
    static PREEMPTION: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::RefCell::new(None) };
}

/// A key whose next hash first runs what [`PREEMPTION`] holds: the check
/// hashing it loses the processor there, after the view read its floor and
/// before the table loads the key's word.
#[derive(Clone, PartialEq, Eq)]
struct Preempted(&'static str);

impl Hash for Preempted {
    fn hash<H: Hasher>(&self, state: &mut H) {
        if let Some(preemption) = PREEMPTION.with(|slot| slot.borrow_mut().take()) {
            preemption();
        }
        self.0.hash(state);
    }
}

/// The same as `a_reading_older_than_a_lease_never_spends_it`, with the
/// lease installed while the stale check is between the view's floor (its
/// latest round trip, read first) and the key's word: first the sibling's
/// reply alone, then its whole call. The sibling's call was sent with the
/// reading `later`, which the remote decided on, so the stale check decides
/// no earlier (the floor of readings sent): the unit is spent owing 50 ms,
/// the lease's end less `later`. (Deciding at the view's floor alone, T0,
/// would owe 250 ms; bounding the instant by the word's grant alone,
/// later − 50 ms, would owe the tolerance, 100 ms: still older than an
/// instant the remote had decided on.)
#[test]
fn a_lease_installed_after_the_floor_is_read_is_not_spent_at_an_older_reading() {
    for whole_call in [false, true] {
        let later = T0 + 200_000_000;
        let now = ManualClock::new();
        now.set(Duration::from_nanos(if whole_call { T0 } else { later }));
        let clock = std::sync::Arc::new(Stale {
            now: now.clone(),
            stale: T0,
            once: AtomicBool::new(false),
        });
        let view: &'static LocalView<Preempted> = Box::leak(Box::new(
            LocalView::new(
                quota(),
                RemoteClock::Local,
                std::sync::Arc::clone(&clock),
                Some(Leases::new()),
                NonZeroUsize::new(16).unwrap(),
                Duration::from_secs(1),
            )
            .unwrap(),
        ));
        // The sibling's lease call, at `later`: a lease of 4 beside its
        // unit, slots up to later + 50 ms.
        let sibling = {
            let clock = std::sync::Arc::clone(&clock);
            move |ask: tollgate::remote::Ask<'static, Preempted>| {
                let reply = Remote::default().answer("k", ask.sent_ns(), ask.request());
                assert_eq!(reply.granted, 4);
                assert!(ask.complete(&reply));
                // The stale check's clock reads T0 once, inside the view.
                clock.once.store(true, Ordering::Relaxed);
            }
        };
        if whole_call {
            PREEMPTION.with(|slot| {
                *slot.borrow_mut() = Some(Box::new(move || {
                    now.set(Duration::from_nanos(later));
                    let Local::Ask(ask) = view.check(&Preempted("k"), 1).unwrap() else {
                        panic!("a new key is asked")
                    };
                    sibling(ask);
                }));
            });
        } else {
            let Local::Ask(ask) = view.check(&Preempted("k"), 1).unwrap() else {
                panic!("a new key is asked")
            };
            PREEMPTION.with(|slot| *slot.borrow_mut() = Some(Box::new(move || sibling(ask))));
        }
        let Local::Decided(spent) = view.check(&Preempted("k"), 1).unwrap() else {
            panic!("spent from the lease (whole call: {whole_call})")
        };
        assert!(spent.is_allowed());
        assert_eq!(
            spent.reset_after(),
            Duration::from_millis(50),
            "decided before the sibling's reading (whole call: {whole_call})"
        );
    }
}

/// Two remotes sharing a view's keys with clocks 5 ms apart (a Cluster's
/// masters): judged by the newest round trip's bound alone, which was
/// master A's, master B's lease units are spent past their deadlines on
/// B's clock, and with what others are admitted on B then, a window holds
/// more than GCRA's bound; with the masters' skew declared
/// (`RemoteClock::Several`), every bound covers both clocks.
#[test]
fn a_cluster_s_masters_keep_their_deadlines_on_their_own_clocks() {
    const SKEW_NS: u64 = 5_000_000;
    // 1 ms an interval, bursts of 10.
    let quota = RemoteQuota::new(1_000, 10).unwrap();
    // The most by which a window of B's clock exceeds `burst + ⌊W / I⌋`.
    let excess = |remote_clock: RemoteClock| {
        let clock = ManualClock::new();
        let view: LocalView<String> = LocalView::new(
            quota,
            remote_clock,
            clock.clone(),
            Some(Leases::new()),
            NonZeroUsize::new(16).unwrap(),
            Duration::from_secs(1),
        )
        .unwrap();
        let mut tats: HashMap<&str, u64> = HashMap::new();
        // Admissions on `kb`, by B's clock (µs).
        let mut admitted: Vec<u64> = Vec::new();
        // Key `kb` lives on master B, `ka` on A; B's clock reads 5 ms more.
        let remote_us = |key: &str, now_ns: u64| {
            (if key == "kb" {
                now_ns + SKEW_NS
            } else {
                now_ns
            }) / 1_000
        };
        let mut ask_redis = |key: &'static str, now_ns: u64, request: &LeaseRequest| {
            let (reply, stored) = lease(
                tats.get(key).copied(),
                remote_us(key, now_ns),
                &quota,
                request,
            )
            .unwrap();
            if let Some(stored) = stored {
                tats.insert(key, stored);
            }
            reply
        };
        let mut check = |key: &'static str, now_ns: u64, admitted: &mut Vec<u64>| {
            clock.set(Duration::from_nanos(now_ns));
            let allowed = match view.check(key, 1).unwrap() {
                Local::Decided(decision) => decision.is_allowed(),
                Local::Ask(ask) => {
                    let reply = ask_redis(key, ask.sent_ns(), ask.request());
                    ask.complete(&reply);
                    reply.allowed
                }
            };
            if allowed && key == "kb" {
                admitted.push(remote_us(key, now_ns));
            }
        };
        // B: a plain check (the first round trip), then a lease of 4 units
        // (half of the 8 left): slots B + 3 … 6 ms, spendable until B + 2
        // … 5 ms. Then a round trip to A.
        check("kb", T0, &mut admitted);
        check("kb", T0, &mut admitted);
        check("ka", T0, &mut admitted);
        // At B + 4.5 ms this instance checks four times; then another
        // instance takes what Redis still admits.
        let later = T0 + 4_500_000;
        for _ in 0..4 {
            check("kb", later, &mut admitted);
        }
        let plain = LeaseRequest::plain(1);
        let other = remote_us("kb", later);
        while ask_redis("kb", later, &plain).allowed {
            admitted.push(other);
        }
        admitted.sort_unstable();
        let mut most = 0_i64;
        for (first, &from_us) in admitted.iter().enumerate() {
            for (last, &to_us) in admitted.iter().enumerate().skip(first) {
                let units = i64::try_from(last - first + 1).unwrap();
                let bound = i64::try_from(10 + (to_us - from_us) / 1_000).unwrap();
                most = most.max(units - bound);
            }
        }
        most
    };
    assert_eq!(
        excess(RemoteClock::Several {
            skew: Duration::from_nanos(SKEW_NS)
        }),
        0
    );
    // The newest bound alone (A's) spends units past their deadlines on
    // B's clock: a window two units over its bound.
    assert_eq!(excess(RemoteClock::One), 2);
}

/// A denial counts the units this node would give back once, among what
/// the remote would have free (counted twice, the denial would report
/// more free than the remote has).
#[test]
fn a_denial_counts_its_own_units_once() {
    let node = Node::<String>::new(RemoteClock::Local, Some(Leases::new()), 16);
    let mut remote = Remote::default();
    // A lease of 4 units beside the first check's unit: the key owes 5
    // intervals, 4 of them this node's.
    assert_eq!(node.check(&mut remote, "k", 1, T0), (true, true));
    // 10 units cannot fit: without this node's 4 the key owes one
    // interval, so 9 are free, the 4 included.
    let Local::Decided(denied) = node.at(T0).check("k", 10).unwrap() else {
        panic!("denied here")
    };
    assert!(!denied.is_allowed());
    assert_eq!(denied.remaining(), 9);
}

/// The clock steps back: the remote's own (an NTP step, a failover to a
/// master whose clock is behind), or the client clock the remote decides
/// on (a step, or a reading older than one already sent). Either way no
/// local decision is taken at an instant older than one the remote may
/// already have decided on, so a lease unit whose deadline had passed is
/// never spent again.
///
/// The scene, 100 a second with bursts of 10 (10 ms, 100 ms of
/// tolerance): at `T0` this node leases 4 units (slots `T0` + 30 … 60 ms,
/// spendable until + 20 … 50 ms) and spends none; at + 70 ms, the key
/// rested, another node takes the whole burst (10) and this node sends a
/// call on another key, whose reply is still on its way when the clock
/// steps back 199 ms; then this node makes a round trip on a third key and
/// checks the key 10 times at + 80 ms. The remote alone admits
/// nothing there (the key owes 179 ms on the stepped-back clock): 10 in
/// those 10 ms. A node that spent its 4 expired units would admit 14.
fn after_a_step_back(remote_clock: RemoteClock) -> (u32, u32) {
    const MS: u64 = 1_000_000;
    const STEP_NS: u64 = 199 * MS;
    let node = Node::<String>::new(remote_clock, Some(Leases::new()), 16);
    let mut remote = Remote::default();
    // The instant the remote decides a call on: its own clock (real time,
    // less the step once stepped), or the reading the call was sent with.
    let stepped = Cell::new(false);
    let deciding_ns = |sent_ns: u64, real_ns: u64| match remote_clock {
        RemoteClock::Local => sent_ns,
        _ if stepped.get() => real_ns - STEP_NS,
        _ => real_ns,
    };
    // The node's reading at real `real_ns`: its own clock, stepped too
    // when it is the one the remote decides on.
    let reading_ns = |real_ns: u64| match remote_clock {
        RemoteClock::Local if stepped.get() => real_ns - STEP_NS,
        _ => real_ns,
    };
    let check = |remote: &mut Remote, key: &str, real_ns: u64| match node
        .at(reading_ns(real_ns))
        .check(key, 1)
        .unwrap()
    {
        Local::Decided(decision) => decision.is_allowed(),
        Local::Ask(ask) => {
            let reply = remote.answer(key, deciding_ns(ask.sent_ns(), real_ns), ask.request());
            ask.complete(&reply);
            reply.allowed
        }
    };
    // A first round trip (a plain check), then a claim that leases 4.
    assert!(check(&mut remote, "k", T0));
    assert!(check(&mut remote, "k", T0));
    let at_70 = T0 + 70 * MS;
    let plain = LeaseRequest::plain(1);
    let mut window = 0;
    while remote.answer("k", at_70, &plain).allowed {
        window += 1;
    }
    assert_eq!(window, 10, "the other node takes the rested key's burst");
    // This node's call on another key, decided by the remote at + 70 ms,
    // its reply not yet in when the clock steps back.
    let Local::Ask(in_flight) = node.at(reading_ns(at_70)).check("other", 1).unwrap() else {
        panic!("a key this node knows nothing of is asked")
    };
    let answered = remote.answer(
        "other",
        deciding_ns(in_flight.sent_ns(), at_70),
        in_flight.request(),
    );
    stepped.set(true);
    let at_80 = T0 + 80 * MS;
    // A round trip after the step (a key this node knows nothing of)
    // teaches the stepped clock.
    assert!(check(&mut remote, "fresh", at_80));
    let here = (0..10).filter(|_| check(&mut remote, "k", at_80)).count();
    let here = u32::try_from(here).unwrap();
    in_flight.complete(&answered);
    (here, window + here)
}

#[test]
fn a_remote_clock_stepped_back_spends_no_expired_unit() {
    assert_eq!(after_a_step_back(RemoteClock::One), (0, 10));
    assert_eq!(
        after_a_step_back(RemoteClock::Several {
            skew: Duration::from_millis(1)
        }),
        (0, 10)
    );
}

#[test]
fn a_client_clock_stepped_back_spends_no_expired_unit() {
    assert_eq!(after_a_step_back(RemoteClock::Local), (0, 10));
}

/// A node that shares a key short of units with others holds off asking
/// for it: a call that grants it a lease and finds the key's TAT moved by
/// others since its last one decides a hold, which the node's claim finds
/// once the lease is spent. The node then denies the key itself (the
/// remote would admit: holds are not exact) until the hold ends, and asks
/// again after.
#[test]
fn a_hold_decided_with_a_lease_denies_once_the_lease_is_spent() {
    const MS: u64 = 1_000_000;
    for holds in [true, false] {
        let node = Node::new(RemoteClock::One, Some(Leases::new().with_holds(holds)), 16);
        let mut remote = Remote::default();
        // The clocks' offset, then a lease of 4 units, spent.
        node.check(&mut remote, "warm", 1, T0);
        assert_eq!(node.check(&mut remote, "k", 1, T0), (true, true));
        for _ in 0..4 {
            assert_eq!(node.check(&mut remote, "k", 1, T0), (true, false));
        }
        // Other nodes take what the key has left.
        let plain = LeaseRequest::plain(1);
        let taken = (0..10)
            .filter(|_| remote.answer("k", T0, &plain).allowed)
            .count();
        assert_eq!(taken, 5);
        // 40 ms on, 3 units are free: the call is admitted with a lease of
        // 1 (of 9 asked), and leaves the key 2 free. Since the node's floor
        // (T0 + 50 ms), 7 were admitted, 2 of them its own: 3 sharers, who
        // would take 27 units (270 ms to refill), more than the key's debt
        // after the call (80 ms): the hold is 40 to 80 ms.
        let now = T0 + 40 * MS;
        assert_eq!(node.check(&mut remote, "k", 1, now), (true, true));
        assert_eq!(node.check(&mut remote, "k", 1, now), (true, false));
        // The lease spent, the remote would admit (its debt is 80 ms of
        // 90): with holds the node denies here until the hold's end.
        let probe = LeaseRequest::plain(1);
        let (reply, _) =
            lease(remote.tats.get("k").copied(), now / 1_000, &quota(), &probe).unwrap();
        assert!(reply.allowed);
        let held = node.check(&mut remote, "k", 1, now);
        if holds {
            assert_eq!(held, (false, false));
            assert_eq!(
                node.check(&mut remote, "k", 1, now + 39 * MS),
                (false, false)
            );
            // Past the longest hold: asked.
            assert!(node.check(&mut remote, "k", 1, now + 80 * MS).1);
        } else {
            assert_eq!(held, (true, true));
        }
    }
}
