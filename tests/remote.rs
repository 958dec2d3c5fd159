//! `tollgate::remote`'s local view against the script's Rust twin
//! (`remote::lease`) as the remote: memory bounded at every instant, claims
//! that stand and go stale, give-backs, user code that panics.

#![cfg(not(any(feature = "loom", feature = "shuttle")))]

use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::num::NonZeroUsize;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use tollgate::remote::{
    GiveBack, LeaseReply, LeaseRequest, Leases, Local, LocalView, RemoteClock, RemoteQuota, lease,
};

/// A remote: the twin over a map of TATs, at the view's own instants.
#[derive(Default)]
struct Remote {
    tats: HashMap<String, u64>,
}

impl Remote {
    fn answer(
        &mut self,
        key: &str,
        now_ns: u64,
        quota: &RemoteQuota,
        ask: &tollgate::remote::LeaseRequest,
    ) -> LeaseReply {
        let (reply, stored) =
            lease(self.tats.get(key).copied(), now_ns / 1_000, quota, ask).unwrap();
        if let Some(stored) = stored {
            self.tats.insert(key.to_owned(), stored);
        }
        reply
    }
}

/// 100 a second (10 ms), bursts of 10.
fn quota() -> RemoteQuota {
    RemoteQuota::new(10_000, 10).unwrap()
}

fn view<K: tollgate::store::Key>(leases: Option<Leases>, max_keys: usize) -> LocalView<K> {
    LocalView::new(
        quota(),
        RemoteClock::One,
        leases,
        NonZeroUsize::new(max_keys).unwrap(),
        Duration::from_secs(1),
    )
    .unwrap()
}

const T0: u64 = 5_000_000_000;

/// Runs one check through the view and, when it asks, through the remote;
/// returns whether it was admitted and whether it took a round trip.
fn check(
    view: &LocalView<String>,
    remote: &mut Remote,
    key: &str,
    cost: u32,
    now_ns: u64,
) -> (bool, bool) {
    match view.check(key, cost, now_ns).unwrap() {
        Local::Decided(decision) => (decision.is_allowed(), false),
        Local::Ask(ask) => {
            let reply = remote.answer(key, now_ns, &quota(), ask.request());
            ask.complete(&reply);
            (reply.allowed, true)
        }
    }
}

#[test]
fn a_flood_of_keys_never_holds_more_than_the_cap() {
    let view = view::<String>(Some(Leases::new()), 8);
    let mut remote = Remote::default();
    // Teach the offset.
    check(&view, &mut remote, "warm", 1, T0);
    for index in 0..2_000 {
        let key = format!("flood-{index}");
        // A key the view cannot hold is asked without a claim, and is
        // still admitted: the remote decides it.
        let (admitted, asked) = check(&view, &mut remote, &key, 1, T0 + index);
        assert!(admitted && asked, "key {index}");
        assert!(
            view.len() <= 8,
            "{} keys held after key {index}",
            view.len()
        );
    }
    // Held keys are idle once their floors pass (a tolerance, 100 ms, on):
    // the next new keys find room again, and an explicit sweep frees all.
    let later = T0 + 200_000_000;
    let held = view.len();
    assert_eq!((held, view.evict_idle(later)), (8, 8));
    assert!(view.is_empty());
}

#[test]
fn a_claim_stands_until_stale_and_is_then_taken_over() {
    let view = view::<String>(Some(Leases::new()), 16);
    let mut remote = Remote::default();
    check(&view, &mut remote, "warm", 1, T0);
    // A claim whose caller never completes nor drops its ask.
    let Local::Ask(claim) = view.check("k", 1, T0).unwrap() else {
        panic!("a new key is asked");
    };
    assert!(claim.is_claim());
    std::mem::forget(claim);
    // Meanwhile others ask without the claim: plain checks, no lease.
    let Local::Ask(other) = view.check("k", 1, T0 + 1).unwrap() else {
        panic!("asked")
    };
    assert!(!other.is_claim());
    assert_eq!(other.request().want, 0);
    drop(other);
    // Claims of 1 s: epochs of a second; the claim's epoch (5), the next
    // (6) and the one before stand; from epoch 7 it is stale. (The instant
    // the view judges is the reading plus the drift allowance, 1/512 of
    // the 2 s since the last round trip: 3.9 ms.)
    let Local::Ask(still) = view.check("k", 1, 6_990_000_000).unwrap() else {
        panic!("asked")
    };
    assert!(!still.is_claim());
    drop(still);
    let Local::Ask(taken) = view.check("k", 1, 7_000_000_000).unwrap() else {
        panic!("asked")
    };
    assert!(taken.is_claim(), "a stale claim is taken over");
}

#[test]
fn a_lease_too_small_for_a_request_is_given_back_first() {
    let view = view::<String>(Some(Leases::new()), 16);
    let mut remote = Remote::default();
    check(&view, &mut remote, "warm", 1, T0);
    // The first claim leases 8 units beside its own... at most half of the
    // 9 left: 4. The key's TAT is then T0 + 5 intervals.
    assert_eq!(check(&view, &mut remote, "k", 1, T0), (true, true));
    assert_eq!(remote.tats["k"], T0 / 1_000 + 50_000);
    // Four units are held; a request of 5 gives them back and asks again.
    let Local::Ask(ask) = view.check("k", 5, T0).unwrap() else {
        panic!("asked")
    };
    assert_eq!(
        ask.request().give_back,
        Some(GiveBack {
            end_us: T0 / 1_000 + 50_000,
            units: 4
        })
    );
    let reply = remote.answer("k", T0, &quota(), ask.request());
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
    let view = view::<String>(Some(Leases::new()), 16);
    let mut remote = Remote::default();
    check(&view, &mut remote, "warm", 1, T0);
    // Drain the key through the view: every admission, local or remote.
    let mut admitted = 0;
    for _ in 0..20 {
        admitted += u32::from(check(&view, &mut remote, "k", 1, T0).0);
    }
    assert_eq!(admitted, 10);
    // Drained: the floor denies here, with no round trip.
    assert_eq!(check(&view, &mut remote, "k", 1, T0), (false, false));
    // Half a tolerance later a unit fits: the view claims and asks; the
    // call fails and the ask is dropped. The floor it knew stays: the
    // next check claims again at once.
    let later = T0 + 10_000_000;
    let Local::Ask(ask) = view.check("k", 1, later).unwrap() else {
        panic!("asked")
    };
    assert!(ask.is_claim());
    drop(ask);
    let Local::Ask(again) = view.check("k", 1, later).unwrap() else {
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
    let view = view::<Touchy>(Some(Leases::new()), 16);
    let mut tat = None;
    let answer = |ask: &tollgate::remote::Ask<'_, Touchy>, tat: &mut Option<u64>, now_ns: u64| {
        let (reply, stored) = lease(*tat, now_ns / 1_000, &quota(), ask.request()).unwrap();
        *tat = stored.or(*tat);
        reply
    };
    let Local::Ask(warm) = view.check(&Touchy("warm"), 1, T0).unwrap() else {
        panic!("asked")
    };
    let mut warm_tat = None;
    let reply = answer(&warm, &mut warm_tat, T0);
    warm.complete(&reply);
    let Local::Ask(claim) = view.check(&Touchy("k"), 1, T0).unwrap() else {
        panic!("asked")
    };
    assert!(claim.is_claim());
    let reply = answer(&claim, &mut tat, T0);
    ARMED.with(|armed| armed.set(true));
    let panicked = catch_unwind(AssertUnwindSafe(|| claim.complete(&reply))).is_err();
    ARMED.with(|armed| armed.set(false));
    assert!(panicked, "the key's Hash panicked in complete");
    // The claim stands (the ask had taken it out to install the reply:
    // nothing releases it): others ask without it.
    let Local::Ask(other) = view.check(&Touchy("k"), 1, T0).unwrap() else {
        panic!("asked")
    };
    assert!(!other.is_claim());
    drop(other);
    // Stale two epochs on: claimed again.
    let Local::Ask(taken) = view.check(&Touchy("k"), 1, T0 + 2_000_000_000).unwrap() else {
        panic!("asked")
    };
    assert!(taken.is_claim());
}

/// Claims in flight survive the table's growth: a growth sweep judges
/// idleness a rest time in the past, and a claimed word is never idle.
#[test]
fn claims_in_flight_survive_the_tables_growth() {
    let view = view::<String>(Some(Leases::new()), 1_000_000);
    let mut remote = Remote::default();
    check(&view, &mut remote, "warm", 1, T0);
    let held: Vec<_> = (0..20)
        .map(|index| {
            let key = format!("held-{index}");
            let Local::Ask(ask) = view.check(key.as_str(), 1, T0).unwrap() else {
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
        check(&view, &mut remote, &format!("other-{index}"), 1, now_ns);
    }
    let later = T0 + 20_000 * 1_000_000_000;
    for (key, ask) in held {
        let reply = remote.answer(&key, later, &quota(), ask.request());
        assert!(ask.complete(&reply), "{key}: its claim was evicted");
    }
}

/// A claim whose call was never sent puts the lease back as it was.
#[test]
fn a_claim_never_sent_keeps_its_lease() {
    let view = view::<String>(Some(Leases::new()), 16);
    let mut remote = Remote::default();
    check(&view, &mut remote, "warm", 1, T0);
    // A lease of 4 units (half of the 9 left beside the request).
    assert_eq!(check(&view, &mut remote, "k", 1, T0), (true, true));
    // A request of 5 claims, giving the 4 back; its call is never sent.
    let Local::Ask(ask) = view.check("k", 5, T0).unwrap() else {
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
            check(&view, &mut remote, "k", 1, T0),
            (true, false),
            "unit {unit}"
        );
    }
}

/// Two remotes sharing a view's keys with clocks 5 ms apart (a Cluster's
/// masters): judged by the newest round trip's bound, which was master A's,
/// master B's lease units are spent past their deadlines on B's clock, and
/// with what others are admitted on B then, a window holds more than
/// GCRA's bound; the largest bound of the window (`RemoteClock::Several`)
/// keeps them to B's clock.
#[test]
fn a_cluster_s_masters_keep_their_deadlines_on_their_own_clocks() {
    const SKEW_NS: u64 = 5_000_000;
    // 1 ms an interval, bursts of 10.
    let quota = RemoteQuota::new(1_000, 10).unwrap();
    // The most by which a window of B's clock exceeds `burst + ⌊W / I⌋`.
    let excess = |clock: RemoteClock| {
        let view: LocalView<String> = LocalView::new(
            quota,
            clock,
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
            let allowed = match view.check(key, 1, now_ns).unwrap() {
                Local::Decided(decision) => decision.is_allowed(),
                Local::Ask(ask) => {
                    let reply = ask_redis(key, now_ns, ask.request());
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
        let plain = LeaseRequest {
            cost: 1,
            want: 0,
            give_back: None,
        };
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
    assert_eq!(excess(RemoteClock::Several), 0);
    // The newest bound alone (A's) spends units past their deadlines on
    // B's clock: a window two units over its bound.
    assert_eq!(excess(RemoteClock::One), 2);
}
