//! [`Tiers`]: a rule's quota chosen per request (free and paying users,
//! one limiter).

use std::fmt;

use http::{HeaderName, HeaderValue};
use tollgate::{LayoutError, Quota};

use crate::head::RequestHead;

/// A function of the request naming its tier.
type SelectFn = Box<dyn Fn(&RequestHead<'_>) -> Option<&'static str> + Send + Sync>;

/// How a request names its tier.
enum Select {
    /// The value of a header.
    Header(HeaderName),
    /// A function of the request: an extension an authentication layer
    /// set, a route.
    By(SelectFn),
}

/// The quotas of a rule's tiers, and how a request names its tier
/// ([`Rule::tiers`](crate::Rule::tiers)): each request's key is checked
/// under its tier's quota, and a request that names no tier, or one not
/// listed, under the limiter's own. Every key stays in the rule's one
/// limiter, whatever its tier (see
/// [`RateLimiter::check_with`](tollgate::RateLimiter::check_with) for what
/// a key's state means under another quota).
///
/// ```
/// use tollgate::{Quota, RateLimiter};
/// use tollgate_http::{Header, Rule, Tiers};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// /// What an authentication layer in front of this one inserts.
/// #[derive(Clone, Copy)]
/// enum Plan { Free, Pro }
///
/// let per_user = Rule::new(
///     "per-user",
///     RateLimiter::keyed(Quota::per_minute(60)?),
///     Header::new(http::HeaderName::from_static("x-api-key")),
/// )?
/// .tiers(
///     Tiers::by(|request| match request.extensions().get::<Plan>()? {
///         Plan::Free => None,
///         Plan::Pro => Some("pro"),
///     })
///     .tier("pro", Quota::per_minute(6_000)?),
/// )?;
/// # let _ = per_user;
/// # Ok(())
/// # }
/// ```
///
/// A header names a tier only if what sets it can be trusted: a client
/// that may send it chooses its own quota. [`Tiers::header`] suits a
/// header an API gateway in front sets (and strips from clients).
pub struct Tiers {
    select: Select,
    quotas: Vec<(Box<str>, Quota)>,
}

impl Tiers {
    /// Tiers named by the value of the header `name` (as sent, compared
    /// byte for byte).
    #[must_use]
    pub fn header(name: HeaderName) -> Self {
        Self {
            select: Select::Header(name),
            quotas: Vec::new(),
        }
    }

    /// Tiers named by `select`, a function of the request: `None` for the
    /// limiter's own quota.
    #[must_use]
    pub fn by(
        select: impl Fn(&RequestHead<'_>) -> Option<&'static str> + Send + Sync + 'static,
    ) -> Self {
        Self {
            select: Select::By(Box::new(select)),
            quotas: Vec::new(),
        }
    }

    /// Adds the tier `name`, whose requests are checked under `quota`.
    #[must_use]
    pub fn tier(mut self, name: impl Into<String>, quota: Quota) -> Self {
        self.quotas.push((name.into().into_boxed_str(), quota));
        self
    }
}

impl fmt::Debug for Tiers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let select = match &self.select {
            Select::Header(name) => name.as_str(),
            Select::By(_) => "a function",
        };
        f.debug_struct("Tiers")
            .field("select", &select)
            .field("quotas", &self.quotas)
            .finish()
    }
}

/// Tiers a rule cannot take ([`Rule::tiers`](crate::Rule::tiers)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TierError {
    /// The rule's limiter cannot check its keys under this tier's quota.
    #[error("tier {tier:?}: {error}")]
    Layout {
        /// The tier's name.
        tier: String,
        /// Why the limiter cannot.
        error: LayoutError,
    },
    /// Two tiers have this name.
    #[error("tier {0:?} is listed twice")]
    Duplicate(String),
}

/// A rule's tiers, checked against its limiter, each with its
/// `RateLimit-Policy` item made once.
pub(crate) struct Table {
    select: Select,
    tiers: Vec<Tier>,
}

struct Tier {
    name: Box<str>,
    quota: Quota,
    /// `None` only for a rule name that is not printable ASCII, which a
    /// rule refuses first.
    policy: Option<HeaderValue>,
}

impl Table {
    /// Checks `tiers` with `accepts` (the limiter's) and makes each tier's
    /// policy item with `policy`.
    pub(crate) fn new(
        tiers: Tiers,
        accepts: impl Fn(&Quota) -> Result<(), LayoutError>,
        policy: impl Fn(&Quota) -> Option<HeaderValue>,
    ) -> Result<Self, TierError> {
        let mut checked: Vec<Tier> = Vec::with_capacity(tiers.quotas.len());
        for (name, quota) in tiers.quotas {
            if checked.iter().any(|tier| tier.name == name) {
                return Err(TierError::Duplicate(name.into()));
            }
            accepts(&quota).map_err(|error| TierError::Layout {
                tier: name.clone().into(),
                error,
            })?;
            checked.push(Tier {
                name,
                policy: policy(&quota),
                quota,
            });
        }
        Ok(Self {
            select: tiers.select,
            tiers: checked,
        })
    }

    /// The quota of `request`'s tier; `None` for the limiter's own.
    #[inline]
    pub(crate) fn quota(&self, request: &RequestHead<'_>) -> Option<&Quota> {
        let name = match &self.select {
            Select::Header(header) => request.headers().get(header)?.as_bytes(),
            Select::By(select) => select(request)?.as_bytes(),
        };
        self.tiers
            .iter()
            .find(|tier| tier.name.as_bytes() == name)
            .map(|tier| &tier.quota)
    }

    /// The policy item made for `quota`, if a tier has it.
    pub(crate) fn policy(&self, quota: &Quota) -> Option<&HeaderValue> {
        self.tiers
            .iter()
            .find(|tier| tier.quota == *quota)
            .and_then(|tier| tier.policy.as_ref())
    }
}
