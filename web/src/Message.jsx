import { isToolUIPart } from 'ai';
import Feedback from './Feedback.jsx';
import { Refresh } from './icons.jsx';
import Markdown from './Markdown.jsx';
import ToolCard from './ToolCard.jsx';

export default function Message({
  message,
  conversationId,
  api,
  streaming,
  stopped,
  canRegenerate,
  onRegenerate,
  onAnswer,
  busy,
}) {
  if (message.role === 'user') {
    const text = message.parts.filter(part => part.type === 'text').map(part => part.text).join('\n');
    return (
      <article className="message user" data-id={message.id} aria-label="You">
        <div className="bubble text">{text}</div>
      </article>
    );
  }
  const hasText = message.parts.some(part => part.type === 'text' && part.text);
  return (
    <article className="message assistant" data-id={message.id} aria-label="Assistant" aria-busy={streaming}>
      {message.parts.map((part, index) => {
        if (part.type === 'text') return <div className="text" key={index}><Markdown text={part.text} /></div>;
        if (part.type === 'reasoning' && part.text) {
          return (
            <details className="reasoning" key={index}>
              <summary>Reasoning</summary>
              <p>{part.text}</p>
            </details>
          );
        }
        if (isToolUIPart(part)) return (
            <ToolCard key={part.toolCallId} part={part} onAnswer={onAnswer} busy={busy} api={api} conversationId={conversationId} />
          );
        return null;
      })}
      {stopped && (
        <p className="stopped-note" role="note">
          Stopped: the reply ends here.
        </p>
      )}
      {!streaming && hasText && (
        <div className="message-actions">
          <Feedback conversationId={conversationId} messageId={message.id} api={api} />
          {canRegenerate && (
            <button type="button" className="small regenerate" onClick={onRegenerate}>
              <Refresh /> Regenerate
            </button>
          )}
        </div>
      )}
    </article>
  );
}
