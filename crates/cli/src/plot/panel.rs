//! One panel: a rule's bins, stacked admitted then refused per series, its limits, and a
//! GCRA bucket's level on a right-hand axis.

use std::fmt::Write;

use super::axis::{self, TimeUnit};
use super::legend::shorten;
use super::svg::{LEFT, LEVEL, LIMIT, PANEL_TITLE, PLOT_HEIGHT, PLOT_WIDTH, WIDTH, colour, escape};
use super::timeline::{Count, Level, Panel, Timeline};

/// Panel `index` with its top edge at `y`, on a count axis from 0 to `top` in steps of `step`.
pub(super) fn draw_panel(
    svg: &mut String,
    timeline: &Timeline,
    index: usize,
    panel: &Panel,
    y: f64,
    (top, step): (f64, f64),
    unit: TimeUnit,
) {
    let summary = panel.summary;
    let _ = writeln!(
        svg,
        r#"<g class="panel" data-panel="{}" data-policy="{}" data-rule="{}" data-algorithm="{}" data-requests="{}" data-allowed="{}" data-denied="{}">"#,
        index + 1,
        escape(&panel.policy),
        escape(&panel.rule),
        escape(&panel.algorithm),
        summary.requests,
        summary.allowed,
        summary.denied
    );
    let _ = writeln!(
        svg,
        r#"<text class="panel-title" x="{LEFT}" y="{:.1}"><tspan font-weight="bold">{} · {}</tspan>: {} admitted, {} refused of {}</text>"#,
        y + 15.0,
        escape(&panel.rule),
        escape(&panel.algorithm),
        summary.allowed,
        summary.denied,
        summary.requests
    );
    let plot_top = y + PANEL_TITLE;
    let bottom = plot_top + PLOT_HEIGHT;
    let to_y = |v: f64| bottom - v / top * PLOT_HEIGHT;
    let slot = PLOT_WIDTH / timeline.bins as f64;

    // Grid and count axis.
    let mut tick = 0.0;
    while tick <= top + step / 2.0 {
        let ty = to_y(tick);
        let _ = writeln!(
            svg,
            r##"<line class="grid" x1="{LEFT}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#e4e4e4"/><text class="tick" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + PLOT_WIDTH,
            LEFT - 6.0,
            ty + 4.0,
            axis::count_label(tick)
        );
        tick += step;
    }
    let extent = timeline.bin * timeline.bins as u64;
    let time_step = axis::time_step(extent, timeline.bin);
    let mut t = 0;
    while t <= extent {
        let tx = LEFT + t as f64 / timeline.bin as f64 * slot;
        let _ = writeln!(
            svg,
            r##"<line class="grid" x1="{tx:.1}" y1="{plot_top:.1}" x2="{tx:.1}" y2="{bottom:.1}" stroke="#eeeeee"/><text class="tick" x="{tx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            bottom + 15.0,
            axis::time_label(t, unit)
        );
        t += time_step;
    }
    let middle = plot_top + PLOT_HEIGHT / 2.0;
    let _ = writeln!(
        svg,
        r#"<text class="axis-title" x="20" y="{middle:.1}" text-anchor="middle" transform="rotate(-90 20 {middle:.1})">hits per {}</text>"#,
        axis::span_label(timeline.bin)
    );

    for (b, counts) in panel.counts.iter().enumerate() {
        draw_bin(svg, timeline, b, counts, slot, plot_top, &to_y);
    }
    draw_limits(svg, panel, top, y + 15.0, &to_y);
    if let Some(level) = &panel.level {
        draw_level(svg, level, slot, plot_top, bottom);
    }
    let _ = writeln!(
        svg,
        r##"<path class="axis" d="M{LEFT} {plot_top:.1} V{bottom:.1} H{:.1}" fill="none" stroke="#333333"/>
</g>"##,
        LEFT + PLOT_WIDTH
    );
}

/// Bin `b`: a `<g>` with its totals, a tooltip, an invisible target for the pointer, and the
/// stacked bars.
fn draw_bin(
    svg: &mut String,
    timeline: &Timeline,
    b: usize,
    counts: &[Count],
    slot: f64,
    plot_top: f64,
    to_y: &impl Fn(f64) -> f64,
) {
    let x = LEFT + b as f64 * slot;
    let admitted: u64 = counts.iter().map(|c| c.admitted).sum();
    let refused: u64 = counts.iter().map(|c| c.refused).sum();
    let seconds = |n: u64| axis::time_label(n, axis::time_unit(0));
    let (start, end) = (
        seconds(b as u64 * timeline.bin),
        seconds((b as u64 + 1) * timeline.bin),
    );
    let per_series = |pick: fn(&Count) -> u64| {
        let parts: Vec<String> = counts
            .iter()
            .zip(&timeline.series)
            .filter(|(c, _)| pick(c) > 0)
            .map(|(c, s)| format!("{} {}", s.label, pick(c)))
            .collect();
        if parts.is_empty() {
            String::new()
        } else {
            format!(" ({})", parts.join(", "))
        }
    };
    let _ = writeln!(
        svg,
        r#"<g class="bin" data-start="{start}" data-end="{end}" data-admitted="{admitted}" data-refused="{refused}"><title>{start}–{end} s: {admitted} admitted{}, {refused} refused{}</title>"#,
        escape(&per_series(|c| c.admitted)),
        escape(&per_series(|c| c.refused))
    );
    let _ = write!(
        svg,
        r##"<rect class="hover" x="{x:.1}" y="{plot_top:.1}" width="{slot:.1}" height="{PLOT_HEIGHT}" fill="#000000" fill-opacity="0"/>"##
    );
    let width = (slot * 0.8).max(1.0);
    let x = x + (slot - width) / 2.0;
    let mut stacked = 0u64;
    let segments = [("admitted", false), ("refused", true)];
    for (class, refused) in segments {
        for (s, count) in counts.iter().enumerate() {
            let hits = if refused {
                count.refused
            } else {
                count.admitted
            };
            if hits == 0 {
                continue;
            }
            let (y_low, y_high) = (to_y(stacked as f64), to_y((stacked + hits) as f64));
            stacked += hits;
            let fill = if refused {
                format!("url(#refused-{s})")
            } else {
                colour(s).to_owned()
            };
            let _ = write!(
                svg,
                r#"<rect class="{class}" data-series="{}" data-hits="{hits}" x="{x:.1}" y="{y_high:.1}" width="{width:.1}" height="{:.1}" fill="{fill}" stroke="{}" stroke-width="0.5"/>"#,
                escape(&timeline.series[s].label),
                y_low - y_high,
                colour(s)
            );
        }
    }
    svg.push_str("</g>\n");
}

/// Each limit as a dashed line, named once at the right of the panel's title row so that no
/// label sits on the bars.
fn draw_limits(
    svg: &mut String,
    panel: &Panel,
    top: f64,
    title_y: f64,
    to_y: &impl Fn(f64) -> f64,
) {
    let right = LEFT + PLOT_WIDTH;
    let mut names = Vec::new();
    for limit in panel.limits.iter().take(3) {
        let per = limit
            .per
            .as_ref()
            .map_or(String::new(), |s| format!(" for each {s}"));
        let mut name = format!(
            "{} = {} per bin{per}",
            limit.leaf,
            axis::count_label(limit.per_bin)
        );
        if limit.per_bin > top {
            name.push_str(" (above the chart)");
        } else {
            let ly = to_y(limit.per_bin);
            let _ = writeln!(
                svg,
                r#"<line class="limit" x1="{LEFT}" y1="{ly:.1}" x2="{right:.1}" y2="{ly:.1}" stroke="{LIMIT}" stroke-width="1.5" stroke-dasharray="6 4"/>"#
            );
        }
        names.push(name);
    }
    if !names.is_empty() {
        let _ = writeln!(
            svg,
            r#"<text class="limit-label" x="{right:.1}" y="{title_y:.1}" text-anchor="end">limit {}</text>"#,
            escape(&names.join("; "))
        );
    }
}

fn draw_level(svg: &mut String, level: &Level, slot: f64, plot_top: f64, bottom: f64) {
    let capacity = level.capacity.max(1) as f64;
    let to_y = |v: u64| bottom - v as f64 / capacity * PLOT_HEIGHT;
    let right = LEFT + PLOT_WIDTH;
    let mut ticks = vec![0, level.capacity / 2, level.capacity];
    ticks.dedup();
    for tick in ticks {
        let _ = writeln!(
            svg,
            r#"<text class="tick level-tick" x="{:.1}" y="{:.1}" fill="{LEVEL}">{tick}</text>"#,
            right + 6.0,
            to_y(tick) + 4.0
        );
    }
    let middle = plot_top + PLOT_HEIGHT / 2.0;
    let x = WIDTH - 18.0;
    let name = level.of.as_ref().map_or("bucket level".to_owned(), |of| {
        format!("bucket of {}", shorten(of, 16))
    });
    let _ = writeln!(
        svg,
        r#"<text class="axis-title" x="{x}" y="{middle:.1}" text-anchor="middle" fill="{LEVEL}" transform="rotate(90 {x} {middle:.1})">{}</text>"#,
        escape(&name)
    );
    // One polyline per run of bins with hits: a gap means no decision to read a level from.
    let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
    for (b, lowest) in level.lowest.iter().enumerate() {
        match lowest {
            Some(v) => runs
                .last_mut()
                .expect("one run at least")
                .push((LEFT + (b as f64 + 0.5) * slot, to_y(*v))),
            None if runs.last().is_some_and(|r| !r.is_empty()) => runs.push(Vec::new()),
            None => {}
        }
    }
    for run in runs.iter().filter(|r| !r.is_empty()) {
        let points: Vec<String> = run.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let points = points.join(" ");
        // A white edge keeps the line readable where it crosses bars.
        let _ = write!(
            svg,
            r##"<polyline points="{points}" fill="none" stroke="#ffffff" stroke-width="4"/><polyline class="level" points="{points}" fill="none" stroke="{LEVEL}" stroke-width="1.5"/>"##
        );
        for (x, y) in run {
            let _ = write!(
                svg,
                r#"<circle class="level-point" cx="{x:.1}" cy="{y:.1}" r="2" fill="{LEVEL}"/>"#
            );
        }
        svg.push('\n');
    }
}
