use std::fmt;

use super::Clock;

/// The default clock: the CPU's time-stamp counter, through `quanta`. A
/// reading is an `rdtsc` (on aarch64, the system counter) and a scaling, a
/// few nanoseconds, where [`MonotonicClock`](super::MonotonicClock) costs a
/// vDSO call, which on a VM costs more than a lock-free denial.
///
/// # Calibration, fallback and error
///
/// - **Start-up:** the first `TscClock` a process builds calibrates the
///   counter against the OS monotonic clock: quanta's loop of at least 500
///   one-microsecond rounds, which stops once its mean error is below 10 ns
///   or after the round that passes 200 ms of wall time (0.6 ms in most
///   fresh processes on the 2-core AMD EPYC VM of tollgate's notes, a few
///   ms with the machine loaded). Every later clock reads that calibrated
///   clock. A builder makes its default `TscClock` only when it builds a
///   limiter: one given another clock never calibrates.
/// - **Fallback:** quanta uses the counter only where the CPU reports an
///   invariant TSC (and `rdtscp`); elsewhere every reading is the OS
///   clock's, as fast as [`MonotonicClock`](super::MonotonicClock) and as
///   exact. On aarch64 it reads the system counter (its frequency's
///   resolution, tens of nanoseconds). Hypervisors advertise an invariant
///   TSC to a guest only when
///   asked (QEMU/KVM's `invtsc`), and then migrate the guest only to hosts
///   that keep its TSC frequency.
/// - **Error:** a reading is scaled from ticks by the calibration, so the
///   clock's rate is the OS clock's to within the calibration's error (parts
///   per million): a quota's rate is enforced to that precision, and over
///   long spans the clock drifts from `Instant` by as much.
/// - **Order:** `rdtsc` does not wait for earlier instructions, and cores'
///   counters may differ by a few ticks, so a thread moved to another core
///   can read an instant a few nanoseconds before its last reading, and two
///   threads' readings can arrive in the opposite order to the instants
///   they stand for. Every limiter tolerates an older reading (see
///   [`Clock`]). No reading is earlier than the clock's origin.
///
/// Under Miri, which runs neither `cpuid` nor `rdtsc`, and in the loom
/// models' build, it reads the OS clock.
///
/// ```
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() {
/// use tollgate::clock::{Clock, TscClock};
///
/// let clock = TscClock::new();
/// let first = clock.now_ns();
/// std::thread::sleep(std::time::Duration::from_millis(2));
/// // 2 ms on the OS clock, read to within the calibration's error.
/// assert!(clock.now_ns().saturating_sub(first) >= 1_000_000);
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
#[derive(Clone, Copy)]
pub struct TscClock {
    /// The process's one calibrated clock.
    #[cfg(not(any(miri, tollgate_loom)))]
    clock: &'static quanta::Clock,
    #[cfg(not(any(miri, tollgate_loom)))]
    origin: u64,
    #[cfg(any(miri, tollgate_loom))]
    os: super::MonotonicClock,
}

impl TscClock {
    /// A calibrated clock whose origin is now. The first in a process
    /// calibrates (see the type's documentation); later ones copy it.
    #[must_use]
    pub fn new() -> Self {
        #[cfg(not(any(miri, tollgate_loom)))]
        {
            // quanta's `Clock::new` calibrates once a process but asks
            // `cpuid` each time, a VM exit on a hypervisor (about 20 µs on
            // the notes' VM): one clock is built, and every `TscClock`
            // reads it.
            static CALIBRATED: std::sync::OnceLock<quanta::Clock> = std::sync::OnceLock::new();
            let clock = CALIBRATED.get_or_init(quanta::Clock::new);
            let origin = clock.raw();
            Self { clock, origin }
        }
        #[cfg(any(miri, tollgate_loom))]
        {
            Self {
                os: super::MonotonicClock::new(),
            }
        }
    }
}

impl Default for TscClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TscClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        // quanta returns 0 for a reading at or before the origin (another
        // core's counter, a few ticks behind).
        #[cfg(not(any(miri, tollgate_loom)))]
        {
            self.clock.delta_as_nanos(self.origin, self.clock.raw())
        }
        #[cfg(any(miri, tollgate_loom))]
        {
            self.os.now_ns()
        }
    }

    /// Cores' counters differ by a few ticks (see "Order"), far under the
    /// microsecond.
    fn ordered(&self) -> bool {
        true
    }
}

impl fmt::Debug for TscClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TscClock").finish_non_exhaustive()
    }
}
