import { useLayoutEffect, useRef } from 'react';
import { StopSquare } from './icons.jsx';

const MAX_HEIGHT = 200;

export default function Composer({ value, onChange, onSend, onStop, busy }) {
  const input = useRef(null);

  // Grow with the text up to a few lines, then scroll inside.
  useLayoutEffect(() => {
    const node = input.current;
    node.style.height = 'auto';
    node.style.height = `${Math.min(node.scrollHeight, MAX_HEIGHT)}px`;
  }, [value]);

  function submit(event) {
    event?.preventDefault();
    const text = value.trim();
    if (!text || busy) return;
    onChange('');
    onSend(text);
  }

  function onKeyDown(event) {
    // Enter sends; Shift+Enter is a new line; Enter while composing (IME) belongs to the composition.
    if (event.key === 'Enter' && !event.shiftKey && !event.nativeEvent.isComposing) submit(event);
  }

  return (
    <form className="composer" id="composer" onSubmit={submit}>
      <label htmlFor="prompt" className="visually-hidden">
        Message
      </label>
      <span id="prompt-hint" className="visually-hidden">
        Enter sends; Shift+Enter starts a new line.
      </span>
      <textarea
        id="prompt"
        ref={input}
        rows={1}
        value={value}
        placeholder="Message the assistant"
        title="Enter sends; Shift+Enter starts a new line"
        aria-describedby="prompt-hint"
        onChange={event => onChange(event.target.value)}
        onKeyDown={onKeyDown}
        autoFocus
      />
      {busy ? (
        <button type="button" id="stop" className="stop" onClick={onStop} aria-label="Stop the reply">
          <StopSquare /> Stop
        </button>
      ) : (
        <button type="submit" id="send" className="primary" disabled={!value.trim()}>
          Send
        </button>
      )}
    </form>
  );
}
