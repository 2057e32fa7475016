import { useCallback, useEffect, useRef, useState } from 'react';
import { messageFor } from './api.js';
import './inbox.css';

// The demo contact widget: a visitor opens a conversation with the support inbox and talks to its bot
// (or, after a handoff, to staff). The contact token lives only in this page's memory.
const POLL_MS = 1000;
const AUTHORS = { contact: 'You', bot: 'Bot', staff: 'Staff' };

async function call(path, { token, method = 'GET', body } = {}) {
  const response = await fetch(path, {
    method,
    headers: {
      ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
      ...(token ? { authorization: `Bearer ${token}` } : {}),
    },
    body: body !== undefined ? JSON.stringify(body) : undefined,
  });
  const text = await response.text();
  if (!response.ok) throw new Error(messageFor(response.status, text));
  return text ? JSON.parse(text) : null;
}

export default function Widget() {
  const [token, setToken] = useState(null);
  const [name, setName] = useState('');
  const [problem, setProblem] = useState('');

  async function start(event) {
    event.preventDefault();
    try {
      const session = await call('/api/inbox/widget/conversations', {
        method: 'POST',
        body: name.trim() ? { name: name.trim() } : {},
      });
      setToken(session.token);
    } catch (error) {
      setProblem(error.message);
    }
  }

  return (
    <main className="widget-page">
      <h1>Support</h1>
      {problem && (
        <p role="alert" className="error-banner" id="widget-problem">
          {problem}
        </p>
      )}
      {token ? (
        <Conversation token={token} onProblem={setProblem} />
      ) : (
        <form id="widget-start" onSubmit={start}>
          <label htmlFor="widget-name">Your name</label>{' '}
          <input id="widget-name" value={name} maxLength={200} onChange={event => setName(event.target.value)} />{' '}
          <button type="submit">Start a conversation</button>
        </form>
      )}
    </main>
  );
}

function Conversation({ token, onProblem }) {
  const [state, setState] = useState({ bot_mode: 'bot', messages: [] });
  const [text, setText] = useState('');
  const counter = useRef(0);

  const load = useCallback(async () => setState(await call('/api/inbox/widget/messages', { token })), [token]);

  useEffect(() => {
    let live = true;
    let timer = null;
    const tick = async () => {
      try {
        const body = await call('/api/inbox/widget/messages', { token });
        if (live) setState(body);
      } catch (error) {
        if (live) onProblem(error.message);
      }
      if (live) timer = setTimeout(tick, POLL_MS);
    };
    tick();
    return () => {
      live = false;
      clearTimeout(timer);
    };
  }, [token, onProblem]);

  async function send(event) {
    event.preventDefault();
    const message = text.trim();
    if (!message) return;
    counter.current += 1;
    setText('');
    try {
      await call('/api/inbox/widget/messages', {
        token,
        method: 'POST',
        body: { text: message, client_message_id: `${Date.now()}-${counter.current}` },
      });
      await load();
    } catch (error) {
      onProblem(error.message);
    }
  }

  return (
    <>
      <p id="widget-mode" className="muted" data-mode={state.bot_mode}>
        {state.bot_mode === 'bot' ? 'The bot answers you.' : 'A member of staff will answer you.'}
      </p>
      <ol className="inbox-messages" id="widget-messages">
        {state.messages.map(message => (
          <li key={message.id} className={`inbox-message author-${message.author}`} data-author={message.author}>
            <span className="inbox-author">{AUTHORS[message.author]}</span>
            <span className="inbox-text">{message.text}</span>
          </li>
        ))}
      </ol>
      <form className="inbox-reply" id="widget-form" onSubmit={send}>
        <label htmlFor="widget-text" className="visually-hidden">
          Your message
        </label>
        <input
          id="widget-text"
          value={text}
          maxLength={8000}
          placeholder="Write a message"
          onChange={event => setText(event.target.value)}
        />
        <button type="submit" id="widget-send" disabled={!text.trim()}>
          Send
        </button>
      </form>
    </>
  );
}
