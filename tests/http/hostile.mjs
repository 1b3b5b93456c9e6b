// tests/http/hostile.mjs: hostile HTTP against edgelmd's front, while a
// greedy generation streams beside it; that generation's text must come
// out exactly as the socket gives it. Environment as openai_sdk.mjs's,
// plus EDGELM_HTTP_MAXCONN (the daemon's http_max_connections) and
// EDGELM_EXPECT_JSON (the greedy text of the side stream, from the socket).
// Prints "N passed, N failed".
import net from "node:net";
import { ok, ko, check, finishTests, EXPECT } from "./check.mjs";

const url = new URL(process.env.EDGELM_HTTP);
const host = url.hostname, port = Number(url.port);
const key = process.env.EDGELM_KEY;
const maxconn = Number(process.env.EDGELM_HTTP_MAXCONN || 64);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// One raw exchange: write `data` (or pieces of it), read until the server
// closes or `ms` pass; resolves to what came back.
function raw(data, ms = 5000) {
  return new Promise((resolve) => {
    const s = net.connect(port, host);
    let got = "";
    const done = () => { clearTimeout(t); s.destroy(); resolve(got); };
    const t = setTimeout(done, ms);
    s.on("data", (d) => { got += d.toString("latin1"); });
    s.on("error", done);
    s.on("close", done);
    s.on("connect", () => s.write(data, "latin1"));
  });
}

const auth = `Authorization: Bearer ${key}\r\n`;
const post = (path, body, extra = "") =>
  `POST ${path} HTTP/1.1\r\nHost: x\r\n${auth}Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body, "latin1")}\r\nConnection: close\r\n${extra}\r\n${body}`;
const status = (resp) => Number((resp.match(/^HTTP\/1\.[01] (\d{3})/) || [])[1] || 0);
const bodyOf = (resp) => resp.slice(resp.indexOf("\r\n\r\n") + 4);

// a normal request, for "the server still serves"
async function healthy(what) {
  const r = await raw(`GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`, 10000);
  check(status(r) === 200, `${what}: /health answered ${status(r) || "nothing"}`);
}

// ---- the side stream: greedy, must not be disturbed
const side = (async () => {
  const r = await fetch(process.env.EDGELM_HTTP + "/v1/completions", {
    method: "POST", headers: { Authorization: "Bearer " + key, "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: "__edgelm_test_stall__ Once upon a time", max_tokens: 150, temperature: 0, stream: true }),
  });
  const t = await r.text();
  let text = "";
  for (const ev of t.split("\n\n")) {
    if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
    text += JSON.parse(ev.slice(6)).choices[0]?.text ?? "";
  }
  return { text, done: t.trimEnd().endsWith("data: [DONE]") };
})();

// ---- malformed and wrongly typed requests: a 4xx in OpenAI's shape each
for (const [what, body, want] of [
  ["malformed JSON", "{\"prompt\": ", 400],
  ["not an object", "[1,2,3]", 400],
  ["prompt a number", "{\"prompt\": 5}", 400],
  ["max_tokens a string", "{\"prompt\": \"a\", \"max_tokens\": \"9\"}", 400],
  ["temperature negative", "{\"prompt\": \"a\", \"temperature\": -1}", 400],
  ["duplicate key", "{\"prompt\": \"a\", \"prompt\": \"b\"}", 400],
  ["NUL in the prompt", "{\"prompt\": \"a\\u0000b\"}", 400],
  ["invalid UTF-8", "{\"prompt\": \"\xff\xfe\"}", 400],
  ["stop a number", "{\"prompt\": \"a\", \"stop\": 3}", 400],
]) {
  const r = await raw(post("/v1/completions", body));
  check(status(r) === want, `${what}: status ${status(r)}, want ${want}`);
  try {
    const j = JSON.parse(bodyOf(r));
    check(j.error && typeof j.error.message === "string" && j.error.type, `${what}: not OpenAI's error shape: ${bodyOf(r)}`);
  } catch { ko(`${what}: the body is not JSON: ${bodyOf(r).slice(0, 200)}`); }
}

// ---- sizes
{
  // announced too large: refused before the body is read
  const r = await raw(`POST /v1/completions HTTP/1.1\r\nHost: x\r\n${auth}Content-Length: 100000000\r\n\r\n{"prompt":"`);
  check(status(r) === 413, `huge Content-Length: ${status(r)}`);
  // chunked, growing past the limit
  const big = "x".repeat(3 << 20);
  const body = `{"prompt":"${big}"}`;
  const chunked = `POST /v1/completions HTTP/1.1\r\nHost: x\r\n${auth}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`;
  const r2 = await raw(chunked, 15000);
  check(status(r2) === 413, `huge chunked body: ${status(r2)}`);
  // headers past the connection's memory: refused, or the connection dropped
  const r3 = await raw(`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${"y".repeat(200000)}\r\n\r\n`);
  check(status(r3) >= 400 || r3 === "", `huge headers: ${status(r3)}`);
}

// ---- protocol garbage
{
  const r = await raw("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http at all\r\n\r\n");
  check(status(r) === 0 || status(r) >= 400, `garbage: ${status(r)}`);
  await healthy("after garbage");
}

// ---- slowloris: every connection the server has, each sending a header
// byte now and then; a new client must still get in
{
  const slow = [];
  for (let i = 0; i < maxconn + 8; i++) {
    const s = net.connect(port, host);
    s.on("error", () => {});
    slow.push(s);
  }
  const drip = setInterval(() => { for (const s of slow) if (!s.destroyed) s.write("X"); }, 300);
  for (const s of slow) s.write("GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ");
  await sleep(1500);
  const t0 = Date.now();
  await healthy("during slowloris");
  check(Date.now() - t0 < 8000, `a request during slowloris took ${Date.now() - t0} ms`);
  clearInterval(drip);
  for (const s of slow) s.destroy();
}

// ---- 1000 rapid connects: open and close at once, or half a request
{
  let opened = 0;
  const burst = [];
  for (let i = 0; i < 1000; i++) {
    burst.push(new Promise((resolve) => {
      const s = net.connect(port, host);
      s.on("connect", () => { opened++; if (i % 2) s.write("GET /v1/mod"); s.destroy(); });
      s.on("error", () => resolve());
      s.on("close", () => resolve());
    }));
    if (i % 100 === 99) await Promise.all(burst.splice(0));
  }
  await Promise.all(burst);
  check(opened > 0, "no rapid connect got through");
  await sleep(300);
  await healthy("after 1000 rapid connects");
}

// ---- the rate limit: a burst from one address gets 429 with Retry-After
if (process.env.EDGELM_HTTP_RATE) {
  let limited = null;
  for (let i = 0; i < 4 * Number(process.env.EDGELM_HTTP_RATE) + 10 && !limited; i++) {
    const r = await raw(`GET /v1/models HTTP/1.1\r\nHost: x\r\n${auth}Connection: close\r\n\r\n`);
    if (status(r) === 429) limited = r;
  }
  check(limited && /\r\nRetry-After: \d+\r\n/i.test(limited), `no 429 with Retry-After within a burst`);
  await sleep(2500); // the bucket refills
}

const s = await side;
check(s.done, "the side stream did not end with [DONE]");
check(s.text === EXPECT, `the side stream was disturbed: ${JSON.stringify(s.text)} != ${JSON.stringify(EXPECT)}`);

// ---- clients that send a long generation and leave at once: none of them
// may go on running for nobody. (The race this was written for, a hang-up
// during the front's info call, is too narrow to hit from here: MHD sees
// these closes first. It is fixed in core_call by inspection.)
if (process.env.EDGELM_METRICS) {
  const body = JSON.stringify({ prompt: "__edgelm_test_stall__ gone", max_tokens: 4000, temperature: 0 });
  await sleep(2500); // the front's cached model name expires: an info call comes first
  for (let i = 0; i < 4; i++) {
    const c = net.connect(port, host);
    c.on("error", () => {});
    c.on("connect", () => { c.write(post("/v1/completions", body), "latin1"); c.end(); setTimeout(() => c.destroy(), 5 * i); });
  }
  let n = NaN;
  for (let i = 0; i < 80; i++) {
    await sleep(100);
    const t = await (await fetch(process.env.EDGELM_METRICS)).text();
    n = Number((t.match(/^edgelm_sequences_running (\S+)$/m) || [])[1]);
    if (i > 10 && n === 0) break;
  }
  check(n === 0, `generations of clients that left still run: ${n}`);
}
await healthy("at the end");
finishTests();
