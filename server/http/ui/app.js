// The playground: chat and plain completion over the server's OpenAI API (streamed with fetch
// and a ReadableStream), the model's card, a glance at /metrics, and the depth-attention
// heatmap of every answer; a chat answer's reasoning and tool calls are shown apart from its
// text. Plain script, no build step, nothing loaded from elsewhere (the server's
// Content-Security-Policy allows this origin only). The state the tests read back is in the
// DOM: body[data-state], body[data-ready], each heatmap cell's data-value, each tool call's
// data-name and data-arguments (the arguments as streamed, assembled), and an answer's
// data-json when it was asked for under a response format.
'use strict';

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = 'attnres-api-key';

const state = {
  key: sessionStorage.getItem(KEY_STORAGE) || '',
  model: null,      // the id /v1/models lists
  info: null,       // /ui/model-info
  entries: [],      // {role, content, depth?, el}: chat messages, or prompt/completion pairs
  controller: null, // the running request's AbortController
  view: null,       // the entry whose depth attention the heatmap shows
  follow: true,     // the heatmap shows each new token as it arrives
  pending: null,    // an entry with depth data the next frame shows
  frame: 0,         // the requested animation frame, 0 when none
  step: -1,         // -1: the prompt's mean; i: generated token i
  lastMetrics: null,
};

// ---- talking to the server ----

function headers(json) {
  const h = {};
  if (json) h['Content-Type'] = 'application/json';
  if (state.key) h.Authorization = 'Bearer ' + state.key;
  return h;
}

class HttpError extends Error {
  constructor(status, message, retryAfter) {
    super(message);
    this.status = status;
    this.retryAfter = retryAfter;
  }
}

// The OpenAI error envelope's message, else the body's text.
async function errorFrom(res) {
  const text = await res.text();
  let message = text;
  try {
    const body = JSON.parse(text);
    if (body && body.error && body.error.message) message = body.error.message;
  } catch (e) { /* not JSON: the text itself */ }
  return new HttpError(res.status, message || res.statusText, res.headers.get('Retry-After'));
}

async function getJson(path) {
  const res = await fetch(path, { headers: headers(false) });
  if (!res.ok) throw await errorFrom(res);
  return res.json();
}

// An error event inside a stream the server had accepted (the engine failed mid-answer).
class StreamError extends Error {}

// A settings field the page cannot turn into a request (JSON that does not parse).
class InputError extends Error {}

function describeError(e) {
  if (e instanceof InputError) return e.message + ' Nothing was sent.';
  if (e instanceof StreamError) return 'The server ended the answer with an error: ' + e.message;
  if (!(e instanceof HttpError)) return 'Cannot reach the server: ' + e.message;
  const retry = e.retryAfter ? ' Retry after ' + e.retryAfter + ' s.' : '';
  switch (e.status) {
    case 400: return 'The server refused the request (400): ' + e.message;
    case 401: return 'The API key was not accepted (401): ' + e.message;
    case 429: return 'Too many requests (429): ' + e.message + retry;
    case 503: return 'The server is busy or unavailable (503): ' + e.message + retry;
    default: return 'HTTP ' + e.status + ': ' + e.message;
  }
}

function showError(e) {
  const box = $('error');
  box.textContent = typeof e === 'string' ? e : describeError(e);
  box.dataset.status = e instanceof HttpError ? String(e.status) : '';
  box.hidden = false;
  if (e instanceof HttpError && e.status === 401) askForKey();
}

function clearError() {
  $('error').hidden = true;
  $('error').textContent = '';
}

function askForKey() {
  $('key-form').hidden = false;
  $('api-key').focus();
}

// ---- the model's card ----

function cardRow(dl, name, value) {
  const dt = document.createElement('dt');
  dt.textContent = name;
  const dd = document.createElement('dd');
  dd.textContent = value;
  dd.dataset.field = name;
  dl.append(dt, dd);
}

async function loadModel() {
  try {
    const [models, info] = await Promise.all([getJson('/v1/models'), getJson('/ui/model-info')]);
    state.model = models.data[0].id;
    state.info = info;
  } catch (e) {
    showError(e);
    return;
  }
  clearError();
  $('key-form').hidden = true;
  const i = state.info;
  const card = $('card');
  card.textContent = '';
  cardRow(card, 'model', state.model);
  cardRow(card, 'shape', `${i.architecture}, ${i.num_layers} layers, d=${i.hidden_size}, ` +
    `${i.num_heads}/${i.num_kv_heads} heads`);
  cardRow(card, 'AttnRes', i.attnres_mode === 'none' ? 'none (plain model)'
    : `${i.attnres_mode}, ${i.attnres_num_blocks} blocks, gate ${i.attnres_gate}`);
  cardRow(card, 'context', String(i.max_model_len));
  cardRow(card, 'dtype', i.dtype);
  cardRow(card, 'device', i.device);
  if (!i.chat_template) $('mode').value = 'completion';
  if (!i.depth_attention) {
    $('depth').checked = false;
    $('depth').disabled = true;
    $('depth-note').textContent =
      'This model has no depth attention: it is a plain model, not an AttnRes one.';
  }
  updateMode();
  document.body.dataset.ready = 'true';
}

// ---- the server glance (/metrics needs no key) ----

function metricValue(text, name) {
  const m = text.match(new RegExp('^' + name + '(?:\\{[^}]*\\})? ([0-9.eE+-]+)$', 'm'));
  return m ? Number(m[1]) : null;
}

async function pollMetrics() {
  let text;
  try {
    const res = await fetch('/metrics');
    if (!res.ok) return;
    text = await res.text();
  } catch (e) {
    return;
  }
  const now = performance.now();
  const running = metricValue(text, 'attnres:num_requests_running');
  const waiting = metricValue(text, 'attnres:num_requests_waiting');
  const kv = metricValue(text, 'attnres:kv_cache_usage_perc');
  const generated = metricValue(text, 'attnres:generation_tokens_total');
  $('g-running').textContent = running === null ? '–' : String(running);
  $('g-waiting').textContent = waiting === null ? '–' : String(waiting);
  $('g-kv').textContent = kv === null ? '–' : (100 * kv).toFixed(1) + '%';
  const last = state.lastMetrics;
  if (last && generated !== null && now > last.time) {
    const rate = (generated - last.generated) / ((now - last.time) / 1000);
    $('g-tps').textContent = rate.toFixed(1);
  }
  state.lastMetrics = { time: now, generated };
}

// ---- the conversation ----

function isChat() { return $('mode').value === 'chat'; }

function updateMode() {
  $('chat-settings').hidden = !isChat();
  $('prompt').placeholder = isChat()
    ? 'Type a message (Enter sends, Shift+Enter a new line)'
    : 'Type the text to continue (Enter sends, Shift+Enter a new line)';
}

function addEntry(role, content) {
  const entry = { role, content, el: document.createElement('div') };
  entry.el.className = 'msg ' + role;
  const who = document.createElement('div');
  who.className = 'who';
  who.textContent = role;
  entry.text = document.createElement('div');
  entry.text.className = 'text';
  entry.text.textContent = content;
  entry.el.append(who, entry.text);
  if (role === 'assistant') addAnswerParts(entry);
  if (role === 'assistant' || role === 'completion') {
    const actions = document.createElement('div');
    actions.className = 'actions';
    const copy = document.createElement('button');
    copy.type = 'button';
    copy.className = 'copy';
    copy.textContent = 'Copy';
    copy.addEventListener('click', () => copyText(answerText(entry), copy));
    const again = document.createElement('button');
    again.type = 'button';
    again.className = 'regenerate';
    again.textContent = 'Regenerate';
    again.addEventListener('click', () => regenerate(entry));
    actions.append(copy, again);
    entry.el.append(actions);
    entry.el.addEventListener('click', (ev) => {
      if (entry.depth && !ev.target.closest('button')) pickDepth(entry, -1);
    });
  }
  state.entries.push(entry);
  $('log').append(entry.el);
  $('log').scrollTop = $('log').scrollHeight;
  return entry;
}

// A chat answer's reasoning (a collapsible block above the text), its tool calls (a block per
// call below it) and its finish reason when the model called tools: empty and hidden until a
// delta fills them.
function addAnswerParts(entry) {
  entry.reasoning = '';
  entry.toolCalls = [];
  entry.reasoningBox = document.createElement('details');
  entry.reasoningBox.className = 'reasoning';
  entry.reasoningBox.open = true;
  const summary = document.createElement('summary');
  summary.textContent = 'Reasoning';
  entry.reasoningText = document.createElement('div');
  entry.reasoningText.className = 'reasoning-text';
  entry.reasoningBox.append(summary, entry.reasoningText);
  entry.callsBox = document.createElement('div');
  entry.callsBox.className = 'tool-calls';
  entry.finishNote = document.createElement('div');
  entry.finishNote.className = 'finish';
  entry.text.before(entry.reasoningBox);
  entry.text.after(entry.callsBox, entry.finishNote);
  clearAnswerParts(entry);
}

function clearAnswerParts(entry) {
  if (!entry.reasoningBox) return;
  entry.reasoning = '';
  entry.toolCalls = [];
  entry.reasoningText.textContent = '';
  entry.reasoningBox.hidden = true;
  entry.callsBox.textContent = '';
  entry.finishNote.textContent = '';
  entry.finishNote.hidden = true;
}

// One streamed tool-call delta: the first for a call carries its index, id and name, the
// later ones fragments of its arguments.
function addToolCallDelta(entry, delta) {
  let call = entry.toolCalls[delta.index];
  if (!call) {
    call = { id: '', name: '', arguments: '', el: document.createElement('div') };
    call.el.className = 'tool-call';
    call.el.dataset.index = String(delta.index);
    const head = document.createElement('div');
    head.className = 'call-head';
    call.nameEl = document.createElement('code');
    head.append('tool call ', call.nameEl);
    call.argsEl = document.createElement('pre');
    call.argsEl.className = 'call-args';
    call.el.append(head, call.argsEl);
    entry.toolCalls[delta.index] = call;
    entry.callsBox.append(call.el);
  }
  if (delta.id) call.id = delta.id;
  const fn = delta.function || {};
  if (fn.name) call.name += fn.name;
  if (fn.arguments) call.arguments += fn.arguments;
  call.el.dataset.id = call.id;
  call.el.dataset.name = call.name;
  call.el.dataset.arguments = call.arguments;
  call.nameEl.textContent = call.name;
  call.argsEl.textContent = prettyJson(call.arguments);
}

// Pretty-printed JSON, or the text as it is while it is not (yet) whole JSON.
function prettyJson(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch (e) {
    return text;
  }
}

function callsOf(entry) {
  return (entry.toolCalls || []).filter(Boolean);
}

function hasAnswer(entry) {
  return Boolean(entry.content || entry.reasoning || callsOf(entry).length);
}

// What Copy copies: the text, else the calls as the API gives them.
function answerText(entry) {
  const calls = callsOf(entry);
  if (entry.content || calls.length === 0) return entry.content;
  return JSON.stringify(calls.map((c) => ({ name: c.name, arguments: c.arguments })), null, 2);
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch (e) {  // no clipboard API (a page not on localhost or https): select and copy
    const area = document.createElement('textarea');
    area.value = text;
    document.body.append(area);
    area.select();
    document.execCommand('copy');
    area.remove();
  }
  button.textContent = 'Copied';
  setTimeout(() => { button.textContent = 'Copy'; }, 1200);
}

function numberField(id, integer) {
  const text = $(id).value.trim();
  if (text === '') return undefined;
  return integer ? parseInt(text, 10) : parseFloat(text);
}

// A JSON settings field: undefined when empty; an InputError naming the field when its text
// does not parse or is not what `check` accepts.
function jsonField(id, label, check, shape) {
  const text = $(id).value.trim();
  if (text === '') return undefined;
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new InputError(`${label}: not valid JSON (${e.message}).`);
  }
  if (!check(value)) throw new InputError(`${label}: must be ${shape}.`);
  return value;
}

// A chat entry as the API takes it back: an answer's calls with their ids and arguments.
function messageOf(e) {
  const calls = callsOf(e);
  if (calls.length === 0) return { role: e.role, content: e.content };
  return { role: e.role, content: e.content || null, tool_calls: calls.map((c) => ({
    id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } })) };
}

function addToolFields(body) {
  const tools = jsonField('tools', 'Tools', Array.isArray, 'a JSON list of tool definitions');
  if (tools && tools.length) body.tools = tools;
  const choice = $('tool-choice').value;
  if (body.tools || choice !== 'auto') body.tool_choice = choice;
  if (body.tools && !$('parallel-tools').checked) body.parallel_tool_calls = false;
  if (!$('thinking').checked) body.chat_template_kwargs = { enable_thinking: false };
}

function requestBody(entries) {
  const body = { model: state.model, stream: true };
  body.temperature = numberField('temperature', false);
  body.top_p = numberField('top-p', false);
  body.top_k = numberField('top-k', true);
  body.max_tokens = numberField('max-tokens', true);
  body.seed = numberField('seed', true);
  const stop = $('stop').value.split('\n').filter((s) => s !== '');
  if (stop.length) body.stop = stop;
  const schema = jsonField('response-format', 'Response format',
    (v) => v !== null && typeof v === 'object' && !Array.isArray(v), 'a JSON schema (an object)');
  if (schema) {
    body.response_format = { type: 'json_schema', json_schema: { name: 'answer', schema } };
  }
  if ($('depth').checked && state.info && state.info.depth_attention) {
    body.return_depth_attention = true;
    body.depth_attention_per_token = true;
  }
  if (isChat()) {
    body.messages = [];
    const system = $('system').value.trim();
    if (system) body.messages.push({ role: 'system', content: system });
    for (const e of entries) body.messages.push(messageOf(e));
    addToolFields(body);
  } else {
    body.prompt = entries[entries.length - 1].content;
  }
  for (const k of Object.keys(body)) if (body[k] === undefined) delete body[k];
  return body;
}

function setBusy(busy) {
  $('send').disabled = busy;
  $('stop-button').disabled = !busy;
  for (const b of document.querySelectorAll('.regenerate')) b.disabled = busy;
  document.body.dataset.state = busy ? 'streaming' : 'idle';
}

// Streams one answer into `entry` from the request for `context` (the entries before it).
// Resolves to false when the request failed before any text came.
async function generate(context, entry) {
  let ok = true;
  clearError();
  let body;
  try {
    body = requestBody(context);
  } catch (e) {
    if (!(e instanceof InputError)) throw e;
    showError(e);
    return false;
  }
  const path = isChat() ? '/v1/chat/completions' : '/v1/completions';
  entry.format = body.response_format ? body.response_format.type : null;
  state.controller = new AbortController();
  setBusy(true);
  entry.depth = null;
  state.follow = true;
  try {
    const res = await fetch(path, {
      method: 'POST', headers: headers(true), body: JSON.stringify(body),
      signal: state.controller.signal,
    });
    if (!res.ok) throw await errorFrom(res);
    await readEvents(res.body, (event) => onChunk(entry, event));
  } catch (e) {
    if (e.name !== 'AbortError') {
      showError(e);
      if (!hasAnswer(entry)) {
        entry.el.classList.add('failed');
        ok = false;
      }
    }
  } finally {
    if (entry.format && hasAnswer(entry)) showJsonAnswer(entry);
    flushFrame();
    state.controller = null;
    setBusy(false);
  }
  return ok;
}

// An answer asked for under a response format: pretty-printed and marked as JSON when it
// parses (the raw text, whose pieces map to tokens, is hidden), else marked as not whole JSON
// (stopped, or cut by max_tokens).
function showJsonAnswer(entry) {
  const box = document.createElement('div');
  box.className = 'json-answer';
  const label = document.createElement('div');
  label.className = 'json-label';
  box.append(label);
  try {
    const pretty = JSON.stringify(JSON.parse(entry.content), null, 2);
    label.textContent = `JSON (response_format ${entry.format})`;
    const pre = document.createElement('pre');
    pre.textContent = pretty;
    box.append(pre);
    entry.el.dataset.json = 'valid';
    entry.text.hidden = true;
  } catch (e) {
    label.textContent = `Not whole JSON (response_format ${entry.format})`;
    entry.el.dataset.json = 'invalid';
  }
  entry.jsonBox = box;
  entry.text.after(box);
}

function clearJsonAnswer(entry) {
  if (entry.jsonBox) entry.jsonBox.remove();
  entry.jsonBox = null;
  entry.text.hidden = false;
  delete entry.el.dataset.json;
}

function removeEntry(entry) {
  state.entries.splice(state.entries.indexOf(entry), 1);
  entry.el.remove();
  if (state.view === entry) state.view = null;
}

// Server-sent events from a fetch body: calls onData with each event's parsed JSON.
async function readEvents(stream, onData) {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r/g, '');
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split('\n').filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).trimStart()).join('\n');
      if (data === '' || data === '[DONE]') continue;
      onData(JSON.parse(data));
    }
  }
}

function onChunk(entry, event) {
  if (event.error) throw new StreamError(event.error.message || JSON.stringify(event.error));
  for (const choice of event.choices || []) {
    const delta = choice.delta;
    const text = delta ? (delta.content || '') : (choice.text || '');
    const thought = delta ? (delta.reasoning_content || '') : '';
    const depth = choice.depth_attention;
    let firstToken = -1;
    if (depth) {
      if (depth.prompt_mean) {
        entry.depth = { sublayers: depth.sublayers, sources: depth.sources,
          prompt_mean: depth.prompt_mean, tokens: [] };
      }
      if (entry.depth && depth.per_token) {
        firstToken = entry.depth.tokens.length;
        depth.per_token.forEach((m, k) => {
          entry.depth.tokens.push({ text: k === 0 ? thought + text : '', matrix: m });
        });
      }
    }
    if (thought) {
      entry.reasoningBox.hidden = false;
      appendPiece(entry, entry.reasoningText, thought, firstToken);
      entry.reasoning += thought;
    }
    if (text) {
      appendPiece(entry, entry.text, text, firstToken);
      entry.content += text;
    }
    for (const call of (delta && delta.tool_calls) || []) addToolCallDelta(entry, call);
    if (depth && entry.depth) state.pending = entry;
    if (choice.finish_reason) {
      entry.el.dataset.finish = choice.finish_reason;
      if (choice.finish_reason === 'tool_calls' && entry.finishNote) {
        entry.finishNote.textContent = 'finish_reason: tool_calls';
        entry.finishNote.hidden = false;
      }
    }
  }
  scheduleFrame();
}

// A streamed piece of text; hovering it shows the depth attention of the token it came with.
function appendPiece(entry, box, text, token) {
  const span = document.createElement('span');
  span.textContent = text;
  if (token >= 0) {
    span.dataset.token = String(token);
    span.addEventListener('mouseenter', () => pickDepth(entry, token));
  }
  box.append(span);
}

// Tokens can arrive faster than the screen refreshes: the heatmap and the scroll position are
// updated once a frame, not once a chunk.
function scheduleFrame() {
  if (!state.frame) state.frame = requestAnimationFrame(flushFrame);
}

function flushFrame() {
  if (state.frame) cancelAnimationFrame(state.frame);
  state.frame = 0;
  const entry = state.pending;
  state.pending = null;
  // While tokens arrive the view follows the newest one, until the reader picks one.
  if (entry && state.follow) showDepth(entry, entry.depth.tokens.length - 1);
  $('log').scrollTop = $('log').scrollHeight;
}

// A refused message leaves the conversation as it was and goes back into the input box, to be
// sent again once the settings are fixed or the server has room.
async function send(text) {
  if (state.controller || !state.model) return;
  let question, answer, ok;
  if (isChat()) {
    question = addEntry('user', text);
    const context = state.entries.filter((e) => e.role === 'user' ||
      (e.role === 'assistant' && (e.content || callsOf(e).length)));
    answer = addEntry('assistant', '');
    ok = await generate(context, answer);
  } else {
    question = addEntry('prompt', text);
    answer = addEntry('completion', '');
    ok = await generate([question], answer);
  }
  if (!ok) {
    removeEntry(answer);
    removeEntry(question);
    if (!$('prompt').value) $('prompt').value = text;
  }
}

function regenerate(entry) {
  if (state.controller) return;
  const at = state.entries.indexOf(entry);
  const context = state.entries.slice(0, at).filter((e) => entry.role === 'assistant'
    ? (e.role === 'user' || (e.role === 'assistant' && (e.content || callsOf(e).length)))
    : e.role === 'prompt');
  const input = entry.role === 'assistant' ? context : context.slice(-1);
  entry.content = '';
  entry.text.textContent = '';
  clearAnswerParts(entry);
  clearJsonAnswer(entry);
  delete entry.el.dataset.finish;
  entry.el.classList.remove('failed');
  generate(input, entry);
}

// ---- the depth view ----

function cellColor(v) {
  // White (0) to deep blue (1): the weight a sublayer gives a source.
  const t = Math.max(0, Math.min(1, v));
  const r = Math.round(255 - 225 * t), g = Math.round(255 - 175 * t), b = Math.round(255 - 55 * t);
  return `rgb(${r}, ${g}, ${b})`;
}

// The reader chose what to see: the view stops following the tokens as they arrive.
function pickDepth(entry, step) {
  state.follow = false;
  showDepth(entry, step);
}

// Shows `entry`'s depth attention: step -1 the prompt's mean, i generated token i.
function showDepth(entry, step) {
  const depth = entry.depth;
  if (!depth) return;
  step = Math.max(-1, Math.min(step, depth.tokens.length - 1));
  state.view = entry;
  state.step = step;
  const matrix = step < 0 ? depth.prompt_mean : depth.tokens[step].matrix;
  const table = $('heatmap');
  table.textContent = '';
  table.dataset.step = step < 0 ? 'prompt' : String(step);
  const head = table.createTHead().insertRow();
  const corner = document.createElement('th');
  corner.textContent = 'sublayer \\ source';
  head.append(corner);
  for (const source of depth.sources) {
    const th = document.createElement('th');
    th.className = 'source';
    th.textContent = source;
    head.append(th);
  }
  const tbody = table.createTBody();
  matrix.forEach((row, r) => {
    const tr = tbody.insertRow();
    const th = document.createElement('th');
    th.textContent = depth.sublayers[r];
    tr.append(th);
    row.forEach((v, c) => {
      const td = tr.insertCell();
      td.dataset.row = String(r);
      td.dataset.col = String(c);
      td.dataset.value = v === null ? '' : String(v);
      if (v === null) {
        td.className = 'unused';
      } else {
        td.textContent = v.toFixed(2);
        td.style.backgroundColor = cellColor(v);
        if (v > 0.55) td.className = 'dark';
        td.title = `${depth.sublayers[r]} ← ${depth.sources[c]}: ${v}`;
      }
    });
  });
  $('depth-note').textContent = step < 0
    ? 'The prompt: each sublayer\'s depth-mix weights, averaged over the prompt\'s tokens.'
    : `Generated token ${step + 1} of ${depth.tokens.length}: the weights of the forward that produced it.`;
  $('depth-caption').textContent = step < 0 ? 'prompt (mean)' : `token ${step + 1} / ${depth.tokens.length}`;
  $('depth-steps').hidden = false;
  renderTokenStrip(entry);
}

// The strip of the answer's tokens: rebuilt for another answer, extended as tokens arrive
// (never rebuilt under the pointer, so hovering a token does not replace it).
function renderTokenStrip(entry) {
  const strip = $('depth-tokens');
  if (strip.owner !== entry) {
    strip.textContent = '';
    strip.owner = entry;
    strip.selected = null;
  }
  const add = (label, step) => {
    const b = document.createElement('button');
    b.type = 'button';
    b.className = 'token';
    b.dataset.step = step < 0 ? 'prompt' : String(step);
    b.textContent = label;
    b.addEventListener('mouseenter', () => pickDepth(entry, step));
    b.addEventListener('click', () => pickDepth(entry, step));
    strip.append(b);
  };
  if (strip.children.length === 0) add('prompt (mean)', -1);
  for (let i = strip.children.length - 1; i < entry.depth.tokens.length; ++i) {
    add(JSON.stringify(entry.depth.tokens[i].text).slice(1, -1) || '·', i);
  }
  if (strip.selected) strip.selected.classList.remove('selected');
  strip.selected = strip.children[state.step + 1];
  strip.selected.classList.add('selected');
}

function stepBy(delta) {
  if (state.view) pickDepth(state.view, state.step + delta);
}

// ---- wiring ----

function init() {
  document.body.dataset.state = 'idle';
  $('prompt-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const text = $('prompt').value;
    if (!text.trim()) return;
    $('prompt').value = '';
    send(text);
  });
  $('prompt').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey) {
      ev.preventDefault();
      $('prompt-form').requestSubmit();
    }
  });
  $('stop-button').addEventListener('click', () => {
    if (state.controller) state.controller.abort();
  });
  $('clear').addEventListener('click', () => {
    if (state.controller) state.controller.abort();
    state.entries = [];
    state.view = null;
    $('log').textContent = '';
    $('heatmap').textContent = '';
    $('depth-tokens').textContent = '';
    $('depth-tokens').owner = null;
    $('depth-tokens').selected = null;
    $('depth-steps').hidden = true;
  });
  $('mode').addEventListener('change', updateMode);
  $('key-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    state.key = $('api-key').value.trim();
    sessionStorage.setItem(KEY_STORAGE, state.key);
    loadModel();
  });
  $('step-prev').addEventListener('click', () => stepBy(-1));
  $('step-next').addEventListener('click', () => stepBy(1));
  document.addEventListener('keydown', (ev) => {
    if (ev.target.closest('input, textarea, select')) return;
    if (ev.key === 'ArrowLeft') stepBy(-1);
    if (ev.key === 'ArrowRight') stepBy(1);
  });
  loadModel();
  pollMetrics();
  setInterval(pollMetrics, 2000);
}

init();
