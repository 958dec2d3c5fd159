//! The summary of the judged targets, the performance tables, and the plots
//! (drawn with plotters as SVG: the viewer draws the text, so no font is
//! loaded).

use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::{AsRangedCoord, DefaultFormatting, KeyPointHint, Ranged};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::memory::{Growth, PeerRow, SweepRow};
use crate::perf::{Judged, Results, THREADS, Table, Target, Verdict, print_table};
use crate::stats::median_ci;

/// The bytes-per-key target for u64 keys with GCRA on the default store.
const BYTES_PER_KEY_TARGET: f64 = 20.0;
/// The heap's peak while a store grows, at most this many times the heap
/// after the insert that grew it.
const PEAK_GROWTH_TARGET: f64 = 1.5;

/// One line of the summary.
struct Headline {
    name: String,
    measured: String,
    interval: String,
    /// The lowest and highest of the blocks' medians.
    between: String,
    /// How many blocks' intervals clear the target, of how many.
    blocks: String,
    target: String,
    verdict: Verdict,
}

/// The summary the report opens with: every judged target (the ratios of
/// `results`, the memory of `sweep` and `growth`, whichever ran) against
/// its target, with its verdict, and the rule that gives it.
pub fn summary(out: &mut String, results: Option<&Results>, sweep: &[SweepRow], growth: &[Growth]) {
    let mut lines = Vec::new();
    let judged: Vec<&Judged> = results
        .map(|results| {
            results
                .judged
                .iter()
                .filter(|judged| judged.verdict().is_some())
                .collect()
        })
        .unwrap_or_default();
    for judged in &judged {
        let (target, verdict) = match (judged.target, judged.verdict()) {
            (Target::AtLeast(target), Some(verdict)) => (format!("≥ {target}×"), verdict),
            (Target::AtMost(target), Some(verdict)) => (format!("≤ {target}×"), verdict),
            _ => continue,
        };
        let (lowest, highest) = judged.between_blocks();
        lines.push(Headline {
            name: judged.name.to_owned(),
            measured: format!("{:.2}×", judged.ratio.median),
            interval: format!("{:.2}–{:.2}", judged.ratio.low, judged.ratio.high),
            between: format!("{lowest:.2}–{highest:.2}"),
            blocks: format!("{}/{}", judged.blocks_met(), judged.blocks_run()),
            target,
            verdict,
        });
    }
    let exact = |met: bool| if met { Verdict::Met } else { Verdict::Missed };
    for row in sweep {
        lines.push(Headline {
            name: format!("B/key, lock-free GCRA, {} keys", thousands(row.keys)),
            measured: format!("{:.2} B", row.lock_free_gcra),
            interval: "exact".to_owned(),
            between: String::new(),
            blocks: String::new(),
            target: format!("≤ {BYTES_PER_KEY_TARGET} B"),
            verdict: exact(row.lock_free_gcra <= BYTES_PER_KEY_TARGET),
        });
    }
    if let Some(row) = growth.first() {
        lines.push(Headline {
            name: format!(
                "B/key, {}, worst of {}–{} keys",
                row.store,
                short_count(Growth::FROM as f64),
                short_count(Growth::TO as f64)
            ),
            measured: format!("{:.2} B", row.worst.0),
            interval: "exact".to_owned(),
            between: String::new(),
            blocks: String::new(),
            target: format!("≤ {BYTES_PER_KEY_TARGET} B"),
            verdict: exact(row.worst.0 <= BYTES_PER_KEY_TARGET),
        });
        lines.push(Headline {
            name: format!("heap peak in growth ÷ after, {}", row.store),
            measured: format!("{:.2}×", row.peak.0),
            interval: "exact".to_owned(),
            between: String::new(),
            blocks: String::new(),
            target: format!("≤ {PEAK_GROWTH_TARGET}×"),
            verdict: exact(row.peak.0 <= PEAK_GROWTH_TARGET),
        });
    }
    say!(out, "# Summary: the judged targets\n");
    if results.is_some() && crate::parallel::cpu_count() < 2 {
        say!(
            out,
            "WARNING: this process may run on fewer than 2 CPUs (taskset?): the 2-thread \
             ratios below share one core and judge nothing.\n"
        );
    }
    if let Some(first) = judged.first() {
        say!(
            out,
            "Ratios: 2 threads on 2 cores unless named (A × B: A's throughput over B's; A ÷ B: \
             A's cost over B's),\nfrom paired runs in {} blocks of {} pairs spread over the \
             run, each block a fresh process: the\nmedian of all {} pairs with its 95 % \
             interval, the lowest and highest of the blocks' medians,\nand how many blocks' own \
             intervals clear the target. A ratio is MET only if every block's\ninterval clears \
             it (≥ t: its lower bound is at least t; ≤ t: its upper bound at most t); if\n\
             some block's interval reaches the target but not every one clears it, it is \
             MISSED (some blocks).",
            first.blocks_run(),
            first.blocks.first().map_or(0, |block| block.samples),
            first.ratio.samples
        );
    }
    if !sweep.is_empty() || !growth.is_empty() {
        say!(
            out,
            "Memory: exact bytes from the counting allocator, one measurement each."
        );
    }
    say!(out);
    say!(
        out,
        "{:<50} {:>9}  {:<11}  {:<14}  {:<6}  {:<7}  verdict",
        "",
        "measured",
        "95 % int.",
        "between blocks",
        "blocks",
        "target"
    );
    for line in &lines {
        say!(
            out,
            "{:<50} {:>9}  {:<11}  {:<14}  {:<6}  {:<7}  {}",
            line.name,
            line.measured,
            line.interval,
            line.between,
            line.blocks,
            line.target,
            line.verdict.as_str()
        );
    }
    let met = lines
        .iter()
        .filter(|line| line.verdict == Verdict::Met)
        .count();
    say!(out, "\n{met} of {} targets met.\n", lines.len());
    for failure in results.iter().flat_map(|results| &results.failures) {
        say!(
            out,
            "FAILED: {failure} (its pairs are missing from every ratio above, and each \
             counts as a block that missed)"
        );
    }
    if let Some(results) = results {
        blocks(out, results, &judged);
    }
}

/// Each judged block's process, in the order they ran: its line handoff
/// (`perf::line_handoff_ns`) and each judged ratio's median in it, so that
/// a ratio that moves between blocks can be read against the placement the
/// host gave that process.
fn blocks(out: &mut String, results: &Results, judged: &[&Judged]) {
    if results.block_handoffs.len() < 2 {
        return;
    }
    say!(
        out,
        "Each block's process: the ns a cache line took between the two CPUs, and each ratio's \
         median in it:"
    );
    let cells = |values: &mut dyn Iterator<Item = f64>| -> String {
        values.map(|value| format!("{value:>7.2}")).collect()
    };
    say!(
        out,
        "{:<50} {}",
        "line handoff, ns",
        cells(&mut results.block_handoffs.iter().copied())
    );
    for judged in judged {
        say!(
            out,
            "{:<50} {}",
            judged.name,
            cells(&mut judged.blocks.iter().map(|block| block.median))
        );
    }
    say!(out);
}

/// A key count in thousands or millions: "100 k", "2 M".
fn short_count(keys: f64) -> String {
    if keys >= 1e6 {
        format!("{} M", tick(keys / 1e6))
    } else {
        format!("{} k", tick(keys / 1e3))
    }
}

/// `n` with a space between groups of three digits.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut grouped = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            grouped.push(' ');
        }
        grouped.push(digit);
    }
    grouped
}

/// Prints every performance table, each against governor where it has a
/// row, the pieces of a keyed check and the ratios shown, not judged (the
/// last two with diagnostics only).
pub fn print(out: &mut String, results: &Results) {
    print_table(out, &results.deny, Some("governor keyed"));
    if let Some(table) = &results.deny_with_clock {
        print_table(out, table, None);
    }
    for table in &results.fewer_keys {
        print_table(out, table, Some("governor keyed"));
    }
    print_table(out, &results.distinct, Some("governor keyed"));
    if let Some(table) = &results.by_algorithm {
        print_table(out, table, None);
    }
    if let Some(table) = &results.hot {
        print_table(out, table, Some("governor keyed"));
    }
    if !results.pieces.is_empty() {
        say!(
            out,
            "## The pieces of a keyed check, one at a time on one pinned thread (beyond an \
             empty step's cost)"
        );
        for (name, ns) in &results.pieces {
            say!(out, "{name:<34} {ns:>7.2} ns");
        }
        say!(out);
    }
    let shown: Vec<&Judged> = results
        .judged
        .iter()
        .filter(|judged| judged.verdict().is_none())
        .collect();
    if let Some(first) = shown.first() {
        say!(
            out,
            "## Ratios shown, not judged (2 threads unless named; the median of {} paired \
             runs, every block's, and its 95 % interval)",
            first.ratio.samples
        );
        for judged in shown {
            say!(
                out,
                "{:<76} {:>6.3}× ({:.3}–{:.3})",
                judged.name.trim_start(),
                judged.ratio.median,
                judged.ratio.low,
                judged.ratio.high
            );
        }
        say!(out);
    }
}

/// The Okabe–Ito palette (colour-blind safe) without its yellow, too pale
/// on white; black is kept for the baseline.
const PALETTE: [RGBColor; 6] = [
    RGBColor(0, 114, 178),   // blue
    RGBColor(213, 94, 0),    // vermillion
    RGBColor(0, 158, 115),   // bluish green
    RGBColor(230, 159, 0),   // orange
    RGBColor(204, 121, 167), // reddish purple
    RGBColor(86, 180, 233),  // sky blue
];
/// The baseline's colour (governor's rows): drawn dashed.
const BASELINE: RGBColor = RGBColor(0, 0, 0);
/// The reference lines' (a target, a floor).
const REFERENCE: RGBColor = RGBColor(110, 110, 110);
const FONT: &str = "sans-serif";

/// One line of a chart: points with intervals `(x, y, low, high)`.
struct Series {
    name: String,
    points: Vec<(f64, f64, f64, f64)>,
    colour: RGBColor,
    /// Drawn dashed: the baseline, or a line that lies on one drawn
    /// before it.
    dashed: bool,
}

/// Whether all four numbers of a point are finite (an interval with a
/// bound of 0 ns has an infinite reciprocal, which no axis can place).
fn finite(point: &(f64, f64, f64, f64)) -> bool {
    point.0.is_finite() && point.1.is_finite() && point.2.is_finite() && point.3.is_finite()
}

/// The rows of `table` named in `rows` (row name, legend label), as
/// throughput series (Mop/s per thread count, with intervals), in that
/// order; rows absent from the table are left out. governor's keyed row
/// is the baseline: black and dashed.
fn throughput(table: &Table, rows: &[(&str, &str)]) -> Vec<Series> {
    let mut colours = PALETTE.iter().copied().cycle();
    rows.iter()
        .filter_map(|&(name, label)| {
            table
                .rows
                .iter()
                .find(|row| row.name == name)
                .zip(Some(label))
        })
        .map(|(row, label)| {
            let baseline = row.name == "governor keyed";
            Series {
                name: label.to_owned(),
                points: THREADS
                    .iter()
                    .enumerate()
                    .map(|(column, &threads)| {
                        let mops = row.mops(column);
                        #[allow(clippy::cast_precision_loss)]
                        (threads as f64, mops.median, mops.low, mops.high)
                    })
                    .collect(),
                colour: if baseline {
                    BASELINE
                } else {
                    colours.next().expect("a cycle")
                },
                dashed: baseline,
            }
        })
        .collect()
}

/// Whether two series have the same x and, at every point, values within
/// 1 % of each other (so that one line hides the other).
fn coincide(a: &Series, b: &Series) -> bool {
    a.points.len() == b.points.len()
        && a.points
            .iter()
            .zip(&b.points)
            .all(|(p, q)| p.0 == q.0 && (p.1 - q.1).abs() <= 0.01 * p.1.abs().max(q.1.abs()))
}

/// A horizontal reference line, drawn grey and dotted with its label.
struct Reference {
    label: String,
    y: f64,
}

type Plotted = Result<(), Box<dyn std::error::Error>>;

/// An axis with its ticks at given values (plotters' `WithKeyPoints`, whose
/// labels its mesh cannot format on an f64 axis).
struct Ticked<R> {
    inner: R,
    ticks: Vec<f64>,
}

impl<R: Ranged<ValueType = f64>> Ranged for Ticked<R> {
    type ValueType = f64;
    type FormatOption = DefaultFormatting;

    fn range(&self) -> std::ops::Range<f64> {
        self.inner.range()
    }

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn axis_pixel_range(&self, limit: (i32, i32)) -> std::ops::Range<i32> {
        self.inner.axis_pixel_range(limit)
    }
}

/// `range` with its ticks at `ticks`.
fn ticked<X>(range: X, ticks: Vec<f64>) -> Ticked<X::CoordDescType>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: Ranged<ValueType = f64>,
{
    Ticked {
        inner: range.into(),
        ticks,
    }
}

/// A line chart's x axis: its ticks, how a tick reads, and how far apart
/// (in x units) the series' points at one x are drawn, so that their
/// intervals do not overlap.
struct XAxis {
    desc: &'static str,
    ticks: Vec<f64>,
    label: fn(&f64) -> String,
    dodge: f64,
}

/// Draws `series` (at most about six) on `x_range` × `0..max y`, each point
/// with its interval, `references` as labelled dotted lines, and the
/// legend to the right of the plot, in the order of the lines' last
/// points, top to bottom.
fn line_chart<X>(
    path: &Path,
    title: &str,
    x_range: X,
    x: &XAxis,
    y_desc: &str,
    series: &[Series],
    references: &[Reference],
) -> Plotted
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: Ranged<ValueType = f64>,
{
    if series.is_empty() {
        return Err("no series to draw".into());
    }
    let top = series
        .iter()
        .flat_map(|line| {
            line.points
                .iter()
                .filter(|point| finite(point))
                .map(|point| point.3)
        })
        .chain(references.iter().map(|line| line.y))
        .fold(1.0_f64, f64::max)
        * 1.08;
    let root = SVGBackend::new(path, (980, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, (FONT, 19))?;
    let (plot, legend) = root.split_horizontally(730);
    let mut chart = ChartBuilder::on(&plot)
        .margin(12)
        .x_label_area_size(46)
        .y_label_area_size(64)
        .build_cartesian_2d(ticked(x_range, x.ticks.clone()), 0.0..top)?;
    let y_label = |y: &f64| {
        if top > 20.0 {
            format!("{y:.0}")
        } else {
            format!("{y:.1}")
        }
    };
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .bold_line_style(RGBColor(225, 225, 225))
        .x_desc(x.desc)
        .y_desc(y_desc)
        .x_label_formatter(&x.label)
        .y_label_formatter(&y_label)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .draw()?;
    for reference in references {
        let (left, right) = (chart.x_range().start, chart.x_range().end);
        chart.draw_series(DashedLineSeries::new(
            [(left, reference.y), (right, reference.y)],
            2,
            4,
            REFERENCE.stroke_width(1),
        ))?;
        chart.draw_series(std::iter::once(Text::new(
            reference.label.clone(),
            (left, reference.y),
            (FONT, 13)
                .into_font()
                .color(&REFERENCE)
                .pos(Pos::new(HPos::Left, VPos::Bottom)),
        )))?;
    }
    let count = series.len();
    #[allow(clippy::cast_precision_loss)]
    let offset = |index: usize| (index as f64 - (count - 1) as f64 / 2.0) * x.dodge;
    let mut styles = Vec::new();
    for (index, line) in series.iter().enumerate() {
        let dashed = line.dashed
            || series[..index]
                .iter()
                .any(|earlier| coincide(earlier, line));
        let style = line.colour.stroke_width(2);
        // The points a little apart, so that intervals at one x stay apart.
        let place = |x_value: f64| x_value + offset(index);
        let points: Vec<(f64, f64)> = line
            .points
            .iter()
            .filter(|point| finite(point))
            .map(|&(x_value, y, _, _)| (place(x_value), y))
            .collect();
        if dashed {
            chart.draw_series(DashedLineSeries::new(points.clone(), 8, 7, style))?;
        } else {
            chart.draw_series(LineSeries::new(points.clone(), style))?;
        }
        chart.draw_series(
            line.points
                .iter()
                .filter(|point| finite(point) && point.2 < point.3)
                .map(|&(x_value, y, low, high)| {
                    ErrorBar::new_vertical(place(x_value), low, y, high, line.colour.filled(), 8)
                }),
        )?;
        chart.draw_series(
            points
                .iter()
                .map(|&point| Circle::new(point, 3, line.colour.filled())),
        )?;
        styles.push((dashed, style));
    }
    // The legend: one entry a series, in the order of their last points.
    let mut order: Vec<usize> = (0..count).collect();
    let last = |index: usize| {
        series[index]
            .points
            .iter()
            .rev()
            .find(|point| finite(point))
            .map_or(f64::NEG_INFINITY, |point| point.1)
    };
    order.sort_by(|&a, &b| last(b).total_cmp(&last(a)));
    legend.draw(&Text::new(
        "top to bottom: as the lines end",
        (4, 16),
        (FONT, 12).into_font().color(&REFERENCE),
    ))?;
    for (row, &index) in order.iter().enumerate() {
        #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
        let y = 48 + 26 * row as i32;
        let (dashed, style) = styles[index];
        if dashed {
            legend.draw(&DashedPathElement::new([(6, y), (40, y)], 8, 7, style))?;
        } else {
            legend.draw(&PathElement::new([(6, y), (40, y)], style))?;
        }
        legend.draw(&Circle::new((23, y), 3, series[index].colour.filled()))?;
        legend.draw(&Text::new(
            series[index].name.clone(),
            (48, y - 8),
            (FONT, 15),
        ))?;
    }
    root.present()?;
    Ok(())
}

/// One row of a ratio chart: its label, the ratio and its interval, and
/// the colour of its point.
struct RatioRow {
    label: String,
    ratio: f64,
    low: f64,
    high: f64,
    colour: RGBColor,
}

/// Each judged ratio over its target (1: the target; an "at most" target
/// inverted, so that right of 1 is met for all), with its interval, and
/// its verdict in its label and colour.
fn over_targets(judged: &[Judged]) -> Vec<RatioRow> {
    judged
        .iter()
        .filter_map(|judged| {
            let verdict = judged.verdict()?;
            let ratio = judged.ratio;
            let (median, low, high, target) = match judged.target {
                Target::AtLeast(target) => (
                    ratio.median / target,
                    ratio.low / target,
                    ratio.high / target,
                    format!("≥ {target}"),
                ),
                Target::AtMost(target) => (
                    target / ratio.median,
                    target / ratio.high,
                    target / ratio.low,
                    format!("≤ {target}"),
                ),
                Target::Shown => return None,
            };
            Some(RatioRow {
                label: format!("{} (target {target}): {}", judged.name, verdict.as_str()),
                ratio: median,
                low,
                high,
                colour: if verdict == Verdict::Met {
                    PALETTE[2]
                } else {
                    PALETTE[1]
                },
            })
        })
        .collect()
}

/// The ratios shown but not judged (the A/A controls, the read path's
/// pieces, the layouts, the peer stores), as measured.
fn shown(judged: &[Judged]) -> Vec<RatioRow> {
    judged
        .iter()
        .filter(|judged| judged.verdict().is_none())
        .map(|judged| RatioRow {
            label: judged.name.trim_start().to_owned(),
            ratio: judged.ratio.median,
            low: judged.ratio.low,
            high: judged.ratio.high,
            colour: PALETTE[0],
        })
        .collect()
}

/// Each of the peer stores' figures over the purpose-built table's (above
/// 1: the table needs less): the median of the rounds' ratios (a round of
/// a store over the same round of the table) and their order-statistics
/// interval (their range below 6 rounds), a colour a store. Only ratios
/// of positive, finite figures.
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
        .zip(PALETTE.iter().copied().cycle())
        .flat_map(|(other, colour)| {
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
                    RatioRow {
                        label: format!("{}: {axis}", other.store),
                        ratio: ratio.median,
                        low: ratio.low,
                        high: ratio.high,
                        colour,
                    }
                })
            })
        })
        .collect()
}

/// Whether a row's ratio and bounds are positive and finite: a ratio with
/// a bound of 0 ns has none, and a log axis cannot place 0.
fn drawable(row: &RatioRow) -> bool {
    [row.ratio, row.low, row.high]
        .iter()
        .all(|value| value.is_finite() && *value > 0.0)
}

/// How a ratio chart's x axis runs.
enum Scale {
    Linear,
    Log,
}

/// Draws `rows`, one a line top to bottom, each a point with its interval,
/// labelled on the left, and a dark line at 1.
fn ratio_chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    scale: &Scale,
    rows: &[RatioRow],
) -> Plotted {
    let rows: Vec<&RatioRow> = rows.iter().filter(|row| drawable(row)).collect();
    if rows.is_empty() {
        return Err("no finite ratio to draw".into());
    }
    let count = rows.len();
    let (lowest, highest) = rows.iter().fold((1.0_f64, 1.0_f64), |(low, high), row| {
        (low.min(row.low), high.max(row.high))
    });
    let longest = rows
        .iter()
        .map(|row| row.label.chars().count())
        .max()
        .unwrap_or(0);
    #[allow(clippy::cast_possible_truncation)]
    let (label_width, height) = (
        (longest as u32 * 13 / 2 + 24).clamp(120, 700),
        110 + 34 * count as u32,
    );
    let root = SVGBackend::new(path, (label_width + 660, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, (FONT, 18))?;
    #[allow(clippy::cast_precision_loss)]
    let y_range = ticked(
        -0.5..count as f64 - 0.5,
        (0..count).map(|y| y as f64).collect(),
    );
    let label = |y: &f64| {
        // The key points are the rows' indices, bottom to top.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let index = count - 1 - (y.round() as usize).min(count - 1);
        rows[index].label.clone()
    };
    let mut builder = ChartBuilder::on(&root);
    builder
        .margin(12)
        .margin_right(24)
        .x_label_area_size(48)
        .y_label_area_size(label_width);
    match scale {
        Scale::Linear => {
            let right = highest * 1.12;
            let mut chart = builder.build_cartesian_2d(0.0..right, y_range)?;
            chart
                .configure_mesh()
                .disable_y_mesh()
                .light_line_style(WHITE)
                .bold_line_style(RGBColor(225, 225, 225))
                .x_labels(10)
                .x_label_formatter(&|x| tick(*x))
                .y_label_formatter(&label)
                .x_desc(x_desc)
                .label_style((FONT, 13))
                .axis_desc_style((FONT, 14))
                .draw()?;
            rows_on(&mut chart, &rows)?;
        }
        Scale::Log => {
            let range = lowest * 0.85..highest * 1.18;
            let ticks = log_ticks(&range);
            let mut chart =
                builder.build_cartesian_2d(ticked(range.log_scale(), ticks), y_range)?;
            chart
                .configure_mesh()
                .disable_y_mesh()
                .light_line_style(WHITE)
                .bold_line_style(RGBColor(225, 225, 225))
                .x_label_formatter(&|x| tick(*x))
                .y_label_formatter(&label)
                .x_desc(x_desc)
                .label_style((FONT, 13))
                .axis_desc_style((FONT, 14))
                .draw()?;
            rows_on(&mut chart, &rows)?;
        }
    }
    root.present()?;
    Ok(())
}

/// Draws the line at 1 and each row's point and interval on `chart`, the
/// first row at the top.
fn rows_on<X, Y>(
    chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<X, Y>>,
    rows: &[&RatioRow],
) -> Plotted
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let count = rows.len();
    #[allow(clippy::cast_precision_loss)]
    let top = count as f64 - 0.5;
    chart.draw_series(LineSeries::new(
        [(1.0, -0.5), (1.0, top)],
        BLACK.stroke_width(1),
    ))?;
    chart.draw_series(rows.iter().enumerate().map(|(index, row)| {
        #[allow(clippy::cast_precision_loss)]
        let y = (count - 1 - index) as f64;
        ErrorBar::new_horizontal(y, row.low, row.ratio, row.high, row.colour.filled(), 10)
    }))?;
    Ok(())
}

/// A tick's text: as few decimals as it needs.
fn tick(x: f64) -> String {
    let text = format!("{x:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// Ticks for a log axis over `range`: the 1-2-5 steps of each decade, or
/// finer steps when they give fewer than five ticks.
fn log_ticks(range: &std::ops::Range<f64>) -> Vec<f64> {
    const STEPS: [&[f64]; 4] = [
        &[1.0, 2.0, 5.0],
        &[1.0, 1.5, 2.0, 3.0, 5.0, 7.0],
        &[1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0],
        &[
            1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0, 2.2, 2.4, 2.6, 2.8, 3.0, 3.5,
            4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0,
        ],
    ];
    #[allow(clippy::cast_possible_truncation)]
    let (first, last) = (
        range.start.log10().floor() as i32,
        range.end.log10().ceil() as i32,
    );
    let mut ticks = Vec::new();
    for steps in STEPS {
        ticks = (first..=last)
            .flat_map(|decade| steps.iter().map(move |step| step * 10_f64.powi(decade)))
            .filter(|tick| range.contains(tick))
            .collect();
        if ticks.len() >= 5 {
            break;
        }
    }
    ticks
}

/// A chart of some rows of a performance table: throughput by threads.
struct ThroughputChart<'a> {
    file: &'static str,
    title: &'static str,
    table: &'a Table,
    /// The rows drawn (row name, legend label), at most six.
    rows: &'static [(&'static str, &'static str)],
    /// Drawn only with diagnostics (its rows exist only then).
    diagnostic: bool,
}

/// Writes the SVG plots into `dir`; returns their paths. With `results`
/// (when the performance section ran): the scaling and denial charts (the
/// diagnostic ones when it ran with diagnostics), the judged ratios and
/// the ratios shown; with `sweep`, bytes per key; with `peers`, the peer
/// stores against the table.
pub fn plots(
    results: Option<&Results>,
    sweep: &[SweepRow],
    peers: &[PeerRow],
    dir: &Path,
) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let mut draw = |file: &str, chart: &dyn Fn(&Path) -> Plotted| -> std::io::Result<()> {
        let path = dir.join(file);
        chart(&path).map_err(|error| std::io::Error::other(format!("{file}: {error}")))?;
        written.push(path);
        Ok(())
    };
    if let Some(results) = results {
        let threads = XAxis {
            desc: "threads (4 oversubscribe the 2 cores)",
            ticks: vec![1.0, 2.0, 4.0],
            label: |x| format!("{x:.0}"),
            dodge: 0.045,
        };
        let mops = "million operations / s (median, 95 % interval)";
        let charts = [
            ThroughputChart {
                file: "scaling-by-store.svg",
                title: "GCRA admitting on 65 536 distinct keys, by store",
                table: &results.distinct,
                rows: &[
                    ("lock-free", "lock-free (default)"),
                    ("lock-free, foldhash", "lock-free, foldhash"),
                    ("sharded", "sharded"),
                    ("per-key", "per-key"),
                    ("global mutex", "global mutex"),
                    ("governor keyed", "governor keyed"),
                ],
                diagnostic: false,
            },
            ThroughputChart {
                file: "deny-by-algorithm.svg",
                title: "Denying on a drained hot key, by algorithm (default store)",
                table: &results.deny,
                rows: &[
                    ("GCRA", "GCRA"),
                    ("fixed window", "fixed window"),
                    ("token bucket", "token bucket"),
                    ("sliding counter", "sliding counter"),
                    ("sliding counter, locked", "sliding counter, locked"),
                    ("sliding log", "sliding log"),
                ],
                diagnostic: false,
            },
            ThroughputChart {
                file: "deny-keyed-against-direct.svg",
                title: "Denying on a drained hot key: keyed, direct, and governor",
                table: &results.deny,
                rows: &[
                    ("GCRA", "keyed GCRA (default)"),
                    ("GCRA, foldhash", "keyed GCRA, foldhash"),
                    ("GCRA direct", "direct GCRA (no key)"),
                    ("governor direct", "governor direct"),
                    ("governor keyed", "governor keyed"),
                ],
                diagnostic: false,
            },
            ThroughputChart {
                file: "deny-read-path.svg",
                title: "Denying on a drained hot key: the read path's pieces",
                table: &results.deny,
                rows: &[
                    ("GCRA", "keyed GCRA"),
                    ("GCRA, its control", "keyed GCRA, wrapped"),
                    (
                        "GCRA in a held read section",
                        "keyed GCRA, in a held read section",
                    ),
                    ("GCRA cell in a HashMap", "cell in a HashMap"),
                    (
                        "the same, a crossbeam-epoch pin",
                        "cell in a HashMap, crossbeam-epoch pinned",
                    ),
                    ("the same, a read counter", "cell in a HashMap, counted"),
                ],
                diagnostic: true,
            },
            ThroughputChart {
                file: "deny-peer-maps.svg",
                title: "Denying on a drained hot key: GCRA on other maps",
                table: &results.deny,
                rows: &[
                    ("GCRA", "lock-free table"),
                    ("GCRA on papaya", "papaya"),
                    ("GCRA on scc::HashIndex", "scc::HashIndex"),
                    ("GCRA on flurry", "flurry"),
                    ("governor keyed", "governor keyed"),
                ],
                diagnostic: true,
            },
            ThroughputChart {
                file: "scaling-layouts.svg",
                title: "GCRA admitting on 65 536 distinct keys: the table's layout",
                table: &results.distinct,
                rows: &[
                    ("lock-free", "lock-free (default)"),
                    ("lock-free, unshared", "one table a thread"),
                    ("lock-free, keys mixed", "threads' keys mixed"),
                    ("lock-free, keys apart", "threads' keys apart"),
                    ("lock-free, a cell a line", "a cell a cache line"),
                ],
                diagnostic: true,
            },
            ThroughputChart {
                file: "scaling-read-path.svg",
                title: "GCRA admitting on 65 536 distinct keys: hasher and guard",
                table: &results.distinct,
                rows: &[
                    ("lock-free", "lock-free (default)"),
                    ("lock-free, foldhash", "lock-free, foldhash"),
                    ("lock-free, its control", "lock-free, wrapped"),
                    (
                        "lock-free in a held read section",
                        "lock-free, in a held read section",
                    ),
                ],
                diagnostic: true,
            },
            ThroughputChart {
                file: "scaling-peer-maps.svg",
                title: "GCRA admitting on 65 536 distinct keys: other maps",
                table: &results.distinct,
                rows: &[
                    ("lock-free", "lock-free table"),
                    ("papaya", "papaya"),
                    ("scc::HashIndex", "scc::HashIndex"),
                    ("flurry", "flurry"),
                    ("governor keyed", "governor keyed"),
                ],
                diagnostic: true,
            },
        ];
        for chart in charts {
            if chart.diagnostic && !results.diagnostics {
                continue;
            }
            draw(chart.file, &|path| {
                line_chart(
                    path,
                    chart.title,
                    0.7..4.3,
                    &threads,
                    mops,
                    &throughput(chart.table, chart.rows),
                    &[],
                )
            })?;
        }
        let targets = over_targets(&results.judged);
        draw("judged-ratios.svg", &|path| {
            ratio_chart(
                path,
                "Judged ratios over their targets (median, 95 % interval)",
                "ratio ÷ target (met: the whole interval at or right of 1)",
                &Scale::Linear,
                &targets,
            )
        })?;
        let shown = shown(&results.judged);
        if !shown.is_empty() {
            draw("shown-ratios.svg", &|path| {
                ratio_chart(
                    path,
                    "Ratios shown, not judged (median, 95 % interval)",
                    "ratio as named (× throughput, ÷ cost; 1: level), log scale",
                    &Scale::Log,
                    &shown,
                )
            })?;
        }
    }
    if !sweep.is_empty() {
        draw("bytes-per-key.svg", &|path| bytes_per_key(path, sweep))?;
    }
    written.extend(peer_plot(peers, dir)?);
    Ok(written)
}

/// Bytes per key retained by each store at each key count of `sweep`,
/// against the target and the floor; the title names the stores whose
/// lines coincide.
fn bytes_per_key(path: &Path, sweep: &[SweepRow]) -> Plotted {
    #[allow(clippy::cast_precision_loss)]
    let line = |name: &str, bytes: fn(&SweepRow) -> f64, colour: RGBColor, dashed: bool| Series {
        name: name.to_owned(),
        points: sweep
            .iter()
            .map(|row| {
                let y = bytes(row);
                (row.keys as f64, y, y, y)
            })
            .collect(),
        colour,
        dashed,
    };
    let series = vec![
        line(
            "lock-free GCRA",
            |row| row.lock_free_gcra,
            PALETTE[0],
            false,
        ),
        line(
            "lock-free token bucket",
            |row| row.lock_free_token_bucket,
            PALETTE[1],
            false,
        ),
        line("sharded GCRA", |row| row.sharded_gcra, PALETTE[2], false),
        line("per-key GCRA", |row| row.per_key_gcra, PALETTE[3], false),
        line("governor keyed", |row| row.governor, BASELINE, true),
    ];
    let mut same = Vec::new();
    for (index, line) in series.iter().enumerate() {
        for other in &series[index + 1..] {
            if coincide(line, other) {
                same.push(format!("{} and {}", line.name, other.name));
            }
        }
    }
    let title = if same.is_empty() {
        "Bytes per key retained, u64 keys".to_owned()
    } else {
        format!(
            "Bytes per key retained, u64 keys ({} coincide)",
            same.join("; ")
        )
    };
    #[allow(clippy::cast_precision_loss)]
    let ticks: Vec<f64> = sweep.iter().map(|row| row.keys as f64).collect();
    let (fewest, most) = (
        ticks.first().copied().unwrap_or(1.0),
        ticks.last().copied().unwrap_or(10.0),
    );
    let keys = XAxis {
        desc: "keys (log scale)",
        ticks,
        label: |keys| short_count(*keys),
        dodge: 0.0,
    };
    line_chart(
        path,
        &title,
        (fewest / 1.3..most * 1.3).log_scale(),
        &keys,
        "bytes per key",
        &series,
        &[
            Reference {
                label: format!(" target: {BYTES_PER_KEY_TARGET} B"),
                y: BYTES_PER_KEY_TARGET,
            },
            Reference {
                label: " floor: a u64 key and 8 B of state, 16 B".to_owned(),
                y: 16.0,
            },
        ],
    )
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
        "The stores on other maps ÷ the lock-free table (the rounds' ratios: median, range)",
        "store ÷ table, log scale (right of 1: the table needs less)",
        &Scale::Log,
        &rows,
    )
    .map_err(|error| std::io::Error::other(format!("peer-stores.svg: {error}")))?;
    Ok(Some(path))
}

/// A figure of a fleet's run that a plot draws.
type FleetFigure = fn(&tollgate_sim::tally::Figures) -> f64;

/// Writes the fleets' plots into `dir`: the hot key's calls a check, and its
/// admissions over the reference's, against the fleet's size, a line per
/// design; returns their paths.
pub fn fleet_plots(
    rows: &[tollgate_sim::report::Row],
    dir: &Path,
) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    #[allow(clippy::cast_precision_loss)]
    let sizes: Vec<f64> = {
        let mut sizes: Vec<f64> = rows.iter().map(|row| row.0 as f64).collect();
        sizes.sort_by(f64::total_cmp);
        sizes.dedup();
        sizes
    };
    let (fewest, most) = (
        sizes.first().copied().unwrap_or(1.0),
        sizes.last().copied().unwrap_or(10.0),
    );
    let axis = XAxis {
        desc: "instances (log scale)",
        ticks: sizes,
        label: |instances| short_count(*instances),
        dodge: 0.0,
    };
    let series = |figure: FleetFigure| -> Vec<Series> {
        tollgate_sim::report::DESIGNS
            .iter()
            .enumerate()
            .map(|(index, design)| {
                #[allow(clippy::cast_precision_loss)]
                let points = rows
                    .iter()
                    .filter(|row| row.1 == *design)
                    .map(|row| {
                        let y = figure(&row.2);
                        (row.0 as f64, y, y, y)
                    })
                    .collect();
                Series {
                    name: (*design).to_owned(),
                    points,
                    colour: if index < PALETTE.len() {
                        PALETTE[index]
                    } else {
                        BASELINE
                    },
                    dashed: !design.starts_with("tollgate"),
                }
            })
            .collect()
    };
    let mut written = Vec::new();
    let charts: [(&str, &str, &str, FleetFigure); 2] = [
        (
            "fleets-calls.svg",
            "A hot key at ten times its limit: calls a check, by fleet (simulated)",
            "calls to a server or peer a check",
            |figures| figures.hot_calls_per_check,
        ),
        (
            "fleets-admitted.svg",
            "A hot key at ten times its limit: admitted ÷ one limiter with no delay (simulated)",
            "admitted ÷ the reference's",
            |figures| figures.admitted as f64 / figures.ideal.max(1) as f64,
        ),
    ];
    for (file, title, y_desc, figure) in charts {
        let path = dir.join(file);
        line_chart(
            &path,
            title,
            (fewest / 1.5..most * 1.5).log_scale(),
            &axis,
            y_desc,
            &series(figure),
            &[],
        )
        .map_err(|error| std::io::Error::other(format!("{file}: {error}")))?;
        written.push(path);
    }
    Ok(written)
}
