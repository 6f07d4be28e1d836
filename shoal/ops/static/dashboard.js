// shoal ops dashboard: reads /dashboard/api/history once, then one document per second from
// the live feed (/dashboard/api/stream, server-sent events; polling /dashboard/api/stats where
// EventSource is missing). Plots are inline SVG; every text goes in through textContent.
"use strict";

const API = "/dashboard/api/";
const KEEP = 600;  // points of history kept (10 minutes at 1 Hz)
const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#2b6cb0", "#dd6b20", "#2f855a", "#b83280", "#6b46c1", "#c53030",
                "#319795", "#975a16", "#4a5568", "#d69e2e"];

const history = { time: [], processes: {}, models: {} };
let samplerStarted = null;

// ------------------------------------------------------------------ formatting

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}
function ms(us) {
  if (us === null || us === undefined) return "–";
  return us >= 100000 ? (us / 1e6).toFixed(2) + " s" : (us / 1000).toFixed(us < 10000 ? 2 : 1) + " ms";
}
function num(x, digits) { return x === null || x === undefined ? "–" : Number(x).toFixed(digits); }
function duration(s) {
  if (s < 60) return Math.round(s) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(Math.round(s % 60)).padStart(2, "0");
  if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0");
  return Math.floor(s / 86400) + "d" + Math.floor(s % 86400 / 3600) + "h";
}
const colors = new Map();  // series key -> color, in order of first appearance
function colorOf(key) {
  if (!colors.has(key)) colors.set(key, COLORS[colors.size % COLORS.length]);
  return colors.get(key);
}

// ------------------------------------------------------------------ DOM helpers

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}
function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}
function row(cells) {
  const tr = el("tr");
  for (const cell of cells) {
    if (cell instanceof Node) { const td = el("td"); td.appendChild(cell); tr.appendChild(td); }
    else if (cell && typeof cell === "object") { tr.appendChild(el("td", cell.attrs, cell.text)); }
    else tr.appendChild(el("td", { class: "num" }, cell));
  }
  return tr;
}
function fill(tableId, rows, emptyText, columns) {
  const body = document.querySelector("#" + tableId + " tbody");
  body.replaceChildren(...rows);
  if (!rows.length) body.appendChild(el("tr", {}, "")).appendChild(
    el("td", { colspan: columns, class: "empty" }, emptyText));
}

// ------------------------------------------------------------------ plots

function sparkline(values, color, floor) {
  const w = 80, h = 18;
  const pts = values.slice(-60);
  const max = Math.max(floor || 1e-9, ...pts.filter(v => v !== null));
  const node = svg("svg", { width: w, height: h, viewBox: `0 0 ${w} ${h}`, class: "spark" });
  node.appendChild(svg("polyline", {
    fill: "none", stroke: color, "stroke-width": "1.2",
    points: pts.map((v, i) => v === null ? null :
      `${(i * w / Math.max(1, pts.length - 1)).toFixed(1)},${(h - 1 - (v / max) * (h - 2)).toFixed(1)}`)
      .filter(p => p !== null).join(" "),
  }));
  return node;
}

function bars(batchSizes) {
  const recent = batchSizes.filter(b => b.recent > 0);
  const shown = recent.length ? recent : batchSizes;
  const field = recent.length ? "recent" : "executions";
  const wrap = el("span");
  if (!shown.length) { wrap.textContent = "–"; return wrap; }
  const w = Math.max(24, shown.length * 9), h = 18;
  const max = Math.max(...shown.map(b => b[field]));
  const node = svg("svg", { width: w, height: h, viewBox: `0 0 ${w} ${h}` });
  shown.forEach((b, i) => {
    const bh = Math.max(1, (b[field] / max) * (h - 2));
    const rect = svg("rect", { x: i * 9, y: h - bh, width: 7, height: bh, fill: "#2b6cb0" });
    const title = svg("title");
    title.textContent = `batch ${b.batch_size}: ${b[field]} executions` +
      (field === "recent" ? " (last ~10 s)" : " (since load)");
    rect.appendChild(title);
    node.appendChild(rect);
  });
  wrap.appendChild(node);
  wrap.appendChild(el("span", { class: "sub" },
    " " + shown.map(b => b.batch_size).join(",")));
  return wrap;
}

function lineChart(title, series, format, floor) {
  const w = 320, h = 110, left = 4, top = 14, bottom = 14;
  const box = el("div", { class: "plot" });
  box.appendChild(el("h3", {}, title));
  const node = svg("svg", { viewBox: `0 0 ${w} ${h}`, role: "img", "aria-label": title });
  const n = history.time.length;
  let max = 0;
  for (const s of series) for (const v of s.values) if (v !== null && v > max) max = v;
  const scale = Math.max(max, floor);  // small noise is not drawn full height
  for (const frac of [0, 0.5, 1]) {
    const y = top + (h - top - bottom) * (1 - frac);
    node.appendChild(svg("line", { x1: left, x2: w, y1: y, y2: y, stroke: "#e2e8f0" }));
  }
  const label = svg("text", { x: left, y: 10, "font-size": 10, fill: "#66727f" });
  label.textContent = "max " + format(max);
  node.appendChild(label);
  if (n > 1) {
    const span = history.time[n - 1] - history.time[0];
    const axis = svg("text", { x: left, y: h - 2, "font-size": 10, fill: "#66727f" });
    axis.textContent = "−" + duration(span);
    node.appendChild(axis);
    const nowLabel = svg("text", { x: w - 2, y: h - 2, "font-size": 10, fill: "#66727f",
                                   "text-anchor": "end" });
    nowLabel.textContent = "now";
    node.appendChild(nowLabel);
  }
  for (const s of series) {
    let d = "", pen = false;
    s.values.forEach((v, i) => {
      if (v === null) { pen = false; return; }
      const x = left + (w - left) * (n > 1 ? i / (n - 1) : 1);
      const y = top + (h - top - bottom) * (1 - v / scale);
      d += (pen ? "L" : "M") + x.toFixed(1) + " " + y.toFixed(1);
      pen = true;
    });
    if (d) node.appendChild(svg("path", { d, fill: "none", stroke: s.color,
                                          "stroke-width": "1.5", "data-series": s.label }));
  }
  box.appendChild(node);
  const legend = el("div", { class: "legend" });
  for (const s of series) {
    const item = el("span", {}, s.label);
    item.style.setProperty("--c", s.color);
    legend.appendChild(item);
  }
  box.appendChild(legend);
  return box;
}

function renderPlots() {
  const models = Object.entries(history.models);
  const procs = Object.entries(history.processes);
  const pick = (entries, field, scale) => entries.map(([key, s]) => ({
    label: s.label, color: colorOf(key),
    values: s[field].map(v => v === null ? null : v * (scale || 1)),
  }));
  document.getElementById("plots").replaceChildren(
    lineChart("Throughput (requests/s)", pick(models, "requests_per_s"), v => num(v, 1), 1),
    lineChart("p99 latency (request, ~10 s window)", pick(models, "request_p99_us"), ms, 1000),
    lineChart("Queue depth", pick(models, "queue_depth"), v => num(v, 0), 1),
    lineChart("In flight (at the workers)", pick(models, "in_flight"), v => num(v, 0), 1),
    lineChart("CPU % per process", pick(procs, "cpu_percent"), v => num(v, 0) + "%", 10),
    lineChart("RSS per process", pick(procs, "rss_bytes"), bytes, 1 << 20),
  );
}

// ------------------------------------------------------------------ history

function loadHistory(doc) {
  history.time = doc.time.slice();
  history.processes = doc.processes;
  history.models = doc.models;
}

function appendSample(doc) {
  const n = history.time.length;
  history.time.push(doc.time);
  const extend = (store, key, label, fields, values) => {
    let s = store[key];
    if (!s) {
      s = store[key] = { label };
      for (const f of fields) s[f] = new Array(n).fill(null);
    }
    s.label = label;
    fields.forEach((f, i) => s[f].push(values[i]));
  };
  for (const p of doc.processes)
    extend(history.processes, p.key, p.label, ["cpu_percent", "rss_bytes"],
           [p.cpu_percent, p.rss_bytes]);
  for (const m of doc.models)
    extend(history.models, m.name + ":" + m.version, m.name + " v" + m.version,
           ["requests_per_s", "request_p99_us", "queue_depth", "in_flight"],
           [m.requests_per_s, m.latency.request_p99_us, m.queue_depth, m.in_flight]);
  for (const store of [history.processes, history.models]) {
    for (const [key, s] of Object.entries(store)) {
      for (const [f, values] of Object.entries(s)) {
        if (!Array.isArray(values)) continue;
        if (values.length < history.time.length) values.push(null);
        if (values.length > KEEP) values.splice(0, values.length - KEEP);
      }
      if (Object.values(s).every(v => !Array.isArray(v) || v.every(x => x === null)))
        delete store[key];
    }
  }
  if (history.time.length > KEEP) history.time.splice(0, history.time.length - KEEP);
}

// ------------------------------------------------------------------ tables

function renderModels(doc) {
  const rows = doc.models.map(m => {
    const series = history.models[m.name + ":" + m.version];
    const lat = m.latency;
    const errors = m.fail_count - m.rejections;
    const restarts = Object.values(m.instance_restarts).reduce((a, b) => a + b, 0);
    return row([
      { text: m.name, attrs: { class: "l" } }, String(m.version),
      { text: m.state, attrs: { class: "l state-" + m.state,
          title: (m.reason ? m.reason + " · " : "") + `loads ${m.loads}, failed ${m.load_failures}` +
                 (m.loads ? `, last took ${num(m.last_load_seconds, 2)} s` : "") } },
      String(m.instances), String(m.queue_depth), String(m.in_flight),
      num(m.requests_per_s, 1),
      series ? sparkline(series.requests_per_s, colorOf(m.name + ":" + m.version), 1) : "",
      ms(lat.request_p50_us) + " / " + ms(lat.request_p99_us),
      ms(lat.queue_p50_us) + " / " + ms(lat.queue_p99_us),
      ms(lat.compute_p50_us) + " / " + ms(lat.compute_p99_us),
      { text: String(errors), attrs: { class: errors ? "num bad" : "num" } },
      { text: String(m.rejections), attrs: { class: m.rejections ? "num bad" : "num" } },
      bars(m.batch_sizes), String(restarts),
    ]);
  });
  fill("models", rows, "no models", 15);
}

function renderProcesses(doc) {
  const rows = doc.processes.map(p => {
    const series = history.processes[p.key];
    const color = colorOf(p.key);
    return row([
      { text: p.label, attrs: { class: "l" } },
      { text: p.role, attrs: { class: "l role" } }, String(p.pid),
      num(p.cpu_percent, 1), series ? sparkline(series.cpu_percent, color, 10) : "",
      bytes(p.rss_bytes), series ? sparkline(series.rss_bytes, color) : "",
      String(p.threads), String(p.open_fds), duration(p.uptime_s),
      { text: String(p.restarts), attrs: { class: p.restarts ? "num bad" : "num" } },
      bytes(p.shm_bytes),
    ]);
  });
  fill("processes", rows, "no processes", 12);
}

function renderSharedMemory(doc) {
  const shm = doc.shared_memory;
  document.getElementById("shm-total").textContent =
    `server segments: ${bytes(shm.total_bytes)} mapped, ${bytes(shm.total_resident_bytes)} resident`;
  const labels = Object.fromEntries(doc.processes.map(p => [p.key, p.label]));
  fill("segments", shm.owners.map(o => row([
    { text: labels[o.owner] || o.owner, attrs: { class: "l" } },
    { text: o.kind, attrs: { class: "l" } }, String(o.segments), bytes(o.bytes),
    bytes(o.resident_bytes)])), "no segments", 5);
  fill("regions", shm.client_regions.map(r => row([
    { text: r.name, attrs: { class: "l" } }, { text: r.kind, attrs: { class: "l" } },
    { text: r.kind === "cuda" ? "device " + r.device_id : r.key, attrs: { class: "l" } },
    String(r.offset), bytes(r.byte_size)])), "no client regions registered", 5);
}

function renderLlm(doc) {
  const panel = document.getElementById("llm-panel");
  panel.hidden = !doc.llm.length;
  if (!doc.llm.length) return;
  fill("llm", doc.llm.map(m => row([
    { text: m.name, attrs: { class: "l" } }, String(m.version), String(m.active_requests),
    String(m.queued_requests), String(m.kv_blocks_used), String(m.kv_blocks_free),
    String(m.kv_blocks_reused), num(m.tokens_per_s, 1), num(m.prompt_tokens_per_s, 1),
    ms(m.ttft_p50_us) + " / " + ms(m.ttft_p99_us),
    ms(m.itl_p50_us) + " / " + ms(m.itl_p99_us)])), "", 11);
}

function renderDevices(doc) {
  const devices = doc.devices || [];
  document.getElementById("devices-panel").hidden = !devices.length;
  if (!devices.length) return;
  const rows = [];
  for (const d of devices) {
    const total = bytes(d.reserved_bytes) + " / " + bytes(d.limit_bytes);
    const holders = d.holders.length ? d.holders : [{ model: "–", part: "–", bytes: 0 }];
    for (const h of holders) rows.push(row([
      String(d.device), { text: h.model, attrs: { class: "l" } },
      { text: h.part, attrs: { class: "l" } }, bytes(h.bytes), total]));
  }
  fill("devices", rows, "", 5);
}

function render(doc) {
  document.getElementById("instance").textContent =
    `instance ${doc.server.instance_id} · ${doc.server.ready ? "ready" : "not ready"}` +
    (doc.server.exiting ? " · exiting" : "");
  document.getElementById("updated").textContent =
    `updated ${new Date(doc.time * 1000).toLocaleTimeString()} · sample ${num(doc.sample_ms, 1)} ms (${num(doc.sample_cpu_ms, 1)} ms CPU)`;
  document.getElementById("errors").textContent = doc.errors.join("; ");
  renderModels(doc);
  renderProcesses(doc);
  renderSharedMemory(doc);
  renderLlm(doc);
  renderDevices(doc);
  renderPlots();
}

// ------------------------------------------------------------------ feed

function setStatus(live, text) {
  const node = document.getElementById("status");
  node.className = live ? "live" : "down";
  node.textContent = text;
}

function onDocument(doc) {
  if (samplerStarted !== null && doc.server.sampler_started !== samplerStarted) {
    history.time = []; history.processes = {}; history.models = {};  // frontend 0 restarted
  }
  samplerStarted = doc.server.sampler_started;
  if (!history.time.length || doc.time > history.time[history.time.length - 1]) appendSample(doc);
  render(doc);
}

async function start() {
  try {
    const reply = await fetch(API + "history", { cache: "no-store" });
    if (reply.ok) loadHistory(await reply.json());
  } catch (e) { /* the feed below reports the state */ }
  if (window.EventSource) {
    const feed = new EventSource(API + "stream");
    feed.onopen = () => setStatus(true, "live");
    feed.onerror = () => setStatus(false, "disconnected · retrying");
    feed.addEventListener("stats", event => onDocument(JSON.parse(event.data)));
  } else {
    setInterval(async () => {
      try {
        const reply = await fetch(API + "stats", { cache: "no-store" });
        if (!reply.ok) throw new Error(String(reply.status));
        setStatus(true, "live (polling)");
        onDocument(await reply.json());
      } catch (e) { setStatus(false, "disconnected · retrying"); }
    }, 1000);
  }
}

start();
