//! Receipts: an admission given back (the layer's rules give back what a
//! later rule refused), for every algorithm, on a real Redis. A refund
//! undoes the admission only if nothing was written on the key since, so
//! that no decision made counting it moves; exact counts throughout.

mod support {
    #[allow(dead_code)]
    pub mod redis;
    #[allow(dead_code)]
    pub mod target;
}

use tollgate::Quota;
use tollgate::algorithm::{
    Carry, FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use tollgate::clock::ManualClock;
use tollgate_redis::{RedisLimiter, Scripted};

use support::target::{Kind, Target};

fn admitted<A: Scripted>(target: &Target, limiter: &RedisLimiter<A>, key: &str) -> u32 {
    let mut admitted = 0;
    while target
        .runtime
        .block_on(limiter.check(key))
        .unwrap()
        .is_allowed()
    {
        admitted += 1;
        assert!(admitted <= 3, "never denied");
    }
    admitted
}

fn receipts_give_back_only_what_nothing_followed<A: Scripted>(kind: Kind) {
    let target = Target::start(kind);
    let clock = ManualClock::new();
    clock.set_ns(1_000_000 * 1_000_000_000);
    let limiter = target.limiter::<A>(Quota::per_minute(3).unwrap(), clock);
    let receipt_check = |key: &str| {
        let (enforced, receipt) = target
            .runtime
            .block_on(limiter.check_n_receipt(key, 1, None))
            .unwrap();
        (enforced.decision.is_allowed(), receipt)
    };
    let refund = |receipt: Option<tollgate_redis::RedisReceipt>| {
        target
            .runtime
            .block_on(receipt.expect("an admission's receipt").refund())
            .unwrap()
    };
    // A fresh key's admission given back: the key is fresh again.
    let (allowed, receipt) = receipt_check("fresh");
    assert!(allowed);
    assert!(refund(receipt));
    assert_eq!(admitted(&target, &limiter, "fresh"), 3);
    // Given back after two others: the last of three, undone.
    for _ in 0..2 {
        assert!(
            target
                .runtime
                .block_on(limiter.check("last"))
                .unwrap()
                .is_allowed()
        );
    }
    let (allowed, receipt) = receipt_check("last");
    assert!(allowed);
    assert!(refund(receipt));
    assert_eq!(admitted(&target, &limiter, "last"), 1);
    // Followed by another admission: kept (the other was decided counting
    // it).
    let (allowed, receipt) = receipt_check("followed");
    assert!(allowed);
    assert!(
        target
            .runtime
            .block_on(limiter.check("followed"))
            .unwrap()
            .is_allowed()
    );
    assert!(!refund(receipt));
    assert_eq!(admitted(&target, &limiter, "followed"), 1);
    // A denial has no receipt.
    let (allowed, receipt) = receipt_check("followed");
    assert!(!allowed && receipt.is_none());
    // Carried to another quota since: kept.
    let (allowed, receipt) = receipt_check("carried");
    assert!(allowed);
    limiter
        .set_quota(Quota::per_minute(6).unwrap(), Carry::Proportional)
        .unwrap();
    assert!(
        target
            .runtime
            .block_on(limiter.peek("carried"))
            .unwrap()
            .is_allowed()
    );
    assert!(
        target
            .runtime
            .block_on(limiter.check("carried"))
            .unwrap()
            .is_allowed()
    );
    assert!(!refund(receipt));
}

macro_rules! receipts {
    ($($name:ident: $algorithm:ty,)*) => {$(
        #[test]
        fn $name() {
            receipts_give_back_only_what_nothing_followed::<$algorithm>(Kind::Standalone);
        }
    )*};
}

receipts! {
    gcra_gives_back_what_nothing_followed: Gcra,
    token_bucket_gives_back_what_nothing_followed: TokenBucket,
    fixed_window_gives_back_what_nothing_followed: FixedWindow,
    sliding_window_counter_gives_back_what_nothing_followed: SlidingWindowCounter,
    sliding_window_log_gives_back_what_nothing_followed: SlidingWindowLog,
}

#[test]
fn receipts_on_a_cluster() {
    receipts_give_back_only_what_nothing_followed::<SlidingWindowLog>(Kind::Cluster);
    receipts_give_back_only_what_nothing_followed::<Gcra>(Kind::Cluster);
}

/// A log's receipt is kept once a carry has rewritten the runs, even
/// when the newest run is written again alike: at one instant, A's
/// admission writes "t 1 1", B's "t 2 2"; a proportional cut from 4 to 2
/// carries the two units to one, written "t 1 1" again. Giving A's back
/// then would erase B's carried unit.
#[test]
fn a_log_receipt_is_kept_once_a_carry_rewrote_the_runs() {
    let target = Target::start(Kind::Standalone);
    let clock = ManualClock::new();
    clock.set_ns(1_000_000 * 1_000_000_000);
    let limiter = target.limiter::<SlidingWindowLog>(Quota::per_minute(4).unwrap(), clock);
    let (enforced, receipt) = target
        .runtime
        .block_on(limiter.check_n_receipt("k", 1, None))
        .unwrap();
    assert!(enforced.decision.is_allowed());
    assert!(
        target
            .runtime
            .block_on(limiter.check("k"))
            .unwrap()
            .is_allowed()
    );
    limiter
        .set_quota(Quota::per_minute(2).unwrap(), Carry::Proportional)
        .unwrap();
    // Carried (two units of four are one of two) and denied.
    assert!(
        !target
            .runtime
            .block_on(limiter.check_n("k", 2))
            .unwrap()
            .is_allowed()
    );
    assert!(!target.runtime.block_on(receipt.unwrap().refund()).unwrap());
    let denied = target.runtime.block_on(limiter.check_n("k", 2)).unwrap();
    assert_eq!((denied.is_allowed(), denied.remaining()), (false, 1));
}
