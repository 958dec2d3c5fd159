//! The Redis script's Rust twin (`tollgate::remote::lease`) decides a plain
//! check (no units wanted, none given back) exactly as the in-process GCRA
//! (`Gcra::decide`) does on the same inputs, microseconds scaled to
//! nanoseconds.
//!
//! Inputs: a quota of `burst` units every `interval_us` (any the remote
//! takes: `burst × interval_us <= 2^51`), a stored TAT (none, anything up
//! to `u64::MAX / 1000`, or near the reading), the remote's reading, and a
//! cost (0 and above the burst included). The in-process quota is one unit
//! every `interval_us × 1000` ns with the same burst; its state is the TAT
//! × 1000 ns. Checked:
//!
//! * both refuse the same costs (0: `ZeroCost`; above the burst:
//!   `InsufficientCapacity`; the twin's `BadRequest`);
//! * on the rest, the same verdict, units remaining, retry and reset times
//!   (the twin's µs × 1000 = the in-process ns), and the same new TAT (a
//!   denial writes nothing in either); the reply reports the TAT and the
//!   reading;
//! * wanting units beside the request never changes its own verdict, nor
//!   its retry time, and grants at most half of what is left.
//!
//! Intended differences, not compared: the twin refuses a reading past
//! 2^52 µs (the script's end of time, its callers clamp to it) where the
//! in-process GCRA reads anything past 2^63 ns as 2^63 ns; and a quota
//! whose interval is not whole microseconds is rounded up for the remote
//! (`RemoteQuota::from_quota`), a slower rate, so there the two decide
//! apart by design.

#![no_main]

use std::time::Duration;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use tollgate::algorithm::{Algorithm, Gcra, PackedAlgorithm, Verdict};
use tollgate::remote::{LeaseRequest, RemoteError, RemoteQuota, lease};
use tollgate::{CheckError, Quota};

fuzz_target!(|data: &[u8]| {
    let _ = check(&mut Unstructured::new(data));
});

const END_OF_TIME_US: u64 = 1 << 52;
const MAX_SPAN_US: u64 = 1 << 51;

fn check(u: &mut Unstructured<'_>) -> Result<()> {
    let burst = match u.int_in_range(0..=2)? {
        0 => u.int_in_range(1..=8)?,
        1 => u.int_in_range(1..=1_000)?,
        _ => u.int_in_range(1..=u32::MAX)?,
    };
    let max_interval_us = MAX_SPAN_US / u64::from(burst);
    if max_interval_us == 0 {
        return Ok(());
    }
    let interval_us = match u.int_in_range(0..=2)? {
        0 => u.int_in_range(1..=max_interval_us.min(1_000))?,
        1 => max_interval_us,
        _ => u.int_in_range(1..=max_interval_us)?,
    };
    let remote_quota = RemoteQuota::new(interval_us, burst).expect("a quota the remote takes");
    let quota = Quota::new(1, Duration::from_micros(interval_us))
        .and_then(|quota| quota.with_burst(burst))
        .expect("a remote quota fits the in-process one");
    assert_eq!(RemoteQuota::from_quota(&quota), Ok(remote_quota));
    let tolerance_us = remote_quota.tolerance_us();

    let now_us = match u.int_in_range(0..=3)? {
        0 => u.int_in_range(0..=END_OF_TIME_US)?,
        1 => END_OF_TIME_US - u.int_in_range(0..=3)?,
        2 => u.int_in_range(0..=tolerance_us.saturating_mul(4))?,
        _ => u.int_in_range(0..=END_OF_TIME_US + 2)?,
    };
    let stored_us = match u.int_in_range(0..=3)? {
        0 => None,
        1 => Some(u.int_in_range(0..=u64::MAX / 1_000)?),
        // Near the reading: owing up to a little more than the tolerance,
        // or rested up to a tolerance ago.
        _ => {
            let ahead = u.int_in_range(0..=tolerance_us + 2 * interval_us)?;
            let behind = u.int_in_range(0..=tolerance_us)?;
            Some(if u.ratio(1, 2)? {
                now_us + ahead
            } else {
                now_us.saturating_sub(behind)
            })
        }
    };
    let cost = match u.int_in_range(0..=3)? {
        0 => 1,
        1 => burst,
        2 => u.int_in_range(0..=burst.saturating_add(1))?,
        _ => u.arbitrary()?,
    };
    let plain = LeaseRequest::plain(cost);
    let remote = lease(stored_us, now_us, &remote_quota, &plain);
    if now_us > END_OF_TIME_US {
        assert_eq!(remote, Err(RemoteError::BadRequest));
        return Ok(());
    }

    let gcra = Gcra::from_quota(&quota);
    let state = gcra.unpack(stored_us.unwrap_or(0) * 1_000);
    let local = gcra.decide(&state, now_us * 1_000, cost);
    let (reply, stored_after) = match (&remote, &local) {
        (Err(RemoteError::BadRequest), Err(CheckError::ZeroCost)) => {
            assert_eq!(cost, 0);
            return Ok(());
        }
        (Err(RemoteError::BadRequest), Err(CheckError::InsufficientCapacity { .. })) => {
            assert!(cost > burst);
            return Ok(());
        }
        (Ok(decided), Ok(_)) => *decided,
        _ => panic!("twin {remote:?}, in-process {local:?}"),
    };
    let verdict = local.unwrap();
    let decision = verdict.decision();
    let context = || {
        format!(
            "stored {stored_us:?} now {now_us} {remote_quota:?} cost {cost}: {reply:?} {verdict:?}"
        )
    };
    assert_eq!(reply.allowed, decision.is_allowed(), "{}", context());
    assert_eq!(reply.remaining, decision.remaining(), "{}", context());
    assert_eq!(decision.limit(), burst);
    assert_eq!(
        Duration::from_micros(reply.retry_us),
        decision.retry_after(),
        "{}",
        context()
    );
    assert_eq!(
        Duration::from_micros(reply.reset_us),
        decision.reset_after(),
        "{}",
        context()
    );
    assert_eq!((reply.granted, reply.returned), (0, 0));
    assert_eq!(reply.now_us, now_us);
    match verdict {
        Verdict::Allow { admission, .. } => {
            assert_eq!(stored_after, Some(reply.end_us));
            assert_eq!(admission.tat_ns(), reply.end_us * 1_000, "{}", context());
        }
        Verdict::Deny(_) => {
            assert_eq!(stored_after, None);
            assert_eq!(reply.end_us, stored_us.unwrap_or(0));
        }
    }

    // A lease beside the request: the request's own verdict is the same.
    let want = match u.int_in_range(0..=1)? {
        0 => burst,
        _ => u.int_in_range(0..=burst)?,
    };
    let leased = LeaseRequest::new(plain.cost, want, plain.give_back);
    let (reply_leased, _) =
        lease(stored_us, now_us, &remote_quota, &leased).expect("as the plain call");
    assert_eq!(reply_leased.allowed, reply.allowed);
    assert_eq!(reply_leased.retry_us, reply.retry_us);
    assert!(reply_leased.granted <= want);
    if reply.allowed {
        assert!(
            reply_leased.granted <= reply.remaining / 2,
            "{reply_leased:?} after {reply:?}"
        );
    } else {
        assert_eq!(reply_leased.granted, 0);
    }
    Ok(())
}
