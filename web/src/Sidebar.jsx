import { useState } from 'react';
import { Pencil, Trash } from './icons.jsx';

function Conversation({ conversation, current, onOpen, onRename, onDelete }) {
  const [mode, setMode] = useState('view');
  const [title, setTitle] = useState(conversation.title || '');
  const label = conversation.title || 'New conversation';

  async function save(event) {
    event.preventDefault();
    const trimmed = title.trim();
    if (!trimmed) return;
    if (await onRename(conversation.id, trimmed)) setMode('view');
  }

  if (mode === 'rename') {
    return (
      <li className="conversation editing">
        <form onSubmit={save} className="rename-form">
          <input
            aria-label="Conversation title"
            value={title}
            maxLength={200}
            autoFocus
            onChange={event => setTitle(event.target.value)}
            onKeyDown={event => event.key === 'Escape' && setMode('view')}
          />
          <button type="submit" className="primary small">
            Save
          </button>
          <button type="button" className="small" onClick={() => setMode('view')}>
            Cancel
          </button>
        </form>
      </li>
    );
  }
  if (mode === 'delete') {
    return (
      <li className="conversation confirming">
        <span className="confirm-text">Delete “{label}”?</span>
        <button type="button" className="danger small" onClick={() => onDelete(conversation.id)}>
          Delete
        </button>
        <button type="button" className="small" onClick={() => setMode('view')}>
          Keep
        </button>
      </li>
    );
  }
  return (
    <li className={`conversation${current ? ' current' : ''}`} data-id={conversation.id}>
      <button
        type="button"
        className="conversation-title"
        aria-current={current ? 'page' : undefined}
        onClick={() => onOpen(conversation.id)}
      >
        {label}
      </button>
      <button
        type="button"
        className="icon rename"
        aria-label={`Rename “${label}”`}
        title="Rename"
        onClick={() => {
          setTitle(conversation.title || '');
          setMode('rename');
        }}
      >
        <Pencil />
      </button>
      <button
        type="button"
        className="icon delete"
        aria-label={`Delete “${label}”`}
        title="Delete"
        onClick={() => setMode('delete')}
      >
        <Trash />
      </button>
    </li>
  );
}

export default function Sidebar({ conversations, currentId, onNew, onOpen, onRename, onDelete }) {
  return (
    <nav className="sidebar" id="sidebar" aria-label="Conversations">
      <button type="button" id="new" className="primary" onClick={onNew}>
        + New conversation
      </button>
      {conversations.length === 0 ? (
        <p className="empty-list">No conversations yet.</p>
      ) : (
        <ul id="conversations">
          {conversations.map(conversation => (
            <Conversation
              key={conversation.id}
              conversation={conversation}
              current={conversation.id === currentId}
              onOpen={onOpen}
              onRename={onRename}
              onDelete={onDelete}
            />
          ))}
        </ul>
      )}
    </nav>
  );
}
