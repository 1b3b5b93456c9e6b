// tests/http/check.mjs: the counters every script here closes with
// ("N passed, N failed", the line tests/run-tests.sh and daemon_http.sh read),
// and the expected text the shell hands over as JSON (a shell's $(...)
// would strip its trailing newlines).
let pass = 0, fail = 0;
export const ok = () => { pass++; };
export const ko = (msg) => { fail++; console.error("FAIL: " + msg); };
export const check = (cond, msg) => (cond ? ok() : ko(msg));
export const EXPECT = JSON.parse(process.env.EDGELM_EXPECT_JSON ?? "null");
export function finishTests() {
  console.log(`${pass} passed, ${fail} failed`);
  process.exit(fail ? 1 : 0);
}
