//! Line charts written as plain SVG: axes, grid, one polyline per series,
//! a legend. No plotting dependency, no fonts to load.

use std::fmt::Write as _;

/// One line on a chart.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A chart: title, axis labels, series; `log_x` spaces x logarithmically.
pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub log_x: bool,
    pub series: Vec<Series>,
}

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [&str; 12] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#17becf", "#bcbd22", "#393b79", "#000000",
];

impl Chart<'_> {
    /// The chart as an SVG document.
    pub fn render(&self) -> String {
        let xs = || {
            self.series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.0))
        };
        let ys = || {
            self.series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.1))
        };
        let scale_x = |x: f64| if self.log_x { x.log10() } else { x };
        let (x_min, x_max) = (
            xs().map(scale_x).fold(f64::INFINITY, f64::min),
            xs().map(scale_x).fold(f64::NEG_INFINITY, f64::max),
        );
        let y_max = ys().fold(0.0_f64, f64::max) * 1.1;
        let plot_width = WIDTH - LEFT - RIGHT;
        let plot_height = HEIGHT - TOP - BOTTOM;
        let x_span = if x_max > x_min { x_max - x_min } else { 1.0 };
        let to_x = |x: f64| LEFT + (scale_x(x) - x_min) / x_span * plot_width;
        let to_y = |y: f64| TOP + plot_height - y / y_max.max(f64::MIN_POSITIVE) * plot_height;

        let mut svg = String::new();
        let _ = write!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = write!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = write!(
            svg,
            r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
            LEFT + plot_width / 2.0,
            escape(self.title)
        );
        for tick in 0..=5 {
            let y = y_max * f64::from(tick) / 5.0;
            let _ = write!(
                svg,
                r##"<line x1="{LEFT}" x2="{}" y1="{y0}" y2="{y0}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
                LEFT + plot_width,
                LEFT - 6.0,
                to_y(y) + 4.0,
                format_tick(y),
                y0 = to_y(y)
            );
        }
        let mut x_ticks: Vec<f64> = xs().collect();
        x_ticks.sort_by(f64::total_cmp);
        x_ticks.dedup();
        for x in x_ticks {
            let _ = write!(
                svg,
                r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
                to_x(x),
                TOP + plot_height + 18.0,
                format_tick(x)
            );
        }
        let _ = write!(
            svg,
            r#"<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{}" stroke="black"/><line x1="{LEFT}" x2="{}" y1="{y}" y2="{y}" stroke="black"/>"#,
            TOP + plot_height,
            LEFT + plot_width,
            y = TOP + plot_height
        );
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text><text transform="translate(18 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
            LEFT + plot_width / 2.0,
            HEIGHT - 12.0,
            escape(self.x_label),
            TOP + plot_height / 2.0,
            escape(self.y_label)
        );
        for (index, series) in self.series.iter().enumerate() {
            let colour = COLOURS[index % COLOURS.len()];
            let points: Vec<String> = series
                .points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", to_x(x), to_y(y)))
                .collect();
            let _ = write!(
                svg,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
                points.join(" ")
            );
            for &(x, y) in &series.points {
                let _ = write!(
                    svg,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{colour}"/>"#,
                    to_x(x),
                    to_y(y)
                );
            }
            let legend_y = TOP + 10.0 + 18.0 * index as f64;
            let _ = write!(
                svg,
                r#"<line x1="{}" x2="{}" y1="{legend_y}" y2="{legend_y}" stroke="{colour}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
                WIDTH - RIGHT + 15.0,
                WIDTH - RIGHT + 35.0,
                WIDTH - RIGHT + 40.0,
                legend_y + 4.0,
                escape(&series.name)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}

fn format_tick(value: f64) -> String {
    if value >= 1_000_000.0 {
        format!("{:.1}M", value / 1_000_000.0)
    } else if value >= 1_000.0 {
        format!("{:.0}k", value / 1_000.0)
    } else if value >= 10.0 || value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
