// Drives one npm OpenAI client, unmodified, through inferd's OpenAI door
// against examples/openai-mock (a stand-in for vLLM), case by case, and
// prints one JSON line per case:
//   {"client", "case", "ok", "error", "skip", "runs", "attempts"}
// runs are the @ids the case's requests carried, those the model is to run
// once and those it is never to run: the mock logs "run ID" each time the
// model runs one, and the Go test (e2e/openai_clients_test.go) counts
// them. attempts are the HTTP requests the client made for the case, as
// its fetch saw them.
//
//   node clients.mjs CLIENT     CLIENT: openai4, openai, ai-sdk-openai,
//                               ai-sdk-compatible, langchain
// Environment: INFERD_BASE (http://127.0.0.1:PORT), INFERD_KEY (a key of
// the project's team), MODEL (the project).
import assert from 'node:assert/strict';
import { adapters, Skip } from './adapters.mjs';

const { INFERD_BASE, INFERD_KEY, MODEL } = process.env;
for (const name of ['INFERD_BASE', 'INFERD_KEY', 'MODEL']) {
  if (!process.env[name]) throw new Error(`${name} must be set (run through the Go end-to-end test)`);
}
const which = process.argv[2];
if (!adapters[which]) throw new Error(`unknown client ${which}: one of ${Object.keys(adapters).join(', ')}`);

// Each HTTP request the client makes, for the case under way.
let attempts = [];
async function recordingFetch(input, init = {}) {
  const at = Date.now();
  let body;
  try {
    body = typeof init.body === 'string' ? JSON.parse(init.body) : undefined;
  } catch {
    body = undefined;
  }
  const a = { at, url: String(input?.url ?? input), encoding_format: body?.encoding_format };
  attempts.push(a);
  const res = await fetch(input, init);
  a.answered = Date.now();
  a.status = res.status;
  a.retryAfter = res.headers.get('retry-after');
  a.callID = res.headers.get('x-inferd-call-id');
  return res;
}

const A = adapters[which]({ baseURL: `${INFERD_BASE}/v1`, apiKey: INFERD_KEY, model: MODEL, fetch: recordingFetch });

// say is a prompt that carries the mock's directives (examples/openai-mock).
const say = (text, id, ...more) => [text, `@id=${id}`, ...more].join(' ');

// The cases. Each gets the @id for its request, and throws if the client
// did not do what a user needs. runs says which @ids the model is to run
// once (at first: this one) and which never; a case whose requests differ
// says so before it makes them. One that the client cannot express is
// skipped: its adapter throws Skip.
const cases = {
  async 'chat'(id) {
    const r = await A.chat(say('hello there', id));
    assert.equal(r.text, 'echo: hello there');
  },
  async 'chat stream'(id) {
    const r = await A.stream(say('one two three', id), { includeUsage: false });
    assert.equal(r.text, 'echo: one two three');
    assert.equal(r.usage, undefined, 'a usage the client did not ask for');
  },
  async 'chat stream with include_usage'(id) {
    const r = await A.stream(say('a b', id), { includeUsage: true });
    assert.equal(r.text, 'echo: a b');
    assert.deepEqual(r.usage, { prompt: 3, completion: 3 });
  },
  async 'completion'(id) {
    // The AI SDK sends its own rendering of the prompt ("user: ...").
    const r = await A.completion(say('say this', id));
    assert.match(r.text, /^echo: (.* )?say this\b/);
  },
  async 'completion stream'(id) {
    const r = await A.completionStream(say('say that', id));
    assert.match(r.text, /^echo: (.* )?say that\b/);
  },
  async 'tool call'(id) {
    const calls = await A.tools(say('Paris', id));
    assert.equal(calls.length, 1);
    assert.equal(calls[0].name, 'get_weather');
    assert.deepEqual(calls[0].args, { city: 'Paris' });
  },
  async 'tool call streamed'(id) {
    const calls = await A.toolsStream(say('Oslo', id));
    assert.equal(calls.length, 1);
    assert.equal(calls[0].name, 'get_weather');
    assert.deepEqual(calls[0].args, { city: 'Oslo' });
  },
  async 'n=2'(id) {
    const texts = await A.n2(say('twice over', id));
    assert.deepEqual(texts, ['echo: twice over', 'echo: twice over']);
  },
  async 'logprobs'(id) {
    const tokens = await A.logprobs(say('how likely', id));
    assert.deepEqual(tokens.map((t) => t.token), ['echo:', ' how', ' likely']);
    assert.ok(tokens.every((t) => t.logprob < 0), JSON.stringify(tokens));
  },
  async 'embeddings'(id) {
    const vecs = await A.embed([say('first', id), 'second']);
    assert.equal(vecs.length, 2);
    for (const v of vecs) {
      assert.equal(v.length, 8);
      assert.ok(v.every((x) => x >= 0 && x <= 1), JSON.stringify(v));
    }
    assert.notDeepEqual(vecs[0], vecs[1]);
    if (A.asksBase64) assert.equal(attempts.at(-1).encoding_format, 'base64', 'the client asks for base64');
  },
  async "vLLM's 400 error"(id, runs) {
    Object.assign(runs, { once: [], never: [id] }); // refused before it runs
    const e = await A.fails(() => A.chat(say('too long', id), { maxTokens: 100000 }));
    assert.equal(e.status, 400);
    assert.match(e.message, /maximum context length is 4096 tokens/);
    assert.equal(attempts.length, 1, 'a 400 is not retried');
  },
  async 'a stream whose body ends 200 ms after [DONE], then a call'(id, runs) {
    runs.once.push(`${id}-next`);
    const s = await A.stream(say('late end', id, '@late_end_ms=200'), { includeUsage: true });
    assert.equal(s.text, 'echo: late end');
    const r = await A.chat(say('right after', `${id}-next`));
    assert.equal(r.text, 'echo: right after');
  },
  async 'a stream cancelled through /cancel/v4 is not sent again'(id) {
    const outcome = A.fails(() => A.stream(say('hold on', id, '@hold'), { includeUsage: true }));
    await cancelRunning(id);
    const e = await outcome;
    assert.equal(attempts.length, 1, `sent ${attempts.length} times (answered ${attempts.map((a) => a.status)}): ${e.message}`);
  },
};

// Cases that hold on the door's answers that issue 40's one call path
// changes: Retry-After passed on, no Go error text in a body, a cancel
// answered with a status no client sends again, the read routes the SDKs
// call.
const pipelineCases = {
  async 'a 429 with Retry-After: 1 is sent again after it'(id) {
    const r = await A.chat(say('busy now', id, '@status=429', '@retry_after=1', '@times=1'));
    assert.equal(r.text, 'echo: busy now');
    assert.deepEqual(attempts.map((a) => a.status), [429, 200]);
    assert.equal(attempts[0].retryAfter, '1', 'the Retry-After of the model reaches the client');
    const waited = attempts[1].at - attempts[0].answered;
    assert.ok(waited >= 950, `sent again after ${waited} ms, not the 1 s Retry-After said`);
  },
  async 'a 503 with Retry-After: 7 reaches the client as it is'(id, runs) {
    Object.assign(runs, { once: [], never: [id] });
    const e = await A.fails(() => A.chat(say('not now', id, '@status=503', '@retry_after=7'), { maxRetries: 0 }));
    assert.equal(e.status, 503);
    assert.equal(e.retryAfter, '7');
  },
  async "a model that drops the connection is a 502 without Go's error text"(id) {
    const e = await A.fails(() => A.chat(say('and then', id, '@drop'), { maxRetries: 0 }));
    assert.equal(e.status, 502);
    assert.doesNotMatch(e.message, /127\.0\.0\.1|Post "|EOF|infer:/, `an address or a Go error in the answer: ${e.message}`);
  },
  async 'GET /v1/models/ID names the model'(id, runs) {
    Object.assign(runs, { once: [] });
    assert.equal(await A.retrieveModel(MODEL), MODEL);
  },
  async 'GET /v1/files and /v1/batches list, in pages'(id, runs) {
    Object.assign(runs, { once: [] });
    assert.ok(Array.isArray(await A.listFiles()));
    assert.ok(Array.isArray(await A.listBatches()));
  },
  async 'a call cancelled through /cancel/v4 is not sent again'(id) {
    const outcome = A.fails(() => A.chat(say('hold on', id, '@hold')));
    await cancelRunning(id);
    const e = await outcome;
    assert.equal(attempts.length, 1, `sent ${attempts.length} times (answered ${attempts.map((a) => a.status)}): ${e.message}`);
  },
};
Object.assign(cases, pipelineCases);

// cancelRunning cancels, through /cancel/v4, the project's one running
// call (the cases run one at a time) once the model has it: once the
// replica's log says it runs the request of @id.
async function cancelRunning(id) {
  const get = async (path) => (await fetch(`${INFERD_BASE}${path}`, { headers: { 'X-Service-API-Key': INFERD_KEY } })).json();
  const poll = () => new Promise((r) => setTimeout(r, 20)); // polls a state; times nothing
  for (;;) {
    const { results = [] } = await get('/v1/status/calls?limit=50');
    const call = results.find((c) => c.projectId === MODEL && c.state === 'running' && c.replicaId);
    if (call) {
      const log = await get(`/v1/status/projects/${MODEL}/replicas/${call.replicaId}/logs?lines=1000`);
      if ((log.lines ?? []).some((l) => l.includes(`run ${id} `))) {
        const r = await fetch(`${INFERD_BASE}/cancel/v4`, {
          method: 'POST', headers: { 'Content-Type': 'application/json' },
          body: JSON.stringify({ apiKey: INFERD_KEY, callID: call.id }),
        });
        const answer = await r.json();
        assert.equal(answer.message, 'cancelled', `cancel ${call.id}: ${JSON.stringify(answer)}`);
        return;
      }
    }
    await poll();
  }
}

// runCase runs one case within a deadline and prints its line.
async function runCase(name, fn) {
  const id = `${which}-${name.replace(/[^a-z0-9]+/gi, '-').replace(/-$/, '')}`;
  attempts = [];
  const runs = { once: [id], never: [] };
  const line = { client: which, case: name, ok: false, runs };
  let timer;
  const deadline = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`case "${name}" did not end within 60 s`)), 60_000);
  });
  try {
    await Promise.race([fn(id, runs), deadline]);
    line.ok = true;
  } catch (err) {
    if (err instanceof Skip) line.skip = err.message;
    else line.error = String(err?.stack ?? err).slice(0, 2000);
  } finally {
    clearTimeout(timer);
  }
  line.attempts = attempts.map(({ at, status, retryAfter, encoding_format }) => ({ at, status, retryAfter, encoding_format }));
  console.log(JSON.stringify(line));
}

for (const [name, fn] of Object.entries(cases)) await runCase(name, fn);
