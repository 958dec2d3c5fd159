//! The lock-free store's read-copy-update itself (`sync::rcu`), through
//! `tollgate::lab_hooks`: grace periods wait for the sections inside when
//! they begin and for no other, a thread that exits (after its sections,
//! inside one, or entering one from a thread-local's destructor) gives its
//! record back, and threads coming and going keep the registry as large as
//! the most that were alive at once.
//!
//! One test, so that no other test's threads take records while it counts
//! them.

#![cfg(not(any(feature = "loom", feature = "shuttle")))]

use std::cell::RefCell;
use std::sync::mpsc;
use std::thread;

use tollgate::lab_hooks::{self, Pinned};

/// A reader that entered a section and stays there until told to leave.
struct StalledReader {
    leave: mpsc::Sender<()>,
    thread: thread::JoinHandle<()>,
}

fn stalled_reader() -> StalledReader {
    let (entered_tx, entered_rx) = mpsc::channel();
    let (leave, leave_rx) = mpsc::channel::<()>();
    let thread = thread::spawn(move || {
        let section = lab_hooks::pin();
        assert!(lab_hooks::is_pinned());
        entered_tx.send(()).unwrap();
        leave_rx.recv().unwrap();
        drop(section);
        assert!(!lab_hooks::is_pinned());
    });
    entered_rx.recv().unwrap();
    StalledReader { leave, thread }
}

impl StalledReader {
    fn leave(self) {
        self.leave.send(()).unwrap();
        self.thread.join().unwrap();
    }
}

fn grace_periods() {
    // No section inside: elapsed at once.
    assert!(lab_hooks::grace_period().elapsed());

    // A stalled reader blocks a grace period begun while it is inside...
    let reader = stalled_reader();
    let blocked = lab_hooks::grace_period();
    for _ in 0..1_000 {
        assert!(
            !blocked.elapsed(),
            "a grace period ended under a stalled reader"
        );
        thread::yield_now();
    }
    // ...and a section entered after the grace period began does not.
    let late = stalled_reader();
    reader.leave();
    assert!(blocked.elapsed(), "the stalled reader left");
    assert!(
        !lab_hooks::grace_period().elapsed(),
        "the late reader is inside"
    );
    late.leave();
    assert!(lab_hooks::grace_period().elapsed());

    // This thread's own section: nested sections count once, and a grace
    // period begun inside it waits for it.
    let outer = lab_hooks::pin();
    let inner = lab_hooks::pin();
    drop(inner);
    assert!(lab_hooks::is_pinned());
    let own = lab_hooks::grace_period();
    assert!(!own.elapsed());
    drop(outer);
    assert!(!lab_hooks::is_pinned());
    assert!(own.elapsed());
}

thread_local! {
    // Registered before the thread's record (its first use comes first), so
    // destroyed after it: the section it holds outlives the thread-local
    // that held the record.
    static HELD: RefCell<Option<Pinned>> = const { RefCell::new(None) };
}

/// Enters (and leaves) a section from its `Drop`, run among the thread's
/// thread-local destructors, after the record's.
struct EnterOnDrop;

impl Drop for EnterOnDrop {
    fn drop(&mut self) {
        let section = lab_hooks::pin();
        drop(section);
    }
}

thread_local! {
    static ENTER_ON_DROP: RefCell<Option<EnterOnDrop>> = const { RefCell::new(None) };
}

/// Spawns `count` threads at once, each entering sections in one of the
/// ways a thread can leave them, and joins them.
fn threads_coming_and_going(count: usize) {
    let threads: Vec<_> = (0..count)
        .map(|index| {
            thread::spawn(move || match index % 3 {
                // Sections that end before the thread does.
                0 => {
                    for _ in 0..3 {
                        drop(lab_hooks::pin());
                    }
                }
                // A section still held when the thread exits.
                1 => {
                    HELD.with(|held| {
                        *held.borrow_mut() = Some(lab_hooks::pin());
                    });
                    assert!(lab_hooks::is_pinned());
                }
                // A section entered after the thread's record was given back.
                _ => {
                    ENTER_ON_DROP.with(|enter| *enter.borrow_mut() = Some(EnterOnDrop));
                    drop(lab_hooks::pin());
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

fn records_are_reused() {
    // This thread's record, taken for good.
    drop(lab_hooks::pin());
    let (before, _) = lab_hooks::records();
    threads_coming_and_going(8);
    let (after_first, held) = lab_hooks::records();
    // Eight threads at once: at most eight records more, and eight more for
    // threads entering from a destructor while their own record is held.
    let bound = before + 16;
    assert!(
        after_first <= bound,
        "{after_first} records after 8 threads (from {before})"
    );
    assert_eq!(
        held, 1,
        "only this thread's record is held once they exited"
    );
    // 400 threads more, never more than eight at once: the registry stays
    // within the same bound (a registry that kept exited threads' records
    // would hold 400 more).
    for _ in 0..50 {
        threads_coming_and_going(8);
    }
    let (after, held) = lab_hooks::records();
    assert!(
        after <= bound,
        "{after} records after 408 threads, never more than 8 at once (from {before})"
    );
    assert_eq!(held, 1);
    // And every grace period still ends: no exited thread left a section
    // open.
    assert!(lab_hooks::grace_period().elapsed());
}

/// `evict_idle` unlinks every shard's replaced table before it waits for
/// any, so one barrier serves them all.
fn evicting_every_shard_issues_one_barrier() {
    use tollgate::clock::ManualClock;
    use tollgate::store::LockFree;
    use tollgate::{Builder, Quota};
    let clock = ManualClock::new();
    let limiter = Builder::new(Quota::per_second(1).unwrap())
        .store(LockFree::new(16))
        .clock(clock.clone())
        .build::<u64>();
    for key in 0..4_096 {
        assert!(limiter.check(&key).unwrap().is_allowed());
    }
    // Every key rested: each shard's table is compacted.
    clock.advance(std::time::Duration::from_secs(2));
    let before = lab_hooks::barriers();
    assert_eq!(limiter.evict_idle(), 4_096);
    assert_eq!(
        lab_hooks::barriers() - before,
        1,
        "one barrier for 16 shards"
    );
    assert_eq!(limiter.len(), 0);
}

#[test]
fn read_copy_update() {
    grace_periods();
    records_are_reused();
    evicting_every_shard_issues_one_barrier();
}
