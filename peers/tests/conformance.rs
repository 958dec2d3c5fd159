//! The conformance suite and the store properties of the crate's own stores
//! (`tests/conformance`, `tests/support/store_properties.rs`), run over the
//! stores on other maps.

#[path = "../../tests/support/builders.rs"]
mod builders;
#[path = "../../tests/support/contention.rs"]
mod contention;
#[path = "../../tests/support/store_properties.rs"]
mod store_properties;
#[path = "../../tests/conformance/suite.rs"]
mod suite;
#[macro_use]
#[path = "../../tests/conformance/store_suite.rs"]
mod store_suite;

use tollgate::algorithm::{FixedWindow, Gcra};
use tollgate_peers::Papaya;

conformance!(gcra_papaya, Gcra, Papaya::new());
conformance!(fixed_window_papaya, FixedWindow, Papaya::new());

#[test]
fn eviction_changes_no_decision_gcra_papaya() {
    store_properties::eviction_changes_no_decision::<Gcra, _>(Papaya::new());
}

#[test]
fn eviction_changes_no_decision_fixed_window_papaya() {
    store_properties::eviction_changes_no_decision::<FixedWindow, _>(Papaya::new());
}

#[test]
fn flood_respects_the_cap_papaya() {
    store_properties::flood_respects_the_cap(Papaya::new());
}

#[test]
fn cap_is_exact_papaya() {
    store_properties::cap_is_exact_when_nothing_is_idle(Papaya::new());
}

#[test]
fn working_set_survives_growth_papaya() {
    store_properties::working_set_survives_growth(Papaya::new());
}
