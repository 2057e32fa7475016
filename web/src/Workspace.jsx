import { useCallback, useEffect, useMemo, useState } from 'react';
import { describeError, makeApi } from './api.js';
import Chat from './Chat.jsx';
import { Menu } from './icons.jsx';
import Sidebar from './Sidebar.jsx';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

function idFromAddress() {
  const id = window.location.hash.slice(1);
  return UUID.test(id) ? id : null;
}

function showInAddress(id) {
  history.replaceState(null, '', id ? `#${id}` : window.location.pathname);
}

export default function Workspace({ info, user, getToken, onSignOut }) {
  const api = useMemo(() => makeApi(getToken), [getToken]);
  const [conversations, setConversations] = useState([]);
  // The open conversation: its id, the stored messages it opened with, and whether the server has it.
  const [current, setCurrent] = useState(null);
  const [problem, setProblem] = useState('');
  const [menuOpen, setMenuOpen] = useState(false);

  // A refused token ends the session here as it does in the chat.
  const report = useCallback(
    error => {
      if (error?.status === 401) onSignOut();
      else setProblem(describeError(error));
    },
    [onSignOut],
  );

  const refreshList = useCallback(async () => {
    const body = await api('/api/conversations');
    setConversations(body.conversations);
    return body.conversations;
  }, [api]);

  const startNew = useCallback(() => {
    setCurrent({ id: crypto.randomUUID(), messages: [], stored: false });
    showInAddress(null);
    setMenuOpen(false);
  }, []);

  const open = useCallback(
    async id => {
      setProblem('');
      try {
        const body = await api(`/api/conversations/${id}/messages`);
        setCurrent({ id, messages: body.messages, stored: true });
        showInAddress(id);
        setMenuOpen(false);
      } catch (error) {
        report(error);
      }
    },
    [api, report],
  );

  useEffect(() => {
    let live = true;
    refreshList()
      .then(list => {
        if (!live) return;
        const wanted = idFromAddress();
        if (wanted && list.some(conversation => conversation.id === wanted)) open(wanted);
        else startNew();
      })
      .catch(error => {
        if (!live) return;
        report(error);
        startNew();
      });
    return () => {
      live = false;
    };
  }, [refreshList, open, startNew, report]);

  // The drawer (narrow screens) takes the focus when it opens and closes with Escape.
  useEffect(() => {
    if (!menuOpen) return undefined;
    document.querySelector('#sidebar #new')?.focus();
    const close = event => event.key === 'Escape' && setMenuOpen(false);
    window.addEventListener('keydown', close);
    return () => window.removeEventListener('keydown', close);
  }, [menuOpen]);

  async function rename(id, title) {
    try {
      const updated = await api(`/api/conversations/${id}`, { method: 'PATCH', body: { title } });
      setConversations(list => list.map(item => (item.id === id ? { ...item, title: updated.title } : item)));
      return true;
    } catch (error) {
      report(error);
      return false;
    }
  }

  async function remove(id) {
    try {
      await api(`/api/conversations/${id}`, { method: 'DELETE' });
      setConversations(list => list.filter(item => item.id !== id));
      if (current?.id === id) startNew();
    } catch (error) {
      report(error);
    }
  }

  // After a turn the list learns a new conversation's title; the address names it from then on.
  const onTurnFinished = useCallback(
    id => {
      showInAddress(id);
      refreshList().catch(() => {});
    },
    [refreshList],
  );

  const name = user.is_anonymous ? 'Guest' : user.email || user.user_metadata?.name || 'Signed in';
  return (
    <div className={`workspace${menuOpen ? ' menu-open' : ''}`}>
      <header className="top-bar">
        <button
          type="button"
          className="menu-button"
          aria-label="Conversations"
          aria-expanded={menuOpen}
          aria-controls="sidebar"
          onClick={() => setMenuOpen(value => !value)}
        >
          <Menu />
        </button>
        <span className="brand">
          <img src="/static/favicon.svg" alt="" width="22" height="22" />
          <span className="brand-name">bastion assistant</span>
        </span>
        {info.demo_model && (
          <span className="badge demo-badge" id="demo" title="Set BASTION_MODEL for a real model.">
            Demo model
          </span>
        )}
        {info.auth.mode === 'development' && (
          <span className="badge dev-badge" title="Tokens are signed by this server, for this machine only.">
            Development sign-in
          </span>
        )}
        <span className="spacer" />
        <span className="user-name" id="user-name-shown">
          {name}
        </span>
        <button type="button" id="sign-out" onClick={onSignOut}>
          Sign out
        </button>
      </header>
      <Sidebar
        conversations={conversations}
        currentId={current?.id}
        onNew={startNew}
        onOpen={open}
        onRename={rename}
        onDelete={remove}
      />
      <div className="scrim" hidden={!menuOpen} onClick={() => setMenuOpen(false)} />
      <main className="chat-area">
        {problem && (
          <div role="alert" className="error-banner" id="problem">
            {problem}
            <button type="button" className="link" onClick={() => setProblem('')} aria-label="Dismiss">
              ✕
            </button>
          </div>
        )}
        {current && (
          <Chat
            key={current.id}
            conversation={current}
            api={api}
            getToken={getToken}
            onTurnFinished={onTurnFinished}
            onSessionEnded={onSignOut}
          />
        )}
      </main>
    </div>
  );
}
