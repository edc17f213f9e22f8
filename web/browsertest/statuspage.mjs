// Drives the inferd status page in Debian's chromium, headless, through
// playwright-core (which never downloads a browser). Run by
// e2e/statuspage_test.go against a live inferd; it reads:
//   INFERD_BASE      http://127.0.0.1:PORT
//   INFERD_KEY       an API key
//   EXPECT_GPUS      how many GPU cards must show
//   EXPECT_PROJECTS  comma-separated project ids that must show
//   EXPECT_FIRST     the projects that must show first, in full, in this order
//                    (work, failures or waits), comma-separated
//   EXPECT_QUIET     a project that must show as one compact line after them
//   EXPECT_FAILED    a project whose failed boot links to its log, and a text
//                    that log holds: PROJECT:TEXT
//   EXPECT_CALL      a finished call id that must show as succeeded
//   EXPECT_REPLICA   a replica of EXPECT_QUIET whose log must open on click,
//                    beside it
//   EXPECT_TEAM      a team whose row shows its replicas against this quota:
//                    TEAM:REPLICAS (optional)
//   EXPECT_QUEUED    a project whose card lists its queued calls, each with
//                    why it waits (optional)
//   EXPECT_USAGE     a team the usage panel shows with calls, its bars drawn,
//                    and energy not measured ("–") (optional)
//   SCREENSHOT       where to save a full-page PNG
//   USAGE_SCREENSHOT where to save a PNG of the usage panel (optional)
//   CHROMIUM         the browser (default /usr/bin/chromium)
//   TIMEOUT_MS       how long each step may wait (default 30000; the e2e test
//                    stretches it on a busy machine, as its own deadlines)
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import assert from "node:assert/strict";

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};
const base = env("INFERD_BASE");
const timeout = Number(process.env.TIMEOUT_MS || 30000);

const profile = mkdtempSync(join(tmpdir(), "inferd-chromium-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1280, height: 900 },
  args: [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
const problems = [];
try {
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(timeout);
  // A CSP violation or a script error shows up here.
  page.on("console", (m) => { if (m.type() === "error") problems.push(`console: ${m.text()}`); });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));

  await page.goto(base + "/");
  await page.locator("#login").waitFor({ state: "visible" });
  assert.match(await page.locator("#login .howto").textContent(), /\.\/inferd --config CONFIG key create --team TEAM/,
    "the sign-in form says how to get a key, as it is typed");
  await page.fill("#key", env("INFERD_KEY"));
  await page.click("#login-form button[type=submit]");
  await page.locator("#dash").waitFor({ state: "visible" });
  const stored = await page.evaluate(() => sessionStorage.getItem("inferd.apiKey"));
  assert.equal(stored, env("INFERD_KEY"), "the key is kept in sessionStorage");

  const gpus = Number(env("EXPECT_GPUS"));
  await page.waitForFunction((n) => document.querySelectorAll("[data-gpu]").length === n, gpus);
  console.log(`ok: ${gpus} GPUs shown`);

  for (const id of env("EXPECT_PROJECTS").split(",")) {
    await page.locator(`[data-project="${id}"]`).waitFor({ state: "visible" });
    console.log(`ok: project ${id} shown`);
  }

  // Projects with work, failures or waits first, in full; the rest after
  // them, one line each.
  const first = env("EXPECT_FIRST").split(",");
  await page.waitForFunction((want) =>
    [...document.querySelectorAll("#projects > [data-project]")].map((e) => e.dataset.project).join(",") === want.join(","), first);
  const quiet = env("EXPECT_QUIET");
  const quietRow = page.locator(`#projects-quiet > .compact[data-project="${quiet}"]`);
  await quietRow.waitFor({ state: "visible" });
  const below = await page.evaluate(([f, q]) =>
    document.querySelector(`[data-project="${f}"]`).getBoundingClientRect().bottom <=
    document.querySelector(`[data-project="${q}"]`).getBoundingClientRect().top, [first[first.length - 1], quiet]);
  assert.ok(below, `${quiet} shows below ${first.join(", ")}`);
  console.log(`ok: ${first.join(", ")} first in full, ${quiet} after them in one line`);

  if (process.env.EXPECT_TEAM) {
    const [team, quota] = process.env.EXPECT_TEAM.split(":");
    await page.waitForFunction(([t, q]) => {
      const cell = document.querySelector(`#teams [data-team="${t}"] td:nth-child(2)`);
      return cell && new RegExp(`^[0-9]+ / ${q}$`).test(cell.textContent);
    }, [team, quota]);
    console.log(`ok: team ${team} shows its replicas against its quota of ${quota}`);
  }

  if (process.env.EXPECT_QUEUED) {
    // Queued calls list why they wait; once a run is measured, an estimate
    // as a range.
    const q = process.env.EXPECT_QUEUED;
    await page.waitForFunction((p) => {
      const rows = [...document.querySelectorAll(`[data-project="${p}"] table.queue tbody tr[data-queued]`)];
      return rows.length > 0 && rows.every((r) => r.querySelector(".why").textContent.length > 3) &&
        rows.some((r) => /^[0-9.]+–[0-9.]+ s$/.test(r.querySelector(".eta").textContent));
    }, q);
    console.log(`ok: ${q}'s queued calls say why they wait and when they should be done`);
  }

  if (process.env.EXPECT_USAGE) {
    const team = process.env.EXPECT_USAGE;
    await page.waitForFunction((t) => {
      const row = document.querySelector(`#usage-teams [data-usage-team="${t}"]`);
      return row && Number(row.querySelector(".calls").textContent) > 0 &&
        Number(document.getElementById("usage-chart").dataset.bars) > 0;
    }, team);
    assert.equal(await page.locator(`#usage-teams [data-usage-team="${team}"] .energy`).textContent(), "–",
      "energy is absent (–), not 0, without NVML's counter");
    console.log(`ok: the usage panel shows team ${team}'s calls and hourly bars, energy absent`);
  }

  // The charts of the last 15 minutes have data: the calls made before the
  // page opened, their latency, the queues and the GPUs' memory.
  for (const [id, test] of [["calls", "max"], ["latency", "max"], ["queue", "points"], ["gpu-memory", "max"]]) {
    await page.waitForFunction(([id, test]) => {
      const c = document.querySelector(`[data-chart="${id}"]`);
      return c && Number(c.dataset.points) > 0 && (test !== "max" || Number(c.dataset.max) > 0) &&
        c.querySelector("svg polyline, svg circle");
    }, [id, test]);
  }
  console.log("ok: the calls, latency, queue and GPU memory charts are drawn with data");

  // A failed boot links to its log, which opens beside that project's replicas.
  const [failed, failedText] = env("EXPECT_FAILED").split(":");
  await page.click(`[data-project="${failed}"] .loglink`);
  await page.locator(`[data-project="${failed}"] #log-panel`).waitFor({ state: "visible" });
  await page.waitForFunction((t) => document.getElementById("log-lines").textContent.includes(t), failedText);
  console.log(`ok: the failed boot of ${failed} links to its log`);

  const call = page.locator(`tr[data-call="${env("EXPECT_CALL")}"]`);
  await call.waitFor({ state: "visible" });
  await call.locator(".badge.succeeded").waitFor({ state: "visible" });
  console.log("ok: the finished call is shown as succeeded");

  const replica = env("EXPECT_REPLICA");
  // Every replica of a min-1 project holds a GPU: the card names it.
  await page.waitForFunction((r) => [...document.querySelectorAll("[data-gpu] .holder")].some((e) => e.textContent.includes(r)), replica);
  // A whole-GPU replica reserves all of its GPU, and a simulated GPU shows
  // that reservation as used memory (it has no driver to ask).
  const mem = await page.evaluate((r) => {
    const card = [...document.querySelectorAll("[data-gpu]")].find((c) => c.querySelector(".holder").textContent.includes(r));
    return {
      used: card.querySelector(".row.used .value").textContent,
      reserved: card.querySelector(".row.reserved .value").textContent,
      bar: card.querySelector(".bar.mem .reserved").style.width,
    };
  }, replica);
  const total = mem.used.split(" / ")[1];
  assert.notEqual(mem.reserved, "0 MiB", `the GPU of ${replica} shows memory reserved`);
  assert.equal(mem.reserved, total, `the GPU of ${replica} is reserved whole: ${JSON.stringify(mem)}`);
  assert.equal(mem.used, `${total} / ${total}`, `the simulated GPU of ${replica} shows its reservation as used`);
  assert.equal(mem.bar, "100%", "the reserved segment fills the bar");
  console.log(`ok: the GPU of ${replica} shows ${mem.reserved} reserved by inferd`);

  // A compact project opens in full on click; its replica's log opens on
  // click beside the replica table (to its right, level with it).
  await quietRow.click();
  await page.click(`tr[data-replica="${replica}"]`);
  await page.locator(`[data-project="${quiet}"] #log-panel`).waitFor({ state: "visible" });
  await page.waitForFunction(() => document.getElementById("log-lines").textContent.includes("listening"));
  const beside = await page.evaluate((q) => {
    const table = document.querySelector(`[data-project="${q}"] table.replicas`).getBoundingClientRect();
    const log = document.getElementById("log-panel").getBoundingClientRect();
    return { tableRight: table.right, logLeft: log.left, tableTop: table.top, logTop: log.top, logBottom: log.bottom };
  }, quiet);
  assert.ok(beside.logLeft >= beside.tableRight && beside.logTop <= beside.tableTop && beside.logBottom > beside.tableTop,
    `the log opens beside the replicas: ${JSON.stringify(beside)}`);
  console.log(`ok: the log of ${replica} opens on click, beside it`);

  // The page keeps refreshing: the "updated" time changes.
  const updated = await page.locator("#summary .muted").textContent();
  await page.waitForFunction((u) => document.querySelector("#summary .muted")?.textContent !== u, updated);
  console.log("ok: the page refreshes by itself");

  // A failing server is reported even before the dashboard has been shown:
  // after signing in, and on a reload with the key kept. (A tab of its own:
  // Chromium logs every 500 as a console error.)
  const failing = await context.newPage();
  failing.setDefaultTimeout(timeout);
  failing.on("pageerror", (e) => problems.push(`page error (failing server): ${e.message}`));
  await failing.route("**/v1/status", (route) => route.fulfill({
    status: 500, contentType: "application/json",
    body: JSON.stringify({ error: { code: "internal", message: "boom from the server" } }),
  }));
  await failing.goto(base + "/");
  await failing.fill("#key", env("INFERD_KEY"));
  await failing.click("#login-form button[type=submit]");
  const stale = failing.locator("#stale");
  await stale.waitFor({ state: "visible" });
  assert.match(await stale.textContent(), /boom from the server/);
  await failing.reload();
  await stale.waitFor({ state: "visible" });
  assert.match(await stale.textContent(), /boom from the server/);
  console.log("ok: a failing server is reported before the dashboard has loaded");
  await failing.unroute("**/v1/status");
  await failing.locator("#dash").waitFor({ state: "visible" });
  await stale.waitFor({ state: "hidden" });
  await failing.click("#signout");
  await failing.locator("#login").waitFor({ state: "visible" });
  assert.equal(await stale.isVisible(), false, "no stale banner over the sign-in form");
  await failing.close();
  console.log("ok: the page recovers once the server answers");

  if (process.env.SCREENSHOT) {
    // A few samples into the charts (one each 5 s), then the top of the
    // page: charts, GPUs, projects and the first recent calls.
    await page.waitForFunction(() => Number(document.querySelector('[data-chart="calls"]').dataset.points) >= 8);
    const height = await page.evaluate(() => document.documentElement.scrollHeight);
    await page.screenshot({ path: process.env.SCREENSHOT, fullPage: true, clip: { x: 0, y: 0, width: 1280, height: Math.min(height, 1300) } });
    console.log(`screenshot: ${process.env.SCREENSHOT}`);
  }
  if (process.env.USAGE_SCREENSHOT) {
    await page.locator("#usage-section").screenshot({ path: process.env.USAGE_SCREENSHOT });
    console.log(`usage panel screenshot: ${process.env.USAGE_SCREENSHOT}`);
  }
  assert.deepEqual(problems, [], "no console errors");
  console.log("PASS status page");
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
