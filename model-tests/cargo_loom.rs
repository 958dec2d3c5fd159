//! `cargo test --features loom` runs the loom models.
//!
//! The models (`model-tests/loom.rs`) need `--cfg tollgate_loom`, which no
//! Cargo feature or profile can set, and a release build in a target
//! directory of their own: the `cargo loom` alias (`.cargo/config.toml`)
//! spells that out and runs this target beside the models. This target has
//! no test harness of its own:
//!
//! * built with the cfg, the models ran beside it: it does nothing;
//! * built by the alias without the cfg (a `RUSTFLAGS`,
//!   `CARGO_ENCODED_RUSTFLAGS` or target `rustflags` overrides the alias's
//!   `build.rustflags`), the models compiled empty: it fails, saying so;
//! * built by plain `cargo test --features loom`, it runs `cargo loom` in a
//!   child process with the cfg added to `RUSTFLAGS`, passing its own
//!   arguments on to the models (a filter, `--nocapture`), and fails if any
//!   model fails. The child's output goes straight to the terminal.

use std::process::ExitCode;

fn main() -> ExitCode {
    #[cfg(tollgate_loom)]
    {
        ExitCode::SUCCESS
    }
    #[cfg(not(tollgate_loom))]
    {
        hand_over()
    }
}

#[cfg(not(tollgate_loom))]
fn hand_over() -> ExitCode {
    // Set by the alias (`--config env...`) for the builds it runs.
    if option_env!("TOLLGATE_LOOM_ALIAS").is_some() {
        eprintln!(
            "cargo loom: the build lost `--cfg tollgate_loom`, so no model ran: \
             RUSTFLAGS, CARGO_ENCODED_RUSTFLAGS or a target's `rustflags` override \
             the alias's `build.rustflags`; add `--cfg tollgate_loom` to them, or \
             run `cargo test --features loom`"
        );
        return ExitCode::FAILURE;
    }
    // RUSTFLAGS overrides the alias's `build.rustflags`, and in the child it
    // carries the cfg (after anything the caller set).
    let mut rustflags = std::env::var("RUSTFLAGS").unwrap_or_default();
    rustflags.push_str(" --cfg tollgate_loom");
    let status = std::process::Command::new(env!("CARGO"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["loom", "--"])
        .args(std::env::args_os().skip(1))
        .env("RUSTFLAGS", rustflags.trim_start())
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status();
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("`cargo loom` failed: {status}");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("`cargo loom` did not start: {error}");
            ExitCode::FAILURE
        }
    }
}
