//! The crate's key encoding for the repository's fuzz targets, behind the
//! `fuzzing` feature: not part of the API and under no semver promise.

use crate::error::ConfigError;
use crate::script::Scripted;

/// A limiter's place in the key space, as `Builder::build` makes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace(crate::key::Namespace);

impl Namespace {
    /// Makes the namespace of a limiter of algorithm `A` named `name`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::BadKeyPart`] for a prefix or tag with a brace, or an
    /// empty tag.
    pub fn new<A: Scripted>(
        prefix: &str,
        name: &str,
        tag: Option<&str>,
    ) -> Result<Self, ConfigError> {
        crate::key::Namespace::new(prefix, name, A::CODE, tag).map(Self)
    }

    /// Returns the Redis key of the user key `key`.
    #[must_use]
    pub fn key(&self, key: &[u8]) -> Vec<u8> {
        self.0.key(key)
    }

    /// Returns the `SCAN` pattern of every key of this namespace.
    #[must_use]
    pub fn pattern(&self) -> Vec<u8> {
        self.0.pattern()
    }
}
