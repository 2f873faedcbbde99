"""The dashboard's one page: self-contained HTML, CSS and script (no CDN, nothing fetched but this
server's own `/events` stream and `/api/*`). Every name and log line a job wrote is put on the page
as text (`textContent`), never as markup, so a hostile name renders as the characters it is."""

from __future__ import annotations

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>actor-run</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body { font: 13px/1.4 system-ui, sans-serif; margin: 1em 2em; color: #222; }
h1 { font-size: 16px; margin: 0 0 .5em; } h2 { font-size: 14px; margin: 1.2em 0 .4em; }
table { border-collapse: collapse; width: 100%; } td, th { padding: 2px 6px; text-align: left; white-space: nowrap; }
th { border-bottom: 1px solid #999; font-weight: 600; } tr.sel { background: #eef; } tr.click { cursor: pointer; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.bar { display: inline-block; width: 120px; height: 9px; background: #ddd; vertical-align: middle; }
.bar i { display: block; height: 100%; background: #3a7; }
.failed { color: #b00; } .succeeded { color: #070; } .canceled { color: #a60; } .abandoned { color: #a60; }
pre { background: #f6f6f6; padding: .5em; max-height: 24em; overflow: auto; white-space: pre-wrap; }
#stale { color: #b00; } button { font-size: 12px; }
</style></head>
<body>
<h1>actor-run <span id="ledger"></span> <span id="stale"></span></h1>
<h2>Runs</h2><table id="runs"><thead><tr><th>run</th><th>batch</th><th>state</th><th>done</th><th>failed</th>
<th>left</th><th>spent</th><th>reserved</th><th>budget</th><th></th></tr></thead><tbody></tbody></table>
<h2>Jobs of <span id="runid"></span></h2><table id="jobs"><thead><tr><th>job</th><th>state</th><th>att</th>
<th>place</th><th>stage</th><th>progress</th><th>cost</th><th>failure</th><th></th></tr></thead><tbody></tbody></table>
<div id="job"></div>
<h2>Machines alive</h2><table id="machines"><thead><tr><th>machine</th><th>cloud</th><th>region</th><th>job</th>
<th>$/h</th><th>deadline in</th></tr></thead><tbody></tbody></table>
<h2>Controllers</h2><table id="owners"><thead><tr><th>owner</th><th>host</th><th>pid</th><th>lease left</th></tr>
</thead><tbody></tbody></table>
<script>
"use strict";
const token = new URLSearchParams(location.search).get("token") || "";
let chosenRun = null, chosenJob = null, canCancel = false, lastAt = Date.now();
function cell(tr, text, cls) { const td = document.createElement("td"); td.textContent = text == null ? "" : String(text);
  if (cls) td.className = cls; tr.appendChild(td); return td; }
function usd(x) { return "$" + Number(x || 0).toFixed(4); }
function secs(s) { s = Math.max(0, Math.round(s)); const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60);
  return (h ? h + ":" + String(m).padStart(2, "0") : m) + ":" + String(s % 60).padStart(2, "0"); }
function cancelButton(tr, what) { const td = document.createElement("td"); tr.appendChild(td);
  if (!canCancel) return; const b = document.createElement("button"); b.textContent = "cancel";
  b.onclick = (ev) => { ev.stopPropagation(); fetch("api/cancel", { method: "POST",
    headers: { "Authorization": "Bearer " + token, "Content-Type": "application/json" },
    body: JSON.stringify(what) }).then(r => { b.textContent = r.ok ? "asked" : "refused " + r.status; }); };
  td.appendChild(b); }
function fill(id, rows, make) { const body = document.querySelector("#" + id + " tbody"); body.replaceChildren();
  for (const r of rows) { const tr = document.createElement("tr"); make(tr, r); body.appendChild(tr); } }
function draw(s) {
  canCancel = !!s.can_cancel;
  document.getElementById("ledger").textContent = s.ledger || "";
  fill("runs", s.runs, (tr, r) => { tr.className = "click" + (r.id === s.run ? " sel" : "");
    tr.onclick = () => { chosenRun = r.id; chosenJob = null; connect(); };
    cell(tr, r.id); cell(tr, r.batch); cell(tr, r.state, r.state); cell(tr, r.succeeded, "num"); cell(tr, r.failed, "num");
    cell(tr, r.left, "num"); cell(tr, usd(r.usd), "num"); cell(tr, usd(r.reserved), "num");
    cell(tr, r.budget == null ? "" : "$" + Number(r.budget).toFixed(2), "num");
    if (r.left) cancelButton(tr, { run: r.id }); else cell(tr, ""); });
  document.getElementById("runid").textContent = s.run || "";
  fill("jobs", s.jobs, (tr, j) => { tr.className = "click" + (j.key === chosenJob ? " sel" : "");
    tr.onclick = () => { chosenJob = j.key; showJob(); };
    cell(tr, j.key); cell(tr, j.state, j.state); cell(tr, j.attempt, "num"); cell(tr, j.place); cell(tr, j.stage);
    const td = cell(tr, "");
    if (j.total) { const bar = document.createElement("span"); bar.className = "bar"; const fillEl = document.createElement("i");
      fillEl.style.width = Math.min(100, 100 * (j.step || 0) / j.total) + "%"; bar.appendChild(fillEl); td.appendChild(bar);
      td.appendChild(document.createTextNode(" " + (j.step || 0) + "/" + j.total)); }
    else if (j.step != null) td.textContent = "step " + j.step;
    cell(tr, usd(j.usd), "num"); cell(tr, j.failure ? j.failure + ": " + j.detail : "", "failed");
    if (["running", "starting", "waiting", "queued"].includes(j.state)) cancelButton(tr, { run: s.run, job: j.key });
    else cell(tr, ""); });
  fill("machines", s.machines, (tr, m) => { cell(tr, m.name); cell(tr, m.cloud); cell(tr, m.region); cell(tr, m.job);
    cell(tr, Number(m.hourly_usd).toFixed(2), "num"); cell(tr, secs(m.deadline - s.now), "num"); });
  fill("owners", s.owners, (tr, o) => { cell(tr, o.short); cell(tr, o.host); cell(tr, o.pid, "num");
    cell(tr, o.lease_until == null ? "" : secs(o.lease_until - s.now), "num"); });
  if (chosenJob) showJob();
}
function showJob() {
  const run = chosenRun || (document.getElementById("runid").textContent);
  fetch("api/job?" + new URLSearchParams({ run: run, key: chosenJob, token: token })).then(r => r.ok ? r.json() : null)
    .then(j => { const box = document.getElementById("job"); box.replaceChildren(); if (!j) return;
      const h = document.createElement("h2"); h.textContent = "Attempts of " + j.key; box.appendChild(h);
      const t = document.createElement("table");
      for (const a of j.attempts) { const tr = document.createElement("tr"); cell(tr, a.attempt, "num");
        cell(tr, a.cloud + " " + a.region); cell(tr, a.state, a.state); cell(tr, a.failure ? a.failure + ": " + a.detail : "", "failed");
        cell(tr, usd(a.usd), "num"); t.appendChild(tr); }
      box.appendChild(t); const pre = document.createElement("pre"); pre.id = "log"; pre.textContent = j.log; box.appendChild(pre);
      pre.scrollTop = pre.scrollHeight; });
}
let source = null;
function connect() {
  if (source) source.close();
  const q = new URLSearchParams({ token: token }); if (chosenRun) q.set("run", chosenRun);
  source = new EventSource("events?" + q);
  source.onmessage = (m) => { lastAt = Date.now(); draw(JSON.parse(m.data)); };
}
setInterval(() => { document.getElementById("stale").textContent =
  Date.now() - lastAt > 5000 ? "(no update for " + Math.round((Date.now() - lastAt) / 1000) + " s)" : ""; }, 1000);
connect();
</script></body></html>
"""
