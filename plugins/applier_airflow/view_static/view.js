// The Applier view: fetches api/status (a relative URL, like every path here) and draws it. No framework, no build.
"use strict";

const MIB = 1024 * 1024;

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function mib(bytes) {
  return bytes === null || bytes === undefined ? "–" : (bytes / MIB).toFixed(2) + " MiB";
}

function seconds(s) {
  return s === null || s === undefined ? "–" : Number(s).toFixed(s < 10 ? 2 : 0) + " s";
}

// A lag or an age for people: seconds, then minutes, hours, days.
function duration(s) {
  if (s === null || s === undefined) return "–";
  if (s < 120) return seconds(s);
  if (s < 7200) return (s / 60).toFixed(0) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

function since(moment, now) {
  return moment ? duration(Math.max(0, (Date.parse(now) - Date.parse(moment)) / 1000)) : "–";
}

function pairs(seqs) {
  return seqs && seqs.length ? (seqs.length > 1 ? seqs[0] + "–" + seqs[seqs.length - 1] : String(seqs[0])) : "–";
}

function definitions(target, rows) {
  target.replaceChildren();
  for (const [name, value] of rows) {
    target.append(el("dt", name), el("dd", value));
  }
}

function docsLink(v) {
  if (!v.data_docs_url) return v.data_docs_page || "–";
  const a = el("a", "open");
  a.href = v.data_docs_url;  // relative: docs/… under this view, behind Airflow's login
  a.target = "_blank";
  return a;
}

function table(headers, rows) {
  const t = el("table");
  const head = t.createTHead().insertRow();
  for (const h of headers) head.append(el("th", h));
  const body = t.createTBody();
  for (const row of rows) {
    const tr = body.insertRow();
    for (const cell of row) {
      const td = tr.insertCell();
      if (cell instanceof Node) td.append(cell); else td.textContent = cell === null || cell === undefined ? "–" : String(cell);
    }
  }
  return t;
}

const SVG = "http://www.w3.org/2000/svg";
const PHASE_COLOURS = ["#3182ce", "#dd6b20", "#38a169", "#805ad5", "#d69e2e", "#e53e3e", "#319795", "#718096"];

function svgNode(tag, attributes) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attributes)) node.setAttribute(k, v);
  return node;
}

// One small chart of the last cycles, oldest on the left: a line (one value a cycle) or stacked bars
// (one value a phase a cycle). Its title, axis label and peak say what it shows; every mark has a tooltip.
function chart(label, cycles, series, stacked) {
  const width = 320, height = 90, top = 14, bottom = 4;
  const totals = cycles.map((c) => series.reduce((sum, [, value]) => sum + (value(c) || 0), 0));
  const peak = Math.max(...(stacked ? totals : cycles.map((c) => series[0][1](c) || 0)), 0) || 1;
  const y = (v) => height - bottom - v * (height - top - bottom) / peak;
  const step = (width - 2) / Math.max(cycles.length, 1);
  const svg = svgNode("svg", { width, height, role: "img", "aria-label": label + ", last " + cycles.length + " cycles" });
  const caption = svgNode("text", { x: 1, y: 10, class: "chart-label" });
  caption.textContent = label + " · peak " + Number(peak).toFixed(peak < 10 ? 2 : 0);
  svg.append(caption);
  if (stacked) {
    cycles.forEach((c, i) => {
      let base = 0;
      series.forEach(([name, value], k) => {
        const v = value(c) || 0;
        const bar = svgNode("rect", { x: (1 + i * step).toFixed(1), y: y(base + v).toFixed(1), width: Math.max(step - 1, 1).toFixed(1),
          height: (y(base) - y(base + v)).toFixed(1), fill: PHASE_COLOURS[k % PHASE_COLOURS.length], class: "phase" });
        const tip = svgNode("title", {});
        tip.textContent = "cycle " + c.cycle_id + ": " + name + " " + seconds(v);
        bar.append(tip);
        svg.append(bar);
        base += v;
      });
    });
  } else if (cycles.length) {
    const [name, value] = series[0];
    const x = (i) => (1 + i * step + step / 2).toFixed(1);
    svg.append(svgNode("polyline", { points: cycles.map((c, i) => x(i) + "," + y(value(c) || 0).toFixed(1)).join(" ") }));
    cycles.forEach((c, i) => {
      const dot = svgNode("circle", { cx: x(i), cy: y(value(c) || 0).toFixed(1), r: 2 });
      const tip = svgNode("title", {});
      tip.textContent = "cycle " + c.cycle_id + ": " + name + " " + (value(c) ?? "–");
      dot.append(tip);
      svg.append(dot);
    });
  }
  return svg;
}

function charts(cycles, phases) {
  const box = el("div", null, "charts");
  box.append(
    chart("changes/s", cycles, [["changes/s", (c) => c.changes_per_second]], false),
    chart("seconds per phase", cycles, phases.map((p) => [p, (c) => c.seconds[p]]), true),
    chart("driver MiB", cycles, [["driver peak MiB", (c) => c.driver_peak_rss_mib]], false));
  const legend = el("p", null, "legend");
  phases.forEach((p, k) => {
    const key = el("span", p);
    key.style.borderLeft = "0.8em solid " + PHASE_COLOURS[k % PHASE_COLOURS.length];
    legend.append(key);
  });
  box.append(legend);
  return box;
}

function draw(doc) {
  const s = doc.status;
  document.getElementById("configuration").textContent = s.configuration;
  document.getElementById("meta").textContent = "configuration file " + doc.config_file + " · read at " + s.generated_at;
  const cp = s.checkpoint, lag = s.lag, backlog = s.backlog;
  definitions(document.getElementById("positions"), [
    ["applied pair", cp.applied_seq ? cp.applied_seq + " (commit LSN " + cp.applied_commit_lsn + ")" : "none yet"],
    ["restart pair", cp.restart_seq],
    ["cycles", cp.cycle_id + ", last committed " + (cp.committed_at || "never")],
    ["lag", duration(lag.seconds) + " (last applied commit " + (lag.last_applied_commit_ts || "none") + ")"],
    ["oldest unapplied", lag.oldest_unapplied_commit_ts ? duration(lag.oldest_unapplied_seconds) + " old" : "none"],
    ["backlog", backlog.pairs + " pairs, " + mib(backlog.bytes)],
    ["changes read", s.totals.changes + " (by the cycles, open transactions' included)"],
  ]);

  const problems = document.getElementById("problems");
  problems.replaceChildren();
  if (s.blocked_by) {
    const what = s.blocked_by.kind === "transaction" ? "transaction " + s.blocked_by.xid : s.blocked_by.kind + " " + s.blocked_by.seq;
    problems.append(el("p", "BLOCKED by " + what + ": " + (s.blocked_by.detail || ""), "bad"));
  }
  if (s.last_error) problems.append(el("p", "last error (" + s.last_error.at + "): " + s.last_error.message, "bad"));
  if (!s.blocked_by && !s.last_error) problems.append(el("p", "nothing blocks", "good"));
  if (s.last_run) problems.append(el("p", "last run: " + (s.last_run.outcome || s.last_run.unreadable) + " at " + (s.last_run.finished_at || "–") + ", " + (s.last_run.cycles ?? "–") + " cycles"));

  const running = document.getElementById("running");
  running.replaceChildren();
  if (s.run_in_progress) {
    const r = s.run_in_progress;
    running.append(el("p", "host " + r.host + ", pid " + r.pid + ", started " + r.started_at + (r.run_key ? ", run key " + r.run_key : "")));
  } else running.append(el("p", "none", "none"));
  if (s.cycle_under_way) running.append(el("p", "cycle " + s.cycle_under_way.cycle_id + " under way: pairs " + pairs(s.cycle_under_way.seqs)));

  const open = document.getElementById("open");
  open.replaceChildren(s.open_transactions.length
    ? table(["xid", "age", "began in pair", "rows", "bytes", "spooled"], s.open_transactions.map((t) =>
        [t.xid, since(t.began_at, s.generated_at), t.began_seq, t.rows, mib(t.bytes), t.spilled ? "yes" : "no"]))
    : el("p", "none", "none"));

  const q = s.queue;
  definitions(document.getElementById("memory"), [
    ["queue budget", mib(q.budget_bytes)],
    ["last cycle's peak", mib(q.peak_bytes)],
    ["held at its end", Object.entries(q.memory_bytes).map(([k, v]) => k + " " + mib(v)).join(", ") || "–"],
    ["spooled during it", (Object.entries(q.spooled_bytes).map(([k, v]) => k + " " + mib(v)).join(", ") || "nothing") +
      " (" + q.spooled_buffers + " buffers)"],
    ["open transactions", mib(q.open_transaction_bytes)],
  ]);
  document.getElementById("spills").replaceChildren(s.spill_files.length
    ? table(["spill file", "bytes"], s.spill_files.map((f) => [f.name, f.bytes]))
    : el("p", "spill files: none", "none"));

  const phases = [...new Set(doc.cycles.flatMap((c) => Object.keys(c.seconds)))];
  document.getElementById("charts").replaceChildren(doc.cycles.length ? charts(doc.cycles, phases) : el("span"));
  document.getElementById("cycles").replaceChildren(doc.cycles.length
    ? table(["cycle", "pairs", "changes", "changes/s", ...phases.map((p) => p + " s"), "total s", "driver MiB", "queue peak"],
        doc.cycles.slice().reverse().map((c) => [c.cycle_id, pairs(c.seqs), c.rows_read, c.changes_per_second,
          ...phases.map((p) => c.seconds[p]), c.total_seconds, c.driver_peak_rss_mib, mib(c.queue_peak_bytes)]))
    : el("p", "no cycle yet", "none"));

  drawExceptions(doc.exceptions, s.set_aside, s.recent_cycles);

  const validation = Object.entries(doc.validation);
  document.getElementById("validation").replaceChildren(validation.length
    ? table(["table", "outcome", "expectations", "failed", "cycle", "validated at", "Data Docs page"], validation.map(([name, v]) =>
        [name, el("span", v.success ? "passed" : "FAILED", v.success ? "good" : "bad"), v.expectations, v.failed, v.cycle_id, v.validated_at, docsLink(v)]))
    : el("p", "no validation yet", "none"));
}

// The exceptions store: counts (beside what the last cycles' reports say, as applier status does) and the newest records.
function drawExceptions(x, setAside, recentCycles) {
  const summary = document.getElementById("exceptions-summary");
  const recent = Object.entries(setAside || {});
  const reported = "set aside in the last " + recentCycles + " cycles: " +
    (recent.length ? recent.map(([action, n]) => n + " " + action).join(", ") : "none");
  if (x.error) {
    summary.replaceChildren(el("span", "exceptions store unreadable: " + x.error, "bad"), el("span", " · " + reported));
    document.getElementById("exceptions").replaceChildren();
    return;
  }
  summary.replaceChildren(el("span", x.open + " open", x.open ? "bad" : "good"),
    el("span", ", " + x.resubmitted + " resubmitted · " + reported +
      (x.total > x.records.length ? " · the newest " + x.records.length + " of " + x.total + " listed" : "")));
  document.getElementById("exceptions").replaceChildren(x.records.length
    ? table(["id", "logged at", "cycle", "transaction", "commit LSN", "pair", "table", "error", "action", "changes", "message", "resubmitted"],
        x.records.map((r) => [r.id, r.logged_at, r.cycle_id, r.xid, r.commit_lsn, r.pair_seq, r.table_name,
          r.error_class + (r.sqlstate ? " " + r.sqlstate : ""), r.action, r.changes, el("span", r.message, "message"),
          r.resubmitted_at || resubmitButton(r)]))
    : el("p", "none", "none"));
}

function resubmitButton(r) {
  const button = el("button", "Resubmit", "resubmit");
  button.type = "button";
  button.setAttribute("data-exception-id", r.id);
  button.title = "apply transaction " + r.xid + " to the target now, as applier exceptions resubmit " + r.id + " does";
  button.addEventListener("click", () => resubmit(r, button));
  return button;
}

// POSTs the resubmission (relative URL; the UI's cookie authorises it, the browser adds Origin), then redraws.
async function resubmit(r, button) {
  const question = "Resubmit exception " + r.id + ": apply transaction " + r.xid + " (" + r.changes +
    " changes, table " + r.table_name + ") to the target now?";
  if (!confirm(question)) return;
  const result = document.getElementById("resubmit-result");
  button.disabled = true;
  try {
    const response = await fetch(`api/exceptions/${encodeURIComponent(r.id)}/resubmit`,
      { method: "POST", credentials: "same-origin", headers: { Accept: "application/json" } });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.error || body.detail || response.status + " " + response.statusText);
    result.replaceChildren(el("span", body.message, "good"));
  } catch (e) {
    result.replaceChildren(el("span", "exception " + r.id + " not resubmitted: " + e.message, "bad"));
    button.disabled = false;
  }
  result.hidden = false;
  await load();
}

async function load() {
  const error = document.getElementById("error");
  try {
    const response = await fetch("api/status", { credentials: "same-origin", headers: { Accept: "application/json" } });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.error || body.detail || response.status + " " + response.statusText);
    draw(body);
    error.hidden = true;
    document.getElementById("view").hidden = false;
  } catch (e) {
    error.textContent = "Cannot read the Applier's status: " + e.message;
    error.hidden = false;
  }
}

load();
setInterval(load, 30000);
