//! The timeline as SVG, written by hand.
//!
//! Why by hand: the picture is a few hundred rectangles, lines and labels, and it needs
//! `data-*` attributes and classes on every bar (the tests sum them, the HTML page reads them
//! on hover), a `<title>` per bin and hatch patterns. `plotters` with only its SVG backend is
//! the lean choice among chart crates, but its backend draws anonymous primitives through a
//! fixed drawing trait, with no way to attach any of those; writing the few element kinds
//! needed here, with one escaping function, is less code than working around it.

use std::fmt::Write;

use super::axis;
use super::legend::{draw_legend_item, legend_items, legend_rows};
use super::panel::draw_panel;
use super::timeline::Timeline;

pub(super) const WIDTH: f64 = 960.0;
pub(super) const LEFT: f64 = 72.0;
pub(super) const RIGHT: f64 = 72.0;
pub(super) const PLOT_WIDTH: f64 = WIDTH - LEFT - RIGHT;
const LEGEND_TOP: f64 = 66.0;
const LEGEND_ROW: f64 = 20.0;
pub(super) const PANEL_TITLE: f64 = 22.0;
pub(super) const PLOT_HEIGHT: f64 = 170.0;
const PANEL: f64 = PANEL_TITLE + PLOT_HEIGHT + 34.0;
const FOOTER: f64 = 30.0;

/// Okabe-Ito colours, told apart with the common colour blindnesses; grey for "others".
const COLOURS: [&str; 4] = ["#0072B2", "#E69F00", "#009E73", "#CC79A7"];
const OTHERS: &str = "#8C8C8C";
pub(super) const LIMIT: &str = "#000000";
pub(super) const LEVEL: &str = "#5E3C99";

/// The whole picture; `source` names the trace in the title.
pub fn draw(timeline: &Timeline, source: &str) -> String {
    let legend = legend_items(timeline);
    let rows = legend_rows(&legend);
    let panels_top = LEGEND_TOP + rows.len() as f64 * LEGEND_ROW + 8.0;
    let height = panels_top + timeline.panels.len() as f64 * PANEL + FOOTER;
    let unit = axis::time_unit(timeline.bin * timeline.bins as u64);
    let title = format!("sluice simulate: {source}");

    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12" role="img" aria-labelledby="chart-title">
<title id="chart-title">{}</title>
"#,
        escape(&title)
    );
    patterns(&mut svg, timeline);
    let _ = write!(
        svg,
        r##"<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>
<text x="{LEFT}" y="26" font-size="16" font-weight="bold">{}</text>
<text class="subtitle" x="{LEFT}" y="46" fill="#444444">{}</text>
"##,
        escape(&title),
        escape(&subtitle(timeline))
    );
    for (row, items) in rows.iter().enumerate() {
        let y = LEGEND_TOP + row as f64 * LEGEND_ROW;
        for (x, item) in items {
            draw_legend_item(&mut svg, item, *x, y);
        }
    }
    let (top, step) = axis::count_scale(count_axis_max(timeline));
    for (i, panel) in timeline.panels.iter().enumerate() {
        let y = panels_top + i as f64 * PANEL;
        draw_panel(&mut svg, timeline, i, panel, y, (top, step), unit);
    }
    let _ = writeln!(
        svg,
        r#"<text class="axis-title" x="{:.1}" y="{:.1}" text-anchor="middle">time ({}) from the start of the trace, in bins of {}</text>
</svg>"#,
        LEFT + PLOT_WIDTH / 2.0,
        height - 10.0,
        unit.name,
        axis::span_label(timeline.bin)
    );
    svg
}

/// `text` safe in XML text and attribute values: markup escaped, and the control
/// characters XML 1.0 forbids even as references replaced by U+FFFD.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if c < ' ' || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

fn subtitle(timeline: &Timeline) -> String {
    let columns = if timeline.key_columns.is_empty() {
        "hits".to_owned()
    } else {
        timeline.key_columns.join("+")
    };
    format!(
        "{} hits over {}; colours: values of {columns}, busiest first",
        timeline.hits,
        axis::span_label(timeline.bin * timeline.bins as u64)
    )
}

/// The count axis covers the tallest bin and the limit lines, unless a limit is so far above
/// the traffic that drawing it would flatten the bars (its label then says so).
fn count_axis_max(timeline: &Timeline) -> f64 {
    let tallest = timeline.tallest_bin() as f64;
    let limits = timeline.panels.iter().flat_map(|p| &p.limits);
    limits
        .map(|l| l.per_bin)
        .filter(|&l| l <= 2.0 * tallest.max(1.0))
        .fold(tallest, f64::max)
}

pub(super) fn colour(series: usize) -> &'static str {
    COLOURS.get(series).copied().unwrap_or(OTHERS)
}

/// Hatching for refused hits: stripes on white, so refused is lighter than admitted even
/// without colour.
fn patterns(svg: &mut String, timeline: &Timeline) {
    svg.push_str("<defs>\n");
    let fills = (0..timeline.series.len())
        .map(|s| (format!("refused-{s}"), colour(s)))
        .chain([("refused-legend".to_owned(), "#555555")]);
    for (id, fill) in fills {
        let _ = writeln!(
            svg,
            r##"<pattern id="{id}" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#ffffff"/><rect width="2" height="6" fill="{fill}"/></pattern>"##
        );
    }
    svg.push_str("</defs>\n");
}
