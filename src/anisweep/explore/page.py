"""The explorer's HTML: Plotly's own minified JavaScript (inline: the page needs no network), the data
(anisweep.explore.data.page_data) as JSON, and the controls that draw it.

Views: `per model` draws the chosen metric at the chosen site over training, one panel per model and seed, a line
per chosen layer (x: step or tokens seen, log or linear; on a log axis step 0 sits at 1, the axis being step + 1);
`survey` draws it across depth (layer over the model's last layer) at each model's last step shown, a line per
model, as Godey et al. 2024 Fig. 1-4 do. Hovering a point gives its value, step, tokens seen and checkpoint.
A chosen model the figure leaves out is named under the controls with the reason: it has no values of the metric at
the site, or none at the chosen layers, or (x: tokens seen) no tokens seen recorded, which step draws; a model that
knows its tokens seen at some steps only is drawn on the tokens axis at those, and the page says how many it left.
Names are shown as written: the data's `<`, `>` and `&` are JSON escapes (script_text), Plotly's text gets entities.
Each drawn trace carries `meta` (model, seed, site, metric, layer) so a test can read back what is drawn.
Where the data holds a series' Multi-Bootstrap intervals (anisweep.explore.data), `per model` draws a translucent band
from low to high around its line (two traces before it, meta `band`: "low" and "high"), shown while the `intervals`
checkbox is ticked (by default; the checkbox is hidden where no series has intervals), their level named below it.

The JavaScript is plotly.js's basic bundle (scatter, bar and pie traces; the page draws scatter traces only), v4.1.1
as npm's plotly.js-basic-dist-min ships it, MIT-licensed (plotly-LICENSE.txt beside it): 1.2 MB, where the full
plotly.js of the plotly wheel is 4.8 MB and takes headless Chromium about four times as long to parse.
"""

from __future__ import annotations

import html
from functools import cache
from importlib.resources import files

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 12px 18px; color: #222; }
h1 { font-size: 1.25em; margin: 0 0 4px 0; }
#summary, #definition { color: #555; font-size: 0.9em; margin: 2px 0 8px 0; }
#controls { display: flex; flex-wrap: wrap; gap: 10px 18px; align-items: flex-start; }
#bandnote { color: #555; font-size: 0.85em; margin: 4px 0 0 0; }
#controls label.check { flex-direction: row; align-items: center; gap: 4px; }
#notes { color: #8a4b00; font-size: 0.9em; margin: 6px 0 0 0; padding-left: 1.2em; }
#controls label { display: flex; flex-direction: column; font-size: 0.85em; gap: 2px; }
select[multiple] { min-width: 9em; }
"""

_SCRIPT = r"""
"use strict";
const D = JSON.parse(document.getElementById("anisweep-data").textContent);
const raw = atob(D.values);
const bytes = new Uint8Array(raw.length);
for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
const V = new Float32Array(bytes.buffer);
const S = D.series;
const offset = new Int32Array(S.model.length + 1);
const index = new Map();
for (let i = 0; i < S.model.length; i++) {
  offset[i + 1] = offset[i] + D.models[S.model[i]].steps.length;
  index.set(S.model[i] + "|" + S.site[i] + "|" + S.metric[i] + "|" + S.layer[i], i);
}
const bare = new Set(["toy", "local", "hub"]);
const name = (m) => (bare.has(m.family) ? m.model : m.family + "/" + m.model);
const seedName = (m) => m.seed === null ? "none" : String(m.seed);
const label = (m) => name(m) + " seed " + seedName(m);
// Plotly reads its text as HTML-like markup and decodes entities: a name is shown as written, never as markup.
const plain = (text) => String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
const float32 = (text) => {
  const raw = atob(text), bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return new Float32Array(bytes.buffer);
};
// The series with Multi-Bootstrap intervals: their low and high, laid out as the values, one per step of the model.
const I = D.intervals || { series: [], label: [], labels: [], low: "", high: "" };
const LOW = float32(I.low), HIGH = float32(I.high), banded = new Map();
for (let b = 0, at = 0; b < I.series.length; b++) {
  banded.set(I.series[b], { at, label: I.labels[I.label[b]] });
  at += offset[I.series[b] + 1] - offset[I.series[b]];
}
const pairs = new Set(S.model.map((k, i) => k + "|" + S.site[i] + "|" + S.metric[i]));
const $ = (id) => document.getElementById(id);

// What the figure leaves out of the selection, and why: one line per reason, naming the models.
class Notes {
  constructor() { this.lines = new Map(); }
  add(reason, model, detail = "") {
    if (!this.lines.has(reason)) this.lines.set(reason, []);
    this.lines.get(reason).push(label(model) + detail);
  }
  show(el) {
    el.replaceChildren(...[...this.lines].map(([reason, names]) => {
      const li = document.createElement("li");
      li.textContent = reason + ": " + names.join(", ") + ".";
      return li;
    }));
  }
}
const chosen = (id) => Array.from($(id).selectedOptions).map((o) => o.value);

function fill(id, values, selected) {
  const el = $(id), keep = new Set(selected);
  el.replaceChildren(...values.map((v) => {
    const o = document.createElement("option");
    o.value = o.textContent = String(v);
    o.selected = keep.has(String(v));
    return o;
  }));
}

function available(metric, site) {
  const m = D.metrics.indexOf(metric), s = D.sites.indexOf(site), layers = new Set(), sites = new Set();
  for (let i = 0; i < S.model.length; i++) {
    if (S.metric[i] !== m) continue;
    sites.add(D.sites[S.site[i]]);
    if (S.site[i] === s) layers.add(S.layer[i]);
  }
  return { sites: [...sites].sort(), layers: [...layers].sort((a, b) => a - b) };
}

function refreshChoices() {
  const metric = $("metric").value;
  const site = $("site").value;
  const sites = available(metric, site).sites;
  fill("site", sites, [sites.includes(site) ? site : (sites.includes("resid") ? "resid" : sites[0])]);
  const before = chosen("layers"), layers = available(metric, $("site").value).layers.map(String);
  const kept = before.filter((l) => layers.includes(l));
  fill("layers", layers, kept.length ? kept : layers);
}

function models() {
  const names = new Set(chosen("models")), seeds = new Set(chosen("seeds"));
  return D.models.map((m, k) => ({ ...m, k })).filter((m) => names.has(name(m)) && seeds.has(seedName(m)));
}

function values(i) {
  return Array.from(V.subarray(offset[i], offset[i + 1]), (v) => (Number.isNaN(v) ? null : v));
}

function interval(i) {  // the band of series i: { low, high, label } (null where none), or undefined
  const b = banded.get(i);
  if (b === undefined) return undefined;
  const n = offset[i + 1] - offset[i], nullNaN = (v) => (Number.isNaN(v) ? null : v);
  return { low: Array.from(LOW.subarray(b.at, b.at + n), nullNaN), high: Array.from(HIGH.subarray(b.at, b.at + n),
    nullNaN), label: b.label };
}

function colour(t) {  // viridis, t in [0, 1]
  const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const x = Math.min(Math.max(t, 0), 1) * (stops.length - 1), j = Math.min(Math.floor(x), stops.length - 2);
  const f = x - j, c = stops[j].map((a, n) => Math.round(a + f * (stops[j + 1][n] - a)));
  return "rgb(" + c.join(",") + ")";
}

function perModel(metric, site) {
  const m = D.metrics.indexOf(metric), s = D.sites.indexOf(site), layers = chosen("layers").map(Number);
  const byTokens = $("x").value === "tokens", log = $("xscale").value === "log";
  const notes = new Notes(), panels = [], bands = new Set(), showBands = $("bands").checked;
  for (const model of models()) {
    const drawn = layers.map((layer) => [layer, index.get(model.k + "|" + s + "|" + m + "|" + layer)])
      .filter(([, i]) => i !== undefined);
    const points = model.steps.map((_, j) => j).filter((j) => !byTokens || model.tokens[j] !== null);
    if (!pairs.has(model.k + "|" + s + "|" + m)) notes.add("Not drawn, no " + metric + " at " + site, model);
    else if (!drawn.length) notes.add("Not drawn, none of the chosen layers", model);
    else if (!points.length) notes.add("Not drawn on the tokens axis, no tokens seen recorded (x axis: step draws it)",
      model);
    else {
      if (points.length < model.steps.length) notes.add("Steps without tokens seen left out of the tokens axis", model,
        " (" + (model.steps.length - points.length) + " of " + model.steps.length + ")");
      panels.push({ model, drawn, points });
    }
  }
  const traces = [], layout = { grid: { rows: Math.max(panels.length, 1), columns: 1, pattern: "independent",
    ygap: 0.35 }, height: 120 + 260 * Math.max(panels.length, 1), annotations: [], showlegend: true,
    hovermode: "closest", margin: { t: 30 } };
  const all = available(metric, site).layers, top = Math.max(...all, 1);
  panels.forEach(({ model, drawn, points }, p) => {
    const ax = p === 0 ? "" : String(p + 1);
    const xs = points.map((j) => (byTokens ? model.tokens[j] : model.steps[j])).map((v) => (log ? v + 1 : v));
    const custom = points.map((j) => [model.steps[j], model.tokens[j] ?? "unknown",
      plain(model.family + "/" + model.model + "/step" + model.steps[j])]);
    for (const [layer, i] of drawn) {
      const ys = values(i), meta = { family: model.family, model: model.model, seed: model.seed, site, metric, layer };
      const band = showBands ? interval(i) : undefined;
      if (band) {
        bands.add(band.label);
        const fill = colour(layer / top).replace("rgb(", "rgba(").replace(")", ",0.2)");
        for (const end of ["low", "high"]) {
          traces.push({ x: xs, y: points.map((j) => band[end][j]), xaxis: "x" + ax, yaxis: "y" + ax, type: "scatter",
            mode: "lines", line: { width: 0 }, hoverinfo: "skip", showlegend: false, legendgroup: "layer " + layer,
            fill: end === "high" ? "tonexty" : "none", fillcolor: fill, meta: { ...meta, band: end,
              level: band.label } });
        }
      }
      traces.push({ x: xs, y: points.map((j) => ys[j]), customdata: custom, xaxis: "x" + ax, yaxis: "y" + ax,
        type: "scatter", mode: "lines+markers", line: { color: colour(layer / top) }, marker: { size: 4 },
        name: plain(label(model) + " · layer " + layer), legendgroup: "layer " + layer,
        meta,
        hovertemplate: "%{fullData.name}<br>" + plain(metric) + " = %{y:.6g}<br>step %{customdata[0]}, " +
          "%{customdata[1]} tokens<br>%{customdata[2]}<extra></extra>" });
    }
    const xTitle = (byTokens ? "tokens seen" : "step") + (log ? " + 1 (log)" : "");
    layout["xaxis" + ax] = { type: log ? "log" : "linear", title: { text: xTitle } };
    layout["yaxis" + ax] = { type: $("yscale").value, title: { text: plain(metric + " (" + site + ")") } };
    const shown = model.steps.length < model.all_steps ? " (" + model.steps.length + " of its " +
      model.all_steps + " steps)" : "";
    layout.annotations.push({ text: plain(label(model) + shown), showarrow: false,
      xref: "x" + ax + " domain", yref: "y" + ax + " domain", x: 0, y: 1.12, xanchor: "left" });
  });
  return { traces, layout, notes, bands };
}

function survey(metric, site) {
  const m = D.metrics.indexOf(metric), s = D.sites.indexOf(site), traces = [], notes = new Notes();
  for (const model of models()) {
    const last = model.steps.length - 1, points = [];
    for (let i = 0; i < S.model.length; i++) {
      const ours = S.model[i] === model.k && S.site[i] === s && S.metric[i] === m;
      if (ours) points.push([S.layer[i], V[offset[i] + last]]);
    }
    if (!points.length) {
      notes.add("Not drawn, no " + metric + " at " + site, model);
      continue;
    }
    points.sort((a, b) => a[0] - b[0]);
    const deepest = Math.max(points[points.length - 1][0], 1), step = model.steps[last];
    traces.push({ x: points.map((p) => p[0] / deepest), y: points.map((p) => (Number.isNaN(p[1]) ? null : p[1])),
      customdata: points.map((p) => [p[0], step, plain(model.family + "/" + model.model + "/step" + step)]),
      type: "scatter", mode: "lines+markers", name: plain(label(model) + " (step " + step + ")"),
      meta: { family: model.family, model: model.model, seed: model.seed, site, metric, step },
      hovertemplate: "%{fullData.name}<br>layer %{customdata[0]}: " + plain(metric) + " = %{y:.6g}<br>" +
        "%{customdata[2]}<extra></extra>" });
  }
  return { traces, notes, bands: new Set(), layout: { height: 560, hovermode: "closest", margin: { t: 30 },
    xaxis: { title: { text: "relative depth (layer / last layer)" } },
    yaxis: { type: $("yscale").value,
      title: { text: plain(metric + " (" + site + "), each model's last step shown") } } } };
}

let draws = 0;
function draw() {
  const metric = $("metric").value, site = $("site").value;
  const survey_ = $("view").value === "survey";
  for (const id of ["layers", "x", "xscale", "bands"]) $(id).disabled = survey_;
  const { traces, layout, notes, bands } = survey_ ? survey(metric, site) : perModel(metric, site);
  notes.show($("notes"));
  $("bandnote").textContent = bands.size ? "Shaded: the " + [...bands].join("; the ") + " (docs/measures.md)." : "";
  Plotly.react("plot", traces, layout, { responsive: true }).then(() => {
    draws += 1;
    document.body.dataset.draws = String(draws);
    if (draws === 1) window.exploreDrawnAt = performance.now();
  });
}

const names = [...new Set(D.models.map(name))].sort(), seeds = [...new Set(D.models.map(seedName))].sort();
fill("metric", D.metrics, [D.metrics.includes("avg_cos") ? "avg_cos" : D.metrics[0]]);
fill("models", names, names);
fill("seeds", seeds, seeds);
refreshChoices();
$("metric").addEventListener("change", () => { refreshChoices(); draw(); });
$("site").addEventListener("change", () => { refreshChoices(); draw(); });
for (const id of ["view", "layers", "models", "seeds", "x", "xscale", "yscale", "bands"]) {
  $(id).addEventListener("change", draw);
}
$("bands").checked = I.series.length > 0;
$("bands").parentElement.hidden = I.series.length === 0;
const checkpoints = D.models.reduce((n, m) => n + m.all_steps, 0);
const shown = D.models.reduce((n, m) => n + m.steps.length, 0);
const thinnedNote = ", " + shown + " of them shown (each model's steps evenly thinned to keep the page small)";
$("summary").textContent = D.models.length + " models (with their seeds), " + checkpoints +
  " analysed checkpoints" + (shown < checkpoints ? thinnedNote : "") +
  "; per-layer values (head null) of each model's sweep.parquet.";
draw();
"""


def _select(id_: str, label: str, options: tuple[str, ...] = (), multiple: bool = False) -> str:
    inner = "".join(f'<option value="{html.escape(o)}">{html.escape(o)}</option>' for o in options)
    size = ' multiple size="6"' if multiple else ""
    return f'<label>{html.escape(label)}<select id="{id_}"{size}>{inner}</select></label>'


def script_text(data_json: str) -> str:
    """`data_json` as a script element's text: its `<`, `>` and `&` (in names only: JSON has them nowhere else) as
    JSON's escapes, so that no name (`</script>`, `<!--`, `<script>`) can end the element or change how the HTML
    parser reads the rest of the page; JSON.parse gives the same names back."""
    return data_json.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


@cache
def plotly_js() -> str:
    """plotly.js's basic bundle, as the page inlines it."""
    return files(__package__).joinpath("plotly-basic.min.js").read_text(encoding="utf-8")


def page(data_json: str, title: str = "anisweep explorer") -> str:
    """The whole page around `data_json` (page_data as JSON)."""
    controls = "".join(
        [
            _select("view", "view", ("per-model", "survey")),
            _select("metric", "metric"),
            _select("site", "site"),
            _select("layers", "layers", multiple=True),
            _select("models", "models", multiple=True),
            _select("seeds", "seeds", multiple=True),
            _select("x", "x axis", ("step", "tokens")),
            _select("xscale", "x scale", ("log", "linear")),
            _select("yscale", "y scale", ("linear", "log")),
            '<label class="check"><input type="checkbox" id="bands" checked>intervals</label>',
        ]
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style>"
        f"<script>{plotly_js()}</script></head><body>"
        f'<h1>{html.escape(title)}</h1><div id="summary"></div><div id="controls">{controls}</div>'
        '<div id="bandnote"></div><ul id="notes"></ul>'
        '<div id="definition">What each metric and site means: glossary.md beside this page (docs/metrics.md).</div>'
        '<div id="plot"></div>'
        f'<script type="application/json" id="anisweep-data">{script_text(data_json)}</script>'
        f"<script>{_SCRIPT}</script></body></html>\n"
    )
