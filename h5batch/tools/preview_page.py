"""The HTML of ``h5batch preview``: one self-contained page, its style and its own check.

Rule: ``index.html`` needs nothing but the files beside it. No server, no network, no
script library: the style and the script are inline, every ``src`` is a relative URL into
the preview folder, and every text from the file (paths, reasons, class names, text fields,
the job) is HTML-escaped. Reason: the page is opened with ``file://`` on any machine the
folder is copied to, and a corpus's file names are data, not markup.

The page checks itself once loaded (:data:`SELF_CHECK`): it counts the images that decoded
(``naturalWidth > 0``) and the clips whose metadata loaded (``duration > 0``), records any
script error, measures the page against the window (``scroll_width`` above ``width`` is
a page that scrolls sideways) and writes the result as JSON into ``<pre id="h5b-check">``
(``data-done="1"`` when finished). A person sees the line at the bottom of the page; a
headless browser's ``--dump-dom`` reads it back (tests/test_preview.py).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote

TOP_CLASSES = 20  # classes shown one by one; the rest are one "others" row

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 24px 40px;color:#222;background:#fafafa;overflow-wrap:anywhere}
h1{font-size:20px;margin:16px 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ccc}
h3{font-size:14px;margin:16px 0 6px}
.meta{color:#555}nav a{margin-right:12px}
.charts{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
.charts img{width:500px;max-width:100%;background:#fff;border:1px solid #ddd}
table{border-collapse:collapse;font-size:12px;background:#fff;display:block;max-width:100%;overflow-x:auto}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#eee}td.n{text-align:right}
.counts td:last-child{width:220px;min-width:120px}.counts summary{cursor:pointer}
.counts td:last-child span{display:block;height:11px;margin-top:3px;background:#3b6ea5}
.counts span.mean{background:#9db7d5}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(160px,1fr));gap:8px}
.grid.audio{grid-template-columns:repeat(auto-fill,minmax(240px,1fr))}
.what{color:#444;margin-top:3px;max-height:4.2em;overflow:hidden}
.card{margin:0;background:#fff;border:1px solid #ddd;padding:4px;font-size:11px;overflow:hidden}
.card img.thumb{width:100%;height:120px;object-fit:contain;image-rendering:pixelated;background:#eee}
.card img.wave,.card img.spec{display:block;width:100%}.card img.spec{height:70px;image-rendering:auto}
.card audio{width:100%;height:28px}.src{color:#666;word-break:break-all}
pre{background:#fff;border:1px solid #ddd;padding:6px;font-size:11px;max-height:360px;overflow:auto}
#h5b-check{max-height:none}
"""

SELF_CHECK = r"""
(function () {
  var errors = [], out = document.getElementById('h5b-check');
  window.addEventListener('error', function (e) {
    if (e.target === window || !e.target || !e.target.tagName) {
      errors.push(String(e.message || 'error') + ' at ' + (e.filename || '') + ':' + (e.lineno || ''));
    }
  }, true);
  window.addEventListener('unhandledrejection', function (e) { errors.push('unhandled: ' + e.reason); });
  function finish(imgs, auds, badAudio) {
    var badImg = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); })
                     .map(function (i) { return i.getAttribute('src'); });
    var r = {images: imgs.length, images_ok: imgs.length - badImg.length, bad_images: badImg,
             audio: auds.length, audio_ok: auds.length - badAudio.length, bad_audio: badAudio,
             errors: errors, width: window.innerWidth,
             scroll_width: document.documentElement.scrollWidth};
    out.textContent = JSON.stringify(r);
    out.setAttribute('data-done', '1');
  }
  window.addEventListener('load', function () {
    var imgs = Array.prototype.slice.call(document.images);
    var auds = Array.prototype.slice.call(document.querySelectorAll('audio'));
    var left = auds.length, bad = [], settled = new Set();
    if (!left) { finish(imgs, auds, bad); return; }
    function settle(a, ok) {
      if (settled.has(a)) return;
      settled.add(a);
      if (!ok) bad.push(a.getAttribute('src'));
      if (--left === 0) finish(imgs, auds, bad);
    }
    auds.forEach(function (a) {
      if (a.readyState >= 1) { settle(a, a.duration > 0); return; }
      a.addEventListener('loadedmetadata', function () { settle(a, a.duration > 0); });
      a.addEventListener('error', function () { settle(a, false); });
      a.load();
    });
    setTimeout(function () { auds.forEach(function (a) { settle(a, false); }); }, 15000);
  });
})();
"""


def esc(x: Any) -> str:
    """Text from the file, escaped for HTML (attributes too)."""
    return html.escape(str(x), quote=True)


def url(rel: str) -> str:
    """A relative URL of a file inside the preview folder (``/`` separated)."""
    return quote(rel, safe="/")


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "", attrs: str = "",
          row_attrs: Sequence[str] | None = None) -> str:
    """A table; ``rows`` hold HTML already (escape text with :func:`esc`)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for k, r in enumerate(rows):
        extra = f" {row_attrs[k]}" if row_attrs else ""
        body.append(f"<tr{extra}>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>")
    return f'<table class="{esc(cls)}" {attrs}><tr>{head}</tr>{"".join(body)}</table>'


def counts_table(split: str, counts: dict[str, int], top: int = TOP_CLASSES) -> str:
    """Samples per class with a bar each, scaled to the largest class: every class, in label
    order, when there are at most ``top + 1``; else the ``top`` largest (ties in label order)
    and one ``others (K classes)`` row, its bar their mean, listing them in a closed
    ``<details>``. Reason: a corpus of a hundred classes must not open on a hundred rows.
    ``data-class`` / ``data-count`` carry the values for machines."""
    names = list(counts)
    if len(names) > top + 1:
        names = sorted(names, key=lambda k: -counts[k])  # stable: ties keep label order
    shown, rest = (names[:top], names[top:]) if len(names) > top + 1 else (names, [])
    most = max([counts[k] for k in shown] + [1])
    bar = '<span{} style="width:{:.1f}%"></span>'.format
    rows = [(esc(k), f'<span class="n">{counts[k]}</span>', bar("", 100 * counts[k] / most)) for k in shown]
    attrs = [f'class="count" data-class="{esc(k)}" data-count="{counts[k]}"' for k in shown]
    if rest:
        total, label = sum(counts[k] for k in rest), f"others ({len(rest)} classes)"
        listed = ", ".join(f"{k}: {counts[k]}" for k in rest)
        mean = total / len(rest)
        rows.append((f"<details><summary>{label}</summary>{esc(listed)}</details>",
                     f'<span class="n">{total}</span>', bar(' class="mean"', 100 * mean / most) + f"{mean:.1f} a class"))
        attrs.append(f'class="count others" data-class="{label}" data-count="{total}"')
    head = ["class", "samples", f"{len(counts)} classes"]
    return table(head, rows, "counts", f'data-split="{esc(split)}"', attrs)


def rejects_table(rejects: list[dict[str, str]], source: str) -> str:
    """Every reject with its stage and reason (or a line saying there are none)."""
    if not rejects:
        return f'<p id="rejects" data-count="0">No rejects ({esc(source)}).</p>'
    rows = [(esc(r["path"]), esc(r["stage"]), esc(r["reason"])) for r in rejects]
    attrs = [f'class="reject" data-path="{esc(r["path"])}" data-stage="{esc(r["stage"])}"' for r in rejects]
    return (f"<p>{len(rejects)} inputs rejected ({esc(source)}).</p>"
            + table(["path", "stage", "reason"], rows, "rejects", f'id="rejects" data-count="{len(rejects)}"', attrs))


def versions_table(versions: dict[str, Any]) -> str:
    return table(["package", "version"], [(esc(k), esc(versions[k])) for k in sorted(versions)], "versions")


def page(title: str, header: str, sections: Sequence[str]) -> str:
    """The whole document."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>\n{header}\n"
            + "\n".join(sections)
            + '\n<h2>Page check</h2><pre id="h5b-check" data-done="0">checking…</pre>\n'
            f"<script>{SELF_CHECK}</script>\n</body></html>\n")


def job_block(job: dict[str, Any]) -> str:
    return f'<pre id="job">{esc(json.dumps(job, indent=1, sort_keys=True))}</pre>'
