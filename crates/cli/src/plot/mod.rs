//! Pictures of a replayed trace (`sluice simulate --plot`): hits admitted and refused over
//! time, per busy value, with each rule's limit and a GCRA bucket's level, one panel per
//! rule on a shared time axis. SVG, or one self-contained HTML page around it.

mod axis;
mod html;
mod legend;
mod panel;
mod svg;
mod timeline;

use std::path::Path;

pub use svg::escape;
pub use timeline::{Count, Level, Limit, Panel, Series, Timeline};

use crate::compare::Comparison;

/// What `--plot` writes, chosen by the file's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Html,
}

impl Format {
    /// `.svg`, or `.html`/`.htm` (any case); `None` for anything else.
    pub fn from_path(path: &Path) -> Option<Format> {
        let extension = path.extension()?.to_str()?.to_ascii_lowercase();
        match extension.as_str() {
            "svg" => Some(Format::Svg),
            "html" | "htm" => Some(Format::Html),
            _ => None,
        }
    }
}

/// The picture of `comparison` in `format`; `source` names the trace in the title.
pub fn render(comparison: &Comparison, source: &str, format: Format) -> String {
    let timeline = Timeline::new(comparison);
    let picture = svg::draw(&timeline, source);
    match format {
        Format::Svg => format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n{picture}"),
        Format::Html => html::page(&picture, &format!("sluice simulate: {source}")),
    }
}
