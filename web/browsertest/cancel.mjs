// Clicks the status page's Cancel button on unfinished calls, one after the
// other, in Debian's chromium through playwright-core, and waits for each
// call to show as failed with "error: cancelled by request". Run by
// e2e/statuspage_cancel_test.go; it reads INFERD_BASE, INFERD_KEY,
// CANCEL_CALL (the calls' ids, comma-separated), CHROMIUM and TIMEOUT_MS (how
// long each step may wait; default 30000, which the test stretches on a busy
// machine as its own deadlines).
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};
const calls = env("CANCEL_CALL").split(",");
const profile = mkdtempSync(join(tmpdir(), "inferd-chromium-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-sync"],
});
const problems = [];
try {
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(Number(process.env.TIMEOUT_MS || 30000));
  page.on("console", (m) => { if (m.type() === "error") problems.push(`console: ${m.text()}`); });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  await page.goto(env("INFERD_BASE") + "/");
  await page.fill("#key", env("INFERD_KEY"));
  await page.click("#login-form button[type=submit]");
  for (const call of calls) {
    const button = page.locator(`tr[data-call="${call}"] button`);
    await button.waitFor({ state: "visible" });
    await button.click();
    await page.waitForFunction((id) => {
      const row = document.querySelector(`tr[data-call="${id}"]`);
      const msg = row && row.nextElementSibling;
      return row && row.querySelector(".badge").textContent === "failed" && !row.querySelector("button") &&
        msg && msg.textContent === "error: cancelled by request";
    }, call);
  }
  if (problems.length) throw new Error(problems.join("\n"));
  console.log("PASS cancel button");
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
