import { getToolName } from 'ai';
import { useEffect, useRef, useState } from 'react';
import { ConnectCard } from './Connections.jsx';

// What a person reads for a tool call: what it does, with what, what came of it. The raw JSON is
// one click away; the SDK's state names never reach the screen.
const TITLES = {
  get_identity: 'Check who you are',
  list_notes: 'Read your notes',
  save_note: 'Save a note',
  load_skill: 'Load a guide',
  remember: 'Remember about you',
  forget: 'Forget a memory',
};

export function toolTitle(name) {
  if (TITLES[name]) return TITLES[name];
  if (name.startsWith('connect_')) return `Connect ${name.slice('connect_'.length)}`;
  const [server, remote] = name.includes('__') ? name.split('__', 2) : [null, name];
  const words = remote.replace(/[_-]+/g, ' ').trim();
  const title = words.charAt(0).toUpperCase() + words.slice(1);
  return server ? `${title} (${server} server)` : title;
}

const STATUS = {
  'input-streaming': ['Preparing…', 'pending'],
  'input-available': ['Running…', 'pending'],
  'approval-requested': ['Needs your approval', 'ask'],
  'output-available': ['Done', 'done'],
  'output-error': ['Failed', 'failed'],
  'output-denied': ['Denied', 'denied'],
};

function statusOf(part) {
  if (part.toolMetadata?.authorization && ['approval-requested', 'approval-responded', 'output-denied'].includes(part.state)) {
    if (part.state === 'approval-requested') return ['Needs you to sign in', 'ask'];
    return part.approval?.approved ? ['Connected, going on…', 'pending'] : ['Not connected', 'denied'];
  }
  if (part.state === 'approval-responded') {
    return part.approval?.approved ? ['Approved, running…', 'pending'] : ['Denied', 'denied'];
  }
  return STATUS[part.state] ?? ['Working…', 'pending'];
}

function short(value, length = 120) {
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  if (text === undefined) return '';
  return text.length > length ? `${text.slice(0, length - 1)}…` : text;
}

function label(key) {
  const words = key.replace(/[_-]+/g, ' ');
  return words.charAt(0).toUpperCase() + words.slice(1);
}

function Fields({ value, className }) {
  const entries = Object.entries(value ?? {}).slice(0, 6);
  if (entries.length === 0) return null;
  return (
    <dl className={className}>
      {entries.map(([key, item]) => (
        <div key={key}>
          <dt>{label(key)}</dt>
          <dd>{short(item)}</dd>
        </div>
      ))}
    </dl>
  );
}

function Summary({ name, output }) {
  // A guide's name is on the card already (its input): say what came of it, not the name again.
  if (name === 'load_skill') return <p className="tool-output">Read the guide; the assistant follows it.</p>;
  if (name === 'save_note' && output && typeof output.text === 'string') {
    return <p className="tool-output">Saved “{short(output.text, 200)}”.</p>;
  }
  if (output && Array.isArray(output.notes)) {
    if (output.notes.length === 0) return <p className="tool-output">No notes yet.</p>;
    return (
      <div className="tool-output">
        <p>
          {output.notes.length} {output.notes.length === 1 ? 'note' : 'notes'}:
        </p>
        <ul>
          {output.notes.slice(0, 5).map((note, index) => (
            <li key={note.id ?? index}>{short(note.text ?? note, 160)}</li>
          ))}
        </ul>
      </div>
    );
  }
  if (Array.isArray(output)) {
    return <p className="tool-output">{output.length === 1 ? '1 result' : `${output.length} results`}.</p>;
  }
  if (output && typeof output === 'object') return <Fields value={output} className="tool-output fields" />;
  if (output === null || output === undefined || output === '') return <p className="tool-output">Finished.</p>;
  return <p className="tool-output">{short(output, 300)}</p>;
}

function Approval({ approvalId, onAnswer, busy }) {
  const [reason, setReason] = useState('');
  const [denying, setDenying] = useState(false);
  // The reason's form opens at the foot of the conversation: scrolled into view whole, buttons too.
  const form = useRef(null);
  useEffect(() => {
    if (denying) form.current?.scrollIntoView({ block: 'nearest' });
  }, [denying]);
  if (denying) {
    return (
      <form
        ref={form}
        className="approval"
        onSubmit={event => {
          event.preventDefault();
          onAnswer(approvalId, false, reason.trim());
        }}
      >
        <label htmlFor={`reason-${approvalId}`}>Why not? (optional)</label>
        <input
          id={`reason-${approvalId}`}
          className="deny-reason"
          value={reason}
          maxLength={500}
          autoFocus
          onChange={event => setReason(event.target.value)}
        />
        <div className="approval-buttons">
          <button type="submit" className="danger deny-confirm" disabled={busy}>
            Deny
          </button>
          <button type="button" onClick={() => setDenying(false)}>
            Back
          </button>
        </div>
      </form>
    );
  }
  return (
    <div className="approval approval-buttons">
      <button type="button" className="primary approve" disabled={busy} onClick={() => onAnswer(approvalId, true)}>
        Approve
      </button>
      <button type="button" className="deny" disabled={busy} onClick={() => setDenying(true)}>
        Deny…
      </button>
    </div>
  );
}

export default function ToolCard({ part, onAnswer, busy, api, conversationId }) {
  const name = getToolName(part);
  const authorization = part.toolMetadata?.authorization;
  const [words, kind] = statusOf(part);
  const raw = { input: part.input, ...(part.output !== undefined ? { output: part.output } : {}) };
  return (
    <section className={`tool-card kind-${kind}`} data-tool={name} data-state={part.state} aria-label={toolTitle(name)}>
      <header className="tool-header">
        <span className="tool-title">{toolTitle(name)}</span>
        <span className={`tool-status status-${kind}`}>{words}</span>
      </header>
      <Fields value={part.input} className="tool-args fields" />
      {part.state === 'approval-requested' && part.approval && authorization && (
        <ConnectCard
          authorization={authorization}
          approvalId={part.approval.id}
          toolCallId={part.toolCallId}
          conversationId={conversationId}
          api={api}
          onAnswer={onAnswer}
          busy={busy}
        />
      )}
      {part.state === 'approval-requested' && part.approval && !authorization && (
        <Approval approvalId={part.approval.id} onAnswer={onAnswer} busy={busy} />
      )}
      {part.state === 'output-available' && <Summary name={name} output={part.output} />}
      {part.state === 'output-error' && (
        <p className="tool-error">{part.errorText ? `It failed: ${part.errorText}` : 'It failed.'}</p>
      )}
      {authorization && (part.state === 'output-denied' || (part.state === 'approval-responded' && !part.approval?.approved)) && (
        <p className="tool-denied connect-refused">
          {authorization.connection} was not connected{part.approval?.reason ? `: ${part.approval.reason}` : '.'}
        </p>
      )}
      {!authorization && (part.state === 'output-denied' || (part.state === 'approval-responded' && !part.approval?.approved)) && (
        <p className="tool-denied">
          You denied this{part.approval?.reason ? `: “${part.approval.reason}”` : ''}. It did not run.
        </p>
      )}
      <details className="tool-raw">
        <summary>Details</summary>
        <pre>{JSON.stringify(raw, null, 2)}</pre>
      </details>
    </section>
  );
}
