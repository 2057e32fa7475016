import { useCallback, useEffect, useRef, useState } from 'react';
import { describeError, makeApi } from './api.js';

// Signing in to the servers the assistant uses on the user's behalf (BASTION_MCP_AUTH=oauth): the card a
// paused turn shows, the page the server sends the browser back to, and the list of connections.
// The sign-in runs in its own window; its page tells every tab of this site how it went.
const CHANNEL = 'bastion-connections';
const CALLBACK = /^\/connections\/([A-Za-z0-9_-]{1,200})\/callback$/;

function announce(message) {
  const channel = new BroadcastChannel(CHANNEL);
  channel.postMessage(message);
  channel.close();
}

function useAnnouncements(onMessage) {
  useEffect(() => {
    const channel = new BroadcastChannel(CHANNEL);
    channel.onmessage = ({ data }) => data && onMessage(data);
    return () => channel.close();
  }, [onMessage]);
}

// The window opens at the click (a window opened later is a blocked pop-up), then goes to the sign-in.
function openSignIn(name) {
  return window.open('about:blank', `connect-${name}`, 'popup,width=520,height=720');
}

function goTo(target, url) {
  if (target) target.location.href = url;
  else window.location.href = url;
}

// What the server sent the browser back with, taken out of the address before anything else reads it
// (supabase-js would take `?code=` for its own), or null on every other page.
export function takeCallback() {
  const match = CALLBACK.exec(window.location.pathname);
  if (!match) return null;
  const query = new URLSearchParams(window.location.search);
  const params = {};
  for (const key of ['state', 'code', 'error', 'iss']) {
    const value = query.get(key);
    if (value) params[key] = value.slice(0, 4096);
  }
  history.replaceState(null, '', window.location.pathname);
  return { name: match[1], params };
}

// The card of a call that waits for the user to sign in. Once they have, the call is answered and the
// turn goes on by itself; a sign-in that did not happen is said, and the assistant is told. A card shown
// again (a reload, another tab) goes on at once when the user is connected by then, and Connect asks for
// a fresh sign-in for this call, since the one in the card is used once and expires in minutes.
export function ConnectCard({ authorization, approvalId, toolCallId, conversationId, api, onAnswer, busy }) {
  const name = authorization.connection;
  const [waiting, setWaiting] = useState(false);
  // Answered once, whichever comes first: the sign-in window's word, or a connection already made.
  const answered = useRef(false);
  const latest = useRef(onAnswer);
  latest.current = onAnswer;
  const answer = useCallback(
    (approved, reason) => {
      if (answered.current) return;
      answered.current = true;
      latest.current(approvalId, approved, reason);
    },
    [approvalId],
  );
  const heard = useCallback(
    message => {
      if (message.connection !== name) return;
      if (message.ok) answer(true);
      else answer(false, message.message || `The ${name} connection was not authorized.`);
    },
    [name, answer],
  );
  useAnnouncements(heard);
  useEffect(() => {
    let live = true;
    api?.('/api/connections')
      .then(({ connections }) => {
        if (live && connections.some(c => c.name === name && c.status === 'connected')) answer(true);
      })
      .catch(() => {});
    return () => {
      live = false;
    };
  }, [api, name, answer]);
  return (
    <div className="connect-card">
      <p>
        {waiting
          ? `Sign in to ${name} in the window that opened; the assistant goes on when you are back.`
          : `The assistant needs your ${name} account for this. You sign in at ${name} itself.`}
      </p>
      <div className="approval-buttons">
        <button
          type="button"
          className="primary connect"
          disabled={busy}
          onClick={async () => {
            setWaiting(true);
            const target = openSignIn(name);
            const fresh = await api?.(`/api/connections/${name}/oauth/authorize`, {
              method: 'POST',
              body: { conversation_id: conversationId, tool_call_id: toolCallId },
            }).catch(() => null);
            goTo(target, fresh?.authorization_url ?? authorization.url);
          }}
        >
          Connect {name}
        </button>
        <button
          type="button"
          className="deny not-now"
          disabled={busy}
          onClick={() => answer(false, `The user chose not to connect ${name}.`)}
        >
          Not now
        </button>
      </div>
    </div>
  );
}

// The page the server sends the browser back to: it finishes the sign-in with the user's own session
// (the callback needs their token, so a link someone else opens finishes nothing) and says how it went.
export function ConnectionCallback({ callback, getToken }) {
  const [outcome, setOutcome] = useState(null);
  const started = useRef(false);
  useEffect(() => {
    if (started.current) return; // the state is single use: never sent twice
    started.current = true;
    const api = makeApi(getToken);
    api(`/api/connections/${callback.name}/oauth/callback`, { method: 'POST', body: callback.params })
      .then(() => ({ ok: true, message: `${callback.name} is connected.` }))
      .catch(error => ({ ok: false, message: describeError(error) }))
      .then(result => {
        setOutcome(result);
        announce({ connection: callback.name, ...result });
        if (result.ok && window.opener) setTimeout(() => window.close(), 1500);
      });
  }, [callback, getToken]);
  return (
    <div className="center-page">
      <section className="sign-in-card" id="connection-callback" aria-busy={outcome === null}>
        <h1>{outcome === null ? `Connecting ${callback.name}…` : outcome.ok ? 'Connected' : 'Not connected'}</h1>
        {outcome && (
          <p role={outcome.ok ? 'status' : 'alert'} id="connection-outcome" className={outcome.ok ? '' : 'error-banner'}>
            {outcome.ok ? `${outcome.message} You can close this window.` : `${callback.name} was not connected: ${outcome.message}`}
          </p>
        )}
        <p>
          <a href="/">Back to the assistant</a>
        </p>
      </section>
    </div>
  );
}

const STATUS_WORDS = {
  connected: 'Connected',
  not_connected: 'Not connected',
  expired: 'Expired: connect again',
};

// The user's connections: whether each is connected, with which scopes and since when; connect or
// disconnect (the tokens are deleted, and revoked at the server when it offers it).
export function ConnectionsPanel({ open, api, onClose }) {
  const dialog = useRef(null);
  const [connections, setConnections] = useState(null);
  const [problem, setProblem] = useState('');
  const [working, setWorking] = useState(null);

  const load = useCallback(async () => {
    try {
      setConnections((await api('/api/connections')).connections);
      setProblem('');
    } catch (error) {
      setProblem(describeError(error));
    }
  }, [api]);

  useEffect(() => {
    const node = dialog.current;
    if (open && !node.open) {
      node.showModal();
      load();
    }
    if (!open && node.open) node.close();
  }, [open, load]);

  useEffect(() => {
    const node = dialog.current;
    node.addEventListener('close', onClose);
    return () => node.removeEventListener('close', onClose);
  }, [onClose]);

  useAnnouncements(load);

  async function act(name, work) {
    setWorking(name);
    try {
      await work();
      await load();
    } catch (error) {
      setProblem(describeError(error));
    } finally {
      setWorking(null);
    }
  }

  const connect = name =>
    act(name, async () => {
      const target = openSignIn(name);
      const { authorization_url: url } = await api(`/api/connections/${name}/oauth/authorize`, { method: 'POST', body: {} });
      goTo(target, url);
    });
  const disconnect = name => act(name, () => api(`/api/connections/${name}/oauth`, { method: 'DELETE' }));

  return (
    <dialog ref={dialog} id="connections" className="memory-dialog" aria-labelledby="connections-title">
      <div className="dialog-header">
        <h2 id="connections-title">Connections</h2>
        <button type="button" className="small" id="connections-close" onClick={onClose}>
          Close
        </button>
      </div>
      <p className="dialog-note">The servers the assistant uses with your own account. You sign in at each server.</p>
      {problem && (
        <p role="alert" className="error-banner" id="connections-error">
          {problem}
        </p>
      )}
      {connections === null ? (
        !problem && <p className="empty-list" aria-busy="true">Loading…</p>
      ) : (
        <ul className="memories" id="connection-list">
          {connections.map(connection => (
            <li key={connection.name} className="memory connection" data-name={connection.name} data-status={connection.status}>
              <span className="memory-text">
                <strong>{connection.name}</strong> · {STATUS_WORDS[connection.status] ?? connection.status}
              </span>
              <span className="memory-date">
                {connection.connected_at
                  ? `Since ${new Date(connection.connected_at).toLocaleDateString()}`
                  : 'Never connected'}
                {connection.scopes.length > 0 && ` · ${connection.scopes.join(', ')}`}
              </span>
              {connection.status === 'connected' ? (
                <button type="button" className="small forget disconnect" disabled={working === connection.name} onClick={() => disconnect(connection.name)}>
                  Disconnect
                </button>
              ) : (
                <button type="button" className="small forget connect" disabled={working === connection.name} onClick={() => connect(connection.name)}>
                  Connect
                </button>
              )}
            </li>
          ))}
        </ul>
      )}
    </dialog>
  );
}
