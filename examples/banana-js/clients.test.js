// Runs the public Banana JavaScript clients, unmodified, against a live inferd.
// The Go end-to-end test (e2e/banana_test.go) starts inferd and sets:
//   BANANA_URL      http://127.0.0.1:PORT/  (the v4 client reads it at import; it must end in /)
//   INFERD_BASE     http://127.0.0.1:PORT
//   INFERD_KEY      a team API key
//   INFERD_MODEL    a modelKey of an examples/echo project of that team
//   INFERD_PROJECT  that project's id
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const banana = require('banana-v4');
const { API } = require('banana-v6');

const { INFERD_BASE, INFERD_KEY, INFERD_MODEL, INFERD_PROJECT } = process.env;
for (const name of ['BANANA_URL', 'INFERD_BASE', 'INFERD_KEY', 'INFERD_MODEL', 'INFERD_PROJECT']) {
  if (!process.env[name]) throw new Error(`${name} must be set (run through the Go end-to-end test)`);
}

test('v4 run returns the model output', async () => {
  const out = await banana.run(INFERD_KEY, INFERD_MODEL, { prompt: 'hello banana' });
  assert.equal(out.message, 'success');
  assert.deepEqual(out.modelOutputs[0].echo, { prompt: 'hello banana' });
});

test('v4 run raises the error message when the model fails', async () => {
  await assert.rejects(
    banana.run(INFERD_KEY, INFERD_MODEL, { fail: 'no such prompt' }),
    (err) => typeof err === 'string' && err.startsWith('error: model returned HTTP 500') && err.includes('no such prompt'),
  );
});

test('v4 run raises on an invalid key', async () => {
  await assert.rejects(banana.run('ik_0000000000_wrong', INFERD_MODEL, {}), (err) => err === 'error: invalid apiKey');
});

test('v4 start then check returns a long call through check', async () => {
  const callID = await banana.start(INFERD_KEY, INFERD_MODEL, { sleep: 2, n: 7 });
  assert.match(callID, /^call_/);
  let out;
  for (let i = 0; i < 10; i++) {
    out = await banana.check(INFERD_KEY, callID);
    if (out.message === 'success') break;
    assert.ok(!out.message.includes('error'), out.message);
  }
  assert.equal(out.message, 'success');
  assert.equal(out.modelOutputs[0].echo.n, 7);
});

test('v4 run on a call longer than the start wait finishes through check', async () => {
  const out = await banana.run(INFERD_KEY, INFERD_MODEL, { sleep: 2.5, n: 8 });
  assert.equal(out.message, 'success');
  assert.equal(out.modelOutputs[0].echo.n, 8);
});

function api() {
  const a = new API(INFERD_KEY);
  a.baseUrl = `${INFERD_BASE}/v1`; // private in TypeScript, a plain property in JavaScript
  return a;
}

test('v6 API lists, gets and updates projects', async () => {
  const a = api();
  const list = await a.listProjects();
  assert.equal(list.status, 200);
  assert.ok(list.json.results.some((p) => p.id === INFERD_PROJECT));

  const got = await a.getProject(INFERD_PROJECT);
  assert.equal(got.status, 200);
  assert.deepEqual(Object.keys(got.json).sort(),
    ['id', 'idleTimeout', 'inferenceTimeout', 'maxReplicas', 'minReplicas', 'teamId']);

  const updated = await a.updateProject(INFERD_PROJECT, { maxReplicas: 4, idleTimeout: 45 });
  assert.equal(updated.status, 200);
  assert.equal(updated.json.maxReplicas, 4);
  assert.equal(updated.json.idleTimeout, 45);
  assert.equal(updated.json.inferenceTimeout, got.json.inferenceTimeout);

  const bad = await a.updateProject(INFERD_PROJECT, { minReplicas: 5, maxReplicas: 2 });
  assert.equal(bad.status, 400);
  assert.ok(bad.json.error.message.length > 0);

  const missing = await a.getProject('no-such-project');
  assert.equal(missing.status, 404);
});
