import { useState } from 'react';
import { describeError } from './api.js';
import { ThumbDown, ThumbUp } from './icons.jsx';

export default function Feedback({ conversationId, messageId, api }) {
  const [rating, setRating] = useState(null);
  const [comment, setComment] = useState('');
  const [state, setState] = useState('idle'); // idle | open | sending | sent
  const [problem, setProblem] = useState('');

  function choose(value) {
    setRating(value);
    setState('open');
    setProblem('');
  }

  async function submit(event) {
    event.preventDefault();
    setState('sending');
    try {
      await api(`/api/conversations/${conversationId}/feedback`, {
        method: 'POST',
        body: { message_id: messageId, rating, ...(comment.trim() ? { comment: comment.trim() } : {}) },
      });
      setState('sent');
    } catch (error) {
      setProblem(describeError(error));
      setState('open');
    }
  }

  if (state === 'sent') {
    return (
      <span className="feedback-sent" role="status">
        Thanks for the feedback.
      </span>
    );
  }
  return (
    <div className="feedback">
      <button
        type="button"
        className={`icon thumb up${rating === 'up' ? ' chosen' : ''}`}
        aria-label="Good reply"
        aria-pressed={rating === 'up'}
        onClick={() => choose('up')}
      >
        <ThumbUp />
      </button>
      <button
        type="button"
        className={`icon thumb down${rating === 'down' ? ' chosen' : ''}`}
        aria-label="Bad reply"
        aria-pressed={rating === 'down'}
        onClick={() => choose('down')}
      >
        <ThumbDown />
      </button>
      {state !== 'idle' && (
        <form className="feedback-form" onSubmit={submit}>
          <label className="visually-hidden" htmlFor={`comment-${messageId}`}>
            Comment (optional)
          </label>
          <input
            id={`comment-${messageId}`}
            className="feedback-comment"
            placeholder={rating === 'up' ? 'What was good? (optional)' : 'What went wrong? (optional)'}
            maxLength={2000}
            value={comment}
            onChange={event => setComment(event.target.value)}
            autoFocus
          />
          <button type="submit" className="small primary" disabled={state === 'sending'}>
            Send feedback
          </button>
          <button type="button" className="small" onClick={() => setState('idle')}>
            Cancel
          </button>
        </form>
      )}
      {problem && (
        <span role="alert" className="inline-error">
          {problem}
        </span>
      )}
    </div>
  );
}
