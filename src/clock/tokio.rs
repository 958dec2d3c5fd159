use tokio::time::Instant;

use super::{Clock, saturating_nanos};

/// tokio's clock: nanoseconds since the clock was made, read from
/// `tokio::time::Instant`, which a test can pause and advance
/// (`tokio::time::pause`), so that waiting limiters and their timers agree
/// on virtual time (feature `tokio`).
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: Instant,
}

impl TokioClock {
    /// A clock whose origin is now.
    #[must_use]
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        saturating_nanos(self.origin.elapsed())
    }

    /// Tokio's `Instant` never runs backwards.
    fn ordered(&self) -> bool {
        true
    }
}
