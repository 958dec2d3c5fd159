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

use tollgate::remote::{GiveBack, LeaseReply, Leases, Local, LocalView, RemoteQuota, lease};

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
        let (reply, stored) = lease(self.tats.get(key).copied(), now_ns / 1_000, quota, ask);
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
        let (reply, stored) = lease(*tat, now_ns / 1_000, &quota(), ask.request());
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
