//! Checking a request against several limits in one script call, all or
//! nothing: [`check_all`] of [`Request`]s, answered by [`Decisions`].

use tollgate::algorithm::validate_cost;
use tollgate::{Decision, Quota};

use super::time::Now;
use super::wire::{Call, Op, Stamp, decision, malformed};
use super::{Core, RedisLimiter};
use crate::error::Error;
use crate::script::Scripted;

/// One limit of a request checked against several ([`check_all`]).
pub struct Request<'a> {
    limiter: &'a Core,
    key: Vec<u8>,
    cost: u32,
    /// The limiter's quota when the request was made.
    stamp: Stamp,
}

impl<A: Scripted> RedisLimiter<A> {
    /// Prepares a check of `cost` units for `key` against this limiter, to
    /// be decided together with others by [`check_all`].
    #[must_use]
    pub fn request(&self, key: impl AsRef<[u8]>, cost: u32) -> Request<'_> {
        Request {
            limiter: &self.core,
            key: self.core.namespace.key(key.as_ref()),
            cost,
            stamp: self.core.quota.load().stamp,
        }
    }

    /// [`request`](RedisLimiter::request) under `quota` rather than this
    /// limiter's own: the limit is decided as
    /// [`check_with`](RedisLimiter::check_with) decides it (a tier's quota,
    /// chosen per request).
    ///
    /// # Errors
    ///
    /// As [`check_with`](RedisLimiter::check_with) for its quota:
    /// [`Error::Quota`] for a quota the script cannot hold, and
    /// [`Error::Check`] with a layout error for a window algorithm and a
    /// quota of another window.
    pub fn request_with(
        &self,
        key: impl AsRef<[u8]>,
        cost: u32,
        quota: &Quota,
    ) -> Result<Request<'_>, Error> {
        Ok(Request {
            limiter: &self.core,
            key: self.core.namespace.key(key.as_ref()),
            cost,
            stamp: self.stamp_for(quota)?,
        })
    }
}

/// The decisions of several limits checked together: admitted only if
/// every limit admits, and then every limit is charged.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "decisions say whether the request may proceed"]
pub struct Decisions {
    decisions: Vec<Decision>,
}

impl Decisions {
    /// Returns whether every limit admitted the request (and was charged).
    #[must_use]
    pub fn is_allowed(&self) -> bool {
        self.decisions.iter().all(Decision::is_allowed)
    }

    /// Returns each limit's decision, in the order of the requests. When
    /// the request was denied, nothing was charged anywhere, and the
    /// decisions that read as allowed say what those limits would have
    /// admitted.
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
    }

    /// Returns the decision a client should be told: when denied, the
    /// denial with the longest wait; when allowed, the limit with the
    /// fewest remaining. `None` only for an empty set of requests.
    #[must_use]
    pub fn binding(&self) -> Option<&Decision> {
        if self.is_allowed() {
            self.decisions
                .iter()
                .min_by_key(|decision| decision.remaining())
        } else {
            self.decisions
                .iter()
                .max_by_key(|decision| decision.retry_after())
        }
    }
}

/// Decides a request against several limits (for example per user and per
/// IP address) in one script call, all or nothing: either every limit
/// admits and each is charged its cost, or nothing is charged.
///
/// The limiters must share one hash tag
/// ([`Builder::hash_tag`](crate::Builder::hash_tag)), so that Redis
/// Cluster keeps their keys in one slot, and one
/// [`Connection`](crate::Connection) (clones of one handle). Each limit is
/// decided at its own limiter's time (the server's, or its clock's).
///
/// # Errors
///
/// [`Error::Unavailable`] when Redis cannot decide, whatever the limiters'
/// failure policies (falling back limit by limit would not be all or
/// nothing: the caller chooses), [`Error::Apart`] when the limiters do not
/// share a hash tag and a connection, [`Error::SameKeyTwice`] when two
/// requests name one limiter's one key (charge it once with their summed
/// cost instead), [`Error::Check`] for an invalid cost (nothing is sent),
/// and as [`RedisLimiter::check`].
pub async fn check_all(requests: &[Request<'_>]) -> Result<Decisions, Error> {
    let Some(first) = requests.first() else {
        return Ok(Decisions {
            decisions: Vec::new(),
        });
    };
    let tag = first.limiter.namespace.tag();
    if tag.is_none()
        || requests.iter().any(|request| {
            request.limiter.namespace.tag() != tag
                || !request
                    .limiter
                    .connection
                    .same_as(&first.limiter.connection)
        })
    {
        return Err(Error::Apart);
    }
    for (index, request) in requests.iter().enumerate() {
        validate_cost(request.cost, request.stamp.limit.burst)?;
        // The script decides every limit against the state before the call
        // and then writes each: a key twice would be charged once for two
        // admissions.
        if requests[..index]
            .iter()
            .any(|earlier| earlier.key == request.key)
        {
            return Err(Error::SameKeyTwice);
        }
    }
    let times: Vec<Now> = requests
        .iter()
        .map(|request| request.limiter.time.now())
        .collect();
    let entries: Vec<_> = requests
        .iter()
        .zip(&times)
        .map(|(request, now)| {
            request
                .limiter
                .entry(request.key.clone(), request.cost, now, request.stamp)
        })
        .collect();
    let replies: Vec<i64> = Call::new(Op::Check, &entries)
        .send(&first.limiter.connection, &first.limiter.script)
        .await?;
    if replies.len() != 4 * requests.len() {
        return Err(malformed(&replies));
    }
    let decisions = requests
        .iter()
        .zip(&times)
        .zip(replies.chunks(4))
        .map(|((request, now), reply)| decision(reply, request.stamp.limit.burst, now))
        .collect::<Result<_, _>>()?;
    Ok(Decisions { decisions })
}

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}
