"""A run's report as one self-contained HTML page (no network needed to open it) that shows where the
time and the money went, drawn from the figures report.py gathers:

- a timeline: one row per job, one coloured span per phase of each attempt (lease, upload, run,
  fetch, release), a failed attempt marked with its code; drawn by the page's own script from the
  data embedded in it, so the page is one file;
- cost by cloud and GPU (dollars, machine time, attempts);
- the walk: for each candidate place, how often it was tried and what came of it, and each job's
  path across the candidates;
- the batch's budget and its reservations (money set aside before each lease, then charged);
- the table of jobs, each attempt linked to its seed's log.txt (the timeline's rows and spans too);
- a resume's gap on the timeline: where the owner of a job's events changes, from the dead
  controller's last event to the adopter's first (no controller watched the job in between).

`render(report, base)` makes the page (`base`: its folder, for relative links).
"""

from __future__ import annotations

import html
import os
import re
import time
import urllib.parse

import msgspec

from actor_run.supervisors.views.report import AttemptRow, JobRow, Money, Report


def _money(usd: float) -> str:
    return f"${usd:.4f}"


def _table(head: list[str], rows: list[list[str]], cls: str) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def cost_rows(report: Report) -> list[list[str]]:
    by: dict[tuple[str, str], list[float]] = {}
    for j in report.jobs:
        for a in j.attempts:
            cell = by.setdefault((a.cloud, a.gpu), [0.0, 0.0, 0])
            cell[0] += a.usd
            cell[1] += a.seconds
            cell[2] += 1
    rows = [[html.escape(cloud), html.escape(gpu or "-"), _money(v[0]), f"{v[1] / 3600:.3f} h", str(int(v[2]))]
            for (cloud, gpu), v in sorted(by.items(), key=lambda kv: -kv[1][0])]
    total = sum(v[0] for v in by.values())
    rows.append(["<b>total</b>", "", f"<b>{_money(total)}</b>", "", str(sum(int(v[2]) for v in by.values()))])
    return rows


def walk_rows(report: Report) -> list[list[str]]:
    places: dict[tuple[int, str], dict[str, int]] = {}
    for j in report.jobs:
        for a in j.attempts:
            tally = places.setdefault((a.candidate, a.place), {})
            result = a.failure or a.outcome or "unfinished"
            tally[result] = tally.get(result, 0) + 1
    return [[str(c), html.escape(place), str(sum(t.values())),
             html.escape(", ".join(f"{k} {v}" for k, v in sorted(t.items())))]
            for (c, place), t in sorted(places.items())]


def _path(job: JobRow) -> str:
    steps = []
    for a in job.attempts:
        result = a.failure or a.outcome or "…"
        steps.append(f'<span class="step {"bad" if a.failure else "ok"}">#{a.candidate} {html.escape(a.place)}'
                     f" → {html.escape(result)}</span>")
    return " ".join(steps) or "-"


def _logs(job: JobRow, href: str) -> str:
    """One link per attempt to the seed's log.txt (each attempt's part of it is under its own header)."""
    if not href:
        return "-"
    return " ".join(f'<a class="log" data-attempt="{a.attempt}" href="{html.escape(href)}">attempt {a.attempt}</a>'
                    + _cut(a) for a in job.attempts) or f'<a class="log" href="{html.escape(href)}">log</a>'


def _cut(a: AttemptRow) -> str:
    """What an attempt's log lost: its middle, cut (a mark in log.txt says where the whole stayed),
    and progress lines never emitted."""
    said = []
    if a.log_cut:
        said.append(f"log cut: {a.log_cut / 1e6:.1f} MB of its middle, see the mark in log.txt")
    if a.progress_dropped:
        said.append(f"{a.progress_dropped} progress lines dropped")
    return f' <span class="cut">({html.escape("; ".join(said))})</span>' if said else ""


# JSON inside a <script> element: no `<` (no `</script>`, no `<!--` that would change how the
# element ends), `>` and `&` for good measure, and U+2028/2029 (line ends to older JavaScript)
_SCRIPT_SAFE = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026", 0x2028: "\\u2028", 0x2029: "\\u2029"}
_SLOT = re.compile(r"\{\{(\w+)\}\}")


def script_json(value: object) -> str:
    """`value` as JSON that a <script type="application/json"> element holds as it is."""
    return msgspec.json.encode(value).decode().translate(_SCRIPT_SAFE)


def fill(page: str, slots: dict[str, str]) -> str:
    """Each `{{name}}` of the page replaced once, in one pass: a value is never searched for slots."""
    return _SLOT.sub(lambda m: slots[m.group(1)], page)


def _link(path: str, base: str | None) -> str:
    """A link to a file: relative to the page's folder `base` when given, else a file: URL."""
    if not path:
        return ""
    if base is not None:
        return "/".join(os.path.relpath(os.path.abspath(path), os.path.abspath(base)).split(os.sep))
    return "file://" + urllib.parse.quote(os.path.abspath(path))


def budget_rows(money: Money) -> list[list[str]]:
    budget = _money(money.budget_usd) if money.budget_usd is not None else "none set"
    return [["budget", budget],
            ["reservations", f"{money.reservations}: {_money(money.reserved_usd)} set aside"],
            ["charged", _money(money.charged_usd)],
            ["still held", f"{money.held}: {_money(money.held_usd)}"]]


def render(report: Report, base: str | None = None) -> str:
    """The page; `base` is the folder it will sit in (its links to the logs are relative to it)."""
    logs = {j.key: _link(j.log, base) for j in report.jobs}
    data = script_json({
        "t0": report.started, "t1": report.ended,
        "jobs": [{"key": j.key, "state": j.state, "failure": j.failure, "log": logs[j.key],
                  "gaps": [[g.t0, g.t1, g.attempt] for g in j.gaps],
                  "attempts": [{"attempt": a.attempt, "place": a.place, "failure": a.failure, "outcome": a.outcome,
                                "usd": a.usd, "spans": [[s.phase, s.t0, s.t1] for s in a.spans]}
                               for a in j.attempts]} for j in report.jobs],
    })
    jobs_table = _table(
        ["job", "state", "attempts", "cost", "failure", "path across candidates", "logs"],
        [[html.escape(j.key), f'<span class="state {html.escape(j.state)}">{html.escape(j.state)}</span>',
          str(j.used), _money(j.usd),
          html.escape(f"{j.failure}: {j.detail}" if j.failure else ""), _path(j), _logs(j, logs[j.key])]
         for j in report.jobs], "jobs")
    n = len(report.jobs)
    ok = sum(j.state == "succeeded" for j in report.jobs)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.started)) if report.started else "-"
    canceled = sum(j.state == "canceled" for j in report.jobs)
    summary = (f"{n} jobs: {ok} succeeded, {sum(j.state == 'failed' for j in report.jobs)} failed; "
               + (f"{canceled} canceled; " if canceled else "") +
               f"{sum(j.used for j in report.jobs)} attempts; "
               f"{_money(sum(j.usd for j in report.jobs))}; started {when}, "
               f"{report.ended - report.started:.1f} s")
    return fill(_PAGE, {
        "run": html.escape(report.run),
        "batch": html.escape(report.batch or "-"),
        "out": html.escape(report.out_dir or "-"),
        "summary": html.escape(summary),
        "budget": _table(["", ""], budget_rows(report.money), "budget"),
        "cost": _table(["cloud", "GPU", "cost", "machine time", "attempts"], cost_rows(report), "cost"),
        "walk": _table(["candidate", "place", "attempts", "results"], walk_rows(report), "walk"),
        "jobs": jobs_table,
        "data": data,
    })


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>actor-run report: run {{run}}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; } td, th { padding: 3px 10px; border-bottom: 1px solid #ddd; text-align: left; }
.meta { color: #555; }
.legend span { display: inline-block; padding: 1px 8px; margin-right: 6px; border-radius: 3px; color: #fff; }
#timeline { margin-top: 8px; }
.tl-row { display: flex; align-items: flex-end; height: 32px; }
.tl-label { width: 220px; flex: none; overflow: hidden; white-space: nowrap; font-size: 12px; }
.tl-track { position: relative; flex: 1; height: 16px; background: #f4f4f4; }
.span { position: absolute; top: 1px; height: 14px; min-width: 1px; border-radius: 2px; }
.phase-lease { background: #8e7cc3; } .phase-upload { background: #6fa8dc; } .phase-run { background: #6aa84f; }
.phase-fetch { background: #f6b26b; } .phase-release { background: #999; }
.fail { position: absolute; top: -14px; transform: translateX(-50%); font-size: 10px; line-height: 12px; color: #c00;
        font-weight: bold; white-space: nowrap; }
.axis { position: relative; height: 16px; margin-left: 220px; font-size: 11px; color: #777; }
.axis span { position: absolute; white-space: nowrap; }
.gap { position: absolute; top: 0; height: 16px; min-width: 2px; background: repeating-linear-gradient(
        45deg, #c00 0 3px, transparent 3px 6px); opacity: 0.6; }
.tl-label a { color: inherit; text-decoration: none; }
.state.succeeded { color: #38761d; } .state.failed { color: #c00; }
td:first-child { white-space: nowrap; }
.step.bad { color: #c00; } .step.ok { color: #38761d; }
</style></head>
<body>
<h1>Run {{run}}</h1>
<p class="meta">batch {{batch}} · results in {{out}}<br>{{summary}}</p>
<h2>Timeline</h2>
<p class="legend"><span class="phase-lease">lease</span><span class="phase-upload">upload</span>
<span class="phase-run">run</span><span class="phase-fetch">fetch</span><span class="phase-release">release</span>
<b style="color:#c00">✕ code</b> a failed attempt;
<span class="gap" style="position: static; display: inline-block; width: 24px"></span>
a resume's gap (no controller)</p>
<div id="timeline"></div>
<h2>Budget and reservations</h2>
{{budget}}
<h2>Cost by cloud and GPU</h2>
{{cost}}
<h2>The walk across candidates</h2>
{{walk}}
<h2>Jobs</h2>
{{jobs}}
<script type="application/json" id="data">{{data}}</script>
<script>
(function () {
  var data = JSON.parse(document.getElementById("data").textContent);
  var root = document.getElementById("timeline");
  var t0 = data.t0, width = Math.max(data.t1 - data.t0, 0.001);
  function pct(t) { return (100 * (t - t0) / width).toFixed(3) + "%"; }
  var axis = document.createElement("div");
  axis.className = "axis";
  // ticks at round values: a step of 1, 2 or 5 times a power of ten, about five of them
  var raw = width / 5, power = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / power;
  var step = (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * power;
  var decimals = Math.max(0, -Math.floor(Math.log10(step)));
  for (var v = 0; v <= width + step * 1e-9; v += step) {
    var tick = document.createElement("span");
    tick.className = "tick";
    tick.style.left = (100 * v / width).toFixed(3) + "%";
    if (v + step > width + step * 1e-9 && v > 0) { tick.style.transform = "translateX(-100%)"; }
    tick.textContent = v.toFixed(decimals) + " s";
    tick.dataset.value = v.toFixed(decimals);
    axis.appendChild(tick);
  }
  root.appendChild(axis);
  data.jobs.forEach(function (job) {
    var row = document.createElement("div");
    row.className = "tl-row";
    row.dataset.job = job.key;
    var label = document.createElement("div");
    label.className = "tl-label";
    if (job.log) {
      var link = document.createElement("a");
      link.href = job.log;
      link.className = "log";
      link.textContent = job.key + " (" + job.state + ")";
      label.appendChild(link);
    } else {
      label.textContent = job.key + " (" + job.state + ")";
    }
    var track = document.createElement("div");
    track.className = "tl-track";
    job.attempts.forEach(function (a) {
      var end = t0;
      a.spans.forEach(function (s) {
        var span = document.createElement("div");
        span.className = "span phase-" + s[0];
        span.dataset.attempt = a.attempt;
        if (job.log) {
          span.dataset.log = job.log;
          span.style.cursor = "pointer";
          span.addEventListener("click", function () { window.location.href = job.log; });
        }
        span.style.left = pct(s[1]);
        span.style.width = (100 * (s[2] - s[1]) / width).toFixed(3) + "%";
        span.title = job.key + " attempt " + a.attempt + " on " + a.place + ": " + s[0] + " " +
          (s[2] - s[1]).toFixed(2) + " s";
        track.appendChild(span);
        end = Math.max(end, s[2]);
      });
      if (a.failure) {
        var mark = document.createElement("div");
        mark.className = "fail";
        mark.dataset.code = a.failure;
        mark.style.left = pct(end);
        mark.textContent = "✕ " + a.failure;
        mark.title = "attempt " + a.attempt + " failed: " + a.failure;
        track.appendChild(mark);
      }
    });
    job.gaps.forEach(function (g) {
      var gap = document.createElement("div");
      gap.className = "gap";
      gap.dataset.attempt = g[2];
      gap.style.left = pct(g[0]);
      gap.style.width = (100 * (g[1] - g[0]) / width).toFixed(3) + "%";
      gap.title = job.key + ": no controller for " + (g[1] - g[0]).toFixed(2) + " s (resumed)";
      track.appendChild(gap);
    });
    row.appendChild(label);
    row.appendChild(track);
    root.appendChild(row);
  });
  // failure labels that would touch go up a level each (their row grows to hold them)
  var overlaps = 0;
  Array.prototype.forEach.call(root.querySelectorAll(".tl-track"), function (track) {
    var marks = Array.prototype.slice.call(track.querySelectorAll(".fail"));
    marks.sort(function (a, b) { return a.getBoundingClientRect().left - b.getBoundingClientRect().left; });
    var ends = [];
    marks.forEach(function (mark) {
      var box = mark.getBoundingClientRect(), level = 0;
      while (level < ends.length && box.left < ends[level] + 3) { level++; }
      ends[level] = box.right;
      mark.style.top = (-14 - 13 * level) + "px";
    });
    if (ends.length > 1) { track.parentNode.style.height = (32 + 13 * (ends.length - 1)) + "px"; }
    for (var i = 0; i < marks.length; i++) {
      for (var j = i + 1; j < marks.length; j++) {
        var a = marks[i].getBoundingClientRect(), b = marks[j].getBoundingClientRect();
        if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom) { overlaps++; }
      }
    }
  });
  root.dataset.overlaps = String(overlaps);
  root.dataset.ready = "1";
})();
</script>
</body></html>
"""
