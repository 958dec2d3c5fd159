//! The simulator on small fleets: reproducible, tollgate's guarantees held
//! through the real code, and the tally able to see a design break them.

use std::sync::Arc;

use tollgate::remote::Leases;
use tollgate_sim::designs::envoy::Envoy;
use tollgate_sim::designs::tollgate::Tollgate;
use tollgate_sim::scenario::{Limit, Scenario};
use tollgate_sim::tally::Figures;
use tollgate_sim::world::run;

/// A fleet small enough for a debug build: a hot key of 2 000 a second
/// at ten times its limit, 2 000 background checks a second over 10 000
/// keys, for 3 s (the first a warm-up), or struck for 5 s.
fn small(instances: usize, seed: u64, struck: bool) -> Scenario {
    let duration_ns = if struck { 5_000_000_000 } else { 3_000_000_000 };
    let mut scenario = if struck {
        Scenario::struck(instances, duration_ns, seed)
    } else {
        Scenario::steady(instances, duration_ns, seed)
    };
    scenario.hot = Limit {
        per_s: 2_000,
        burst: 2_000,
    };
    scenario.keys = 10_000;
    scenario.background_per_s = 2_000.0;
    scenario
}

fn tollgate(scenario: Scenario, leases: Option<Leases>) -> Figures {
    let scenario = Arc::new(scenario);
    let mut design = Tollgate::new(&scenario, leases);
    run(Arc::clone(&scenario), &mut design, None).figures(scenario.duration_ns, scenario.instances)
}

#[test]
fn a_run_is_a_function_of_its_seed() {
    let first = tollgate(small(20, 7, true), Some(Leases::new()));
    assert_eq!(first, tollgate(small(20, 7, true), Some(Leases::new())));
    assert_ne!(first, tollgate(small(20, 8, true), Some(Leases::new())));
}

#[test]
fn tollgate_admits_the_limit_and_never_more_on_a_steady_fleet() {
    for leases in [None, Some(Leases::new())] {
        let figures = tollgate(small(50, 1, false), leases);
        assert_eq!(figures.over, 0, "{leases:?}: {figures:?}");
        assert_eq!(figures.over_in_faults, 0, "{leases:?}: {figures:?}");
        // Two seconds of a saturated key, admissions counted at the
        // instants they were decided: the reference's, to the unit, for
        // this seed (an admission at either end of the span could fall on
        // its other side for another).
        assert_eq!(figures.admitted, figures.ideal, "{leases:?}: {figures:?}");
    }
}

#[test]
fn faults_away_from_the_failover_cost_tollgate_no_over_admission() {
    // Crashes, joins and a shift, judged away from the failover's reach,
    // never over-admit; the failover's lost writes (50 ms: 100 units) and
    // forward clock step (20 ms: 40 units) do, as they do Redis alone,
    // though by less than GCRA's bound on any window at saturation (a
    // burst) shows.
    let figures = tollgate(small(50, 1, true), Some(Leases::new()));
    assert_eq!(figures.over, 0, "{figures:?}");
    assert!(figures.admitted >= figures.ideal + 100, "{figures:?}");
}

#[test]
fn the_tally_sees_envoy_s_fail_open_partition_over_admit() {
    // Envoy lets requests through when the rate-limit service cannot
    // answer: the partition's checks are all admitted.
    let steady = Arc::new(small(50, 1, false));
    let figures = run(Arc::clone(&steady), &mut Envoy::new(&steady), None)
        .figures(steady.duration_ns, steady.instances);
    assert_eq!(
        (figures.over, figures.over_in_faults),
        (0, 0),
        "{figures:?}"
    );
    assert_eq!(figures.admitted, figures.ideal, "{figures:?}");
    let struck = Arc::new(small(50, 1, true));
    let figures = run(Arc::clone(&struck), &mut Envoy::new(&struck), None)
        .figures(struck.duration_ns, struck.instances);
    assert!(figures.over_in_faults > 0, "{figures:?}");
}

#[test]
fn holds_cut_a_shared_hot_key_s_calls_and_keep_its_limit() {
    // Six seconds: what the fleet leaves in the remote's free units at
    // the warm-up's end and at the run's (up to a burst) counts against
    // it, and a longer run makes that a smaller share.
    let mut scenario = small(100, 1, false);
    scenario.duration_ns = 6_000_000_000;
    let leased = tollgate(scenario.clone(), Some(Leases::new()));
    let held = tollgate(scenario, Some(Leases::new().with_holds(true)));
    assert_eq!(held.over, 0, "{held:?}");
    assert!(held.under() < 0.01, "{held:?}");
    assert!(
        held.hot_calls_per_check * 100.0 < leased.hot_calls_per_check,
        "{leased:?}\n{held:?}"
    );
}

#[test]
fn the_peers_break_the_limit_where_their_designs_say() {
    use tollgate_sim::report::figures;
    let scenario = small(100, 1, false);
    // One round trip a check to a counter: exact.
    let envoy = figures("envoyproxy/ratelimit", &scenario, None);
    assert_eq!((envoy.over, envoy.admitted), (0, envoy.ideal), "{envoy:?}");
    // Every peer starts from a full copy of a GLOBAL key's bucket and
    // learns the owner's count at least 200 ms later: a window holds more
    // than the limit.
    let gubernator = figures("gubernator GLOBAL", &scenario, None);
    assert!(gubernator.over > 0, "{gubernator:?}");
    // Instances admit everything until the first rejection rates come
    // back, for every background key anew.
    let counting = figures("local counting, 100 ms reports", &scenario, None);
    assert!(
        counting.over > 0 && counting.background_ratio() > 1.01,
        "{counting:?}"
    );
    // Clients are blocked until their first lease, and a cold key's lease
    // comes after its few checks: background keys are mostly denied.
    let doorman = figures("Doorman", &scenario, None);
    assert_eq!(doorman.over, 0, "{doorman:?}");
    assert!(doorman.background_ratio() < 0.5, "{doorman:?}");
}
