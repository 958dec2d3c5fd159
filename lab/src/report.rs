//! The performance tables, the targets judged in the same run, and the plots
//! (drawn with plotters as SVG: the viewer draws the text, so no font is
//! loaded).

use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use crate::memory::{Growth, SweepRow};
use crate::perf::{Judged, Results, THREADS, Table, Target, print_table};

/// The bytes-per-key target for u64 keys with GCRA (issue 12).
const BYTES_PER_KEY_TARGET: f64 = 20.0;
/// Issue 12: the heap's peak while a store grows, at most 1.5× the heap
/// after the insert that grew it.
const PEAK_GROWTH_TARGET: f64 = 1.5;

/// Prints every performance table, each against governor where it has a row.
pub fn print(results: &Results) {
    print_table(&results.deny, Some("governor keyed"));
    print_table(&results.deny_with_clock, None);
    for (_, table) in &results.distinct {
        print_table(table, Some("governor keyed"));
    }
    print_table(&results.by_algorithm, None);
    print_table(&results.hot, Some("governor keyed"));
    println!(
        "## The pieces of a keyed check, one at a time on one pinned thread (beyond an empty \
         step's cost)"
    );
    for (name, ns) in &results.pieces {
        println!("{name:<34} {ns:>7.2} ns");
    }
    println!();
}

/// The targets: each judged ratio from its own pairs, then memory.
pub fn targets(results: &Results, sweep: &[SweepRow], growth: &[Growth]) {
    if crate::parallel::cpu_count() < 2 {
        println!(
            "WARNING: this process may run on fewer than 2 CPUs (taskset?): the 2-thread \
             ratios below share one core and judge nothing."
        );
    }
    let pairs = results
        .judged
        .first()
        .map_or(0, |judged| judged.ratio.samples);
    println!(
        "## Targets (2 threads on 2 cores; each ratio the median of {pairs} paired runs, \
         with its 95 % interval: met only if the whole interval meets the target)"
    );
    for judged in &results.judged {
        let target = match judged.target {
            Target::AtLeast(target) => format!("≥ {target}×"),
            Target::AtMost(target) => format!("≤ {target}×"),
            Target::Shown => String::new(),
        };
        println!(
            "{:<54} {:>6.3}× ({:.3}–{:.3}) {:>7}  {}",
            judged.name,
            judged.ratio.median,
            judged.ratio.low,
            judged.ratio.high,
            target,
            judged.verdict()
        );
    }
    let verdict = |met: bool| if met { "met" } else { "MISSED" };
    for row in sweep {
        println!(
            "{:<54} {:>7.3} B (target ≤ {BYTES_PER_KEY_TARGET} B; governor {:.3} B)  {}",
            format!("bytes/key, lock-free GCRA, {} keys", row.keys),
            row.lock_free_gcra,
            row.governor,
            verdict(row.lock_free_gcra <= BYTES_PER_KEY_TARGET)
        );
    }
    let governor = growth.iter().find(|row| row.store == "governor keyed");
    if let (Some(row), Some(governor)) = (growth.first(), governor) {
        println!(
            "{:<54} {:>7.3} B (target ≤ {BYTES_PER_KEY_TARGET} B; governor {:.3}–{:.3} B)  {}",
            format!(
                "bytes/key, {}, worst of {}..{} keys",
                row.store,
                Growth::FROM,
                Growth::TO
            ),
            row.worst.0,
            governor.best.0,
            governor.worst.0,
            verdict(row.worst.0 <= BYTES_PER_KEY_TARGET)
        );
        println!(
            "{:<54} {:>7.3}× (target ≤ {PEAK_GROWTH_TARGET}×)  {}",
            format!("peak during growth ÷ after, {}, 1 thread", row.store),
            row.peak.0,
            verdict(row.peak.0 <= PEAK_GROWTH_TARGET)
        );
    }
    println!();
}

/// One line of a chart: points with optional intervals `(x, y, low, high)`.
struct Series {
    name: String,
    points: Vec<(f64, f64, f64, f64)>,
}

/// Throughput series of a table: Mop/s per thread count, with intervals.
fn throughput(table: &Table) -> Vec<Series> {
    table
        .rows
        .iter()
        .map(|row| Series {
            name: row.name.to_owned(),
            points: THREADS
                .iter()
                .enumerate()
                .map(|(column, &threads)| {
                    let mops = row.mops(column);
                    #[allow(clippy::cast_precision_loss)]
                    (threads as f64, mops.median, mops.low, mops.high)
                })
                .collect(),
        })
        .collect()
}

type Plotted = Result<(), Box<dyn std::error::Error>>;

/// Draws `series` on `x_range` × `0..max y`, with error bars where a point
/// has an interval.
fn line_chart<X>(
    path: &Path,
    title: &str,
    labels: (&str, &str),
    x_range: X,
    series: &[Series],
) -> Plotted
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    // Only finite values are drawn (an interval with a bound of 0 ns has an
    // infinite reciprocal, and plotters cannot place ticks up to it).
    let finite = |point: &&(f64, f64, f64, f64)| {
        point.0.is_finite() && point.1.is_finite() && point.2.is_finite() && point.3.is_finite()
    };
    let top = series
        .iter()
        .flat_map(|line| line.points.iter().filter(finite).map(|point| point.3))
        .fold(1.0_f64, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (760, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(x_range, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc(labels.0)
        .y_desc(labels.1)
        .draw()?;
    for (index, line) in series.iter().enumerate() {
        let colour = Palette99::pick(index).to_rgba();
        chart
            .draw_series(LineSeries::new(
                line.points
                    .iter()
                    .filter(finite)
                    .map(|&(x, y, _, _)| (x, y)),
                colour.stroke_width(2),
            ))?
            .label(line.name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], colour.stroke_width(2)));
        chart.draw_series(
            line.points
                .iter()
                .filter(finite)
                .filter(|point| point.2 < point.3)
                .map(|&(x, y, low, high)| {
                    ErrorBar::new_vertical(x, low, y, high, colour.filled(), 6)
                }),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Each judged ratio over its target (1: the target; an "at most" target
/// inverted, so that right of 1 is met for all), with its interval.
fn judged_chart(path: &Path, judged: &[Judged]) -> Plotted {
    let shown: Vec<(&str, f64, f64, f64)> = judged
        .iter()
        .filter_map(|judged| {
            let ratio = judged.ratio;
            match judged.target {
                Target::AtLeast(target) => Some((
                    judged.name.trim_start(),
                    ratio.median / target,
                    ratio.low / target,
                    ratio.high / target,
                )),
                Target::AtMost(target) => Some((
                    judged.name.trim_start(),
                    target / ratio.median,
                    target / ratio.high,
                    target / ratio.low,
                )),
                Target::Shown => None,
            }
        })
        .filter(|row: &(&str, f64, f64, f64)| {
            row.1.is_finite() && row.2.is_finite() && row.3.is_finite()
        })
        .collect();
    if shown.is_empty() {
        return Ok(());
    }
    let right = shown.iter().map(|row| row.3).fold(1.0_f64, f64::max) * 1.15;
    let root = SVGBackend::new(path, (900, 60 + 44 * shown.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let (labels, plot) = root.split_horizontally(420);
    let mut chart = ChartBuilder::on(&plot)
        .caption(
            "Judged ratios over their targets (95 % intervals)",
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(36)
        .build_cartesian_2d(0.0..right, -0.5..shown.len() as f64 - 0.5)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("ratio ÷ target (≥ 1 over the whole interval: met)")
        .draw()?;
    chart.draw_series(LineSeries::new(
        [(1.0, -0.5), (1.0, shown.len() as f64 - 0.5)],
        RED.stroke_width(1),
    ))?;
    chart.draw_series(shown.iter().enumerate().map(|(index, row)| {
        #[allow(clippy::cast_precision_loss)]
        let y = (shown.len() - 1 - index) as f64;
        ErrorBar::new_horizontal(y, row.2, row.1, row.3, BLUE.filled(), 8)
    }))?;
    let area = plot.dim_in_pixel().1;
    for (index, row) in shown.iter().enumerate() {
        // The same rows as the chart's, top to bottom, inside its plotting
        // area (caption and margin above, the x labels below).
        #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
        let y = 40 + ((area - 86) as usize * (2 * index + 1) / (2 * shown.len())) as i32;
        labels.draw(&Text::new(row.0.to_owned(), (8, y), ("sans-serif", 13)))?;
    }
    root.present()?;
    Ok(())
}

/// Writes the SVG plots into `dir`; returns their paths.
pub fn plots(results: &Results, sweep: &[SweepRow], dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    #[allow(clippy::cast_precision_loss)]
    let memory_series = |name: &str, bytes: fn(&SweepRow) -> f64| Series {
        name: name.to_owned(),
        points: sweep
            .iter()
            .map(|row| {
                let y = bytes(row);
                (row.keys as f64, y, y, y)
            })
            .collect(),
    };
    let memory = vec![
        memory_series("governor keyed", |row| row.governor),
        memory_series("lock-free GCRA", |row| row.lock_free_gcra),
        memory_series("lock-free tok. bucket", |row| row.lock_free_token_bucket),
        memory_series("per-key GCRA", |row| row.per_key_gcra),
        memory_series("sharded GCRA", |row| row.sharded_gcra),
        memory_series("target (20 B)", |_| BYTES_PER_KEY_TARGET),
        memory_series("floor (16 B)", |_| 16.0),
    ];
    #[allow(clippy::cast_precision_loss)]
    let (fewest, most) = (
        sweep.first().map_or(1.0, |row| row.keys as f64),
        sweep.last().map_or(10.0, |row| row.keys as f64),
    );
    let distinct = &results.distinct.last().expect("65 536 keys").1;
    let threads = (0.8..4.2, ("threads (2 cores)", "million operations / s"));
    let mut written = Vec::new();
    let mut draw = |file: &str, chart: &dyn Fn(&Path) -> Plotted| -> std::io::Result<()> {
        let path = dir.join(file);
        chart(&path).map_err(|error| std::io::Error::other(format!("{file}: {error}")))?;
        written.push(path);
        Ok(())
    };
    draw("scaling-by-store.svg", &|path| {
        line_chart(
            path,
            "GCRA admitting on 65 536 distinct keys (95 % intervals)",
            threads.1,
            threads.0.clone(),
            &throughput(distinct),
        )
    })?;
    draw("deny-by-algorithm.svg", &|path| {
        line_chart(
            path,
            "Denying on a drained hot key (95 % intervals)",
            threads.1,
            threads.0.clone(),
            &throughput(&results.deny),
        )
    })?;
    if !sweep.is_empty() {
        draw("bytes-per-key.svg", &|path| {
            line_chart(
                path,
                "Bytes per key, u64 keys (governor, lock-free and sharded GCRA coincide)",
                ("keys", "bytes per key"),
                (fewest * 0.9..most * 1.1).log_scale(),
                &memory,
            )
        })?;
    }
    draw("judged-ratios.svg", &|path| {
        judged_chart(path, &results.judged)
    })?;
    Ok(written)
}
