//! The legend above the panels: a swatch per series, what solid and hatched mean, the limit
//! and bucket-level lines.

use std::fmt::Write;

use super::svg::{LEFT, LEVEL, LIMIT, RIGHT, WIDTH, colour, escape};
use super::timeline::Timeline;

/// One entry: a filled swatch or a short line, then its label.
pub(super) enum LegendItem {
    Swatch {
        fill: String,
        label: String,
    },
    Line {
        colour: &'static str,
        dashed: bool,
        label: String,
    },
}

/// The series, busiest first, then what the marks mean.
pub(super) fn legend_items(timeline: &Timeline) -> Vec<LegendItem> {
    let mut items: Vec<LegendItem> = timeline
        .series
        .iter()
        .enumerate()
        .map(|(s, series)| LegendItem::Swatch {
            fill: colour(s).to_owned(),
            label: shorten(&series.label, 32),
        })
        .collect();
    items.push(LegendItem::Swatch {
        fill: "#555555".to_owned(),
        label: "admitted (solid)".to_owned(),
    });
    items.push(LegendItem::Swatch {
        fill: "url(#refused-legend)".to_owned(),
        label: "refused (hatched)".to_owned(),
    });
    items.push(LegendItem::Line {
        colour: LIMIT,
        dashed: true,
        label: "limit per bin".to_owned(),
    });
    if timeline.panels.iter().any(|p| p.level.is_some()) {
        items.push(LegendItem::Line {
            colour: LEVEL,
            dashed: false,
            label: "GCRA bucket level (right axis)".to_owned(),
        });
    }
    items
}

/// `label` cut to `chars` characters with an ellipsis (the bins' tooltips keep it whole).
pub(super) fn shorten(label: &str, chars: usize) -> String {
    if label.chars().count() <= chars {
        return label.to_owned();
    }
    let mut short: String = label.chars().take(chars - 1).collect();
    short.push('…');
    short
}

/// Lays the legend out in rows that fit the width, with a rough 7 px per character.
pub(super) fn legend_rows(items: &[LegendItem]) -> Vec<Vec<(f64, &LegendItem)>> {
    let mut rows: Vec<Vec<(f64, &LegendItem)>> = vec![Vec::new()];
    let mut x = LEFT;
    for item in items {
        let label = match item {
            LegendItem::Swatch { label, .. } | LegendItem::Line { label, .. } => label,
        };
        let width = 26.0 + 7.0 * label.chars().count() as f64 + 18.0;
        if x + width > WIDTH - RIGHT / 2.0 && x > LEFT {
            rows.push(Vec::new());
            x = LEFT;
        }
        rows.last_mut().expect("one row at least").push((x, item));
        x += width;
    }
    rows
}

pub(super) fn draw_legend_item(svg: &mut String, item: &LegendItem, x: f64, y: f64) {
    let label = match item {
        LegendItem::Swatch { fill, label } => {
            let _ = writeln!(
                svg,
                r##"<rect class="legend-swatch" x="{x:.1}" y="{:.1}" width="18" height="12" fill="{fill}" stroke="#333333" stroke-width="0.5"/>"##,
                y - 10.0
            );
            label
        }
        LegendItem::Line {
            colour,
            dashed,
            label,
        } => {
            let dash = if *dashed {
                r#" stroke-dasharray="6 4""#
            } else {
                ""
            };
            let _ = writeln!(
                svg,
                r#"<line class="legend-line" x1="{x:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="2"{dash}/>"#,
                y - 4.0,
                x + 18.0,
                y - 4.0
            );
            label
        }
    };
    let _ = writeln!(
        svg,
        r#"<text class="legend" x="{:.1}" y="{y:.1}">{}</text>"#,
        x + 24.0,
        escape(label)
    );
}
