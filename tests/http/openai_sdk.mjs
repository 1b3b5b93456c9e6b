// tests/http/openai_sdk.mjs: edgelmd's HTTP front through the official
// `openai` Node SDK, and the same requests over the nng socket through
// edgelmctl, whose greedy text must be the same. Run by
// tests/integration/daemon_http.sh with:
//   EDGELM_HTTP   http://127.0.0.1:PORT      the HTTP front
//   EDGELM_KEY    an API key the daemon accepts
//   EDGELM_CTL    edgelmctl, EDGELM_SOCK its --socket URL
//   EDGELM_METRICS http://127.0.0.1:PORT/metrics
// Prints "N passed, N failed".
import OpenAI from "openai";
import { execFileSync } from "node:child_process";
import { ok, ko, check, finishTests } from "./check.mjs";

const base = process.env.EDGELM_HTTP;
const ctl = (args, input) =>
  JSON.parse(execFileSync(process.env.EDGELM_CTL,
    ["--socket", process.env.EDGELM_SOCK, "--json", ...args], { input }).toString().trim().split("\n").pop());

async function expectError(what, fn, status, param) {
  try {
    await fn();
    ko(`${what}: no error`);
  } catch (e) {
    check(e instanceof OpenAI.APIError, `${what}: ${e}`);
    check(e.status === status, `${what}: status ${e.status}, want ${status}`);
    if (param !== undefined) check(e.param === param, `${what}: param ${e.param}, want ${param}`);
    check(typeof e.message === "string" && e.message.length > 0, `${what}: no message`);
  }
}

async function running() {
  const t = await (await fetch(process.env.EDGELM_METRICS)).text();
  const m = t.match(/^edgelm_sequences_running (\S+)$/m);
  return m ? Number(m[1]) : NaN;
}

async function settles(what) {
  // the sequence must be freed within a step; a few seconds is generous
  for (let i = 0; i < 100; i++) {
    if ((await running()) === 0) return ok();
    await new Promise((r) => setTimeout(r, 100));
  }
  ko(`${what}: edgelm_sequences_running stayed at ${await running()}`);
}

const client = new OpenAI({ baseURL: base + "/v1", apiKey: process.env.EDGELM_KEY, maxRetries: 0 });
const prompt = "Once upon a time";

// ---- models
const models = await client.models.list();
const ids = [];
for await (const m of models) ids.push(m.id);
check(ids.length === 1 && ids[0].endsWith(".gguf"), `models: ${JSON.stringify(ids)}`);
const model = ids[0];

// ---- completions: greedy, equal to the socket's
const nng = ctl(["generate", "--no-stream", "--temp", "0", "-n", "24", prompt]);
const c = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0 });
check(c.object === "text_completion", `completion object ${c.object}`);
check(c.choices[0].text === nng.text, `completion text ${JSON.stringify(c.choices[0].text)} != socket's ${JSON.stringify(nng.text)}`);
check(c.choices[0].finish_reason === nng.finish_reason, `finish ${c.choices[0].finish_reason} != ${nng.finish_reason}`);
check(c.usage.completion_tokens === nng.usage.completion_tokens && c.usage.prompt_tokens === nng.usage.prompt_tokens,
  `usage ${JSON.stringify(c.usage)} vs ${JSON.stringify(nng.usage)}`);
check(c.usage.total_tokens === c.usage.prompt_tokens + c.usage.completion_tokens, "total_tokens");
check(typeof c.usage.prompt_tokens_details.cached_tokens === "number", "cached_tokens missing");
check(c.model === model, `model ${c.model}`);

// ---- completions, streamed: the same text in pieces
let streamed = "", finish = null, chunks = 0;
for await (const ch of await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stream: true })) {
  chunks++;
  streamed += ch.choices[0]?.text ?? "";
  finish = ch.choices[0]?.finish_reason ?? finish;
}
check(streamed === nng.text, `streamed completion ${JSON.stringify(streamed)} != ${JSON.stringify(nng.text)}`);
check(finish === nng.finish_reason, `streamed finish ${finish}`);
check(chunks >= 2, `only ${chunks} chunks`);

// ---- chat: greedy, equal to the socket's chat
const nchat = ctl(["chat", "--temp", "0", "-n", "24", "--system", "Be brief."], "Hello there\n");
const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello there" }];
const cc = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
check(cc.object === "chat.completion", `chat object ${cc.object}`);
check(cc.choices[0].message.role === "assistant", "chat role");
check(cc.choices[0].message.content === nchat.text, `chat ${JSON.stringify(cc.choices[0].message.content)} != socket's ${JSON.stringify(nchat.text)}`);

// content as text parts, and "developer" for "system": the same prompt
const cp = await client.chat.completions.create({ model, max_tokens: 24, temperature: 0,
  messages: [{ role: "developer", content: "Be brief." }, { role: "user", content: [{ type: "text", text: "Hello " }, { type: "text", text: "there" }] }] });
check(cp.choices[0].message.content === nchat.text, "chat with text parts and developer role differs");

// ---- chat, streamed, with usage
let role = null, text = "", usage = null, nfinish = 0;
for await (const ch of await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, stream: true, stream_options: { include_usage: true } })) {
  if (ch.usage) usage = ch.usage;
  const d = ch.choices[0]?.delta;
  if (d?.role) role = d.role;
  if (d?.content) text += d.content;
  if (ch.choices[0]?.finish_reason) nfinish++;
}
check(role === "assistant", `stream role ${role}`);
check(text === nchat.text, `streamed chat ${JSON.stringify(text)} != ${JSON.stringify(nchat.text)}`);
check(nfinish === 1, `${nfinish} chunks with a finish_reason`);
check(usage && usage.completion_tokens === nchat.usage.completion_tokens, `stream usage ${JSON.stringify(usage)}`);

// ---- sampling fields pass through; seeds reproduce
const s1 = await client.completions.create({ model, prompt, max_tokens: 16, temperature: 0.9, top_p: 0.9, seed: 42, frequency_penalty: 0.5, presence_penalty: 0.2, stop: ["zzzz"], user: "tester" });
const s2 = await client.completions.create({ model, prompt, max_tokens: 16, temperature: 0.9, top_p: 0.9, seed: 42, frequency_penalty: 0.5, presence_penalty: 0.2, stop: ["zzzz"], user: "tester" });
check(s1.choices[0].text === s2.choices[0].text, "the same seed gave different text");
const ex = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0, top_k: 5, min_p: 0.1, repeat_penalty: 1.1 });
check(typeof ex.choices[0].text === "string", "llama-server extras refused");

// ---- logprobs: one entry a token, greedy picks the best, sorted alternatives
{
  const r = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, logprobs: true, top_logprobs: 3 });
  const lc = r.choices[0].logprobs?.content ?? [];
  check(lc.length === r.usage.completion_tokens, `chat logprobs: ${lc.length} entries for ${r.usage.completion_tokens} tokens`);
  check(r.choices[0].message.content === nchat.text, "logprobs changed the greedy text");
  for (const e of lc) {
    check(e.logprob <= 0 && e.top_logprobs.length === 3, `entry ${JSON.stringify(e)}`);
    check(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6, `greedy did not pick the best: ${JSON.stringify(e)}`);
    check(e.top_logprobs.every((t, i) => i === 0 || t.logprob <= e.top_logprobs[i - 1].logprob), "alternatives not sorted");
    check(Array.isArray(e.bytes), "no bytes");
  }
  let n = 0, usage = null;
  for await (const ch of await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0, logprobs: true, stream: true, stream_options: { include_usage: true } })) {
    n += ch.choices[0]?.logprobs?.content?.length ?? 0;
    if (ch.usage) usage = ch.usage;
  }
  check(usage && n === usage.completion_tokens, `streamed logprobs: ${n} entries for ${usage?.completion_tokens} tokens`);
  const c = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0, logprobs: 2 });
  const l = c.choices[0].logprobs;
  check(l && l.tokens.length === c.usage.completion_tokens && l.token_logprobs.length === l.tokens.length &&
    l.top_logprobs.length === l.tokens.length && l.text_offset.every((o, i) => i === 0 || o >= l.text_offset[i - 1]),
    `completions logprobs: ${JSON.stringify(l)}`);
  const plain = await client.completions.create({ model, prompt, max_tokens: 4, temperature: 0 });
  check(plain.choices[0].logprobs === null, "logprobs without asking");
}

// ---- embeddings: the socket's vectors, as floats and as base64 (the SDK
// asks for base64 and decodes it unless told "float")
{
  const texts = ["Once upon a time", "The cat sat on the mat."];
  const nemb = ctl(["embed", ...texts]);
  const near = (a, b) => a.length === b.length && a.every((x, i) => Math.abs(x - b[i]) < 1e-6);
  const e1 = await client.embeddings.create({ model, input: texts });
  check(e1.object === "list" && e1.data.length === 2, `embeddings: ${JSON.stringify(e1).slice(0, 200)}`);
  check(e1.model === model, `embeddings model ${e1.model}`);
  const tokens = nemb.embeddings.reduce((n, x) => n + x.tokens, 0);
  check(e1.usage.prompt_tokens === tokens && e1.usage.total_tokens === tokens, `embeddings usage ${JSON.stringify(e1.usage)}`);
  for (let i = 0; i < 2; i++) {
    check(e1.data[i].object === "embedding" && e1.data[i].index === i, `embedding ${i} shape`);
    check(near(Array.from(e1.data[i].embedding), nemb.embeddings[i].embedding), `embedding ${i} (base64) differs from the socket's`);
  }
  const e2 = await client.embeddings.create({ model, input: texts[1], encoding_format: "float" });
  check(e2.data.length === 1 && near(e2.data[0].embedding, nemb.embeddings[1].embedding), "embedding (float) differs from the socket's");
  const norm = Math.hypot(...e2.data[0].embedding);
  check(Math.abs(norm - 1) < 1e-5, `embedding norm ${norm}`);
  await expectError("embeddings: empty input", () => client.embeddings.create({ model, input: [] }), 400, "input");
  await expectError("embeddings: token ids", () => client.embeddings.create({ model, input: [[1, 2, 3]] }), 400, "input");
}

// ---- structured output: the reply parses as JSON and holds to the schema
{
  const schema = { type: "object", properties: { name: { type: "string", maxLength: 12 }, n: { type: "integer" },
    kind: { enum: ["cat", "dog"] } }, required: ["name", "n", "kind"], additionalProperties: false };
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 200, temperature: 1, seed,
      response_format: { type: "json_schema", json_schema: { name: "thing", schema, strict: true } } });
    const text = r.choices[0].message.content;
    let v = null;
    try { v = JSON.parse(text); } catch { /* checked below */ }
    check(v && typeof v.name === "string" && [...v.name].length <= 12 && Number.isInteger(v.n) &&
      ["cat", "dog"].includes(v.kind) && Object.keys(v).length === 3,
      `json_schema seed ${seed}: ${JSON.stringify(text)}`);
    check(r.choices[0].finish_reason === "stop", `json_schema seed ${seed}: finish ${r.choices[0].finish_reason}`);
  }
  const o = await client.completions.create({ model, prompt, max_tokens: 200, temperature: 0,
    response_format: { type: "json_object" } });
  let v = null;
  try { v = JSON.parse(o.choices[0].text); } catch { /* checked below */ }
  check(v !== null && typeof v === "object" && !Array.isArray(v), `json_object: ${JSON.stringify(o.choices[0].text)}`);
}

// ---- errors in OpenAI's shape
await expectError("n 2", () => client.completions.create({ model, prompt, n: 2 }), 400, "n");
await expectError("top_p 5", () => client.completions.create({ model, prompt, top_p: 5 }), 400, "top_p");
await expectError("max_tokens string", () => client.completions.create({ model, prompt, max_tokens: "many" }), 400, "max_tokens");
await expectError("no messages", () => client.chat.completions.create({ model, messages: [] }), 400, "messages");
await expectError("tool role", () => client.chat.completions.create({ model, messages: [{ role: "tool", content: "x", tool_call_id: "a" }] }), 400);
await expectError("top_logprobs 21", () => client.chat.completions.create({ model, messages, logprobs: true, top_logprobs: 21 }), 400, "top_logprobs");
await expectError("json_schema outside the subset", () => client.chat.completions.create({ model, messages,
  response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "string", pattern: "a+" } } } }), 400, "json_schema");
await expectError("response_format xml", () => client.chat.completions.create({ model, messages, response_format: { type: "xml" } }), 400, "response_format");
await expectError("max_tokens over the limit", () => client.completions.create({ model, prompt, max_tokens: 1000000 }), 400, "max_tokens");
const bad = new OpenAI({ baseURL: base + "/v1", apiKey: "not-a-valid-key", maxRetries: 0 });
await expectError("wrong key", () => bad.models.list(), 401);

// ---- abort: the generation is cancelled, streaming or not. The stalled
// prompt (watchdog_stall_ms) makes every step slow, so it is still running
// when the client aborts.
const aborted = (e) => e instanceof OpenAI.APIUserAbortError || e.name === "AbortError";
{
  const ac = new AbortController();
  const stream = await client.completions.create({ model, max_tokens: 4000, temperature: 0, stream: true,
    prompt: "__edgelm_test_stall__ " + prompt }, { signal: ac.signal });
  let got = 0, was = NaN;
  try {
    for await (const ch of stream) {
      if (ch.choices[0]?.text && ++got === 3) {
        was = await running();
        ac.abort();
      }
    }
  } catch (e) {
    check(aborted(e), `stream abort: ${e.constructor.name} ${e.message}`);
  }
  check(was === 1, `the stream was not running when aborted (${was})`);
  await settles("streaming abort");
}
{
  const ac = new AbortController();
  const p = client.completions.create({ model, prompt: "__edgelm_test_stall__ " + prompt, max_tokens: 4000, temperature: 0 }, { signal: ac.signal });
  for (let i = 0; i < 50 && (await running()) === 0; i++) await new Promise((r) => setTimeout(r, 50));
  check((await running()) === 1, "the non-streaming generation did not start");
  ac.abort();
  try { await p; ko("non-streaming not aborted"); } catch (e) { check(aborted(e), `abort: ${e.constructor.name} ${e.message}`); }
  await settles("non-streaming abort");
}

finishTests();
