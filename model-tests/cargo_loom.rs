//! `cargo test --features loom` runs the loom models.
//!
//! The models (`model-tests/loom.rs`) need `--cfg crossbeam_loom`, which no
//! Cargo feature or profile can set, and a release build in a target
//! directory of their own: the `cargo loom` alias (`.cargo/config.toml`)
//! spells that out. Without the cfg, the loom test target compiles empty and
//! this one test runs `cargo loom` in a child process, whose output goes
//! straight to the terminal, and fails if any model fails.

#![cfg(all(feature = "loom", not(crossbeam_loom)))]

use std::process::Command;

/// Set in the child: a child that still lacks the cfg (a RUSTFLAGS that
/// overrides the alias's) must not start another.
const CHILD: &str = "TOLLGATE_LOOM_CHILD";

#[test]
fn every_loom_model() {
    assert!(
        std::env::var_os(CHILD).is_none(),
        "the loom models were built without --cfg crossbeam_loom: run \
         `cargo test --release --features loom --test loom --target-dir target/loom` \
         with RUSTFLAGS=\"--cfg crossbeam_loom\""
    );
    // A RUSTFLAGS in the environment overrides the alias's
    // `build.rustflags`: the cfg joins it instead.
    let mut rustflags = std::env::var("RUSTFLAGS").unwrap_or_default();
    rustflags.push_str(" --cfg crossbeam_loom");
    let status = Command::new(env!("CARGO"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("loom")
        .env(CHILD, "1")
        .env("RUSTFLAGS", rustflags.trim_start())
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .expect("cargo starts");
    assert!(status.success(), "`cargo loom` failed: {status}");
}
