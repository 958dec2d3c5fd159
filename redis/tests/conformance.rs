//! The in-process crate's conformance suite (`tests/conformance/suite.rs`,
//! unchanged) over the Redis limiter, for all five algorithms, on a real
//! standalone server and on a real three-master Cluster, with a client
//! `ManualClock`: 64 threads × 20 checks admit exactly the limit, waits are
//! exact, a peek stores nothing.

#[path = "../../tests/support/contention.rs"]
mod contention;
#[path = "../../tests/conformance/suite.rs"]
#[allow(dead_code)]
mod suite;
mod support {
    #[allow(dead_code)]
    pub mod redis;
    #[allow(dead_code)]
    pub mod target;
}

use tollgate::clock::ManualClock;
use tollgate::{CheckError, Decision, Quota};
use tollgate_redis::{RedisLimiter, Scripted};

use support::target::{Kind, Target};

/// A key type of the suite, as the bytes the Redis limiter takes.
trait Bytes {
    fn bytes(&self) -> Vec<u8>;
}

impl Bytes for u64 {
    fn bytes(&self) -> Vec<u8> {
        self.to_be_bytes().to_vec()
    }
}

impl Bytes for String {
    fn bytes(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

struct OnRedis<'a, A: Scripted> {
    target: &'a Target,
    limiter: RedisLimiter<A>,
}

impl<A: Scripted, K: Bytes> suite::Subject<K> for OnRedis<'_, A> {
    fn check_n(&self, key: &K, n: u32) -> Result<Decision, CheckError> {
        self.unwrap(
            self.target
                .runtime
                .block_on(self.limiter.check_n(key.bytes(), n)),
        )
    }

    fn peek(&self, key: &K) -> Result<Decision, CheckError> {
        self.unwrap(self.target.runtime.block_on(self.limiter.peek(key.bytes())))
    }

    fn len(&self) -> usize {
        self.target.count_keys(&self.limiter.key_pattern())
    }
}

impl<A: Scripted> OnRedis<'_, A> {
    /// The suite's errors are the contract's; anything from Redis fails the
    /// test.
    fn unwrap(
        &self,
        result: Result<Decision, tollgate_redis::Error>,
    ) -> Result<Decision, CheckError> {
        match result {
            Ok(decision) => Ok(decision),
            Err(tollgate_redis::Error::Check(error)) => Err(error),
            Err(error) => panic!("{error}"),
        }
    }
}

macro_rules! run_suite {
    ($target:expr, $algorithm:ty, $($test:ident),* $(,)?) => {{
        let target = $target;
        let make = |quota: Quota, clock: ManualClock| OnRedis {
            target,
            limiter: target.limiter::<$algorithm>(quota, clock),
        };
        $(
            eprintln!("{}: {}", stringify!($algorithm), stringify!($test));
            suite::$test(make);
        )*
        suite::isolates_string_keys(make);
    }};
}

fn conformance<A: Scripted>(kind: Kind) {
    let target = Target::start(kind);
    suite::with_suite_tests!(run_suite!(&target, A,));
}

mod standalone {
    use tollgate::algorithm::{
        FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
    };

    use super::{Kind, conformance};

    #[test]
    fn gcra() {
        conformance::<Gcra>(Kind::Standalone);
    }
    #[test]
    fn token_bucket() {
        conformance::<TokenBucket>(Kind::Standalone);
    }
    #[test]
    fn fixed_window() {
        conformance::<FixedWindow>(Kind::Standalone);
    }
    #[test]
    fn sliding_window_counter() {
        conformance::<SlidingWindowCounter>(Kind::Standalone);
    }
    #[test]
    fn sliding_window_log() {
        conformance::<SlidingWindowLog>(Kind::Standalone);
    }
}

mod cluster {
    use tollgate::algorithm::{
        FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
    };

    use super::{Kind, conformance};

    #[test]
    fn gcra() {
        conformance::<Gcra>(Kind::Cluster);
    }
    #[test]
    fn token_bucket() {
        conformance::<TokenBucket>(Kind::Cluster);
    }
    #[test]
    fn fixed_window() {
        conformance::<FixedWindow>(Kind::Cluster);
    }
    #[test]
    fn sliding_window_counter() {
        conformance::<SlidingWindowCounter>(Kind::Cluster);
    }
    #[test]
    fn sliding_window_log() {
        conformance::<SlidingWindowLog>(Kind::Cluster);
    }
}
