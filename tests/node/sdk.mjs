// Drives a running petrel server (test model, see tests/test_server_engine.h)
// with the official OpenAI and Anthropic clients and a short autocannon load.
// Usage: node tests/node/sdk.mjs http://127.0.0.1:PORT
// Prints one "PASS name" or "FAIL name: why" line per check.
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import autocannon from 'autocannon';

const base = process.argv[2];
if (!base) { console.log('FAIL args: usage: node sdk.mjs http://127.0.0.1:PORT'); process.exit(2); }
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 20000 });
const anthropic = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 20000 });

let failed = 0;
async function check(name, fn) {
  try {
    await fn();
    console.log(`PASS ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${(e && e.stack ? e.stack : String(e)).split('\n').slice(0, 3).join(' | ')}`);
  }
}
function eq(a, b, what) {
  if (JSON.stringify(a) !== JSON.stringify(b)) throw new Error(`${what}: got ${JSON.stringify(a)}, want ${JSON.stringify(b)}`);
}

await check('openai_models', async () => {
  const list = await openai.models.list();
  eq(list.data[0].id, 'test-model', 'model id');
});

await check('openai_chat', async () => {
  const r = await openai.chat.completions.create({
    model: 'whatever', messages: [{ role: 'user', content: 'SAY:Hello SDK' }], max_tokens: 40,
  });
  eq(r.choices[0].message.content, 'Hello SDK', 'content');
  eq(r.choices[0].finish_reason, 'stop', 'finish');
  eq(r.usage.completion_tokens, 9, 'completion tokens');
});

await check('openai_chat_stream', async () => {
  const stream = await openai.chat.completions.create({
    model: 'm', messages: [{ role: 'user', content: 'SAY:streamed text' }], stream: true,
    stream_options: { include_usage: true },
  });
  let text = '', finish = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.choices.length) {
      text += chunk.choices[0].delta.content ?? '';
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  eq(text, 'streamed text', 'text');
  eq(finish, 'stop', 'finish');
  eq(usage.completion_tokens, 13, 'usage');
});

await check('openai_stop_and_length', async () => {
  const r = await openai.chat.completions.create({
    model: 'm', messages: [{ role: 'user', content: 'LOOP:abc' }], stop: ['ca'], max_tokens: 50,
  });
  eq(r.choices[0].message.content, 'ab', 'stopped text');
  const r2 = await openai.chat.completions.create({
    model: 'm', messages: [{ role: 'user', content: 'LOOP:abc' }], max_completion_tokens: 4,
  });
  eq([r2.choices[0].message.content, r2.choices[0].finish_reason], ['abca', 'length'], 'length');
});

await check('openai_tool_calls', async () => {
  const r = await openai.chat.completions.create({
    model: 'm',
    messages: [{ role: 'user', content: 'SAY:<tool_call>{"name":"lookup","arguments":{"id":42}}</tool_call>' }],
    tools: [{ type: 'function', function: { name: 'lookup', parameters: { type: 'object', properties: { id: { type: 'integer' } } } } }],
  });
  eq(r.choices[0].finish_reason, 'tool_calls', 'finish');
  const call = r.choices[0].message.tool_calls[0];
  eq([call.type, call.function.name, JSON.parse(call.function.arguments)], ['function', 'lookup', { id: 42 }], 'call');
  // the call and its result go back through the template
  const r2 = await openai.chat.completions.create({
    model: 'm', max_tokens: 5,
    messages: [{ role: 'user', content: 'q' }, r.choices[0].message,
      { role: 'tool', tool_call_id: call.id, content: '{"ok":true}' }],
  });
  eq(r2.choices.length, 1, 'follow-up');
});

await check('openai_tool_calls_stream', async () => {
  const stream = await openai.chat.completions.create({
    model: 'm', stream: true,
    messages: [{ role: 'user', content: 'SAY:<tool_call>{"name":"lookup","arguments":{"id":7}}</tool_call>' }],
    tools: [{ type: 'function', function: { name: 'lookup', parameters: { type: 'object' } } }],
  });
  const final = await stream.finalChatCompletion?.();
  if (final) {
    eq(final.choices[0].message.tool_calls[0].function.name, 'lookup', 'name');
  } else {
    let args = '', finish = null;
    for await (const c of stream) {
      const tc = c.choices[0]?.delta?.tool_calls?.[0];
      if (tc) args += tc.function.arguments;
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    eq([JSON.parse(args), finish], [{ id: 7 }, 'tool_calls'], 'stream call');
  }
});

await check('openai_json_schema', async () => {
  const r = await openai.chat.completions.create({
    model: 'm', messages: [{ role: 'user', content: 'SAY:not json at all' }],
    response_format: { type: 'json_schema', json_schema: { name: 'x', strict: true, schema: {
      type: 'object', properties: { tags: { type: 'array', items: { enum: ['a', 'b'] }, minItems: 1 }, ok: { type: 'boolean' } },
      required: ['tags', 'ok'], additionalProperties: false } } },
  });
  const doc = JSON.parse(r.choices[0].message.content);
  if (!Array.isArray(doc.tags) || doc.tags.length < 1 || typeof doc.ok !== 'boolean') throw new Error(r.choices[0].message.content);
});

await check('openai_completions_logprobs', async () => {
  const r = await openai.completions.create({ model: 'm', prompt: 'x', max_tokens: 3, logprobs: 1 });
  eq(r.choices[0].text, 'cde', 'text');
  eq(r.choices[0].logprobs.tokens.length, 3, 'logprob tokens');
});

await check('openai_errors', async () => {
  try {
    await openai.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }], temperature: 'hot' });
    throw new Error('no error');
  } catch (e) {
    if (!(e instanceof OpenAI.APIError) || e.status !== 400 || !/temperature/.test(e.message)) throw e;
  }
});

await check('openai_abort_mid_stream', async () => {
  const ac = new AbortController();
  const stream = await openai.chat.completions.create({
    model: 'm', messages: [{ role: 'user', content: 'SLOW LOOP:zz' }], stream: true, max_tokens: 5000,
  }, { signal: ac.signal });
  let n = 0;
  try {
    for await (const c of stream) { if (++n === 5) ac.abort(); }
  } catch (e) {
    if (!(e instanceof OpenAI.APIUserAbortError) && e.name !== 'AbortError') throw e;
  }
  // the server keeps serving
  const r = await openai.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'SAY:still here' }] });
  eq(r.choices[0].message.content, 'still here', 'after abort');
});

await check('anthropic_messages', async () => {
  const m = await anthropic.messages.create({
    model: 'm', max_tokens: 64, system: 'be nice', messages: [{ role: 'user', content: 'SAY:Salut' }],
  });
  eq([m.type, m.role, m.content[0].type, m.content[0].text, m.stop_reason], ['message', 'assistant', 'text', 'Salut', 'end_turn'], 'message');
  eq(m.usage.output_tokens, 5, 'usage');
});

await check('anthropic_stream', async () => {
  const stream = anthropic.messages.stream({
    model: 'm', max_tokens: 64, messages: [{ role: 'user', content: 'SAY:one, two' }], stop_sequences: [','],
  });
  const types = [];
  stream.on('streamEvent', (e) => types.push(e.type));
  const final = await stream.finalMessage();
  eq([final.content[0].text, final.stop_reason, final.stop_sequence], ['one', 'stop_sequence', ','], 'final');
  eq([types[0], types.at(-1)], ['message_start', 'message_stop'], 'event order');
});

await check('anthropic_tool_use', async () => {
  const m = await anthropic.messages.create({
    model: 'm', max_tokens: 200,
    tools: [{ name: 'calc', description: 'adds', input_schema: { type: 'object', properties: { a: { type: 'number' } } } }],
    messages: [{ role: 'user', content: 'SAY:<tool_call>{"name":"calc","arguments":{"a":1}}</tool_call>' }],
  });
  const tu = m.content.find((b) => b.type === 'tool_use');
  eq([m.stop_reason, tu.name, tu.input], ['tool_use', 'calc', { a: 1 }], 'tool_use');
  const m2 = await anthropic.messages.create({
    model: 'm', max_tokens: 5,
    tools: [{ name: 'calc', input_schema: { type: 'object' } }],
    messages: [{ role: 'user', content: 'q' }, { role: 'assistant', content: m.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: tu.id, content: '2' }] }],
  });
  eq(m2.type, 'message', 'tool_result round trip');
});

await check('anthropic_error', async () => {
  try {
    await anthropic.messages.create({ model: 'm', max_tokens: 0, messages: [{ role: 'user', content: 'x' }] });
    throw new Error('no error');
  } catch (e) {
    if (!(e instanceof Anthropic.APIError) || e.status !== 400) throw e;
  }
});

await check('autocannon_load', async () => {
  const result = await autocannon({
    url: `${base}/v1/chat/completions`, method: 'POST', connections: 8, duration: 1.5,
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'SAY:ok' }] }),
  });
  const bad = result.non2xx - (result.statusCodeStats['429']?.count ?? 0);
  if (result.errors || result.timeouts || bad) throw new Error(`errors ${result.errors} timeouts ${result.timeouts} non-2xx ${result.non2xx}`);
  if (result.requests.total < 10) throw new Error(`only ${result.requests.total} requests`);
  console.log(`INFO autocannon: ${result.requests.total} requests in 1.5 s over 8 connections, ` +
              `p50 ${result.latency.p50} ms, p99 ${result.latency.p99} ms`);
});

process.exit(failed ? 1 : 0);
