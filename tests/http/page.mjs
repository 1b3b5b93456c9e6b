// tests/http/page.mjs: the web page in a headless Chromium (Debian's,
// driven by playwright-core): it loads with no request leaving the
// server, shows the status strip, sends a prompt, streams the answer, and
// the answer is the socket's greedy chat text (EDGELM_EXPECT_JSON, for
// temperature 0 and 16 tokens); the stop button ends a long answer.
// EDGELM_SCREENSHOT=FILE saves a picture of the page.
// Environment: EDGELM_HTTP, EDGELM_KEY, EDGELM_CHROMIUM (the browser).
// Prints "N passed, N failed".
import { chromium } from "playwright-core";
import { ok, ko, check, finishTests, EXPECT } from "./check.mjs";

const base = process.env.EDGELM_HTTP;
const browser = await chromium.launch({ executablePath: process.env.EDGELM_CHROMIUM,
  args: ["--no-sandbox", "--disable-gpu"] });
try {
  const page = await browser.newPage({ viewport: { width: 1000, height: 640 } });
  const foreign = [];
  page.on("request", (r) => { if (!r.url().startsWith(base)) foreign.push(r.url()); });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(base + "/");
  check((await page.title()) === "edgelm", "the page's title");

  // settings: the key, greedy, 16 tokens
  await page.click("summary");
  await page.fill("#key", process.env.EDGELM_KEY);
  await page.dispatchEvent("#key", "change");
  await page.fill("#temperature", "0");
  await page.fill("#max_tokens", "16");

  // the status strip names the model and the ISA once the key is set
  await page.waitForFunction(() => /gguf/.test(document.getElementById("status").textContent), null, { timeout: 10000 })
    .then(ok, () => ko("status strip: " + "no model"));

  await page.fill("#input", "Hello there");
  await page.keyboard.press("Enter");
  await page.waitForSelector(".msg.assistant .meta", { timeout: 20000 });
  const answer = await page.$eval(".msg.assistant", (el) => el.firstChild ? el.firstChild.textContent : "");
  check(answer === EXPECT, `the page's answer ${JSON.stringify(answer)} != socket's ${JSON.stringify(EXPECT)}`);
  const meta = await page.$eval(".msg.assistant .meta", (el) => el.textContent);
  check(/length|stop/.test(meta) && /tokens/.test(meta), `meta line: ${meta}`);

  // a long answer, stopped: the stop button ends it and the form is usable again
  await page.fill("#max_tokens", "4000");
  await page.fill("#input", "__edgelm_test_stall__ tell me a long story");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.querySelectorAll(".msg.assistant")[1]?.textContent.length > 3, null, { timeout: 20000 });
  check(await page.isEnabled("#stop"), "stop is not enabled while answering");
  await page.click("#stop");
  await page.waitForSelector(".msg.assistant >> nth=1 >> .meta", { timeout: 10000 });
  const meta2 = await page.$eval(".msg.assistant:nth-of-type(4) .meta", (el) => el.textContent).catch(() => "");
  check(/stopped/.test(meta2), `after stop: ${meta2}`);
  check(await page.isEnabled("#send"), "send stays disabled after stop");

  if (process.env.EDGELM_SCREENSHOT) {
    await page.fill("#max_tokens", "16");
    await page.screenshot({ path: process.env.EDGELM_SCREENSHOT });
  }
  check(foreign.length === 0, `requests left the server: ${foreign.join(", ")}`);
  check(errors.length === 0, `page errors: ${errors.join("; ")}`);
} finally {
  await browser.close();
}
finishTests();
