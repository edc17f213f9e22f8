// Drives the inferd status page in Debian's chromium, headless, through
// playwright-core (which never downloads a browser). Run by
// e2e/statuspage_test.go against a live inferd; it reads:
//   INFERD_BASE      http://127.0.0.1:PORT
//   INFERD_KEY       an API key
//   EXPECT_GPUS      how many GPU cards must show
//   EXPECT_PROJECTS  comma-separated project ids that must show
//   EXPECT_CALL      a finished call id that must show as succeeded
//   EXPECT_REPLICA   a replica whose log must open on click
//   SCREENSHOT       where to save a full-page PNG
//   CHROMIUM         the browser (default /usr/bin/chromium)
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
const timeout = 30000;

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

  await page.click(`tr[data-replica="${replica}"]`);
  await page.locator("#log-panel").waitFor({ state: "visible" });
  await page.waitForFunction(() => document.getElementById("log-lines").textContent.includes("listening"));
  console.log(`ok: the log of ${replica} opens on click`);

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
    await page.screenshot({ path: process.env.SCREENSHOT, fullPage: true });
    console.log(`screenshot: ${process.env.SCREENSHOT}`);
  }
  assert.deepEqual(problems, [], "no console errors");
  console.log("PASS status page");
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
