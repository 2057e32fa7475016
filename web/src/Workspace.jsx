import { useCallback, useEffect, useMemo, useRef, useState } from 'react';
import { describeError, makeApi } from './api.js';
import Chat from './Chat.jsx';
import InboxView from './InboxView.jsx';
import { Menu } from './icons.jsx';
import MemoryPanel from './MemoryPanel.jsx';
import { ConnectionsPanel } from './Connections.jsx';
import Sidebar from './Sidebar.jsx';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

function idFromAddress() {
  const id = window.location.hash.slice(1);
  return UUID.test(id) ? id : null;
}

// The memory tools: a turn that ran one changed what the assistant remembers.
const MEMORY_TOOLS = new Set(['tool-remember', 'tool-forget']);

function changedMemory(message) {
  return Boolean(message?.parts?.some(part => MEMORY_TOOLS.has(part.type) && part.state === 'output-available'));
}

function showInAddress(id) {
  history.replaceState(null, '', id ? `#${id}` : window.location.pathname);
}

export default function Workspace({ info, user, getToken, onSignOut, onSessionEnded }) {
  const api = useMemo(() => makeApi(getToken), [getToken]);
  const [conversations, setConversations] = useState([]);
  // The open conversation: its id, the stored messages it opened with, and whether the server has it.
  const [current, setCurrent] = useState(null);
  const [problem, setProblem] = useState('');
  const [menuOpen, setMenuOpen] = useState(false);
  // What the assistant remembers about this user (null until loaded), and why it could not load.
  const [memories, setMemories] = useState(null);
  const [memoryProblem, setMemoryProblem] = useState('');
  const [memoryOpen, setMemoryOpen] = useState(false);
  // The servers this user signs in to (BASTION_MCP_AUTH=oauth), when the server has any.
  const [hasConnections, setHasConnections] = useState(false);
  const [connectionsOpen, setConnectionsOpen] = useState(false);
  const closeConnections = useCallback(() => setConnectionsOpen(false), []);
  // The chat, or the support inbox's staff view.
  const [inboxOpen, setInboxOpen] = useState(false);
  // A conversation the address named that this user does not have (deleted, another account's, made up).
  const [missing, setMissing] = useState(null);

  // A refused token ends the session here as it does in the chat.
  const report = useCallback(
    error => {
      if (error?.status === 401) onSessionEnded();
      else setProblem(describeError(error));
    },
    [onSessionEnded],
  );

  // The connections list exists only on a server whose users sign in to an MCP server (404 elsewhere).
  useEffect(() => {
    api('/api/connections')
      .then(() => setHasConnections(true))
      .catch(() => {});
  }, [api]);

  const refreshList = useCallback(async () => {
    const body = await api('/api/conversations');
    setConversations(body.conversations);
    return body.conversations;
  }, [api]);

  // An answer that arrives after this workspace is gone (its session ended meanwhile) is dropped, so it
  // cannot turn an ended session into a plain sign out.
  const mounted = useRef(false);
  useEffect(() => {
    mounted.current = true;
    return () => {
      mounted.current = false;
    };
  }, []);

  // Only the latest answer counts: a list asked for before a Forget (or a newer list) is stale.
  const memoryAsk = useRef(0);

  const refreshMemories = useCallback(async () => {
    memoryAsk.current += 1;
    const ask = memoryAsk.current;
    try {
      const body = await api('/api/memories');
      if (!mounted.current || ask !== memoryAsk.current) return;
      setMemories(body.memories);
      setMemoryProblem('');
    } catch (error) {
      if (!mounted.current || ask !== memoryAsk.current) return;
      if (error?.status === 401) onSessionEnded();
      else setMemoryProblem(describeError(error));
    }
  }, [api, onSessionEnded]);

  useEffect(() => {
    refreshMemories();
  }, [refreshMemories]);

  const openMemory = useCallback(() => {
    setMenuOpen(false);
    setMemoryOpen(true);
    setMemoryProblem('');
    refreshMemories();
  }, [refreshMemories]);
  const closeMemory = useCallback(() => setMemoryOpen(false), []);

  const forgetMemory = useCallback(
    async id => {
      memoryAsk.current += 1;
      try {
        await api(`/api/memories/${id}`, { method: 'DELETE' });
        if (!mounted.current) return false;
        setMemories(list => (list ?? []).filter(memory => memory.id !== id));
        setMemoryProblem('');
        return true;
      } catch (error) {
        if (!mounted.current) return false;
        if (error?.status === 401) onSessionEnded();
        else setMemoryProblem(describeError(error));
        return false;
      }
    },
    [api, onSessionEnded],
  );

  const startNew = useCallback(() => {
    setMissing(null);
    setCurrent({ id: crypto.randomUUID(), messages: [], stored: false });
    showInAddress(null);
    setMenuOpen(false);
  }, []);

  const open = useCallback(
    async id => {
      setProblem('');
      try {
        const body = await api(`/api/conversations/${id}/messages`);
        setMissing(null);
        setCurrent({ id, messages: body.messages, stored: true });
        showInAddress(id);
        setMenuOpen(false);
      } catch (error) {
        if (error?.status === 404) setMissing(id);
        else report(error);
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
        else if (window.location.hash.length > 1) {
          // The address names a conversation this user does not have: say so, not an empty chat.
          setCurrent(null);
          setMissing(window.location.hash.slice(1));
        } else startNew();
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
  // A turn that remembered or forgot something changes the memory list too.
  const onTurnFinished = useCallback(
    (id, message) => {
      showInAddress(id);
      refreshList().catch(() => {});
      if (changedMemory(message)) refreshMemories();
    },
    [refreshList, refreshMemories],
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
        <a className="docs-link" id="docs-link" href="/docs" target="_blank" rel="noopener">
          API reference
        </a>
        <span className="user-name" id="user-name-shown">
          {name}
        </span>
        <button type="button" id="inbox-button" aria-pressed={inboxOpen} onClick={() => setInboxOpen(value => !value)}>
          {inboxOpen ? 'Chat' : 'Inbox'}
        </button>
        <button
          type="button"
          id="memory-button"
          aria-haspopup="dialog"
          aria-expanded={memoryOpen}
          aria-controls="memory"
          onClick={openMemory}
        >
          Memory
        </button>
        {hasConnections && (
          <button
            type="button"
            id="connections-button"
            aria-haspopup="dialog"
            aria-expanded={connectionsOpen}
            aria-controls="connections"
            onClick={() => setConnectionsOpen(true)}
          >
            Connections
          </button>
        )}
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
      <MemoryPanel
        open={memoryOpen}
        memories={memories}
        problem={memoryProblem}
        onClose={closeMemory}
        onForget={forgetMemory}
      />
      {hasConnections && <ConnectionsPanel open={connectionsOpen} api={api} onClose={closeConnections} />}
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
        {inboxOpen && <InboxView api={api} onSessionEnded={onSessionEnded} />}
        {missing && !inboxOpen && (
          <section className="gone" id="not-found" aria-labelledby="not-found-title">
            <h2 id="not-found-title">Conversation not found</h2>
            <p>
              This address names no conversation of yours: it may have been deleted, belong to another account,
              or be mistyped.
            </p>
            <button type="button" className="primary" id="start-new" onClick={startNew}>
              Start a new conversation
            </button>
          </section>
        )}
        {current && !missing && !inboxOpen && (
          <Chat
            key={current.id}
            conversation={current}
            api={api}
            getToken={getToken}
            onTurnFinished={onTurnFinished}
            onSessionEnded={onSessionEnded}
          />
        )}
      </main>
    </div>
  );
}
