//! The instant each call is decided at: the server's `TIME`, or a client
//! clock's reading sent as an argument, in whole microseconds.

use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::Clock;

use crate::local::Hybrid;
use crate::script::END_OF_TIME_US;

/// Where a check's "now" comes from.
#[derive(Clone)]
pub(super) enum Time {
    /// The server's `TIME`, read inside the script: one clock for every
    /// instance (per master, on a Cluster: a key's master decides it).
    Server,
    /// The caller's clock, in nanoseconds from its origin; and the local
    /// half deciding on it, if any, which must know every reading sent.
    Client(Arc<dyn Clock>, Option<Arc<Hybrid>>),
}

impl Time {
    /// Returns the time argument for a call now; on the client clock, the
    /// reading is recorded with the local half first (it is about to be
    /// sent).
    pub(super) fn now(&self) -> Now {
        match self {
            Time::Server => Now::SERVER,
            Time::Client(clock, local) => {
                let reading_ns = clock.now_ns();
                if let Some(local) = local {
                    local.view.record_sent(reading_ns);
                }
                Now::reading(reading_ns)
            }
        }
    }

    /// Returns the time argument for a check whose local reading is
    /// `reading_ns` (the client clock's, when it decides).
    pub(super) fn at(&self, reading_ns: u64) -> Now {
        match self {
            Time::Server => Now::SERVER,
            Time::Client(..) => Now::reading(reading_ns),
        }
    }

    /// Names the clock, for `Debug`.
    pub(super) fn describe(&self) -> &'static str {
        match self {
            Time::Server => "server TIME",
            Time::Client(..) => "client clock",
        }
    }
}

/// A check's time argument, and how far the client's reading lies past the
/// microsecond it was rounded down to (so that waits can be told from the
/// reading itself).
pub(super) struct Now {
    /// Microseconds, or `None` for the server's `TIME`.
    pub(super) us: Option<u64>,
    fraction_ns: u64,
}

impl Now {
    /// The server's `TIME`.
    const SERVER: Now = Now {
        us: None,
        fraction_ns: 0,
    };

    /// Splits a client clock's reading into whole microseconds (clamped to
    /// the script's end of time) and the nanoseconds past them.
    fn reading(reading_ns: u64) -> Now {
        let now_us = reading_ns / 1_000;
        if now_us >= END_OF_TIME_US {
            Now {
                us: Some(END_OF_TIME_US),
                fraction_ns: 0,
            }
        } else {
            Now {
                us: Some(now_us),
                fraction_ns: reading_ns % 1_000,
            }
        }
    }

    /// Returns how far from the reading an instant `us` microseconds after
    /// the microsecond decided on lies.
    ///
    /// The client's reading lay `fraction_ns` past that microsecond, so the
    /// instant is `us × 1000 − fraction` from the reading. A denial waits
    /// at least 1 µs: its wait stays positive.
    pub(super) fn after(&self, us: u64) -> Duration {
        Duration::from_nanos(us.saturating_mul(1_000).saturating_sub(self.fraction_ns))
    }
}
