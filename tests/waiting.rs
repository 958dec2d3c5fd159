//! Waiting for an admission (`reserve_n`, `until_ready`): waiters served in
//! arrival order at exactly the quota's rate, cancellation that loses no
//! capacity and admits nothing extra, errors at once. On tokio's paused
//! clock, which the limiter reads too (`TokioClock`), so every instant is
//! exact and the same on any machine.
#![cfg(not(any(feature = "loom", feature = "shuttle")))]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tollgate::clock::TokioClock;
use tollgate::wait::WaitError;
use tollgate::{Builder, CheckError, Quota, RateLimiter};

type Limiter = RateLimiter<String, tollgate::algorithm::Gcra, TokioClock>;

/// 10 a second (one every 100 ms) in bursts of 5.
fn limiter() -> Arc<Limiter> {
    Arc::new(
        Builder::new(Quota::per_second(10).unwrap().with_burst(5).unwrap())
            .clock(TokioClock::new())
            .build(),
    )
}

const INTERVAL: Duration = Duration::from_millis(100);
const BURST: usize = 5;

/// The instant the `k`-th admission (from 0) of a key kept busy from
/// `start` comes: the burst at once, then one an interval.
fn slot(k: usize) -> Duration {
    INTERVAL * u32::try_from(k.saturating_sub(BURST - 1)).unwrap()
}

/// Takes the burst of key "k", waiting for nothing.
async fn drain(limiter: &Limiter) {
    for _ in 0..BURST {
        let decision = limiter.until_ready("k", Duration::ZERO).await.unwrap();
        assert!(decision.is_allowed());
    }
}

/// Each waiter's arrival index and admission time, in admission order.
type Served = Arc<Mutex<Vec<(usize, Duration)>>>;

#[tokio::test(start_paused = true)]
async fn a_thousand_waiters_are_served_in_order_at_exactly_the_rate() {
    let limiter = limiter();
    let start = Instant::now();
    let served: Served = Arc::default();
    let tasks: Vec<_> = (0..1_000)
        .map(|index| {
            let limiter = Arc::clone(&limiter);
            let served = Arc::clone(&served);
            tokio::spawn(async move {
                assert!(
                    limiter
                        .until_ready("hot", Duration::from_secs(1_000))
                        .await
                        .unwrap()
                        .is_allowed()
                );
                served.lock().unwrap().push((index, start.elapsed()));
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let served = served.lock().unwrap();
    assert_eq!(served.len(), 1_000);
    for (k, &(index, at)) in served.iter().enumerate() {
        assert_eq!(index, k, "served out of arrival order");
        assert_eq!(at, slot(k), "waiter {k} served off its slot");
    }
    // The key is as drained as 1 000 admissions leave it: nothing extra.
    assert!(!limiter.check("hot").unwrap().is_allowed());
}

/// A small deterministic generator (xorshift64*), so that the cancellations
/// are "random" yet the same on every run.
struct Random(u64);

impl Random {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound
    }
}

#[tokio::test(start_paused = true)]
async fn cancelled_waiters_lose_no_capacity_and_admit_nothing_extra() {
    let limiter = limiter();
    let start = Instant::now();
    let served: Served = Arc::default();
    let mut random = Random(0x9e37_79b9_7f4a_7c15);
    let mut cancelled_at = Vec::new();
    let tasks: Vec<_> = (0..1_000)
        .map(|index| {
            // About a third give up, at a random instant within the run,
            // halfway between two slots (never on one).
            let give_up = (random.below(3) == 0)
                .then(|| INTERVAL * u32::try_from(random.below(800)).unwrap() + INTERVAL / 2);
            cancelled_at.push(give_up);
            let limiter = Arc::clone(&limiter);
            let served = Arc::clone(&served);
            tokio::spawn(async move {
                let wait = limiter.until_ready("hot", Duration::from_secs(1_000));
                let admitted = match give_up {
                    Some(at) => tokio::select! {
                        admitted = wait => Some(admitted),
                        () = tokio::time::sleep_until(start + at) => None,
                    },
                    None => Some(wait.await),
                };
                if let Some(admitted) = admitted {
                    assert!(admitted.unwrap().is_allowed());
                    served.lock().unwrap().push((index, start.elapsed()));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let served = std::mem::take(&mut *served.lock().unwrap());
    let gave_up = cancelled_at.iter().flatten().count();
    assert!(gave_up > 250, "the test cancels about a third: {gave_up}");
    // Every admission on its slot, with no slot left empty: each abandoned
    // slot went to the next in line, and none was given twice.
    for (k, &(_, at)) in served.iter().enumerate() {
        assert_eq!(at, slot(k), "admission {k} off its slot");
    }
    // In arrival order.
    assert!(
        served.windows(2).all(|pair| pair[0].0 < pair[1].0),
        "out of order"
    );
    // Exactly the waiters that had not given up by their slot were served.
    let served_indices: Vec<usize> = served.iter().map(|&(index, _)| index).collect();
    for (k, &index) in served_indices.iter().enumerate() {
        if let Some(at) = cancelled_at[index] {
            assert!(at > slot(k), "waiter {index} was served after it gave up");
        }
    }
    assert!(
        served.len() < 1_000 && served.len() > 500,
        "{}",
        served.len()
    );
    // And the key is drained exactly as far as those admissions leave it:
    // at the last slot, nothing remains.
    let last = served.last().unwrap().1;
    tokio::time::sleep_until(start + last).await;
    assert!(!limiter.check("hot").unwrap().is_allowed());
    tokio::time::sleep(INTERVAL).await;
    assert!(limiter.check("hot").unwrap().is_allowed());
}

#[tokio::test(start_paused = true)]
async fn waits_beyond_the_maximum_and_costs_above_the_burst_fail_at_once() {
    let limiter = limiter();
    let start = Instant::now();
    drain(&limiter).await;
    assert_eq!(
        limiter.until_ready("k", Duration::from_millis(99)).await,
        Err(WaitError::TooLong {
            wait: INTERVAL,
            max_wait: Duration::from_millis(99)
        })
    );
    assert_eq!(
        limiter.until_n_ready("k", 6, Duration::from_secs(60)).await,
        Err(WaitError::Check(CheckError::InsufficientCapacity {
            cost: 6,
            capacity: 5
        }))
    );
    assert_eq!(
        limiter.until_n_ready("k", 0, Duration::from_secs(60)).await,
        Err(WaitError::Check(CheckError::ZeroCost))
    );
    assert_eq!(start.elapsed(), Duration::ZERO, "nothing waited");
    // Nothing was reserved: the next unit is one interval away.
    let decision = limiter.until_ready("k", INTERVAL).await.unwrap();
    assert_eq!(
        (decision.remaining(), decision.reset_after()),
        (0, INTERVAL * 5)
    );
    assert_eq!(start.elapsed(), INTERVAL);
}

#[tokio::test(start_paused = true)]
async fn plain_checks_do_not_jump_the_queue() {
    let limiter = limiter();
    for _ in 0..BURST {
        assert!(limiter.check("k").unwrap().is_allowed());
    }
    let mut first = limiter.reserve_n("k", 1, Duration::from_secs(1)).unwrap();
    assert_eq!(first.wait(), INTERVAL);
    // At the first waiter's slot, a check finds the unit taken.
    tokio::time::sleep(INTERVAL).await;
    assert!(!limiter.check("k").unwrap().is_allowed());
    assert!(first.is_ready());
    drop(first);
    // Dropped once due: kept, nothing given back.
    assert!(!limiter.check("k").unwrap().is_allowed());
}

#[tokio::test(start_paused = true)]
async fn a_reservation_given_back_moves_the_next_forward_and_wakes_it() {
    let limiter = limiter();
    let start = Instant::now();
    drain(&limiter).await;
    let ahead = limiter.reserve_n("k", 3, Duration::from_secs(1)).unwrap();
    assert_eq!(ahead.wait(), INTERVAL * 3);
    let behind = {
        let limiter = Arc::clone(&limiter);
        tokio::spawn(async move {
            assert!(
                limiter
                    .until_n_ready("k", 2, Duration::from_secs(1))
                    .await
                    .unwrap()
                    .is_allowed()
            );
            start.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    drop(ahead);
    // Behind waited for 5 intervals; with the 3 ahead given back, 2.
    assert_eq!(behind.await.unwrap(), INTERVAL * 2);
}

/// Runs `test` with a deadline of virtual time: a waiter never woken
/// fails the test instead of hanging it (tokio's paused clock jumps to the
/// deadline once every task waits).
async fn within<F: std::future::Future>(test: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(1_000_000), test)
        .await
        .expect("a waiter was never woken")
}

#[tokio::test(start_paused = true)]
async fn near_the_clocks_origin_a_shifted_slot_is_due_at_once() {
    within(async {
        // A rested key at the clock's origin: slots there are within the
        // tolerance of 0, and moving one earlier must not wrap.
        let limiter = limiter();
        let now = limiter.reserve_n("k", 1, Duration::from_secs(1)).unwrap();
        assert_eq!(now.wait(), Duration::ZERO);
        let big = limiter.reserve_n("k", 5, Duration::from_secs(1)).unwrap();
        let mut after = limiter.reserve_n("k", 1, Duration::from_secs(1)).unwrap();
        assert_eq!(big.wait(), INTERVAL);
        assert_eq!(after.wait(), INTERVAL * 2);
        drop(big);
        // Without the five, the third would have been admitted at once.
        assert_eq!(after.wait(), Duration::ZERO);
        assert!(after.is_ready());
        after.ready().await;
        // Two admitted at 0: three left of the burst, and no more.
        for _ in 0..3 {
            assert!(limiter.check("k").unwrap().is_allowed());
        }
        assert!(!limiter.check("k").unwrap().is_allowed());
        drop((now, after));
        assert_eq!(limiter.waiting_keys(), 0);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn queues_are_removed_with_their_last_reservation() {
    within(async {
        let limiter = limiter();
        for _ in 0..BURST {
            assert!(limiter.check("k").unwrap().is_allowed());
        }
        // Two waiters; the second gives up, then the first is served.
        let mut first = limiter.reserve_n("k", 1, Duration::from_secs(1)).unwrap();
        let second = limiter.reserve_n("k", 1, Duration::from_secs(1)).unwrap();
        assert_eq!(limiter.waiting_keys(), 1);
        drop(second);
        first.ready().await;
        drop(first);
        assert_eq!(limiter.waiting_keys(), 0);
        // A reservation refused, one admitted at once: no queue left either.
        assert!(
            limiter
                .reserve_n("other", 6, Duration::from_secs(1))
                .is_err()
        );
        let at_once = limiter.reserve_n("other", 1, Duration::ZERO).unwrap();
        drop(at_once);
        assert_eq!(limiter.waiting_keys(), 0);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_reservation_dropped_once_due_is_kept() {
    within(async {
        let limiter = limiter();
        for _ in 0..BURST {
            assert!(limiter.check("k").unwrap().is_allowed());
        }
        let due = limiter.reserve_n("k", 1, Duration::from_secs(1)).unwrap();
        // Its slot comes and goes without anyone looking.
        tokio::time::sleep(INTERVAL * 3 / 2).await;
        drop(due);
        // Kept: the next unit comes at 2 intervals, not at once.
        assert!(!limiter.check("k").unwrap().is_allowed());
        tokio::time::sleep(INTERVAL / 2).await;
        assert!(limiter.check("k").unwrap().is_allowed());
        assert_eq!(limiter.waiting_keys(), 0);
    })
    .await;
}

/// Once a reader has seen a reservation due, a clock reading older than
/// its slot (a clock stepped back, or a thread's stale reading) does not
/// make it pending again: dropping it gives nothing back.
#[test]
fn a_reservation_once_seen_due_is_never_given_back() {
    let clock = tollgate::clock::ManualClock::new();
    let limiter = Builder::new(Quota::per_second(10).unwrap().with_burst(1).unwrap())
        .clock(clock.clone())
        .build::<u64>();
    clock.set(Duration::from_secs(10));
    assert!(limiter.check(&1).unwrap().is_allowed());
    let reserved = limiter.reserve_n(&1, 1, Duration::from_secs(1)).unwrap();
    assert_eq!(reserved.wait(), INTERVAL);
    clock.advance(INTERVAL);
    assert_eq!(reserved.wait(), Duration::ZERO);
    clock.set(Duration::from_secs(10));
    assert_eq!(reserved.wait(), Duration::ZERO, "due for good");
    drop(reserved);
    // Kept: a reservation now waits behind it, two intervals.
    let next = limiter.reserve_n(&1, 1, Duration::from_secs(1)).unwrap();
    assert_eq!(next.wait(), INTERVAL * 2);
}

#[tokio::test(start_paused = true)]
async fn a_direct_limiter_serves_its_waiters_in_order_and_takes_cancellations_back() {
    within(async {
        let limiter = Arc::new(
            Builder::new(Quota::per_second(10).unwrap().with_burst(5).unwrap())
                .clock(TokioClock::new())
                .build_direct(),
        );
        let start = Instant::now();
        let served: Served = Arc::default();
        let tasks: Vec<_> = (0..50)
            .map(|index| {
                let limiter = Arc::clone(&limiter);
                let served = Arc::clone(&served);
                tokio::spawn(async move {
                    let wait = limiter.until_ready(Duration::from_secs(60));
                    // Waiter 20 gives up a quarter interval before its slot.
                    if index == 20 {
                        let give_up = start + slot(20) - INTERVAL / 4;
                        tokio::select! {
                            _ = wait => panic!("served after giving up"),
                            () = tokio::time::sleep_until(give_up) => return,
                        }
                    }
                    assert!(wait.await.unwrap().is_allowed());
                    served.lock().unwrap().push((index, start.elapsed()));
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let served = std::mem::take(&mut *served.lock().unwrap());
        assert_eq!(served.len(), 49);
        for (k, &(index, at)) in served.iter().enumerate() {
            assert_eq!(index, if k < 20 { k } else { k + 1 }, "out of order");
            assert_eq!(at, slot(k), "admission {k} off its slot");
        }
    })
    .await;
}

/// A clock that panics while armed.
#[derive(Debug, Clone, Default)]
struct Fragile {
    clock: tollgate::clock::ManualClock,
    armed: Arc<std::sync::atomic::AtomicBool>,
}

impl tollgate::clock::Clock for Fragile {
    fn now_ns(&self) -> u64 {
        assert!(
            !self.armed.load(std::sync::atomic::Ordering::Relaxed),
            "the clock is armed"
        );
        self.clock.now_ns()
    }
}

/// 10 a second in bursts of 1 on `fragile`'s clock, key "k" drained at 1 s:
/// the next reservation's slot is an interval away.
fn drained_on(fragile: &Fragile) -> RateLimiter<String, tollgate::algorithm::Gcra, Fragile> {
    fragile.clock.set(Duration::from_secs(1));
    let limiter = Builder::new(Quota::per_second(10).unwrap().with_burst(1).unwrap())
        .clock(fragile.clone())
        .build();
    assert!(limiter.check("k").unwrap().is_allowed());
    limiter
}

/// A waker whose `wake` panics: an executor's, and so user code.
fn panicking_waker() -> std::task::Waker {
    struct Panics;
    impl std::task::Wake for Panics {
        fn wake(self: Arc<Self>) {
            panic!("a waker that panics");
        }
    }
    std::task::Waker::from(Arc::new(Panics))
}

/// A reservation dropped before its slot moves the later ones forward and
/// wakes their waiters after the schedule is whole: a waker that panics
/// (an executor's, user code) leaves no slot held twice and no entry
/// behind. (Woken under the queue's lock, mid-shift, a panicking waker
/// would leave the later slots unshifted beside a refunded TAT: two
/// reservations on one slot.)
#[tokio::test(flavor = "current_thread")]
async fn a_waker_that_panics_leaves_the_schedule_whole() {
    use std::future::Future;
    use std::task::{Context, Poll};

    let fragile = Fragile::default();
    let limiter = drained_on(&fragile);
    let max_wait = Duration::from_secs(10);
    let first = limiter.reserve_n("k", 1, max_wait).unwrap();
    let mut second = limiter.reserve_n("k", 1, max_wait).unwrap();
    let mut third = limiter.reserve_n("k", 1, max_wait).unwrap();
    // Both later waiters wait with the panicking waker.
    let waker = panicking_waker();
    let mut context = Context::from_waker(&waker);
    for reservation in [&mut second, &mut third] {
        let mut ready = std::pin::pin!(reservation.ready());
        assert_eq!(ready.as_mut().poll(&mut context), Poll::Pending);
    }
    drop(first);
    assert_eq!(
        (second.wait(), third.wait()),
        (INTERVAL, INTERVAL * 2),
        "both moved forward by the dropped one's slot"
    );
    let next = limiter.reserve_n("k", 1, max_wait).unwrap();
    assert_eq!(
        next.wait(),
        INTERVAL * 3,
        "the slot after them, none held twice"
    );
    assert_eq!(limiter.waiting_reservations(), 3);
}

/// A reservation dropped while the clock panics leaves its queue all the
/// same, its units kept (nothing given back without a reading): no
/// reservation outlives its caller. (A drop that read the clock again to
/// cancel it would leave the entry queued for good.)
#[test]
fn a_reservation_dropped_while_the_clock_panics_leaves_its_queue() {
    let fragile = Fragile::default();
    let limiter = drained_on(&fragile);
    let pending = limiter.reserve_n("k", 1, Duration::from_secs(10)).unwrap();
    assert_eq!(limiter.waiting_reservations(), 1);
    fragile
        .armed
        .store(true, std::sync::atomic::Ordering::Relaxed);
    drop(pending);
    fragile
        .armed
        .store(false, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        (limiter.waiting_reservations(), limiter.waiting_keys()),
        (0, 0)
    );
    // Its units were kept: the next reservation comes after its slot.
    let next = limiter.reserve_n("k", 1, Duration::from_secs(10)).unwrap();
    assert_eq!(next.wait(), INTERVAL * 2);
}
