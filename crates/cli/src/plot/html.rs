//! The timeline as one HTML page: the SVG inline, a few lines of script that show a bin's
//! counts per value on hover (or tap), and nothing fetched from anywhere.
//!
//! The page is also well-formed XML (closed tags, the script inside a commented CDATA
//! section), so the tests parse it with the same XML parser as the SVG.

use super::svg::escape;

/// Shows the hovered bin's counts, built with `textContent` only: values come from the
/// trace and must never be read as markup.
const SCRIPT: &str = r#"
(function () {
  var tip = document.getElementById('tip');
  function cell(row, text, tag) {
    var c = document.createElement(tag || 'td');
    c.textContent = text;
    row.appendChild(c);
  }
  function show(bin, event) {
    var panel = bin.closest('g.panel');
    var rows = new Map();
    bin.querySelectorAll('rect[data-series]').forEach(function (rect) {
      var name = rect.getAttribute('data-series');
      if (!rows.has(name)) { rows.set(name, { admitted: 0, refused: 0 }); }
      rows.get(name)[rect.getAttribute('class')] += Number(rect.getAttribute('data-hits'));
    });
    tip.textContent = '';
    var head = document.createElement('div');
    head.textContent = panel.getAttribute('data-rule') + ' \u00b7 ' +
      panel.getAttribute('data-algorithm') + ', ' + bin.getAttribute('data-start') +
      '\u2013' + bin.getAttribute('data-end') + ' s';
    tip.appendChild(head);
    var table = document.createElement('table');
    var top = document.createElement('tr');
    ['value', 'admitted', 'refused'].forEach(function (h) { cell(top, h, 'th'); });
    table.appendChild(top);
    rows.forEach(function (counts, name) {
      var row = document.createElement('tr');
      cell(row, name);
      cell(row, counts.admitted);
      cell(row, counts.refused);
      table.appendChild(row);
    });
    var total = document.createElement('tr');
    cell(total, 'all', 'th');
    cell(total, bin.getAttribute('data-admitted'), 'th');
    cell(total, bin.getAttribute('data-refused'), 'th');
    table.appendChild(total);
    tip.appendChild(table);
    tip.hidden = false;
    var x = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    tip.style.left = Math.max(x, 0) + 'px';
    tip.style.top = (event.clientY + 14) + 'px';
  }
  document.querySelectorAll('g.bin').forEach(function (bin) {
    // The SVG's own tooltip would show over this one.
    var title = bin.querySelector('title');
    if (title) { title.remove(); }
    bin.addEventListener('mousemove', function (e) { show(bin, e); });
    bin.addEventListener('click', function (e) { show(bin, e); });
    bin.addEventListener('mouseleave', function () { tip.hidden = true; });
  });
})();
"#;

const STYLE: &str = "
body { font-family: sans-serif; margin: 1em; color: #222; }
svg { max-width: 100%; height: auto; }
g.bin:hover rect.hover { fill-opacity: 0.07; }
#tip { position: fixed; background: #fff; border: 1px solid #888; padding: 4px 8px;
  font-size: 13px; pointer-events: none; box-shadow: 2px 2px 6px rgba(0, 0, 0, 0.2); }
#tip td, #tip th { padding: 0 6px; text-align: right; }
#tip td:first-child, #tip th:first-child { text-align: left; }
";

/// A page holding `svg` (the picture, without an XML declaration) under `title`.
pub fn page(svg: &str, title: &str) -> String {
    let title = escape(title);
    format!(
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8"/>
<meta name="viewport" content="width=device-width, initial-scale=1"/>
<title>{title}</title>
<style>{STYLE}</style>
</head>
<body>
{svg}<p>Hover over (or tap) a bin for its hits per value.</p>
<div id="tip" hidden="hidden"></div>
<script>
//<![CDATA[{SCRIPT}//]]>
</script>
</body>
</html>
"#
    )
}
