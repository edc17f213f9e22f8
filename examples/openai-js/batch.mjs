// The OpenAI Batch API through the official openai npm client, in two
// steps around a daemon restart (e2e/openai_test.go runs them):
//   node batch.mjs start N     upload N chat requests, create the batch, wait
//                              until some have finished; prints the batch id
//   node batch.mjs finish ID N wait for the batch to complete and check its
//                              output file: N lines, one per request, in order
// INFERD_BASE and INFERD_KEY as for openai.test.js; the lines ask model batchy (maxReplicas 1, concurrency 1).
import assert from 'node:assert/strict';
import OpenAI, { toFile } from 'openai';

const { INFERD_BASE, INFERD_KEY } = process.env;
const client = new OpenAI({ apiKey: INFERD_KEY, baseURL: `${INFERD_BASE}/v1` });
const [step, arg, count] = process.argv.slice(2);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms)); // polls a state; times nothing

if (step === 'start') {
  const n = Number(arg);
  const lines = [];
  for (let i = 0; i < n; i++) {
    lines.push(JSON.stringify({
      custom_id: `req-${i}`, method: 'POST', url: '/v1/chat/completions',
      body: { model: 'batchy', mock_delay_ms: 30, messages: [{ role: 'user', content: `line ${i}` }] },
    }));
  }
  const file = await client.files.create({ file: await toFile(Buffer.from(lines.join('\n') + '\n'), 'batch.jsonl'), purpose: 'batch' });
  assert.equal(file.purpose, 'batch');
  const batch = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  assert.equal(batch.status, 'in_progress');
  assert.equal(batch.request_counts.total, n);
  let b = batch;
  while (b.request_counts.completed < 10) {
    await sleep(10);
    b = await client.batches.retrieve(batch.id);
  }
  assert.equal(b.status, 'in_progress', 'the batch must still run when the daemon is killed');
  console.log(JSON.stringify({ batch: batch.id, completed: b.request_counts.completed }));
} else if (step === 'finish') {
  const n = Number(count);
  let b = await client.batches.retrieve(arg);
  while (b.status !== 'completed') {
    assert.ok(['in_progress', 'finalizing'].includes(b.status), `batch ${b.status}`);
    await sleep(20);
    b = await client.batches.retrieve(arg);
  }
  assert.deepEqual(b.request_counts, { total: n, completed: n, failed: 0 });
  assert.equal(b.error_file_id, null);
  const text = await (await client.files.content(b.output_file_id)).text();
  const out = text.trim().split('\n').map((l) => JSON.parse(l));
  assert.equal(out.length, n);
  out.forEach((l, i) => {
    assert.equal(l.custom_id, `req-${i}`);
    assert.equal(l.response.status_code, 200);
    assert.match(l.response.request_id, /^call_/);
    assert.equal(l.response.body.choices[0].message.content, `echo: line ${i}`);
  });
  console.log('batch ok');
} else {
  throw new Error('usage: node batch.mjs start N | finish ID N');
}
