#include "starling/net/dashboard_page.h"

namespace starling::net {

// The page polls /api/swarm and /api/history once a second and redraws: a members table (state,
// step, loss, tokens/s, validation loss, network wait, the strategy's round and staleness, the
// last checkpoint), the measured link matrix, and loss and tokens/s curves per member (SVG drawn
// here, no chart library).
const char* dashboard_page() {
  return R"HTML(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Starling swarm</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 20px; color: #1d2330; background: #f7f8fa; }
  h1 { font-size: 20px; margin: 0 0 4px; }
  h2 { font-size: 15px; margin: 22px 0 6px; }
  #summary { color: #555; }
  #error { color: #b00020; font-weight: 600; }
  table { border-collapse: collapse; background: #fff; }
  th, td { padding: 4px 10px; border-bottom: 1px solid #e3e6eb; text-align: right; }
  th { background: #eef1f5; font-weight: 600; }
  td.text, th.text { text-align: left; }
  .alive { color: #1a7f37; } .dead, .left { color: #b00020; }
  .charts { display: flex; flex-wrap: wrap; gap: 16px; }
  .chart { background: #fff; border: 1px solid #e3e6eb; padding: 8px; }
  .legend span { margin-right: 12px; }
  svg text { font-size: 11px; fill: #555; }
</style>
</head>
<body>
<h1>Starling swarm</h1>
<div id="summary">waiting for the first view&hellip;</div>
<div id="error"></div>

<h2>Members</h2>
<table id="members">
  <thead><tr>
    <th class="text">id</th><th class="text">name</th><th class="text">state</th>
    <th class="text">role</th><th>heard</th><th>step</th><th>loss</th><th>tokens/s</th>
    <th>val loss</th><th>net wait</th><th>round</th><th>staleness gap</th><th>checkpoint</th>
  </tr></thead>
  <tbody></tbody>
</table>

<h2>Links <small>(row &rarr; column: Mbit/s, round trip ms; measured by the peers)</small></h2>
<table id="links"><tbody></tbody></table>

<h2>Training</h2>
<div class="legend" id="legend"></div>
<div class="charts">
  <div class="chart"><div>loss against step</div><svg id="loss" width="520" height="260"></svg></div>
  <div class="chart"><div>tokens/s against step</div><svg id="speed" width="520" height="260"></svg></div>
</div>

<script>
"use strict";
const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#0598bc", "#d63384", "#57606a"];
const colorOf = {};
function color(id) {
  if (!(id in colorOf)) colorOf[id] = COLORS[Object.keys(colorOf).length % COLORS.length];
  return colorOf[id];
}
function fmt(v, digits) {
  if (v === undefined || v === null || Number.isNaN(v)) return "-";
  return typeof v === "number" ? v.toFixed(digits) : String(v);
}
function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}
function drawMembers(view) {
  const body = document.querySelector("#members tbody");
  body.replaceChildren();
  for (const m of view.members) {
    const p = m.progress || {};
    const tr = document.createElement("tr");
    tr.className = "member";
    tr.dataset.id = m.id;
    const id = cell(m.id, "text id");
    id.style.color = color(m.id);
    tr.append(id, cell(m.name || "", "text"), cell(m.state, "text state " + m.state),
              cell(m.role || "", "text"), cell(fmt(m.heard_s, 1) + " s"),
              cell(fmt(p.step, 0), "step"), cell(fmt(p.loss, 4), "loss"),
              cell(fmt(p.tokens_per_s, 0), "speed"), cell(fmt(p.val_loss, 4)),
              cell(p.net_wait_s === undefined ? "-" : fmt(p.net_wait_s, 2) + " s"),
              cell(fmt(p.round, 0)), cell(fmt(p.gap, 4)),
              cell(p.checkpoint_step === undefined ? "-" : "step " + fmt(p.checkpoint_step, 0)));
    body.append(tr);
  }
}
function drawLinks(view) {
  const body = document.querySelector("#links tbody");
  body.replaceChildren();
  const ids = view.members.map(m => m.id);
  const at = {};
  for (const l of view.links) at[l.from + ">" + l.to] = l;
  const head = document.createElement("tr");
  head.append(document.createElement("th"));
  for (const id of ids) { const th = document.createElement("th"); th.textContent = id; head.append(th); }
  body.append(head);
  for (const a of ids) {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.textContent = a;
    tr.append(th);
    for (const b of ids) {
      const l = at[a + ">" + b];
      tr.append(cell(a === b ? "self" : !l ? "-" :
        (l.mbit_per_s === null ? "-" : fmt(l.mbit_per_s, 0)) + " / " +
        (l.rtt_ms === null ? "-" : fmt(l.rtt_ms, 2))));
    }
    body.append(tr);
  }
}
function drawChart(svg, series, key) {
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height");
  const L = 52, R = 10, T = 10, B = 24;
  let xs = [], ys = [];
  for (const pts of Object.values(series))
    for (const p of pts) if (p[key] !== undefined && p.step !== undefined) { xs.push(p.step); ys.push(p[key]); }
  svg.replaceChildren();
  const ns = "http://www.w3.org/2000/svg";
  const el = (name, attrs) => { const e = document.createElementNS(ns, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]); svg.append(e); return e; };
  el("rect", {x: L, y: T, width: W - L - R, height: H - T - B, fill: "none", stroke: "#ccd"});
  if (xs.length === 0) { el("text", {x: L + 10, y: T + 20}).textContent = "no steps yet"; return; }
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = y => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  for (let i = 0; i <= 4; ++i) {
    const y = y0 + (y1 - y0) * i / 4;
    el("text", {x: 4, y: sy(y) + 4}).textContent = y >= 100 ? y.toFixed(0) : y.toFixed(3);
  }
  el("text", {x: L, y: H - 6}).textContent = "step " + x0;
  el("text", {x: W - R - 60, y: H - 6}).textContent = "step " + x1;
  for (const [id, pts] of Object.entries(series)) {
    const d = pts.filter(p => p[key] !== undefined && p.step !== undefined)
                 .map(p => sx(p.step).toFixed(1) + "," + sy(p[key]).toFixed(1)).join(" ");
    if (d) el("polyline", {points: d, fill: "none", stroke: color(id), "stroke-width": 1.5});
  }
}
async function refresh() {
  try {
    const [view, hist] = await Promise.all([
      fetch("api/swarm", {cache: "no-store"}).then(r => r.json()),
      fetch("api/history", {cache: "no-store"}).then(r => r.json())]);
    const alive = view.members.filter(m => m.state === "alive").length;
    document.getElementById("summary").textContent =
      view.members.length + " members, " + alive + " alive" +
      (view.answered_by ? " (as seen by " + view.answered_by + ")" : "") +
      (view.source ? " from " + view.source : "") +
      (view.age_s === null ? "" : "; updated " + fmt(view.age_s, 1) + " s ago");
    document.getElementById("error").textContent = view.error ? "no answer: " + view.error : "";
    drawMembers(view);
    drawLinks(view);
    drawChart(document.getElementById("loss"), hist.members, "loss");
    drawChart(document.getElementById("speed"), hist.members, "tokens_per_s");
    document.getElementById("legend").replaceChildren(...view.members.map(m => {
      const s = document.createElement("span");
      s.style.color = color(m.id);
      s.textContent = "\u25A0 " + m.id + (m.name ? " " + m.name : "");
      return s;
    }));
  } catch (e) {
    document.getElementById("error").textContent = "the dashboard does not answer: " + e;
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
)HTML";
}

}  // namespace starling::net
