// The inferd status page: polls /v1/status every 2 s with the API key kept in
// sessionStorage and redraws. Every value is written with textContent, never
// as HTML, so nothing a model or a user named can inject markup.
"use strict";

const KEY = "inferd.apiKey";
const POLL_MS = 2000;
const $ = (id) => document.getElementById(id);

let timer = null;
let openLog = null; // {project, replica} whose log is shown

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "dataset") Object.assign(e.dataset, v);
    else if (k === "style") e.style.cssText = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function bytes(n) {
  const gib = n / 1024 ** 3;
  return gib >= 1 ? `${gib.toFixed(gib >= 10 ? 0 : 1)} GiB` : `${Math.round(n / 1024 ** 2)} MiB`;
}

function ms(n) {
  if (n === null || n === undefined) return "–";
  if (n < 1000) return `${n} ms`;
  if (n < 60000) return `${(n / 1000).toFixed(n < 10000 ? 2 : 1)} s`;
  return `${(n / 60000).toFixed(1)} min`;
}

function duration(s) {
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  const h = Math.floor(s / 3600);
  return h < 48 ? `${h}h ${Math.floor((s % 3600) / 60)}m` : `${Math.floor(h / 24)}d ${h % 24}h`;
}

function ago(iso, now) {
  return `${duration(Math.max(0, Math.round((now - Date.parse(iso)) / 1000)))} ago`;
}

function badge(state) {
  return el("span", { class: `badge ${state}` }, state);
}

async function api(path) {
  const res = await fetch(path, { headers: { "X-Service-API-Key": sessionStorage.getItem(KEY) || "" }, cache: "no-store" });
  let body = null;
  try { body = await res.json(); } catch { /* not JSON */ }
  if (!res.ok) {
    const err = new Error((body && body.error && body.error.message) || `HTTP ${res.status}`);
    err.status = res.status;
    throw err;
  }
  return body;
}

function showLogin(message) {
  clearTimeout(timer);
  timer = null;
  $("dash").hidden = true;
  $("stale").hidden = true;
  $("login").hidden = false;
  $("signout").hidden = true;
  $("who").textContent = "";
  $("summary").replaceChildren();
  $("login-error").textContent = message || "";
  $("key").focus();
}

async function refresh() {
  try {
    const st = await api("/v1/status");
    render(st);
    if (openLog) await loadLog();
    $("stale").hidden = true;
  } catch (err) {
    if (err.status === 401) {
      sessionStorage.removeItem(KEY);
      showLogin(err.message);
      return;
    }
    $("stale").hidden = false;
    $("stale").textContent = `Could not refresh: ${err.message}. Retrying…`;
  }
  timer = setTimeout(refresh, POLL_MS);
}

function render(st) {
  $("login").hidden = true;
  $("dash").hidden = false;
  $("signout").hidden = false;
  $("who").textContent = st.scope === "admin" ? "admin key · all teams" : `team ${st.teamId}`;
  const now = Date.parse(st.generated);
  const replicas = st.projects.reduce((n, p) => n + p.replicas.length, 0);
  const queued = st.projects.reduce((n, p) => n + p.queued, 0);
  $("summary").replaceChildren(
    el("span", {}, el("b", {}, st.gpus.length), " GPUs"),
    el("span", {}, el("b", {}, st.projects.length), " projects"),
    el("span", {}, el("b", {}, replicas), " replicas"),
    el("span", {}, el("b", {}, queued), " queued"),
    sandbox(st.protections || []),
    el("span", { class: "muted" }, `updated ${new Date(now).toLocaleTimeString()}`),
  );
  renderGPUs(st.gpus);
  renderProjects(st.projects, now);
  renderCalls(st.calls, now);
}

// sandbox sums up the replica sandbox: how many protections are on, and the
// detail of each in the tooltip (docs/security.md).
function sandbox(ps) {
  const on = ps.filter((p) => p.on).length;
  const title = ps.map((p) => `${p.on ? "on" : "OFF"} ${p.name}: ${p.detail}`).join("\n");
  return el("span", { class: on === ps.length ? "" : "waiting", title },
    "sandbox ", el("b", {}, `${on}/${ps.length}`), " on");
}

function renderGPUs(gpus) {
  const box = $("gpus");
  if (gpus.length === 0) {
    box.replaceChildren(el("div", { class: "card empty" }, "No GPUs: replicas run on CPU."));
    return;
  }
  box.replaceChildren(...gpus.map((g) => {
    const pct = (n) => (g.memoryTotalBytes ? Math.min(100, (100 * n) / g.memoryTotalBytes) : 0);
    const memPct = pct(g.memoryUsedBytes);
    const resPct = pct(g.memoryReservedBytes);
    let holder;
    if (g.heldBy) holder = el("div", { class: "holder" }, "held by ", el("b", {}, g.heldBy.replica));
    else if (g.held) holder = el("div", { class: "holder" }, "held by another team's replica");
    else holder = el("div", { class: "holder free" }, "free");
    return el("div", { class: "card gpu", dataset: { gpu: g.index } },
      el("div", { class: "name" }, `GPU ${g.index} · ${g.name}`),
      el("div", { class: "sub mono", title: g.uuid }, g.uuid + (g.simulated ? " (simulated)" : "")),
      el("div", { class: "row used" }, el("span", {}, "memory used"), el("span", { class: "value" }, `${bytes(g.memoryUsedBytes)} / ${bytes(g.memoryTotalBytes)}`)),
      // The driver's used memory over the lighter share inferd has handed
      // out: before a model has loaded, only the reservation shows.
      el("div", { class: "bar mem", title: `${memPct.toFixed(0)}% used, ${resPct.toFixed(0)}% reserved by inferd` },
        el("span", { class: "reserved", style: `width:${resPct.toFixed(1)}%` }),
        el("span", { class: "used", style: `width:${memPct.toFixed(1)}%` })),
      el("div", { class: "row reserved" }, el("span", {}, el("i", { class: "swatch" }), "reserved by inferd"),
        el("span", { class: "value" }, bytes(g.memoryReservedBytes))),
      el("div", { class: "row" }, el("span", {}, "utilization"), el("span", {}, `${g.utilizationPct}%`)),
      el("div", { class: "bar util" }, el("span", { style: `width:${g.utilizationPct}%` })),
      holder,
    );
  }));
}

function renderProjects(projects, now) {
  const box = $("projects");
  if (projects.length === 0) {
    box.replaceChildren(el("div", { class: "card empty" }, "No projects. Apply a manifest: inferd apply -f projects.yaml"));
    return;
  }
  box.replaceChildren(...projects.map((p) => {
    const rows = p.replicas.map((r) => {
      const open = openLog && openLog.project === p.id && openLog.replica === r.id;
      const tr = el("tr", { class: open ? "open" : "", dataset: { replica: r.id }, title: "Show this replica's log" },
        el("td", { class: "mono" }, r.id),
        el("td", {}, badge(r.state)),
        el("td", { class: "num mono" }, r.pid || "–"),
        el("td", {}, r.gpus.length ? r.gpus.map((i) => `GPU ${i}`).join(", ") : "CPU"),
        el("td", { class: "num" }, duration(r.uptimeSeconds)),
        el("td", { class: "num" }, r.inFlight),
        el("td", {}, r.idleExpiry ? `in ${duration(Math.max(0, Math.round((Date.parse(r.idleExpiry) - now) / 1000)))}` : "–"),
      );
      tr.addEventListener("click", () => showLog(p.id, r.id));
      return tr;
    });
    const table = rows.length
      ? el("table", { class: "replicas" },
          el("thead", {}, el("tr", {},
            el("th", {}, "Replica"), el("th", {}, "State"), el("th", { class: "num" }, "PID"), el("th", {}, "GPU"),
            el("th", { class: "num" }, "Uptime"), el("th", { class: "num" }, "In flight"), el("th", {}, "Idle stop"))),
          el("tbody", {}, ...rows))
      : el("p", { class: "muted" }, "No replicas running.");
    return el("div", { class: "card project", dataset: { project: p.id } },
      el("div", { class: "head" },
        el("span", { class: "id" }, p.id),
        el("span", { class: "muted" }, `team ${p.teamId}`),
        p.waiting ? el("span", { class: "waiting" }, p.waiting) : null),
      el("div", { class: "facts" },
        el("span", {}, "replicas ", el("b", {}, `${p.replicas.length}`), ` (min ${p.minReplicas}, max ${p.maxReplicas})`),
        el("span", {}, "GPUs each ", el("b", {}, p.gpusPerReplica)),
        el("span", {}, "queued ", el("b", {}, p.queued)),
        el("span", {}, "running ", el("b", {}, p.running)),
        el("span", {}, "p50 ", el("b", {}, ms(p.latencyP50Ms))),
        el("span", {}, "p95 ", el("b", {}, ms(p.latencyP95Ms))),
        el("span", { class: "muted" }, `over ${p.recentFinished} recent calls`),
        p.oomKills ? el("span", { class: "waiting" }, "out of memory ", el("b", {}, p.oomKills)) : null),
      p.lastError ? el("div", { class: "lasterror" }, `last error: ${p.lastError}`) : null,
      table,
    );
  }));
}

function renderCalls(calls, now) {
  $("calls-empty").hidden = calls.length > 0;
  $("calls").replaceChildren(...calls.map((c) => {
    const rows = [el("tr", { dataset: { call: c.id } },
      el("td", { class: "mono", title: c.id }, c.id.slice(0, 5) + "…" + c.id.slice(-12)),
      el("td", {}, c.projectId),
      el("td", {}, badge(c.state)),
      el("td", { title: c.created }, ago(c.created, now)),
      el("td", { class: "num" }, c.dispatched ? ms(c.queueMs) : "–"),
      el("td", { class: "num" }, c.dispatched ? ms(c.bootMs) : "–"),
      el("td", { class: "num" }, c.finished && c.dispatched ? ms(c.runMs) : "–"),
      el("td", { class: "num" }, ms(c.totalMs)),
      el("td", { class: "mono" }, c.replicaId || "–"))];
    if (c.message) rows.push(el("tr", {}, el("td", { colspan: 9, class: "msg" }, c.message)));
    return rows;
  }).flat());
}

async function showLog(project, replica) {
  openLog = { project, replica };
  $("log-panel").hidden = false;
  $("log-title").textContent = `Log · ${replica}`;
  $("log-lines").textContent = "loading…";
  document.querySelectorAll("tr[data-replica]").forEach((tr) => tr.classList.toggle("open", tr.dataset.replica === replica));
  await loadLog();
  $("log-panel").scrollIntoView({ block: "nearest" });
}

async function loadLog() {
  const { project, replica } = openLog;
  const pre = $("log-lines");
  const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 20;
  try {
    const log = await api(`/v1/status/projects/${encodeURIComponent(project)}/replicas/${encodeURIComponent(replica)}/logs?lines=200`);
    if (!openLog || openLog.replica !== replica) return;
    pre.textContent = log.lines.length ? log.lines.join("\n") : "(empty)";
  } catch (err) {
    if (err.status === 401) throw err;
    pre.textContent = `(${err.message})`;
  }
  if (atBottom) pre.scrollTop = pre.scrollHeight;
}

function start() {
  $("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const key = $("key").value.trim();
    if (!key) return;
    sessionStorage.setItem(KEY, key);
    $("key").value = "";
    $("login-error").textContent = "";
    clearTimeout(timer);
    refresh();
  });
  $("signout").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    openLog = null;
    $("log-panel").hidden = true;
    showLogin("");
  });
  $("log-close").addEventListener("click", () => {
    openLog = null;
    $("log-panel").hidden = true;
    document.querySelectorAll("tr.open").forEach((tr) => tr.classList.remove("open"));
  });
  if (sessionStorage.getItem(KEY)) refresh();
  else showLogin("");
}

start();
