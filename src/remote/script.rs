//! The remote side of a lease call, as a pure function: the Rust twin of
//! the Redis script's lease mode (`tollgate-redis`, `lua/limits.lua`),
//! which its differential test holds to it, and the simulated remote of
//! the model checks (`model-tests/leases.rs`).

use super::{LeaseReply, LeaseRequest, RemoteError, RemoteQuota};
use crate::algorithm::to_u32;

/// The latest instant the script takes: 2^52 µs (its callers clamp to it).
const END_OF_TIME_US: u64 = 1 << 52;

/// Decides a lease call on a key whose stored TAT is `stored_us` (`None`:
/// absent, a fresh key) at the remote's `now_us`; returns the reply and the
/// TAT to store (`None`: unchanged).
///
/// 1. **Give back**: if the request gives units back and the key still
///    holds exactly the TAT its lease wrote (no admission since, by anyone),
///    the TAT moves back by those units. Otherwise nothing is given back:
///    later admissions were decided counting them, and their slots cannot
///    be moved.
/// 2. **Decide** the request's own cost as GCRA does (against the TAT after
///    the give-back). A denial writes nothing else.
/// 3. **Grant**: admitted, it also takes up to `want` units, but at most
///    half of those still free beside the request, so that leases shrink
///    near the limit and a later caller always finds half of what was left.
///    The request's units take the first slots, the lease the last.
///
/// The quota is [`RemoteQuota::new`]'s: `tolerance = burst × interval` fits
/// 2^51, and `now_us` is at most 2^52, so no sum overflows, here or in
/// Lua's doubles.
///
/// # Errors
///
/// [`RemoteError::BadRequest`], as the script refuses them: a cost of 0
/// or above the burst, more units wanted or given back than the burst, or
/// an instant past 2^52 µs.
#[doc(hidden)]
pub fn lease(
    stored_us: Option<u64>,
    now_us: u64,
    quota: &RemoteQuota,
    request: &LeaseRequest,
) -> Result<(LeaseReply, Option<u64>), RemoteError> {
    let burst = quota.burst();
    if request.cost == 0
        || request.cost > burst
        || request.want > burst
        || request
            .give_back
            .is_some_and(|give_back| give_back.units > burst)
        || now_us > END_OF_TIME_US
    {
        return Err(RemoteError::BadRequest);
    }
    let interval_us = quota.interval_us();
    let tolerance_us = quota.tolerance_us();
    let mut tat_us = stored_us.unwrap_or(0);
    let mut returned = 0;
    if let Some(give_back) = request.give_back {
        if stored_us == Some(give_back.end_us) && give_back.units > 0 {
            tat_us = tat_us.saturating_sub(u64::from(give_back.units) * interval_us);
            returned = give_back.units;
        }
    }
    let debt_us = tat_us.saturating_sub(now_us);
    let max_debt_us = tolerance_us - u64::from(request.cost) * interval_us;
    if debt_us > max_debt_us {
        let reply = LeaseReply {
            allowed: false,
            remaining: to_u32((tolerance_us - debt_us.min(tolerance_us)) / interval_us),
            retry_us: debt_us - max_debt_us,
            reset_us: debt_us,
            granted: 0,
            end_us: tat_us,
            now_us,
            returned,
        };
        return Ok((reply, (returned > 0).then_some(tat_us)));
    }
    let free = (max_debt_us - debt_us) / interval_us;
    let granted = request.want.min(to_u32(free / 2));
    let end_us = tat_us.max(now_us) + u64::from(request.cost + granted) * interval_us;
    let reset_us = end_us - now_us;
    let reply = LeaseReply {
        allowed: true,
        remaining: to_u32((tolerance_us - reset_us) / interval_us),
        retry_us: 0,
        reset_us,
        granted,
        end_us,
        now_us,
        returned,
    };
    Ok((reply, Some(end_us)))
}

#[cfg(all(test, not(any(feature = "loom", feature = "shuttle"))))]
mod tests {
    use super::lease;
    use crate::remote::{GiveBack, LeaseRequest, RemoteQuota};

    #[test]
    fn a_fresh_key_grants_half_of_what_is_left() {
        // 10 µs, burst 100: the request's unit and 49 of the 99 left.
        let quota = RemoteQuota::new(10, 100).unwrap();
        let request = LeaseRequest {
            cost: 1,
            want: 100,
            give_back: None,
        };
        let (reply, stored) = lease(None, 1_000, &quota, &request).unwrap();
        assert!(reply.allowed);
        assert_eq!(reply.granted, 49);
        assert_eq!(reply.end_us, 1_500);
        assert_eq!(stored, Some(1_500));
        assert_eq!(reply.remaining, 50);
        // Next: 50 free, one for the request, 24 of the 49 left.
        let (reply, stored) = lease(stored, 1_000, &quota, &request).unwrap();
        assert_eq!((reply.granted, stored), (24, Some(1_750)));
    }

    #[test]
    fn units_come_back_only_to_the_tat_their_lease_wrote() {
        let quota = RemoteQuota::new(10, 100).unwrap();
        let give_back = Some(GiveBack {
            end_us: 1_500,
            units: 20,
        });
        let request = LeaseRequest {
            cost: 1,
            want: 0,
            give_back,
        };
        // The key holds 1 500: 20 units come back (TAT 1 300), then the
        // request's unit is charged.
        let (reply, stored) = lease(Some(1_500), 1_000, &quota, &request).unwrap();
        assert_eq!((reply.returned, stored), (20, Some(1_310)));
        // Someone was admitted since (the key holds 1 510): nothing.
        let (reply, stored) = lease(Some(1_510), 1_000, &quota, &request).unwrap();
        assert_eq!((reply.returned, stored), (0, Some(1_520)));
    }

    #[test]
    fn requests_the_script_refuses_are_errors() {
        use crate::remote::RemoteError;
        let quota = RemoteQuota::new(10, 2).unwrap();
        let request = |cost, want, units| LeaseRequest {
            cost,
            want,
            give_back: Some(GiveBack { end_us: 5, units }),
        };
        for bad in [
            request(0, 0, 0),
            request(3, 0, 0),
            request(1, 3, 0),
            request(1, 0, 3),
        ] {
            assert_eq!(
                lease(Some(5), 1, &quota, &bad),
                Err(RemoteError::BadRequest)
            );
        }
        assert_eq!(
            lease(None, (1 << 52) + 1, &quota, &request(1, 0, 0)),
            Err(RemoteError::BadRequest)
        );
        assert!(lease(None, 1 << 52, &quota, &request(2, 2, 2)).is_ok());
    }

    #[test]
    fn a_denial_reports_the_tat_and_writes_only_a_give_back() {
        let quota = RemoteQuota::new(10, 100).unwrap();
        let request = LeaseRequest {
            cost: 2,
            want: 8,
            give_back: None,
        };
        let (reply, stored) = lease(Some(2_000), 1_000, &quota, &request).unwrap();
        assert!(!reply.allowed);
        assert_eq!(
            (reply.retry_us, reply.reset_us, reply.end_us),
            (20, 1_000, 2_000)
        );
        assert_eq!(stored, None);
    }
}
