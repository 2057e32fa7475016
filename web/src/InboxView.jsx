import { useCallback, useEffect, useState } from 'react';
import { describeError } from './api.js';
import './inbox.css';

// The staff's view of the support inbox: the tenant's conversations, one conversation's messages (the
// contact's, the bot's and staff's), Take over / Hand back, and a reply as staff. It polls, since
// messages also arrive from contacts and from the bot's jobs.
const POLL_MS = 1000;
const AUTHORS = { contact: 'Contact', bot: 'Bot', staff: 'Staff' };

function usePolling(load, deps) {
  useEffect(() => {
    let live = true;
    let timer = null;
    const tick = async () => {
      await load(() => live);
      if (live) timer = setTimeout(tick, POLL_MS);
    };
    tick();
    return () => {
      live = false;
      clearTimeout(timer);
    };
  }, deps);
}

export default function InboxView({ api, onSessionEnded }) {
  const [conversations, setConversations] = useState(null);
  const [openId, setOpenId] = useState(null);
  const [problem, setProblem] = useState('');

  const report = useCallback(
    error => {
      if (error?.status === 401) onSessionEnded();
      else setProblem(describeError(error));
    },
    [onSessionEnded],
  );

  usePolling(
    async live => {
      try {
        const body = await api('/api/inbox/conversations');
        if (live()) setConversations(body.conversations);
      } catch (error) {
        if (live()) report(error);
      }
    },
    [api, report],
  );

  return (
    <section className="inbox" id="inbox" aria-labelledby="inbox-title">
      <div className="inbox-list">
        <h2 id="inbox-title">Support inbox</h2>
        {problem && (
          <p role="alert" className="error-banner" id="inbox-problem">
            {problem}
          </p>
        )}
        {conversations?.length === 0 && <p className="muted">No conversations yet.</p>}
        <ul id="inbox-conversations">
          {(conversations ?? []).map(item => (
            <li key={item.id}>
              <button
                type="button"
                className={`inbox-item${item.id === openId ? ' current' : ''}`}
                data-id={item.id}
                aria-current={item.id === openId ? 'true' : undefined}
                onClick={() => setOpenId(item.id)}
              >
                <span className="inbox-contact">{item.contact_name || 'Visitor'}</span>
                <span className={`badge mode-${item.bot_mode}`}>{item.bot_mode === 'bot' ? 'Bot' : 'Human'}</span>
                <span className="inbox-preview">{item.preview}</span>
              </button>
            </li>
          ))}
        </ul>
      </div>
      {openId ? (
        <InboxConversation key={openId} id={openId} api={api} report={report} />
      ) : (
        <p className="inbox-empty muted">Open a conversation to read it.</p>
      )}
    </section>
  );
}

function InboxConversation({ id, api, report }) {
  const [detail, setDetail] = useState(null);
  const [reply, setReply] = useState('');
  const [busy, setBusy] = useState(false);

  const load = useCallback(async () => setDetail(await api(`/api/inbox/conversations/${id}`)), [api, id]);

  usePolling(
    async live => {
      try {
        const body = await api(`/api/inbox/conversations/${id}`);
        if (live()) setDetail(body);
      } catch (error) {
        if (live()) report(error);
      }
    },
    [api, id, report],
  );

  async function act(work) {
    setBusy(true);
    try {
      await work();
      await load();
    } catch (error) {
      report(error);
    } finally {
      setBusy(false);
    }
  }

  const setMode = mode => act(() => api(`/api/inbox/conversations/${id}/mode`, { method: 'PUT', body: { bot_mode: mode } }));

  function send(event) {
    event.preventDefault();
    const text = reply.trim();
    if (!text) return;
    act(async () => {
      await api(`/api/inbox/conversations/${id}/messages`, { method: 'POST', body: { text } });
      setReply('');
    });
  }

  if (!detail) return <div className="inbox-conversation" aria-busy="true" />;
  const { conversation, messages } = detail;
  const human = conversation.bot_mode === 'human';
  return (
    <div className="inbox-conversation" id="inbox-conversation" data-mode={conversation.bot_mode}>
      <div className="inbox-header">
        <h3>{conversation.contact_name || 'Visitor'}</h3>
        <span id="inbox-mode" className={`badge mode-${conversation.bot_mode}`}>
          {human ? 'A person answers' : 'The bot answers'}
        </span>
        {conversation.handoff_reason && (
          <span className="muted" id="inbox-handoff-reason">
            {conversation.handoff_reason}
          </span>
        )}
        <span className="spacer" />
        {human ? (
          <button type="button" id="hand-back" disabled={busy} onClick={() => setMode('bot')}>
            Hand back
          </button>
        ) : (
          <button type="button" id="take-over" disabled={busy} onClick={() => setMode('human')}>
            Take over
          </button>
        )}
      </div>
      <ol className="inbox-messages" id="inbox-messages">
        {messages.map(message => (
          <li key={message.id} className={`inbox-message author-${message.author}`} data-author={message.author}>
            <span className="inbox-author">{AUTHORS[message.author]}</span>
            <span className="inbox-text">{message.text}</span>
          </li>
        ))}
      </ol>
      <form className="inbox-reply" onSubmit={send}>
        <label htmlFor="staff-reply" className="visually-hidden">
          Reply as staff
        </label>
        <input
          id="staff-reply"
          value={reply}
          maxLength={8000}
          placeholder="Reply as staff"
          onChange={event => setReply(event.target.value)}
        />
        <button type="submit" id="staff-send" disabled={busy || !reply.trim()}>
          Send
        </button>
      </form>
    </div>
  );
}
