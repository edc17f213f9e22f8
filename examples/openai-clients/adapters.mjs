// One adapter per npm client: the same few operations (a chat, a stream,
// a completion, tool calls, n=2, logprobs, embeddings), each done the way a
// user of that client does it, with its results in one shape for
// clients.mjs to check. An operation the client cannot express throws Skip.
import OpenAI from 'openai';
import OpenAI4 from 'openai4';
import { createOpenAI } from '@ai-sdk/openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateText, streamText, embedMany, tool, jsonSchema } from 'ai';
import { ChatOpenAI, OpenAI as LangChainOpenAI, OpenAIEmbeddings } from '@langchain/openai';
import { HumanMessage } from '@langchain/core/messages';

export class Skip extends Error {}

const weather = {
  name: 'get_weather',
  description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false },
};
const user = (text) => [{ role: 'user', content: text }];

// header reads a header from an error's headers: a Headers (openai 5 and
// later), a plain object (openai 4, the AI SDK) or nothing.
function header(h, name) {
  if (!h) return null;
  if (typeof h.get === 'function') return h.get(name);
  return h[name] ?? h[name.toLowerCase()] ?? null;
}

// fails awaits fn, which must reject, and returns what a user sees of the
// error: its HTTP status, message and Retry-After.
async function fails(fn, status, headers) {
  try {
    await fn();
  } catch (err) {
    if (err instanceof Skip) throw err;
    return { status: status(err), message: String(err?.message ?? err), retryAfter: header(headers(err), 'retry-after'), err };
  }
  throw new Error('the call succeeded; it was to fail');
}

// The official openai client, 4.x or the current major: the same API.
function openaiClient(Client) {
  return ({ baseURL, apiKey, model, fetch }) => {
    const client = new Client({ baseURL, apiKey, fetch });
    const collect = async (stream) => {
      let text = '';
      let usage;
      for await (const chunk of stream) {
        if (chunk.usage) usage = { prompt: chunk.usage.prompt_tokens, completion: chunk.usage.completion_tokens };
        for (const c of chunk.choices) text += c.delta?.content ?? c.text ?? '';
      }
      return { text, usage };
    };
    const toolCalls = (calls) => calls.map((c) => ({ name: c.function.name, args: JSON.parse(c.function.arguments) }));
    return {
      asksBase64: true, // when encoding_format is not given
      async chat(text, { maxTokens, maxRetries } = {}) {
        const r = await client.chat.completions.create({ model, messages: user(text), max_tokens: maxTokens }, { maxRetries });
        return { text: r.choices[0].message.content };
      },
      async stream(text, { includeUsage }) {
        const s = await client.chat.completions.create({
          model, messages: user(text), stream: true, ...(includeUsage ? { stream_options: { include_usage: true } } : {}),
        });
        return collect(s);
      },
      async completion(text) {
        const r = await client.completions.create({ model, prompt: text });
        return { text: r.choices[0].text };
      },
      async completionStream(text) {
        return collect(await client.completions.create({ model, prompt: text, stream: true }));
      },
      async tools(text) {
        const r = await client.chat.completions.create({ model, messages: user(text), tools: [{ type: 'function', function: weather }] });
        assert(r.choices[0].finish_reason === 'tool_calls', r.choices[0].finish_reason);
        return toolCalls(r.choices[0].message.tool_calls);
      },
      async toolsStream(text) {
        const s = await client.chat.completions.create({
          model, messages: user(text), tools: [{ type: 'function', function: weather }], stream: true,
        });
        const calls = [];
        for await (const chunk of s) {
          for (const d of chunk.choices[0]?.delta?.tool_calls ?? []) {
            calls[d.index] ??= { function: { name: '', arguments: '' } };
            calls[d.index].function.name += d.function?.name ?? '';
            calls[d.index].function.arguments += d.function?.arguments ?? '';
          }
        }
        return toolCalls(calls);
      },
      async n2(text) {
        const r = await client.chat.completions.create({ model, messages: user(text), n: 2 });
        return r.choices.sort((a, b) => a.index - b.index).map((c) => c.message.content);
      },
      async logprobs(text) {
        const r = await client.chat.completions.create({ model, messages: user(text), logprobs: true, top_logprobs: 2 });
        return r.choices[0].logprobs.content.map(({ token, logprob }) => ({ token, logprob }));
      },
      async embed(texts) {
        const r = await client.embeddings.create({ model, input: texts });
        return r.data.sort((a, b) => a.index - b.index).map((d) => Array.from(d.embedding));
      },
      async retrieveModel(id) {
        return (await client.models.retrieve(id)).id;
      },
      async listFiles() {
        const out = [];
        for await (const f of client.files.list()) out.push(f);
        return out;
      },
      async listBatches() {
        const out = [];
        for await (const b of client.batches.list()) out.push(b);
        return out;
      },
      fails: (fn) => fails(fn, (e) => e.status, (e) => e.headers),
    };
  };
}

// What only the openai client asks of the door.
const openaiOnly = {
  async retrieveModel() {
    throw new Skip('it has no call that reads one model');
  },
  async listFiles() {
    throw new Skip('it has no Files API');
  },
  async listBatches() {
    throw new Skip('it has no Batch API');
  },
};

// The AI SDK (ai) with a provider: @ai-sdk/openai's chat model, or
// @ai-sdk/openai-compatible's.
function aiSDK(providers) {
  return (opts) => {
    const p = providers(opts);
    const weatherTool = { get_weather: tool({ description: weather.description, inputSchema: jsonSchema(weather.parameters) }) };
    const toolCalls = (calls) => calls.map((c) => ({ name: c.toolName, args: c.input }));
    return {
      ...openaiOnly,
      async chat(text, { maxTokens, maxRetries } = {}) {
        const r = await generateText({ model: p.chat, prompt: text, maxOutputTokens: maxTokens, maxRetries });
        return { text: r.text };
      },
      async stream(text, { includeUsage }) {
        const model = includeUsage ? p.chat : p.chatNoUsage;
        if (!model) throw new Skip('it always asks for the usage chunk (stream_options.include_usage)');
        let error;
        const r = streamText({ model, prompt: text, onError: ({ error: e }) => { error = e; } });
        let out = '';
        for await (const t of r.textStream) out += t;
        if (error) throw error;
        const u = await r.usage;
        return { text: out, usage: includeUsage ? { prompt: u.inputTokens, completion: u.outputTokens } : undefined };
      },
      async completion(text) {
        const r = await generateText({ model: p.completion, prompt: text });
        return { text: r.text };
      },
      async completionStream(text) {
        const r = streamText({ model: p.completion, prompt: text });
        let out = '';
        for await (const t of r.textStream) out += t;
        return { text: out };
      },
      async tools(text) {
        const r = await generateText({ model: p.chat, prompt: text, tools: weatherTool });
        return toolCalls(r.toolCalls);
      },
      async toolsStream(text) {
        const r = streamText({ model: p.chat, prompt: text, tools: weatherTool });
        for await (const _ of r.fullStream); // eslint-disable-line no-unused-vars
        return toolCalls(await r.toolCalls);
      },
      async n2() {
        throw new Skip('the AI SDK has no n: one choice per call');
      },
      async logprobs(text) {
        if (!p.logprobs) throw new Skip('its chat model does not pass logprobs on');
        const r = await generateText({ model: p.chat, prompt: text, providerOptions: { openai: { logprobs: 2 } } });
        return r.providerMetadata.openai.logprobs.map(({ token, logprob }) => ({ token, logprob }));
      },
      async embed(texts) {
        const r = await embedMany({ model: p.embedding, values: texts });
        return r.embeddings.map((v) => Array.from(v));
      },
      // With retries the AI SDK throws a RetryError around the last one.
      fails: (fn) => fails(fn, (e) => (e.lastError ?? e).statusCode, (e) => (e.lastError ?? e).responseHeaders),
    };
  };
}

// LangChain's ChatOpenAI, OpenAI (completions) and OpenAIEmbeddings.
function langchain({ baseURL, apiKey, model, fetch }) {
  const configuration = { baseURL, fetch };
  const chat = (more = {}) => new ChatOpenAI({ model, apiKey, configuration, ...more });
  const toolCalls = (calls) => calls.map((c) => ({ name: c.name, args: c.args }));
  const text = (content) => (typeof content === 'string' ? content : content.map((p) => p.text ?? '').join(''));
  return {
    ...openaiOnly,
    asksBase64: true, // its openai client's default
    async chat(prompt, { maxTokens, maxRetries } = {}) {
      const r = await chat({ maxTokens, maxRetries }).invoke(prompt);
      return { text: text(r.content) };
    },
    async stream(prompt, { includeUsage }) {
      let out = '';
      let usage;
      for await (const chunk of await chat({ streamUsage: includeUsage }).stream(prompt)) {
        out += text(chunk.content);
        if (chunk.usage_metadata) usage = { prompt: chunk.usage_metadata.input_tokens, completion: chunk.usage_metadata.output_tokens };
      }
      return { text: out, usage };
    },
    async completion(prompt) {
      return { text: await new LangChainOpenAI({ model, apiKey, configuration }).invoke(prompt) };
    },
    async completionStream(prompt) {
      let out = '';
      for await (const t of await new LangChainOpenAI({ model, apiKey, configuration }).stream(prompt)) out += t;
      return { text: out };
    },
    async tools(prompt) {
      const r = await chat().bindTools([{ type: 'function', function: weather }]).invoke(prompt);
      return toolCalls(r.tool_calls);
    },
    async toolsStream(prompt) {
      let all;
      for await (const chunk of await chat().bindTools([{ type: 'function', function: weather }]).stream(prompt)) {
        all = all ? all.concat(chunk) : chunk;
      }
      return toolCalls(all.tool_calls);
    },
    async n2(prompt) {
      const r = await chat({ n: 2 }).generate([[new HumanMessage(prompt)]]);
      return r.generations[0].map((g) => g.text);
    },
    async logprobs(prompt) {
      const r = await chat({ logprobs: true, topLogprobs: 2 }).invoke(prompt);
      return r.response_metadata.logprobs.content.map(({ token, logprob }) => ({ token, logprob }));
    },
    async embed(texts) {
      return new OpenAIEmbeddings({ model, apiKey, configuration }).embedDocuments(texts);
    },
    // LangChain names some errors itself (ContextOverflowError), the
    // openai client's error as their cause.
    fails: (fn) => fails(fn, (e) => e.status ?? e.cause?.status, (e) => e.headers ?? e.cause?.headers),
  };
}

function assert(ok, what) {
  if (!ok) throw new Error(`unexpected: ${what}`);
}

export const adapters = {
  openai4: openaiClient(OpenAI4),
  openai: openaiClient(OpenAI),
  'ai-sdk-openai': aiSDK(({ baseURL, apiKey, model, fetch }) => {
    const p = createOpenAI({ baseURL, apiKey, fetch });
    return { chat: p.chat(model), completion: p.completion(model), embedding: p.embedding(model), logprobs: true };
  }),
  'ai-sdk-compatible': aiSDK(({ baseURL, apiKey, model, fetch }) => {
    const p = createOpenAICompatible({ name: 'inferd', baseURL, apiKey, fetch, includeUsage: true });
    const q = createOpenAICompatible({ name: 'inferd', baseURL, apiKey, fetch });
    return { chat: p.chatModel(model), chatNoUsage: q.chatModel(model), completion: p.completionModel(model), embedding: p.textEmbeddingModel(model) };
  }),
  langchain,
};
