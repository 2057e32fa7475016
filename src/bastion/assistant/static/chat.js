// bastion's reference chat page: sign-in, conversations, and a small client of the AI SDK UI message
// stream (the same chunks `useChat` reads), with tool calls shown as cards and approvals answered here.

const state = {
  token: localStorage.getItem('bastion.token'),
  conversations: [],
  current: null,
  messages: [],
  memories: [],
  busy: false,
};

const $ = selector => document.querySelector(selector);

function element(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === 'onclick') node.addEventListener('click', value);
    else if (value !== undefined && value !== null) node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function showError(message) {
  const box = $('#error');
  box.textContent = message || '';
  box.hidden = !message;
}

async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    headers: {
      'content-type': 'application/json',
      ...(state.token ? { authorization: `Bearer ${state.token}` } : {}),
      ...(options.headers || {}),
    },
  });
  if (response.status === 401) {
    signOut();
    throw new Error('Your session has ended. Sign in again.');
  }
  if (!response.ok) {
    let message = 'Unable to complete the request. Try again.';
    try {
      message = (await response.json()).message || message;
    } catch {}
    throw new Error(message);
  }
  return response;
}

// --- Sign-in ---

async function signIn(event) {
  event.preventDefault();
  showError('');
  const name = $('#user-name').value.trim();
  try {
    const response = await fetch('/auth/dev/token', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ user: name }),
    });
    const body = await response.json();
    if (!response.ok) throw new Error(body.message || 'Sign-in failed.');
    state.token = body.access_token;
    localStorage.setItem('bastion.token', state.token);
    await start();
  } catch (error) {
    showError(error.message);
  }
}

function signOut() {
  state.token = null;
  state.current = null;
  state.messages = [];
  state.memories = [];
  localStorage.removeItem('bastion.token');
  render();
}

// --- Conversations ---

async function loadConversations() {
  const response = await api('/api/conversations');
  state.conversations = (await response.json()).conversations;
}

// --- Memories (what the assistant remembers about the signed-in user, across conversations) ---

async function loadMemories() {
  const response = await api('/api/memories');
  state.memories = (await response.json()).memories;
}

async function forgetMemory(id) {
  showError('');
  try {
    await api(`/api/memories/${id}`, { method: 'DELETE' });
    await loadMemories();
    render();
  } catch (error) {
    showError(error.message);
  }
}

// A conversation is created by its first message, under an id chosen here (as the AI SDK client does).
function startConversation() {
  state.current = crypto.randomUUID();
  state.messages = [];
  history.replaceState(null, '', `#${state.current}`);
  render();
}

async function openConversation(id) {
  showError('');
  const response = await api(`/api/conversations/${id}/messages`);
  state.current = id;
  state.messages = (await response.json()).messages;
  history.replaceState(null, '', `#${id}`);
  render();
}

// --- The UI message stream ---

function lastAssistant() {
  const last = state.messages[state.messages.length - 1];
  return last && last.role === 'assistant' ? last : null;
}

function toolPart(message, toolCallId) {
  return message.parts.find(part => part.toolCallId === toolCallId);
}

// Applies one chunk to the assistant message being streamed, as the AI SDK client does.
function applyChunk(message, chunk, open) {
  switch (chunk.type) {
    case 'start':
      if (chunk.messageId) message.id = chunk.messageId;
      break;
    case 'start-step':
      message.parts.push({ type: 'step-start' });
      break;
    case 'text-start':
    case 'reasoning-start': {
      const part = { type: chunk.type.split('-')[0], text: '', state: 'streaming' };
      open[chunk.id] = part;
      message.parts.push(part);
      break;
    }
    case 'text-delta':
    case 'reasoning-delta':
      open[chunk.id].text += chunk.delta;
      break;
    case 'text-end':
    case 'reasoning-end':
      open[chunk.id].state = 'done';
      delete open[chunk.id];
      break;
    case 'tool-input-start':
      message.parts.push({
        type: chunk.dynamic ? 'dynamic-tool' : `tool-${chunk.toolName}`,
        ...(chunk.dynamic ? { toolName: chunk.toolName } : {}),
        toolCallId: chunk.toolCallId,
        state: 'input-streaming',
        input: undefined,
      });
      break;
    case 'tool-input-available':
    case 'tool-input-error': {
      let part = toolPart(message, chunk.toolCallId);
      if (!part) {
        part = {
          type: chunk.dynamic ? 'dynamic-tool' : `tool-${chunk.toolName}`,
          ...(chunk.dynamic ? { toolName: chunk.toolName } : {}),
          toolCallId: chunk.toolCallId,
        };
        message.parts.push(part);
      }
      part.input = chunk.input;
      part.state = chunk.type === 'tool-input-error' ? 'output-error' : 'input-available';
      if (chunk.errorText) part.errorText = chunk.errorText;
      break;
    }
    case 'tool-approval-request': {
      const part = toolPart(message, chunk.toolCallId);
      part.state = 'approval-requested';
      part.approval = { id: chunk.approvalId };
      break;
    }
    case 'tool-output-available': {
      const part = toolPart(message, chunk.toolCallId);
      part.state = 'output-available';
      part.output = chunk.output;
      break;
    }
    case 'tool-output-error': {
      const part = toolPart(message, chunk.toolCallId);
      part.state = 'output-error';
      part.errorText = chunk.errorText;
      break;
    }
    case 'tool-output-denied':
      toolPart(message, chunk.toolCallId).state = 'output-denied';
      break;
    case 'error':
      showError(chunk.errorText);
      break;
  }
}

async function submit(trigger = 'submit-message') {
  state.busy = true;
  render();
  try {
    const response = await api('/api/chat', {
      method: 'POST',
      body: JSON.stringify({ id: state.current, messages: state.messages, trigger }),
    });
    let message = lastAssistant();
    if (!message) {
      message = { id: '', role: 'assistant', parts: [] };
      state.messages.push(message);
    }
    const open = {};
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let boundary;
      while ((boundary = buffer.indexOf('\n\n')) >= 0) {
        const event = buffer.slice(0, boundary);
        buffer = buffer.slice(boundary + 2);
        const data = event.startsWith('data: ') ? event.slice(6) : '';
        if (!data || data === '[DONE]') continue;
        applyChunk(message, JSON.parse(data), open);
      }
      render();
    }
  } catch (error) {
    showError(error.message);
  } finally {
    state.busy = false;
    // The server's copy is canonical: continue from it, not from what this page assembled.
    await openConversation(state.current).catch(error => showError(error.message));
    loadConversations().then(render).catch(() => {});
    loadMemories().then(render).catch(() => {});
  }
}

async function send(event) {
  event.preventDefault();
  const input = $('#prompt');
  const text = input.value.trim();
  if (!text || state.busy) return;
  showError('');
  if (!state.current) startConversation();
  input.value = '';
  state.messages.push({ id: crypto.randomUUID(), role: 'user', parts: [{ type: 'text', text }] });
  await submit();
}

async function answer(part, approved) {
  part.state = 'approval-responded';
  part.approval = { ...part.approval, approved };
  const waiting = lastAssistant().parts.some(p => p.state === 'approval-requested');
  render();
  if (!waiting) await submit();
}

// --- Rendering ---

function renderToolCard(part) {
  const name = part.type === 'dynamic-tool' ? part.toolName : part.type.slice('tool-'.length);
  const card = element(
    'div',
    { class: `tool-card state-${part.state}`, 'data-tool': name, 'data-state': part.state },
    element('div', { class: 'tool-title' }, `Tool: ${name}`, element('span', { class: 'tool-state' }, part.state)),
    element('pre', { class: 'tool-input' }, JSON.stringify(part.input ?? {}, null, 2)),
  );
  if (part.state === 'output-available') {
    card.append(element('pre', { class: 'tool-output' }, JSON.stringify(part.output, null, 2)));
  } else if (part.state === 'output-error') {
    card.append(element('div', { class: 'tool-error' }, part.errorText));
  } else if (part.state === 'output-denied') {
    card.append(element('div', { class: 'tool-denied' }, 'Denied.'));
  } else if (part.state === 'approval-requested') {
    card.append(
      element(
        'div',
        { class: 'approval' },
        element('button', { class: 'approve', onclick: () => answer(part, true), disabled: state.busy ? '' : null }, 'Approve'),
        element('button', { class: 'deny', onclick: () => answer(part, false), disabled: state.busy ? '' : null }, 'Deny'),
      ),
    );
  }
  return card;
}

function renderMessage(message) {
  const node = element('div', { class: `message ${message.role}`, 'data-id': message.id });
  for (const part of message.parts) {
    if (part.type === 'text') node.append(element('div', { class: 'text' }, part.text));
    else if (part.type === 'reasoning') node.append(element('div', { class: 'reasoning' }, part.text));
    else if (part.type === 'dynamic-tool' || part.type.startsWith('tool-')) node.append(renderToolCard(part));
  }
  return node;
}

function render() {
  $('#sign-in').hidden = Boolean(state.token);
  $('#app').hidden = !state.token;
  if (!state.token) return;
  const list = $('#conversations');
  list.replaceChildren(
    ...state.conversations.map(conversation =>
      element(
        'li',
        {},
        element(
          'button',
          {
            class: conversation.id === state.current ? 'current' : '',
            'data-id': conversation.id,
            onclick: () => openConversation(conversation.id).catch(error => showError(error.message)),
          },
          conversation.title || 'New conversation',
        ),
      ),
    ),
  );
  $('#memories').replaceChildren(
    ...state.memories.map(memory =>
      element(
        'li',
        { 'data-id': memory.id },
        element('span', { class: 'memory-text' }, memory.text),
        element('button', { type: 'button', class: 'forget', onclick: () => forgetMemory(memory.id) }, 'Forget'),
      ),
    ),
  );
  $('#no-memories').hidden = state.memories.length > 0;
  $('#messages').replaceChildren(...state.messages.map(renderMessage));
  $('#send').disabled = state.busy;
  $('#status').textContent = state.busy ? 'Thinking…' : '';
}

async function start() {
  render();
  if (!state.token) return;
  try {
    await Promise.all([loadConversations(), loadMemories()]);
    const fromUrl = location.hash.slice(1);
    if (fromUrl && state.conversations.some(c => c.id === fromUrl)) await openConversation(fromUrl);
    render();
  } catch (error) {
    showError(error.message);
  }
}

async function showServerInfo() {
  try {
    const info = await (await fetch('/api/info')).json();
    $('#demo').hidden = !info.demo_model;
    $('#dev-sign-in-note').hidden = !info.development_sign_in;
  } catch {}
}

window.addEventListener('DOMContentLoaded', () => {
  $('#sign-in-form').addEventListener('submit', signIn);
  $('#composer').addEventListener('submit', send);
  $('#new').addEventListener('click', startConversation);
  $('#sign-out').addEventListener('click', signOut);
  showServerInfo();
  start();
});
