// Drives inferd's OpenAI front door with the official openai npm client,
// unmodified, against examples/openai-mock served as inferd projects.
// The Go end-to-end test (e2e/openai_test.go) starts inferd and sets:
//   INFERD_BASE        http://127.0.0.1:PORT
//   INFERD_KEY         a key of team llm: project chat (alias my-llm), booting
//                      from zero replicas
//   INFERD_OTHER_KEY   a key of team other: project other-chat
//   INFERD_TIGHT_KEY   a key of team tight (quota queuedCalls: 1): project
//                      tight (maxReplicas 1, concurrency 1)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const { INFERD_BASE, INFERD_KEY, INFERD_OTHER_KEY, INFERD_TIGHT_KEY } = process.env;
for (const name of ['INFERD_BASE', 'INFERD_KEY', 'INFERD_OTHER_KEY', 'INFERD_TIGHT_KEY']) {
  if (!process.env[name]) throw new Error(`${name} must be set (run through the Go end-to-end test)`);
}
const baseURL = `${INFERD_BASE}/v1`;
const client = (apiKey, opts = {}) => new OpenAI({ apiKey, baseURL, ...opts });
const llm = client(INFERD_KEY);

async function replicas(project) {
  const res = await fetch(`${INFERD_BASE}/v1/status/projects`, { headers: { 'X-Service-API-Key': INFERD_KEY } });
  const body = await res.json();
  return body.results.find((p) => p.id === project).replicas.length;
}

// The call's own answer, fetched by its id once it has finished.
async function finishedCall(key, callID) {
  for (;;) {
    const res = await fetch(`${INFERD_BASE}/v1/calls/${callID}/response`, { headers: { Authorization: `Bearer ${key}` } });
    if (res.status !== 202) return { status: res.status, body: await res.json() };
    await new Promise((r) => setTimeout(r, 20)); // poll: the test waits for an end, it times nothing
  }
}

test('a chat call scales its project from zero and answers the server JSON', async () => {
  assert.equal(await replicas('chat'), 0);
  const { data, response } = await llm.chat.completions
    .create({ model: 'chat', messages: [{ role: 'user', content: 'hello there' }] })
    .withResponse();
  assert.equal(data.object, 'chat.completion');
  assert.equal(data.choices[0].message.content, 'echo: hello there');
  assert.equal(data.model, 'served-chat'); // the name the server knows
  assert.deepEqual(data.usage, { prompt_tokens: 2, completion_tokens: 3, total_tokens: 5, prompt_tokens_details: null }); // vLLM's
  const callID = response.headers.get('x-inferd-call-id');
  assert.match(callID, /^call_/);
  assert.ok((await replicas('chat')) >= 1);
  const again = await finishedCall(INFERD_KEY, callID);
  assert.equal(again.status, 200);
  assert.equal(again.body.choices[0].message.content, 'echo: hello there');
});

test('streaming chat passes each chunk on and ends cleanly', async () => {
  const stream = await llm.chat.completions.create({
    model: 'my-llm', stream: true, messages: [{ role: 'user', content: 'one two three' }],
  });
  const parts = [];
  let usageChunks = 0;
  for await (const chunk of stream) {
    if (chunk.usage) usageChunks++;
    if (chunk.choices.length) parts.push(chunk.choices[0].delta.content ?? '');
  }
  assert.equal(parts.join(''), 'echo: one two three');
  assert.equal(usageChunks, 0); // not asked for: inferd held back the usage chunk it asked for
});

test('a stream that asks for usage gets the usage chunk', async () => {
  const stream = await llm.chat.completions.create({
    model: 'chat', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'a b' }],
  });
  let usage;
  for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
  assert.deepEqual(usage, { prompt_tokens: 2, completion_tokens: 3, total_tokens: 5, prompt_tokens_details: null });
});

test('completions and embeddings', async () => {
  const c = await llm.completions.create({ model: 'chat', prompt: 'say this' });
  assert.equal(c.choices[0].text, 'echo: say this');
  const e = await llm.embeddings.create({ model: 'my-llm', input: ['a b', 'c'] });
  assert.equal(e.data.length, 2);
  assert.equal(e.data[0].embedding.length, 8);
  assert.notDeepEqual(Array.from(e.data[0].embedding), Array.from(e.data[1].embedding));
  assert.equal(e.usage.prompt_tokens, 3);
});

test('model listing shows the team its own models only', async () => {
  const mine = [];
  for await (const m of llm.models.list()) mine.push(m.id);
  assert.deepEqual(mine.sort(), ['batchy', 'chat', 'my-llm']);
  const theirs = [];
  for await (const m of client(INFERD_OTHER_KEY).models.list()) theirs.push(m.id);
  assert.deepEqual(theirs, ['other-chat']);
});

test('a wrong key is a 401', async () => {
  await assert.rejects(client('ik_0000000000_wrong').models.list(), (err) => err instanceof OpenAI.AuthenticationError && err.status === 401);
});

test('an unknown model, or another team\'s, is a 404', async () => {
  for (const model of ['no-such-model', 'other-chat']) {
    await assert.rejects(
      llm.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }] }),
      (err) => err instanceof OpenAI.NotFoundError && err.code === 'model_not_found',
    );
  }
});

test('a client that aborts mid-stream cancels its call', async () => {
  const controller = new AbortController();
  const { data: stream, response } = await llm.chat.completions
    .create({ model: 'chat', stream: true, mock_hold: true, messages: [{ role: 'user', content: 'never ending story' }] },
      { signal: controller.signal })
    .withResponse();
  const callID = response.headers.get('x-inferd-call-id');
  for await (const chunk of stream) {
    if (!chunk.choices[0].delta.content) continue; // the role's chunk, as vLLM's first
    assert.equal(chunk.choices[0].delta.content, 'echo:');
    controller.abort();
    break;
  }
  const ended = await finishedCall(INFERD_KEY, callID);
  assert.equal(ended.status, 400); // final: no client retries it (docs/openai.md)
  assert.equal(ended.body.error.code, 'cancelled');
});

test('a team at its queued-calls quota gets a 429 with Retry-After', async () => {
  const tight = client(INFERD_TIGHT_KEY, { maxRetries: 0 });
  const controller = new AbortController();
  // A holds the project's one replica; then one of B and C queues (the
  // quota's one call) and the other is refused.
  const a = await tight.chat.completions.create(
    { model: 'tight', stream: true, mock_hold: true, messages: [{ role: 'user', content: 'hold it' }] },
    { signal: controller.signal });
  const it = a[Symbol.asyncIterator]();
  await it.next();
  const ask = () => tight.chat.completions.create({ model: 'tight', messages: [{ role: 'user', content: 'queued' }] });
  const b = ask();
  const c = ask();
  const first = await Promise.race([b.then(() => 'ok', (e) => e), c.then(() => 'ok', (e) => e)]);
  assert.ok(first instanceof OpenAI.RateLimitError, `first to settle: ${first}`);
  assert.equal(first.status, 429);
  assert.ok(Number(first.headers.get('retry-after')) >= 1);
  controller.abort(); // A's call is cancelled: the queued one runs
  const settled = await Promise.allSettled([b, c]);
  assert.deepEqual(settled.map((s) => s.status).sort(), ['fulfilled', 'rejected']);
  assert.equal(settled.find((s) => s.status === 'fulfilled').value.choices[0].message.content, 'echo: queued');
});
