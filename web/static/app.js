// The inferd status page: polls /v1/status (and /v1/status/history for the
// charts) every 2 s with the API key kept in sessionStorage and redraws.
// Every value is written with textContent, never as HTML, so nothing a model
// or a user named can inject markup. Charts are inline SVG built here.
"use strict";

const KEY = "inferd.apiKey";
const POLL_MS = 2000;
const USAGE_MS = 30000; // the usage panel is read again this often: the ledger moves by the minute
const RECENT_MS = 15 * 60 * 1000; // a failure this recent puts its project first
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

let timer = null;
let usage = { at: 0, data: null }; // the last /v1/status/usage answer and when it came
let openLog = null; // {project, replica} whose log is shown
const expanded = new Set(); // quiet projects shown in full on request

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

// size writes a byte count in the unit that reads best.
function size(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(n >= 10 ? 0 : 1) : n} ${units[i]}`;
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
    // The charts are extra: a server without them (404) still shows the rest.
    const [st, hist] = await Promise.all([
      api("/v1/status"),
      api("/v1/status/history").catch((err) => { if (err.status === 401) throw err; return null; }),
    ]);
    if (Date.now() - usage.at > USAGE_MS) {
      usage = { at: Date.now(), data: await api("/v1/status/usage").catch((err) => { if (err.status === 401) throw err; return null; }) };
    }
    render(st);
    renderCharts(hist);
    renderUsage(usage.data);
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
    ...clusterSummary(st.cluster),
    el("span", {}, el("b", {}, st.gpus.length), " GPUs"),
    el("span", {}, el("b", {}, st.projects.length), " projects"),
    el("span", {}, el("b", {}, replicas), " replicas"),
    el("span", {}, el("b", {}, queued), " queued"),
    sandbox(st.protections || []),
    ...imagesSummary(st.images),
    ...webhookSummary(st.webhooks),
    el("span", { class: "muted" }, `updated ${new Date(now).toLocaleTimeString()}`),
  );
  renderTeams(st.teams || []);
  renderCluster(st.cluster);
  renderGPUs(st.gpus);
  renderProjects(st.projects, now);
  renderCalls(st.calls, now);
}

// clusterSummary names this node and the leader, in cluster mode only.
function clusterSummary(c) {
  if (!c) return [];
  return [el("span", {}, "node ", el("b", {}, c.node), " · leader ",
    el("b", { class: c.leader ? "" : "bad" }, c.leader || "none"), ` · ${c.nodes.length} nodes`)];
}

// renderCluster shows every live node of the cluster (its GPUs, CPU slots
// and the load of each project it holds) and each project's placement:
// which nodes run it, with their min–max share. Cluster mode only.
function renderCluster(c) {
  $("cluster-section").hidden = !c;
  if (!c) return;
  const role = (n) => [n.leader ? "leader" : "", n.self ? "this node" : "", n.member ? "etcd member" : ""].filter(Boolean).join(" · ");
  const plural = (k, word) => `${k} ${word}${k === 1 ? "" : "s"}`;
  const load = (n) => n.projects.map((p) => `${p.id}: ${plural(p.replicas, "replica")}, ${p.busy} busy, ${p.queued} queued`).join("; ") || "–";
  $("cluster").replaceChildren(el("table", {},
    el("thead", {}, el("tr", {}, ...["Node", "Role", "Address", "GPUs free", "GPU memory free", "CPU slots used", "Projects"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...c.nodes.map((n) => el("tr", { dataset: { node: n.name } },
      el("td", { title: `capacity published ${new Date(Date.parse(n.updated)).toLocaleTimeString()}` }, el("b", {}, n.name)),
      el("td", {}, role(n)),
      el("td", { class: "mono" }, n.advertise),
      el("td", {}, n.gpus.total ? `${n.gpus.free} / ${n.gpus.total}` : "–"),
      el("td", {}, n.gpus.total ? `${bytes(n.gpus.memoryFreeMiB * 1048576)} / ${bytes(n.gpus.memoryTotalMiB * 1048576)}` : "–"),
      el("td", {}, `${n.cpuUsed} / ${n.cpuSlots}`),
      el("td", {}, load(n)))))));
  $("placement").replaceChildren(el("table", {},
    el("thead", {}, el("tr", {}, el("th", {}, "Project"), el("th", {}, "Placed on (min–max replicas)"))),
    el("tbody", {}, ...c.placement.map((p) => el("tr", { dataset: { placement: p.project } },
      el("td", {}, p.project),
      el("td", { class: p.nodes.length ? "" : "muted" },
        p.nodes.map((n) => `${n.node} (${n.min}–${n.max})`).join(", ") || "not placed yet"))))));
}

// sandbox sums up the replica sandbox: how many protections are on, and the
// detail of each in the tooltip (docs/security.md).
function sandbox(ps) {
  const on = ps.filter((p) => p.on).length;
  const title = ps.map((p) => `${p.on ? "on" : "OFF"} ${p.name}: ${p.detail}`).join("\n");
  return el("span", { class: on === ps.length ? "" : "waiting", title },
    "sandbox ", el("b", {}, `${on}/${ps.length}`), " on");
}

// imagesSummary shows how many images this node holds and what they take
// on disk (docs/images.md), once it holds one.
function imagesSummary(im) {
  if (!im || im.count === 0) return [];
  return [el("span", { title: `images: ${bytes(im.layerBytes)} of layers as imported, ${bytes(im.rootBytes)} unpacked` },
    el("b", {}, im.count), ` image${im.count === 1 ? "" : "s"} · `, el("b", {}, bytes(im.layerBytes + im.rootBytes)), " on disk")];
}

// webhookSummary shows the webhook counts once there is something to say.
function webhookSummary(w) {
  if (!w || w.delivered + w.retries + w.gaveUp + w.dropped + w.pending === 0) return [];
  return [el("span", { title: `webhooks: ${w.delivered} delivered, ${w.retries} retried attempts, ${w.gaveUp} given up, ` +
      `${w.dropped} dropped over webhook.maxPendingPerTeam, ${w.pending} pending (${w.sending} sending)` },
    "webhooks ", el("b", {}, w.delivered), " sent · ", el("b", {}, w.pending), " pending · ",
    el("b", { class: w.gaveUp ? "bad" : "" }, w.gaveUp), " given up",
    ...(w.dropped ? [" · ", el("b", { class: "bad" }, w.dropped), " dropped"] : []))];
}

// renderTeams shows each team's use against its quota ("3 / 8"; "3" when
// unlimited), only on a box where some team has a quota.
function renderTeams(teams) {
  const fields = [["replicas", "replicas", "Replicas"], ["gpus", "gpus", "GPUs"], ["cpuSlots", "cpuSlots", "CPU slots"],
    ["runningCalls", "runningCalls", "Running"], ["queuedCalls", "queuedCalls", "Queued"], ["queuedBytes", "queuedBytes", "Queued bytes"]];
  const limited = teams.some((t) => fields.some(([, q]) => t.quota[q] > 0));
  $("teams-section").hidden = !limited;
  if (!limited) return;
  const cell = (t, use, q) => {
    const fmt = use === "queuedBytes" ? bytes : (n) => n;
    const max = t.quota[q] || 0;
    const full = max > 0 && t[use] >= max;
    return el("td", { class: full ? "waiting" : "" }, max > 0 ? `${fmt(t[use])} / ${fmt(max)}` : `${fmt(t[use])}`);
  };
  $("teams").replaceChildren(el("table", {},
    el("thead", {}, el("tr", {}, el("th", {}, "Team"), ...fields.map(([, , label]) => el("th", {}, label)))),
    el("tbody", {}, ...teams.map((t) => el("tr", { dataset: { team: t.id } }, el("td", {}, t.id), ...fields.map(([use, q]) => cell(t, use, q)))))));
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

// needsLook says whether a project has work, a recent failure or waiting
// calls: those come first, in full; the rest are one line each.
function needsLook(p, now) {
  const failedRecently = p.recentFailures > 0 || (p.lastErrorAt && now - Date.parse(p.lastErrorAt) < RECENT_MS);
  return p.queued > 0 || p.running > 0 || Boolean(p.waiting) || failedRecently ||
    p.replicas.some((r) => r.state !== "ready" && r.state !== "parked");
}

// Within those, failures and waits before plain work, busiest first.
function lookOrder(p, now) {
  const trouble = p.waiting || p.recentFailures > 0 || (p.lastErrorAt && now - Date.parse(p.lastErrorAt) < RECENT_MS);
  return [trouble ? 0 : 1, -(p.queued + p.running)];
}

function renderProjects(projects, now) {
  const box = $("projects");
  const quiet = $("projects-quiet");
  const pre = $("log-lines");
  const logScroll = pre.scrollTop;
  $("log-parking").append($("log-panel")); // before its card is replaced
  if (projects.length === 0) {
    box.replaceChildren(el("div", { class: "card empty" }, "No projects. Apply a manifest: inferd apply -f projects.yaml"));
    quiet.hidden = true;
    return;
  }
  const busy = projects.filter((p) => needsLook(p, now));
  busy.sort((a, b) => {
    const [x, y] = [lookOrder(a, now), lookOrder(b, now)];
    return x[0] - y[0] || x[1] - y[1] || a.id.localeCompare(b.id);
  });
  const rest = projects.filter((p) => !needsLook(p, now));
  box.replaceChildren(...busy.map((p) => projectCard(p, now)));
  quiet.hidden = rest.length === 0;
  quiet.replaceChildren(...rest.map((p) => expanded.has(p.id) ? projectCard(p, now, true) : quietRow(p)));
  // The open log sits beside its project's replicas.
  const slot = openLog && document.querySelector(`[data-project="${CSS.escape(openLog.project)}"] .side`);
  if (slot) {
    slot.append($("log-panel"));
    slot.closest(".project").classList.add("with-log");
    pre.scrollTop = logScroll;
  }
}

function quietRow(p) {
  const states = {};
  for (const r of p.replicas) states[r.state] = (states[r.state] || 0) + 1;
  const replicas = Object.entries(states).map(([s, n]) => `${n} ${s}`).join(", ") || "no replicas";
  const row = el("div", { class: "project compact", dataset: { project: p.id }, role: "button", tabindex: 0, title: "Show in full" },
    el("span", { class: "id" }, p.id),
    el("span", { class: "muted" }, `team ${p.teamId}`),
    el("span", {}, replicas, el("span", { class: "muted" }, ` (min ${p.minReplicas}, max ${p.maxReplicas})`)),
    el("span", {}, "p50 ", el("b", {}, ms(p.latencyP50Ms)), " · p95 ", el("b", {}, ms(p.latencyP95Ms))),
    p.lastError ? el("span", { class: "muted", title: p.lastError }, "earlier error") : null);
  const open = () => { expanded.add(p.id); refreshSoon(); };
  row.addEventListener("click", open);
  row.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); open(); } });
  return row;
}

function projectCard(p, now, collapsible) {
  const rows = p.replicas.map((r) => {
    const open = openLog && openLog.project === p.id && openLog.replica === r.id;
    const tr = el("tr", { class: open ? "open" : "", dataset: { replica: r.id }, title: "Show this replica's log" },
      el("td", { class: "mono" }, r.id),
      el("td", {}, badge(r.state), r.previousSpec ? el("span", { class: "muted", title: "started from the project's previous spec: it serves until a replica of the new one replaces it" }, " (previous spec)") : null),
      el("td", { class: "num mono" }, r.pid || "–"),
      el("td", {}, r.gpus.length ? r.gpus.map((i) => `GPU ${i}`).join(", ") : "CPU"),
      el("td", { class: "num" }, duration(r.uptimeSeconds)),
      el("td", { class: "num" }, r.inFlight),
      el("td", {}, r.idleExpiry ? `in ${duration(Math.max(0, Math.round((Date.parse(r.idleExpiry) - now) / 1000)))}` : "–",
        r.parkedSince ? el("span", { class: "muted", title: "its GPUs are free for others until a call restores it" },
          ` (parked ${ago(r.parkedSince, now)})`) : null),
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
  let lastError = null;
  if (p.lastError) {
    lastError = el("div", { class: "lasterror" },
      el("span", {}, `last error${p.lastErrorAt ? ` (${ago(p.lastErrorAt, now)})` : ""}: ${p.lastError}`));
    if (p.lastErrorReplica) {
      const link = el("button", { type: "button", class: "link loglink", dataset: { logReplica: p.lastErrorReplica } },
        `log of ${p.lastErrorReplica}`);
      link.addEventListener("click", () => showLog(p.id, p.lastErrorReplica));
      lastError.append(" ", link);
    }
  }
  let collapse = null;
  const queue = (p.queue || []).length ? queueTable(p.queue, p.queued) : null;
  if (collapsible) {
    collapse = el("button", { type: "button", class: "link collapse" }, "Show less");
    collapse.addEventListener("click", () => { expanded.delete(p.id); refreshSoon(); });
  }
  return el("div", { class: "card project", dataset: { project: p.id } },
    el("div", { class: "head" },
      el("span", { class: "id" }, p.id),
      el("span", { class: "muted" }, `team ${p.teamId}`),
      p.waiting ? el("span", { class: "waiting", title: waitHelp(p.waiting) }, p.waiting) : null,
      collapse),
    el("div", { class: "body" },
      el("div", { class: "main" },
        el("div", { class: "facts" },
          el("span", {}, "replicas ", el("b", {}, `${p.replicas.length}`), ` (min ${p.minReplicas}, max ${p.maxReplicas})`),
          el("span", {}, "GPUs each ", el("b", {}, p.gpusPerReplica)),
          el("span", { title: p.durability === "answered"
            ? "durability: answered: a plain sync call is answered before its record is durable (docs/reliability.md)"
            : "durability: strict: every call is durable before it is answered" }, "durability ", el("b", {}, p.durability || "strict")),
          el("span", {}, "queued ", el("b", {}, p.queued)),
          el("span", {}, "running ", el("b", {}, p.running)),
          el("span", {}, "p50 ", el("b", {}, ms(p.latencyP50Ms))),
          el("span", {}, "p95 ", el("b", {}, ms(p.latencyP95Ms))),
          el("span", { class: "muted", title: "calls that failed before reaching a replica (a failed boot) are left out" },
            `over ${p.recentFinished} recent calls`),
          p.batchMaxSize ? el("span", { title: "calls per request to the model since the daemon started (model.batch.maxSize is the most)" },
            "batch mean ", el("b", {}, p.batches ? p.meanBatchSize.toFixed(1) : "–"), ` of ${p.batchMaxSize}`) : null,
          p.recentFailures ? el("span", { class: "bad" }, `${p.recentFailures} failed in 15 min`) : null,
          p.oomKills ? el("span", { class: "bad", title: "replicas the kernel killed for going over the project's memoryMiB, since the daemon started" },
            `${p.oomKills} out of memory`) : null,
          p.parkTimeout ? el("span", { class: p.parkingOff ? "bad" : "", title: p.parkingOff ||
            "idle replicas park after parkTimeout: GPU memory moved to host memory, the GPU free for others, restored on the next call" },
            p.parkingOff ? "parking off" : `parks after ${duration(p.parkTimeout)} idle`) : null),
        lastError,
        queue,
        table),
      el("div", { class: "side" })),
  );
}

// QUEUE_ROWS is how many queued calls a project's card lists.
const QUEUE_ROWS = 5;

// queueTable lists a project's first queued calls: why each waits and when
// the scheduler expects it done (its measured run and boot times and the
// queue ahead; "–" until it has measured a run).
function queueTable(queue, queued) {
  const more = queued - Math.min(queue.length, QUEUE_ROWS);
  queue = queue.slice(0, QUEUE_ROWS);
  return el("table", { class: "queue" },
    el("thead", {}, el("tr", {}, el("th", { class: "num" }, "#"), el("th", {}, "Queued call"), el("th", {}, "Waiting for"),
      el("th", { class: "num" }, "Done in"))),
    el("tbody", {}, ...queue.map((q) => el("tr", { dataset: { queued: q.id } },
      el("td", { class: "num" }, q.queuePosition + 1),
      el("td", { class: "mono", title: q.id }, q.id.slice(0, 5) + "…" + q.id.slice(-8)),
      el("td", { class: "why", title: q.waitingFor ? q.waitingFor.code : "" }, q.waitingFor ? q.waitingFor.text : "–"),
      etaCell(q))),
      more > 0 ? el("tr", {}, el("td", {}, ""), el("td", { colspan: 3, class: "muted" }, `and ${more} more`)) : null));
}

// etaCell shows when a queued call should be done as a range, "3.1–12.0 s",
// from the project's 10th and 90th percentile recent runs, with the
// estimate from their mean in the tooltip; "–" until a run is measured.
function etaCell(q) {
  if (q.etaMs === null || q.etaMs === undefined) return el("td", { class: "num eta" }, "–");
  const s = (ms) => (ms / 1000).toFixed(1);
  const [lo, hi] = q.etaRangeMs || [q.etaMs, q.etaMs];
  return el("td", { class: "num eta", title: `likely ~${s(q.etaMs)} s (its recent runs' mean); ${s(lo)}–${s(hi)} s from their 10th and 90th percentiles` },
    `${s(lo)}–${s(hi)} s`);
}

// waitHelp says what decides a wait, for the tooltip.
function waitHelp(waiting) {
  if (waiting.startsWith("waiting for CPU slot")) {
    return "cpuSlots in the config: how many CPU replicas (gpus: 0) may run at once; 0 means one per core. " +
      "A slot frees when a replica stops (idleTimeout) or fails.";
  }
  if (waiting.startsWith("booting (attempt") || waiting.startsWith("boots failed")) {
    return "A boot failed (the last error says why; its log link shows the output). inferd retries after " +
      "replica.restartBackoff, doubling up to maxRestartBackoff; after replica.maxBootFailures, or at once for a wrong " +
      "port, a missing health path or a boot timeout, the waiting calls fail, and new ones fail until the next boot.";
  }
  if (waiting.startsWith("waiting: team")) {
    return "The team's quota (inferd team set, or teams: in the manifest) bounds what its projects hold and run " +
      "at once; calls wait until the team's own replicas or calls free it.";
  }
  if (waiting.startsWith("waiting for GPU")) {
    return "A replica needs its gpus (or gpuMemoryMiB) free on one GPU; idle replicas of other projects above " +
      "their minReplicas are stopped to make room, busy ones are waited for.";
  }
  return "";
}

let soon = null;
// refreshSoon redraws at once after a click instead of at the next poll.
function refreshSoon() {
  if (soon) return;
  soon = setTimeout(() => { soon = null; clearTimeout(timer); refresh(); }, 0);
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
      el("td", { class: "mono" }, c.replicaId || "–"),
      el("td", {}, c.finished ? null : cancelButton(c.id)))];
    if (c.message) rows.push(el("tr", {}, el("td", { colspan: 10, class: "msg" }, c.message)));
    return rows;
  }).flat());
}

// cancelButton ends an unfinished call through POST /cancel/v4 with the
// page's key (its own team's calls, or any for an admin key: the calls listed
// are the ones the key may see).
function cancelButton(id) {
  const b = el("button", { class: "link", type: "button", title: "cancel this call" }, "Cancel");
  b.addEventListener("click", async () => {
    b.disabled = true;
    try {
      const res = await fetch("/cancel/v4", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ apiKey: sessionStorage.getItem(KEY) || "", callID: id }),
      });
      const body = await res.json();
      if (body.message !== "cancelled") b.title = body.message; // e.g. already finished
    } catch (err) {
      b.title = String(err);
    }
    refreshSoon();
  });
  return b;
}

// Charts: the last 15 minutes from /v1/status/history, one point per sample.
const CHART_W = 320;
const CHART_H = 120;
const MIN_SPAN_MS = 2 * 60 * 1000;
const PAD = { l: 4, r: 4, t: 18, b: 16 };

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) if (c) e.append(c instanceof Node ? c : String(c));
  return e;
}

// niceMax rounds up to 1, 2 or 5 times a power of ten, so the axis reads well.
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 5, 10].map((m) => m * p).find((m) => m >= v);
}

// chart draws series [{name, cls, values}] against times (ms) on one y scale;
// null values leave gaps. fmt writes a y value. The x axis spans the last 15
// minutes, or less while the daemon has not run that long (2 min at least),
// so that a fresh start is not a sliver at the right edge.
function chart(id, title, times, series, fmt, fixedMax) {
  const now = times.length ? times[times.length - 1] : Date.now();
  const span = Math.min(RECENT_MS, Math.max(MIN_SPAN_MS, times.length ? now - times[0] : RECENT_MS));
  const from = now - span;
  const all = series.flatMap((s) => s.values).filter((v) => v !== null && v !== undefined);
  const top = fixedMax || niceMax(Math.max(0, ...all));
  const x = (t) => PAD.l + ((t - from) / span) * (CHART_W - PAD.l - PAD.r);
  const y = (v) => CHART_H - PAD.b - (v / top) * (CHART_H - PAD.t - PAD.b);
  const plot = svg("svg", { viewBox: `0 0 ${CHART_W} ${CHART_H}`, class: "chart", role: "img", "aria-label": title },
    svg("line", { x1: PAD.l, x2: CHART_W - PAD.r, y1: y(0), y2: y(0), class: "axis" }),
    svg("line", { x1: PAD.l, x2: CHART_W - PAD.r, y1: y(top), y2: y(top), class: "grid" }),
    svg("text", { x: PAD.l, y: PAD.t - 6, class: "tick" }, fmt(top)),
    svg("text", { x: PAD.l, y: CHART_H - 3, class: "tick" }, `${Math.round(span / 60000)} min ago`),
    svg("text", { x: CHART_W - PAD.r, y: CHART_H - 3, class: "tick end" }, "now"));
  let drawn = 0;
  for (const s of series) {
    // One polyline per run of values without a gap; a lone point is a dot.
    let run = [];
    const flush = () => {
      if (run.length === 1) plot.append(svg("circle", { cx: run[0][0], cy: run[0][1], r: 2, class: `dot ${s.cls}` }));
      else if (run.length > 1) plot.append(svg("polyline", { points: run.map((p) => p.join(",")).join(" "), class: `line ${s.cls}` }));
      drawn += run.length;
      run = [];
    };
    s.values.forEach((v, i) => {
      if (v === null || v === undefined || times[i] < from) { flush(); return; }
      run.push([x(times[i]).toFixed(1), y(v).toFixed(1)]);
    });
    flush();
  }
  const legend = el("div", { class: "legend" }, ...series.map((s) => {
    const last = [...s.values].reverse().find((v) => v !== null && v !== undefined);
    return el("span", {}, el("i", { class: `swatch ${s.cls}` }), `${s.name} `, el("b", {}, last === undefined ? "–" : fmt(last)));
  }));
  return el("div", { class: "card chartcard", dataset: { chart: id, points: drawn, max: Math.max(0, ...all) } },
    el("div", { class: "name" }, title), plot, legend);
}

function perSec(v) {
  if (v === 0) return "0/s";
  return v >= 10 ? `${v.toFixed(0)}/s` : v >= 1 ? `${v.toFixed(1)}/s` : `${v.toFixed(2)}/s`;
}

function renderCharts(hist) {
  const section = $("charts-section");
  section.hidden = !hist;
  if (!hist) return;
  const pts = hist.points;
  const times = pts.map((p) => Date.parse(p.time));
  const gpuClasses = ["s1", "s2", "s3", "s4", "s5", "s6"];
  const charts = [
    chart("calls", "Calls per second", times, [
      { name: "succeeded", cls: "ok", values: pts.map((p) => p.succeededPerSec) },
      { name: "failed", cls: "bad", values: pts.map((p) => p.failedPerSec) },
    ], perSec),
    chart("latency", "Latency (calls that reached a replica)", times, [
      { name: "p50", cls: "s1", values: pts.map((p) => p.latencyP50Ms) },
      { name: "p95", cls: "s2", values: pts.map((p) => p.latencyP95Ms) },
    ], ms),
    chart("queue", "Queue depth", times, [
      { name: "queued", cls: "s1", values: pts.map((p) => p.queued) },
    ], (v) => `${Math.round(v)}`),
  ];
  if (hist.gpus.length) {
    const total = Math.max(...hist.gpus.map((g) => g.memoryTotalBytes));
    charts.push(chart("gpu-memory", "GPU memory used", times,
      hist.gpus.map((g, i) => ({ name: `GPU ${g.index}`, cls: gpuClasses[i % gpuClasses.length], values: g.memoryUsedBytes })),
      bytes, total));
  }
  if (!pts.length) {
    charts.forEach((c) => c.append(el("p", { class: "muted empty-chart" },
      `Collecting: a point every ${hist.intervalSeconds} s.`)));
  }
  $("charts").replaceChildren(...charts);
}

// renderUsage draws the usage panel: replica-seconds per hour for each team
// (solid: the calls' shares; light: booting and idle, kept by minReplicas
// or idleTimeout), and each team's totals over the 24 hours.
function renderUsage(u) {
  $("usage-section").hidden = !u;
  if (!u) return;
  const classes = ["s1", "s2", "s3", "s4", "s5", "s6"];
  const cls = new Map(u.teams.map((t, i) => [t.teamId, classes[i % classes.length]]));
  const hours = u.hours;
  const totals = hours.map((h) => Object.values(h.teams).reduce((n, s) => n + s.calls + s.boot + s.idle, 0));
  const top = niceMax(Math.max(0, ...totals));
  const slot = (CHART_W - PAD.l - PAD.r) / Math.max(hours.length, 1);
  const y = (v) => CHART_H - PAD.b - (v / top) * (CHART_H - PAD.t - PAD.b);
  const plot = svg("svg", { viewBox: `0 0 ${CHART_W} ${CHART_H}`, class: "chart", role: "img", "aria-label": "replica-seconds per hour by team" },
    svg("line", { x1: PAD.l, x2: CHART_W - PAD.r, y1: y(0), y2: y(0), class: "axis" }),
    svg("line", { x1: PAD.l, x2: CHART_W - PAD.r, y1: y(top), y2: y(top), class: "grid" }),
    svg("text", { x: PAD.l, y: PAD.t - 6, class: "tick" }, `${duration(Math.round(top))} per hour`),
    svg("text", { x: PAD.l, y: CHART_H - 3, class: "tick" }, "24 h ago"),
    svg("text", { x: CHART_W - PAD.r, y: CHART_H - 3, class: "tick end" }, "now"));
  let bars = 0;
  hours.forEach((h, i) => {
    let base = 0;
    for (const [team, s] of Object.entries(h.teams)) {
      for (const [part, v] of [["calls", s.calls], ["kept", s.boot + s.idle]]) {
        if (!(v > 0)) continue;
        plot.append(svg("rect", { x: (PAD.l + i * slot + 1).toFixed(1), width: Math.max(slot - 2, 1).toFixed(1),
          y: y(base + v).toFixed(1), height: (y(base) - y(base + v)).toFixed(1), class: `bar-${part} ${cls.get(team) || "s1"}` },
          svg("title", {}, `${team}: ${duration(Math.round(v))} ${part === "calls" ? "in calls" : "booting or idle"}`)));
        base += v;
        bars++;
      }
    }
  });
  const legend = el("div", { class: "legend" },
    ...u.teams.map((t) => el("span", {}, el("i", { class: `swatch ${cls.get(t.teamId)}` }), t.teamId)),
    el("span", {}, el("i", { class: "swatch kept" }), "light: booting or idle"));
  $("usage-chart").replaceChildren(el("div", { class: "name" }, "Replica time per hour"), plot, legend);
  $("usage-chart").dataset.bars = bars;
  const hrs = (s) => (s < 10 ? `${s.toFixed(s ? 1 : 0)}s` : duration(Math.round(s)));
  const opt = (v, fmt) => (v === null || v === undefined ? "–" : fmt(v));
  const head = ["Team", "Calls", "In calls", "Booting", "Idle", "GPU", "CPU", "Energy", "In / out"];
  $("usage-teams").replaceChildren(u.teams.length
    ? el("table", {},
        el("thead", {}, el("tr", {}, ...head.map((h, i) => el("th", { class: i ? "num" : "" }, h)))),
        el("tbody", {}, ...u.teams.map((t) => el("tr", { dataset: { usageTeam: t.teamId } },
          el("td", {}, t.teamId),
          el("td", { class: "num calls" }, t.calls),
          el("td", { class: "num", title: "replica time the calls used (a replica running k calls at once charges each 1/k)" }, hrs(t.replicaSeconds)),
          el("td", { class: "num" }, hrs(t.bootReplicaSeconds)),
          el("td", { class: "num", title: "ready replicas with nothing to do, kept by minReplicas or idleTimeout" }, hrs(t.idleReplicaSeconds)),
          el("td", { class: "num", title: "GPU-seconds: calls, booting and idle" }, hrs(t.gpuSeconds + t.bootGPUSeconds + t.idleGPUSeconds)),
          el("td", { class: "num cpu", title: "CPU time of the replicas' cgroups over the calls; – where not measured" }, opt(t.cpuSeconds, hrs)),
          el("td", { class: "num energy", title: "GPU energy from NVML's counter; – where the GPUs have none" }, opt(t.energyJoules, (j) => `${(j / 1000).toFixed(1)} kJ`)),
          el("td", { class: "num" }, `${size(t.bytesIn)} / ${size(t.bytesOut)}`)))))
    : el("p", { class: "empty" }, "No usage in the last 24 hours."));
}

async function showLog(project, replica) {
  openLog = { project, replica };
  const panel = $("log-panel");
  panel.hidden = false;
  $("log-title").textContent = `Log · ${replica}`;
  $("log-lines").textContent = "loading…";
  document.querySelectorAll(".project.with-log").forEach((c) => c.classList.remove("with-log"));
  const card = document.querySelector(`[data-project="${CSS.escape(project)}"]`);
  if (card) {
    card.querySelector(".side").append(panel);
    card.classList.add("with-log");
  }
  document.querySelectorAll("tr[data-replica]").forEach((tr) => tr.classList.toggle("open", tr.dataset.replica === replica));
  await loadLog();
  panel.scrollIntoView({ block: "nearest" });
}

function closeLog() {
  openLog = null;
  $("log-panel").hidden = true;
  $("log-parking").append($("log-panel"));
  document.querySelectorAll(".project.with-log").forEach((c) => c.classList.remove("with-log"));
  document.querySelectorAll("tr.open").forEach((tr) => tr.classList.remove("open"));
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
    closeLog();
    expanded.clear();
    showLogin("");
  });
  $("log-close").addEventListener("click", closeLog);
  if (sessionStorage.getItem(KEY)) refresh();
  else showLogin("");
}

start();
