import { useEffect, useLayoutEffect, useRef, useState } from 'react';
import { Trash } from './icons.jsx';

// A modal dialog (the browser's own: it keeps the focus inside, closes with Escape and gives the focus
// back to the button that opened it) listing what the assistant remembers about the signed-in user.
export default function MemoryPanel({ open, memories, problem, onClose, onForget }) {
  const dialog = useRef(null);
  const [forgetting, setForgetting] = useState(null);
  const refocus = useRef(false);

  useEffect(() => {
    const node = dialog.current;
    if (open && !node.open) node.showModal();
    if (!open && node.open) node.close();
  }, [open]);

  useEffect(() => {
    const node = dialog.current;
    node.addEventListener('close', onClose);
    return () => node.removeEventListener('close', onClose);
  }, [onClose]);

  // A forgotten memory's button is gone: the focus moves to the next one, or to Close, as it goes.
  useLayoutEffect(() => {
    if (!refocus.current) return;
    refocus.current = false;
    (dialog.current.querySelector('.forget') ?? dialog.current.querySelector('#memory-close'))?.focus();
  }, [memories]);

  async function forget(id) {
    setForgetting(id);
    refocus.current = await onForget(id);
    setForgetting(null);
  }

  return (
    <dialog ref={dialog} id="memory" className="memory-dialog" aria-labelledby="memory-title">
      <div className="dialog-header">
        <h2 id="memory-title">What the assistant remembers</h2>
        <button type="button" className="small" id="memory-close" onClick={onClose}>
          Close
        </button>
      </div>
      <p className="dialog-note">
        It recalls these about you in every conversation. Forget one and it is gone, with its earlier versions.
      </p>
      {problem && (
        <p role="alert" className="error-banner" id="memory-error">
          {problem}
        </p>
      )}
      {memories === null ? (
        !problem && (
          <p className="empty-list" aria-busy="true">
            Loading…
          </p>
        )
      ) : memories.length === 0 ? (
        <p className="empty-list" id="memory-empty">
          Nothing remembered yet. Tell the assistant something lasting about you, like what to call you.
        </p>
      ) : (
        <ul id="memories" className="memories">
          {memories.map(memory => (
            <li key={memory.id} className="memory" data-id={memory.id}>
              <span className="memory-text">{memory.text}</span>
              <span className="memory-date">
                Remembered <time dateTime={memory.created_at}>{new Date(memory.created_at).toLocaleDateString()}</time>
              </span>
              <button
                type="button"
                className="small forget"
                aria-label={`Forget “${memory.text}”`}
                disabled={forgetting === memory.id}
                onClick={() => forget(memory.id)}
              >
                <Trash />
                <span>Forget</span>
              </button>
            </li>
          ))}
        </ul>
      )}
    </dialog>
  );
}
