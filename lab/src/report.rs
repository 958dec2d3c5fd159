//! The performance tables, the targets judged in the same run, and the plots.

use std::path::{Path, PathBuf};

use crate::memory::SweepRow;
use crate::perf::{Results, THREADS, Table, print_table};
use crate::svg::{Chart, Series};

/// Prints every performance table, each against governor where it has a row.
pub fn print(results: &Results) {
    print_table(&results.deny, Some("governor keyed"));
    print_table(&results.deny_with_clock, None);
    for (_, table) in &results.distinct {
        print_table(table, Some("governor keyed"));
    }
    print_table(&results.by_algorithm, None);
    print_table(&results.hot, Some("governor keyed"));
    println!("## Clock: one reading");
    for (name, ns) in &results.clock_read {
        println!("{name:<26} {ns:>7.2} ns");
    }
    println!();
}

/// One target: what was asked, what was measured, met or not.
fn judge(name: &str, measured: f64, target: f64, unit: &str) {
    let verdict = if measured >= target { "met" } else { "MISSED" };
    println!("{name:<62} {measured:>7.2}{unit} (target ≥ {target}{unit})  {verdict}");
}

/// The targets, each a ratio from this run.
pub fn targets(results: &Results, sweep: &[SweepRow]) {
    println!("## Targets (ratios from this run; the machine has 2 cores)");
    let deny = &results.deny;
    let gcra = deny.row("GCRA");
    judge(
        "keyed GCRA deny, 2 threads: throughput × governor keyed",
        deny.row("governor keyed").ns[1] / gcra.ns[1],
        4.0,
        "×",
    );
    judge(
        "keyed GCRA deny: 2-thread throughput × its 1-thread",
        gcra.scaling(),
        1.6,
        "×",
    );
    judge(
        "  the same deny, seeded foldhash (trusted keys): × governor",
        deny.row("governor keyed").ns[1] / deny.row("GCRA, foldhash").ns[1],
        4.0,
        "×",
    );
    let distinct = &results.distinct.last().expect("65 536 keys").1;
    let lock_free = distinct.row("lock-free");
    judge(
        "GCRA admit, 65 536 keys, 2 threads: × governor keyed",
        distinct.row("governor keyed").ns[1] / lock_free.ns[1],
        2.0,
        "×",
    );
    judge(
        "  the same admit, seeded foldhash (trusted keys): × governor",
        distinct.row("governor keyed").ns[1] / distinct.row("lock-free, foldhash").ns[1],
        2.0,
        "×",
    );
    judge(
        "GCRA admit, 65 536 keys, 2 threads: × global mutex",
        distinct.row("global mutex").ns[1] / lock_free.ns[1],
        4.0,
        "×",
    );
    for row in sweep {
        let verdict = if row.lock_free_gcra <= row.governor {
            "met"
        } else {
            "MISSED"
        };
        #[allow(clippy::cast_precision_loss)]
        let excess_bytes = (row.lock_free_gcra - row.governor) * row.keys as f64;
        println!(
            "{:<62} {:>7.3} B vs governor {:.3} B ({excess_bytes:+.0} B in all)  {verdict}",
            format!(
                "bytes/key, lock-free GCRA, {} keys (target ≤ governor)",
                row.keys
            ),
            row.lock_free_gcra,
            row.governor
        );
    }
    let global = distinct.row("global mutex");
    println!(
        "{:<62} {:>7.2}× (below 1: slower with a second thread)",
        "global mutex 1→2 thread scaling, 65 536 keys",
        global.scaling()
    );
    println!();
}

/// Writes the SVG plots into `dir`; returns their paths.
pub fn plots(results: &Results, sweep: &[SweepRow], dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let throughput = |table: &Table| -> Vec<Series> {
        table
            .rows
            .iter()
            .map(|row| Series {
                name: row.name.to_owned(),
                points: THREADS
                    .iter()
                    .enumerate()
                    .map(|(column, &threads)| (threads as f64, row.mops(column)))
                    .collect(),
            })
            .collect()
    };
    let distinct = &results.distinct.last().expect("65 536 keys").1;
    #[allow(clippy::cast_precision_loss)]
    let memory = vec![
        Series {
            name: "governor keyed".into(),
            points: sweep
                .iter()
                .map(|row| (row.keys as f64, row.governor))
                .collect(),
        },
        Series {
            name: "lock-free GCRA".into(),
            points: sweep
                .iter()
                .map(|row| (row.keys as f64, row.lock_free_gcra))
                .collect(),
        },
        Series {
            name: "lock-free tok. bucket".into(),
            points: sweep
                .iter()
                .map(|row| (row.keys as f64, row.lock_free_token_bucket))
                .collect(),
        },
        Series {
            name: "per-key GCRA".into(),
            points: sweep
                .iter()
                .map(|row| (row.keys as f64, row.per_key_gcra))
                .collect(),
        },
        Series {
            name: "sharded GCRA".into(),
            points: sweep
                .iter()
                .map(|row| (row.keys as f64, row.sharded_gcra))
                .collect(),
        },
        Series {
            name: "floor (16 B)".into(),
            points: sweep.iter().map(|row| (row.keys as f64, 16.0)).collect(),
        },
    ];
    let charts = [
        (
            "scaling-by-store.svg",
            Chart {
                title: "GCRA admitting on 65 536 distinct keys",
                x_label: "threads (2 cores)",
                y_label: "million operations / s",
                log_x: false,
                series: throughput(distinct),
            },
        ),
        (
            "deny-by-algorithm.svg",
            Chart {
                title: "Denying on a drained hot key",
                x_label: "threads (2 cores)",
                y_label: "million operations / s",
                log_x: false,
                series: throughput(&results.deny),
            },
        ),
        (
            "bytes-per-key.svg",
            Chart {
                title: "Bytes per key, u64 keys (governor, lock-free and sharded GCRA coincide)",
                x_label: "keys",
                y_label: "bytes per key",
                log_x: true,
                series: memory,
            },
        ),
    ];
    charts
        .into_iter()
        .map(|(file, chart)| {
            let path = dir.join(file);
            std::fs::write(&path, chart.render())?;
            Ok(path)
        })
        .collect()
}
