//! The performance tables, the targets judged in the same run, and the plots
//! (drawn with plotters as SVG: the viewer draws the text, so no font is
//! loaded).

use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use crate::memory::{Growth, PeerRow, SweepRow};
use crate::perf::{Judged, Results, THREADS, Table, Target, print_table};
use crate::stats::median_ci;

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

/// One row of a ratio chart: its label, the ratio and its interval.
type RatioRow = (String, f64, f64, f64);

/// Each judged ratio over its target (1: the target; an "at most" target
/// inverted, so that right of 1 is met for all), with its interval.
fn over_targets(judged: &[Judged]) -> Vec<RatioRow> {
    judged
        .iter()
        .filter_map(|judged| {
            let (name, ratio) = (judged.name.trim_start().to_owned(), judged.ratio);
            match judged.target {
                Target::AtLeast(target) => Some((
                    name,
                    ratio.median / target,
                    ratio.low / target,
                    ratio.high / target,
                )),
                Target::AtMost(target) => Some((
                    name,
                    target / ratio.median,
                    target / ratio.high,
                    target / ratio.low,
                )),
                Target::Shown => None,
            }
        })
        .collect()
}

/// The ratios shown but not judged (the A/A control, the read path's
/// pieces, the table against the peer stores), as measured.
fn shown(judged: &[Judged]) -> Vec<RatioRow> {
    judged
        .iter()
        .filter(|judged| matches!(judged.target, Target::Shown))
        .map(|judged| {
            let ratio = judged.ratio;
            (
                judged.name.trim_start().to_owned(),
                ratio.median,
                ratio.low,
                ratio.high,
            )
        })
        .collect()
}

/// Each of the peer stores' figures over the purpose-built table's (above
/// 1: the table needs less): the median of the rounds' ratios (a round of
/// a store over the same round of the table) and their order-statistics
/// interval (their range below 6 rounds). Only ratios of positive, finite
/// figures.
fn over_table(peers: &[PeerRow]) -> Vec<RatioRow> {
    const AXES: [(&str, usize); 5] = [
        ("B/key, 100 000 keys", 0),
        ("B/key, 1 000 000 keys", 1),
        ("churn peak ÷ settled, 2 threads", 3),
        ("evict, all idle, ns a key", 4),
        ("evict, half idle, ns a key", 5),
    ];
    let Some(table) = peers.iter().find(|row| row.store == "lock-free") else {
        return Vec::new();
    };
    peers
        .iter()
        .filter(|row| row.store != table.store)
        .flat_map(|other| {
            AXES.iter().filter_map(move |&(axis, at)| {
                let mut ratios: Vec<f64> = other
                    .rounds
                    .iter()
                    .zip(&table.rounds)
                    .map(|(theirs, ours)| theirs[at] / ours[at])
                    .filter(|ratio| ratio.is_finite() && *ratio > 0.0)
                    .collect();
                (ratios.len() == table.rounds.len()).then(|| {
                    let ratio = median_ci(&mut ratios);
                    (
                        format!("{}: {axis}", other.store),
                        ratio.median,
                        ratio.low,
                        ratio.high,
                    )
                })
            })
        })
        .collect()
}

/// Draws `rows`, one a line top to bottom, each a point with its interval
/// on `x_range`, and a red line at 1.
fn ratio_chart<X>(path: &Path, title: &str, x_desc: &str, x_range: X, rows: &[RatioRow]) -> Plotted
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let rows: Vec<&RatioRow> = rows.iter().filter(|row| drawable(row)).collect();
    if rows.is_empty() {
        return Err("no finite ratio to draw".into());
    }
    let count = rows.len();
    #[allow(clippy::cast_possible_truncation)]
    let height = 60 + 44 * count as u32;
    let root = SVGBackend::new(path, (1_160, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (labels, plot) = root.split_horizontally(480);
    #[allow(clippy::cast_precision_loss)]
    let y_range = -0.5..count as f64 - 0.5;
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(36)
        .build_cartesian_2d(x_range, y_range.clone())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_labels(8)
        .x_label_formatter(&|x| format!("{x:.2}"))
        .x_desc(x_desc)
        .draw()?;
    chart.draw_series(LineSeries::new(
        [(1.0, y_range.start), (1.0, y_range.end)],
        RED.stroke_width(1),
    ))?;
    chart.draw_series(rows.iter().enumerate().map(|(index, row)| {
        #[allow(clippy::cast_precision_loss)]
        let y = (count - 1 - index) as f64;
        ErrorBar::new_horizontal(y, row.2, row.1, row.3, BLUE.filled(), 8)
    }))?;
    let area = plot.dim_in_pixel().1;
    for (index, row) in rows.iter().enumerate() {
        // The same rows as the chart's, top to bottom, inside its plotting
        // area (caption and margin above, the x labels below).
        #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
        let y = 40 + ((area - 86) as usize * (2 * index + 1) / (2 * count)) as i32;
        labels.draw(&Text::new(row.0.clone(), (8, y), ("sans-serif", 13)))?;
    }
    root.present()?;
    Ok(())
}

/// Whether a row's ratio and bounds are positive and finite: a ratio with
/// a bound of 0 ns has none, and a log axis cannot place 0.
fn drawable(row: &RatioRow) -> bool {
    [row.1, row.2, row.3]
        .iter()
        .all(|value| value.is_finite() && *value > 0.0)
}

/// From 0 to a little right of the drawable rows' highest bound and of 1.
fn linear_to_fit(rows: &[RatioRow]) -> std::ops::Range<f64> {
    let right = rows
        .iter()
        .filter(|row| drawable(row))
        .fold(1.0_f64, |right, row| right.max(row.3));
    0.0..right * 1.15
}

/// A little beyond the drawable rows' lowest and highest bounds, and 1:
/// for a log scale.
fn log_to_fit(rows: &[RatioRow]) -> std::ops::Range<f64> {
    let (lowest, highest) = rows
        .iter()
        .filter(|row| drawable(row))
        .fold((1.0_f64, 1.0_f64), |(low, high), row| {
            (low.min(row.2), high.max(row.3))
        });
    lowest * 0.8..highest * 1.25
}

/// Writes the SVG plots into `dir`; returns their paths.
pub fn plots(
    results: &Results,
    sweep: &[SweepRow],
    peers: &[PeerRow],
    dir: &Path,
) -> std::io::Result<Vec<PathBuf>> {
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
    let targets = over_targets(&results.judged);
    draw("judged-ratios.svg", &|path| {
        ratio_chart(
            path,
            "Judged ratios over their targets (95 % intervals)",
            "ratio ÷ target (≥ 1 over the whole interval: met)",
            linear_to_fit(&targets),
            &targets,
        )
    })?;
    let shown = shown(&results.judged);
    draw("shown-ratios.svg", &|path| {
        ratio_chart(
            path,
            "Ratios shown, not judged (95 % intervals)",
            "ratio, as named (1: level), log scale",
            log_to_fit(&shown).log_scale(),
            &shown,
        )
    })?;
    written.extend(peer_plot(peers, dir)?);
    Ok(written)
}

/// Writes the peer stores' figures over the table's into `dir` (nothing
/// when the peer table did not run); returns the plot's path.
pub fn peer_plot(peers: &[PeerRow], dir: &Path) -> std::io::Result<Option<PathBuf>> {
    let rows = over_table(peers);
    if rows.is_empty() {
        return Ok(None);
    }
    std::fs::create_dir_all(dir)?;
    let path = dir.join("peer-stores.svg");
    ratio_chart(
        &path,
        "The peer stores ÷ the purpose-built table (the rounds' ratios: median, range)",
        "store ÷ table, log scale (> 1: the table needs less)",
        log_to_fit(&rows).log_scale(),
        &rows,
    )
    .map_err(|error| std::io::Error::other(format!("peer-stores.svg: {error}")))?;
    Ok(Some(path))
}
