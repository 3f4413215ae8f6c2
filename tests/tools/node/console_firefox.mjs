// Drives the hub's console in Debian's Firefox ESR, headless, over WebDriver BiDi
// (puppeteer-core: no geckodriver needed), for tests/it/console.rs.
//
//   node console_firefox.mjs BASE_URL TOKEN FAILING_ID SCREENSHOT_DIR
//
// Signs in, opens every view, follows the failing subscriber's link, sends the redeliver form
// and its confirmation, and waits for a live update of the page; prints one JSON line of
// findings (the browser's errors among them). Exits non-zero with the reason on a failed step.
import fs from "node:fs";
import path from "node:path";
import puppeteer from "puppeteer-core";

const [base, token, failing, shots] = process.argv.slice(2);
const findings = { pages: {}, errors: [] };
fs.mkdirSync(shots, { recursive: true });

const browser = await puppeteer.launch({
  browser: "firefox",
  executablePath: "/usr/bin/firefox-esr",
  headless: true,
  args: ["--width=1280", "--height=1000"],
  extraPrefsFirefox: {
    // No calls home from a closed network.
    "app.update.enabled": false,
    "browser.safebrowsing.malware.enabled": false,
    "browser.safebrowsing.phishing.enabled": false,
    "network.captive-portal-service.enabled": false,
    "network.connectivity-service.enabled": false,
  },
});
let page;
try {
  page = await browser.newPage();
  page.on("console", (m) => {
    if (m.type() === "error" || m.type() === "warn") {
      findings.errors.push({ page: page.url(), text: m.text() });
    }
  });
  page.on("pageerror", (e) => findings.errors.push({ page: page.url(), text: String(e) }));

  const shot = async (name) => {
    await page.screenshot({ path: path.join(shots, name + ".png") });
    findings.pages[name] = {
      url: page.url(),
      title: await page.title(),
      bytes: await page.evaluate(() => {
        const n = performance.getEntriesByType("navigation")[0];
        const r = performance.getEntriesByType("resource");
        return (n ? n.decodedBodySize : 0) + r.reduce((a, e) => a + e.decodedBodySize, 0);
      }),
    };
  };

  await page.goto(base + "/console/");
  if (!page.url().endsWith("/console/login")) throw new Error("not sent to the login form");
  await page.type("#token", token);
  await Promise.all([page.waitForNavigation(), page.click("form button[type=submit]")]);
  findings.overview_title = await page.$eval("h1", (e) => e.textContent);
  await shot("firefox-overview");

  await Promise.all([
    page.waitForNavigation(),
    page.click(`a[href="/console/subscriptions/${failing}"]`),
  ]);
  await page.waitForSelector("#redeliver-form");
  await shot("firefox-subscription");
  await Promise.all([page.waitForNavigation(), page.click("#redeliver-form button")]);
  findings.confirm = await page.$eval("#confirm-what", (e) => e.textContent);
  await Promise.all([page.waitForNavigation(), page.click("#confirm")]);
  findings.done = await page.$eval("#done", (e) => e.textContent);
  // The script keeps the page current: it swaps in fresh parts (and counts it), and the
  // attempts table has the delivered ones.
  await page.waitForFunction(
    () =>
      Number(document.body.dataset.refreshed || 0) >= 1 &&
      (document.querySelector("#attempts")?.textContent || "").includes("delivered"),
    { timeout: 60000 },
  );
  findings.live_update = await page.evaluate(() => Number(document.body.dataset.refreshed));

  for (const [name, p] of [
    ["firefox-subscriptions", "/console/subscriptions"],
    ["firefox-sets", "/console/sets"],
  ]) {
    await page.goto(base + p);
    await shot(name);
  }
  // Keyboard: the first Tab reaches the skip link.
  await page.keyboard.press("Tab");
  findings.first_tab = await page.evaluate(() => document.activeElement.textContent);
} catch (e) {
  if (page) await page.screenshot({ path: path.join(shots, "firefox-failure.png") }).catch(() => {});
  console.error(String(e && e.stack ? e.stack : e));
  await browser.close();
  process.exit(1);
}
await browser.close();
console.log(JSON.stringify(findings));
