//! What a request has passed so far: the decisions of the rules that
//! admitted it, what gives their admissions back should a later rule
//! refuse it, and the `RateLimit-Policy` and `RateLimit` lines they make.

use bytes::Bytes;
use http::HeaderValue;
use tollgate::{Decision, Quota};

use crate::fields::{RATELIMIT, RATELIMIT_POLICY, limit_item};
use crate::layer::{Config, OnUnavailable};
use crate::limit::Failure;
use crate::refusal::Refusal;
use crate::rule::{Outcome, Refund};

/// A short list whose first item needs no allocation: most layers have
/// one rule, and a request through them allocates nothing for it.
struct Few<T> {
    first: Option<T>,
    rest: Vec<T>,
}

impl<T> Few<T> {
    const fn new() -> Self {
        Self {
            first: None,
            rest: Vec::new(),
        }
    }

    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    fn push(&mut self, item: T) {
        if self.first.is_none() {
            self.first = Some(item);
        } else {
            self.rest.push(item);
        }
    }

    fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        match index.checked_sub(1) {
            None => self.first.as_mut(),
            Some(rest) => self.rest.get_mut(rest),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.first.iter().chain(&self.rest)
    }

    fn into_iter(self) -> impl Iterator<Item = T> {
        self.first.into_iter().chain(self.rest)
    }
}

/// A rule's decision, and the quota that made it.
pub(crate) struct RuleDecision {
    /// The rule's index.
    pub(crate) rule: usize,
    pub(crate) decision: Decision,
    /// `None`: no quota counted the request, and the fields leave the rule
    /// out.
    quota: Option<Quota>,
}

/// The decisions of the rules a request has passed so far.
pub(crate) struct Passed {
    decisions: Few<RuleDecision>,
    /// What gives back the admissions that can be, should a later rule
    /// refuse the request, by their place in `decisions`.
    refunds: Vec<(usize, Refund)>,
}

impl Passed {
    pub(crate) const fn new() -> Self {
        Self {
            decisions: Few::new(),
            refunds: Vec::new(),
        }
    }

    /// Records rule `index`'s outcome; a refusal ends the checks.
    #[inline]
    pub(crate) fn record(
        &mut self,
        config: &Config,
        index: usize,
        outcome: Outcome,
    ) -> Result<(), Refusal> {
        let refusal = match outcome {
            Ok(checked) => {
                let decided = RuleDecision {
                    rule: index,
                    decision: checked.decision,
                    quota: checked.quota,
                };
                if decided.decision.is_allowed() {
                    if let Some(refund) = checked.receipt {
                        self.refunds.push((self.decisions.len(), refund));
                    }
                    self.decisions.push(decided);
                    return Ok(());
                }
                Refusal::Denied(decided)
            }
            Err(Failure::Unavailable(_)) if config.on_unavailable == OnUnavailable::Allow => {
                return Ok(());
            }
            Err(failure) => Refusal::Failed(index, failure),
        };
        self.refund_all();
        Err(refusal)
    }

    /// Keeps every admission: the request went through.
    #[inline]
    pub(crate) fn keep_all(&mut self) {
        self.refunds.clear();
    }

    /// Gives back every admission that can be: the request is refused.
    /// A rule's `RateLimit` item then counts the units given back; an
    /// admission another request followed stays charged (giving it back
    /// could admit more than the quota), and its item says so.
    pub(crate) fn refund_all(&mut self) {
        while let Some((place, refund)) = self.refunds.pop() {
            self.give_back(place, refund);
        }
    }

    /// Gives back the admission in `place` with `refund`, and counts the
    /// units it gave back in its decision.
    fn give_back(&mut self, place: usize, refund: Refund) {
        let Some(units) = refund() else {
            return;
        };
        let Some(RuleDecision { decision, .. }) = self.decisions.get_mut(place) else {
            return;
        };
        // The reset time stays as it was: never earlier than the truth.
        if let Some(restored) = Decision::from_parts(
            decision.limit(),
            decision
                .remaining()
                .saturating_add(units)
                .min(decision.limit()),
            decision.retry_after(),
            decision.reset_after(),
        ) {
            *decision = restored;
        }
    }

    /// Makes the two fields for these decisions (and `extra`, a refusing one):
    /// one line of each a rule, which a client reads as one list per field
    /// (a structured-field list may be split over several lines). Each
    /// rule's policy is the quota that made its decision; a decision no
    /// quota made has no lines.
    pub(crate) fn fields(&self, config: &Config, extra: Option<&RuleDecision>) -> Option<Fields> {
        let mut fields = Few::new();
        for decided in self.decisions.iter().chain(extra) {
            let Some(quota) = &decided.quota else {
                continue;
            };
            let rule = &config.rules[decided.rule];
            let policy = rule.policy(quota)?;
            // Printable ASCII (names are checked when a rule is made), in a
            // buffer the value then owns.
            let item = limit_item(rule.limit_prefix(), &decided.decision);
            let limit = HeaderValue::from_maybe_shared(Bytes::from(item)).ok()?;
            fields.push((policy, limit));
        }
        (fields.len() > 0).then_some(Fields(fields))
    }
}

/// A request dropped before it went through (its client gone, a timeout
/// while a limit waited for its backend, a panic in a later rule's user
/// code) gives its admissions back, as a refused one does.
impl Drop for Passed {
    #[inline]
    fn drop(&mut self) {
        if self.refunds.is_empty() {
            return;
        }
        if !std::thread::panicking() {
            self.refund_all();
            return;
        }
        // Unwinding already: a refund that panicked too (a key's `Hash`
        // panicking again) would abort the process. Each refund's panic is
        // caught instead, and the admission it was giving back stays
        // charged: units lost, never over-admitted.
        while let Some((place, refund)) = self.refunds.pop() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.give_back(place, refund);
            }));
        }
    }
}

/// `RateLimit-Policy` and `RateLimit` lines, ready to add to a response.
pub(crate) struct Fields(Few<(HeaderValue, HeaderValue)>);

impl Fields {
    /// Appends the lines to `headers`.
    pub(crate) fn add_to(self, headers: &mut http::HeaderMap) {
        // Appended: an inner layer's items stay, and one list is read from
        // every line of a field.
        for (policy, limit) in self.0.into_iter() {
            headers.append(RATELIMIT_POLICY, policy);
            headers.append(RATELIMIT, limit);
        }
    }
}
