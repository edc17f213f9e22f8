// Runs Banana's Potassium-era Client SDK (@banana-dev/banana-dev 6.2.0,
// `Client`), unmodified, against a live inferd serving examples/potassium
// through the /run routes. The Go end-to-end test (e2e/banana_client_test.go)
// starts inferd and sets:
//   INFERD_RUN_URL    http://127.0.0.1:PORT/run/PROJECT  (the SDK's base URL)
//   INFERD_PROXY_URL  the same through a proxy that answers the first /second
//                     call 503 after inferd has run it (the SDK then retries)
//   INFERD_BASE       http://127.0.0.1:PORT
//   INFERD_KEY        a key of the project's team
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { Client, ClientException } = require('banana-v6');

const { INFERD_RUN_URL, INFERD_PROXY_URL, INFERD_BASE, INFERD_KEY } = process.env;
for (const name of ['INFERD_RUN_URL', 'INFERD_PROXY_URL', 'INFERD_BASE', 'INFERD_KEY']) {
  if (!process.env[name]) throw new Error(`${name} must be set (run through the Go end-to-end test)`);
}

const client = (url = INFERD_RUN_URL, key = INFERD_KEY) => new Client(key, url, 'INFO');

test('warmup boots a replica and answers once it is warm', async () => {
  const { json } = await client().warmup();
  assert.equal(json.warm, true);
});

test('call("/") answers the handler JSON, and the call is a durable one', async () => {
  const { json, meta } = await client().call('/', { prompt: 'hello client' });
  assert.deepEqual(json.echo, { prompt: 'hello client' });
  const callID = meta.headers['x-inferd-call-id'];
  assert.match(callID, /^call_/);
  const res = await fetch(`${INFERD_BASE}/check/v4`, {
    method: 'POST',
    body: JSON.stringify({ apiKey: INFERD_KEY, callID }),
  });
  const check = await res.json();
  assert.equal(check.message, 'success');
  assert.deepEqual(check.modelOutputs[0].echo, { prompt: 'hello client' });
});

test('call reaches a second route of the app', async () => {
  const { json } = await client().call('/second', { n: 1 });
  assert.equal(json.route, 'second');
  assert.deepEqual(json.echo, { n: 1 });
});

test('a handler exception is a ClientException carrying its text', async () => {
  await assert.rejects(client().call('/', { raise: true }), (err) =>
    err instanceof ClientException && err.message.includes('ValueError: bad prompt'));
});

test('a bad key is a ClientException at once, not retried', async () => {
  const began = Date.now();
  await assert.rejects(client(INFERD_RUN_URL, 'ik_0000000000_wrong').call('/', {}), ClientException);
  assert.ok(Date.now() - began < 5000);
});

test('a call the SDK retries after a 503 runs the model once', async () => {
  const before = (await client().call('/second', {})).json.runs;
  const retried = await client(INFERD_PROXY_URL).call('/second', { retried: true });
  assert.equal(retried.json.runs, before + 1, 'the retry got the first run\'s answer');
  const after = (await client().call('/second', {})).json.runs;
  assert.equal(after, before + 2, 'the model ran once for the retried call');
});
