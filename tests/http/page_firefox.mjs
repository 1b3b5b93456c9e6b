// tests/http/page_firefox.mjs: the web page in Debian's headless Firefox
// (firefox-esr, driven over WebDriver BiDi by puppeteer-core): it loads
// with no request leaving the server, the status strip fills, a prompt's
// streamed answer is the socket's greedy chat text (EDGELM_EXPECT_JSON, for
// temperature 0 and 16 tokens), and the stop button ends a long answer.
// page.mjs does the same in Chromium. Environment: EDGELM_HTTP, EDGELM_KEY,
// EDGELM_FIREFOX (the browser). Prints "N passed, N failed".
import puppeteer from "puppeteer-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ok, ko, check, finishTests, EXPECT } from "./check.mjs";

const base = process.env.EDGELM_HTTP;
const profile = mkdtempSync(join(tmpdir(), "edgelm-ff-"));
const browser = await puppeteer.launch({
  browser: "firefox",
  executablePath: process.env.EDGELM_FIREFOX,
  headless: true,
  userDataDir: profile,
  protocolTimeout: 60000,
});
try {
  const page = await browser.newPage();
  const foreign = [];
  /* data: URLs are inline (Firefox makes one for a font of its own) */
  page.on("request", (r) => { if (!r.url().startsWith(base) && !r.url().startsWith("data:")) foreign.push(r.url()); });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(base + "/");
  check((await page.title()) === "edgelm", "the page's title");

  // settings: the key, greedy, 16 tokens (set as a user would, then "change")
  await page.evaluate((key) => {
    document.querySelector("details").open = true;
    const set = (id, v) => {
      const el = document.getElementById(id);
      el.value = v;
      el.dispatchEvent(new Event("change"));
    };
    set("key", key);
    set("temperature", "0");
    set("max_tokens", "16");
  }, process.env.EDGELM_KEY);
  await page.waitForFunction(() => /gguf/.test(document.getElementById("status").textContent), { timeout: 15000 })
    .then(ok, () => ko("status strip: no model"));

  await page.type("#input", "Hello there");
  await page.keyboard.press("Enter");
  await page.waitForSelector(".msg.assistant .meta", { timeout: 30000 });
  const answer = await page.$eval(".msg.assistant", (el) => (el.firstChild ? el.firstChild.textContent : ""));
  check(answer === EXPECT, `Firefox's answer ${JSON.stringify(answer)} != socket's ${JSON.stringify(EXPECT)}`);

  await page.evaluate(() => {
    const el = document.getElementById("max_tokens");
    el.value = "4000";
    el.dispatchEvent(new Event("change"));
  });
  await page.type("#input", "__edgelm_test_stall__ tell me a long story");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => (document.querySelectorAll(".msg.assistant")[1]?.textContent.length ?? 0) > 3, { timeout: 30000 });
  await page.click("#stop");
  await page.waitForFunction(() => document.querySelectorAll(".msg.assistant .meta").length >= 2, { timeout: 15000 });
  const meta = await page.$$eval(".msg.assistant .meta", (els) => els[1].textContent);
  check(/stopped/.test(meta), `after stop: ${meta}`);
  check(foreign.length === 0, `requests left the server: ${foreign.join(", ")}`);
  check(errors.length === 0, `page errors: ${errors.join("; ")}`);
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
finishTests();
