//! The conformance suite and the store properties of the crate's own stores
//! (`tests/conformance`, `tests/support/store_properties.rs`), run over the
//! stores on other maps.

#[path = "../../tests/support/builders.rs"]
mod builders;
#[path = "../../tests/support/contention.rs"]
mod contention;
#[path = "../../tests/conformance/mixed.rs"]
mod mixed;
#[path = "../../tests/support/store_properties.rs"]
mod store_properties;
#[path = "../../tests/conformance/suite.rs"]
mod suite;
#[macro_use]
#[path = "../../tests/conformance/store_suite.rs"]
mod store_suite;

use tollgate::algorithm::{FixedWindow, Gcra};
use tollgate_peers::{Flurry, Papaya, SccIndex};

conformance!(gcra_papaya, Gcra, Papaya::new());
conformance!(fixed_window_papaya, FixedWindow, Papaya::new());
conformance!(gcra_scc_index, Gcra, SccIndex::new());
conformance!(fixed_window_scc_index, FixedWindow, SccIndex::new());
conformance!(gcra_flurry, Gcra, Flurry::new(), Ord);
conformance!(fixed_window_flurry, FixedWindow, Flurry::new(), Ord);
// Mixed quotas (`tests/conformance/mixed.rs`).
conformance!(mixed gcra_papaya_mixed, Gcra, Papaya::new());
conformance!(mixed fixed_window_scc_index_mixed, FixedWindow, SccIndex::new());

/// The store properties, for one store kind over GCRA and the fixed window.
macro_rules! store_properties {
    ($name:ident, $store:expr) => {
        mod $name {
            use tollgate::algorithm::{FixedWindow, Gcra};

            use super::*;

            #[test]
            fn eviction_changes_no_decision_gcra() {
                store_properties::eviction_changes_no_decision::<Gcra, _>($store);
            }

            #[test]
            fn eviction_changes_no_decision_fixed_window() {
                store_properties::eviction_changes_no_decision::<FixedWindow, _>($store);
            }

            #[test]
            fn flood_respects_the_cap() {
                store_properties::flood_respects_the_cap($store);
            }

            #[test]
            fn cap_is_exact_when_nothing_is_idle() {
                store_properties::cap_is_exact_when_nothing_is_idle($store);
            }

            #[test]
            fn working_set_survives_growth() {
                store_properties::working_set_survives_growth($store);
            }
        }
    };
}

store_properties!(papaya_properties, Papaya::new());
store_properties!(scc_index_properties, SccIndex::new());
store_properties!(flurry_properties, Flurry::new());
