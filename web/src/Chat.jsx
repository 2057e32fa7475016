import { useChat } from '@ai-sdk/react';
import { DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } from 'ai';
import { useEffect, useLayoutEffect, useMemo, useRef, useState } from 'react';
import { describeError } from './api.js';
import Composer from './Composer.jsx';
import { ArrowDown } from './icons.jsx';
import Message from './Message.jsx';

// How near the bottom (in pixels) still counts as following the reply.
const FOLLOW_MARGIN = 48;

function streamError(error) {
  if (error && typeof error.statusCode === 'number') return describeError(error);
  if (error instanceof TypeError) return describeError(error);
  // An error chunk from the stream: the server's words for a failed model or tool run.
  const words = error?.message && !error.message.startsWith('{') ? `: ${error.message}` : '. Try again.';
  return `The assistant could not finish this reply${words}`;
}

function makeTransport(getToken) {
  return new DefaultChatTransport({
    api: '/api/chat',
    headers: async () => {
      const token = await getToken();
      return token ? { authorization: `Bearer ${token}` } : {};
    },
    // A server without the resume route answers 404: that is "nothing to resume", like 204.
    fetch: async (input, init) => {
      const response = await fetch(input, init);
      const method = (init?.method ?? 'GET').toUpperCase();
      if (method === 'GET' && response.status === 404 && String(input).endsWith('/stream')) {
        return new Response(null, { status: 204 });
      }
      return response;
    },
  });
}

const CHANGED =
  'This conversation changed elsewhere; it now shows the latest. Your message is still in the box: send it again.';

export default function Chat({ conversation, api, getToken, onTurnFinished, onSessionEnded }) {
  const transport = useMemo(() => makeTransport(getToken), [getToken]);
  const [draft, setDraft] = useState('');
  const [problem, setProblem] = useState('');
  const lastSent = useRef('');

  async function reloadFromServer() {
    try {
      const body = await api(`/api/conversations/${conversation.id}/messages`);
      chat.setMessages(body.messages);
      return true;
    } catch {
      return false;
    }
  }

  const chat = useChat({
    id: conversation.id,
    messages: conversation.messages,
    transport,
    resume: conversation.stored,
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    onFinish: ({ message }) => onTurnFinished(conversation.id, message),
    onError: error => {
      if (error?.statusCode === 401) {
        onSessionEnded();
        return;
      }
      setProblem(streamError(error));
      if (typeof error?.statusCode !== 'number') return;
      // A refused send is no lost message: it goes back into the input, as typed.
      // (The SDK applies this update at once, to its own current messages.)
      chat.setMessages(messages => {
        const last = messages[messages.length - 1];
        if (last?.role !== 'user') return messages;
        const text = last.parts.filter(part => part.type === 'text').map(part => part.text).join('');
        setDraft(current => current || text || lastSent.current);
        return messages.slice(0, -1);
      });
      // The server's copy moved on (another tab, or a reply it finished after this page stopped
      // reading): show it, so the next send continues from there.
      if (error.statusCode === 409) {
        reloadFromServer().then(reloaded => {
          if (reloaded) setProblem(CHANGED);
        });
      }
    },
  });
  const { messages, status, sendMessage, regenerate, stop, addToolApprovalResponse } = chat;
  const busy = status === 'submitted' || status === 'streaming';

  // Follow the reply while the reader is at the bottom; leave them where they are once they scroll up.
  const scroller = useRef(null);
  const following = useRef(true);
  const [atBottom, setAtBottom] = useState(true);
  function onScroll() {
    const node = scroller.current;
    const near = node.scrollHeight - node.scrollTop - node.clientHeight <= FOLLOW_MARGIN;
    following.current = near;
    setAtBottom(near);
  }
  function toBottom() {
    const node = scroller.current;
    if (node) node.scrollTop = node.scrollHeight;
    following.current = true;
    setAtBottom(true);
  }
  useLayoutEffect(() => {
    if (following.current && scroller.current) scroller.current.scrollTop = scroller.current.scrollHeight;
  }, [messages, status]);
  useEffect(() => {
    toBottom();
  }, []);

  function send(text) {
    setProblem('');
    lastSent.current = text;
    toBottom();
    sendMessage({ text });
  }

  async function stopReply() {
    // Ask the server to stop the run (a server without durable turns has no such route), then stop reading.
    const token = await getToken();
    const stopped = await fetch(`/api/chat/${conversation.id}/stop`, {
      method: 'POST',
      headers: token ? { authorization: `Bearer ${token}` } : {},
    }).catch(() => null);
    await stop();
    // The server kept what was said before the stop: continue from its copy.
    if (stopped?.ok) await reloadFromServer();
  }

  function answer(approvalId, approved, reason) {
    setProblem('');
    addToolApprovalResponse({ id: approvalId, approved, reason: reason || undefined });
  }

  const lastAssistant = [...messages].reverse().find(message => message.role === 'assistant');
  return (
    <section className="chat" aria-label="Conversation">
      <div className="messages" ref={scroller} onScroll={onScroll} id="messages" aria-live="polite">
        {messages.length === 0 && (
          <div className="welcome">
            <h2>How can I help?</h2>
            <p>Try “who am I?”, “remember that the launch is on Friday” or “show my notes”.</p>
          </div>
        )}
        {messages.map(message => (
          <Message
            key={message.id}
            message={message}
            conversationId={conversation.id}
            api={api}
            streaming={busy && message === messages[messages.length - 1] && message.role === 'assistant'}
            canRegenerate={!busy && message === lastAssistant && message === messages[messages.length - 1]}
            onRegenerate={() => {
              setProblem('');
              regenerate();
            }}
            onAnswer={answer}
            busy={busy}
          />
        ))}
        {status === 'submitted' && (
          <div className="thinking" id="status">
            <span className="dot" />
            <span className="dot" />
            <span className="dot" />
            <span className="visually-hidden">The assistant is thinking</span>
          </div>
        )}
      </div>
      {!atBottom && (
        <button type="button" className="jump" id="jump-to-latest" onClick={toBottom}>
          <ArrowDown /> Latest
        </button>
      )}
      {problem && (
        <div role="alert" className="error-banner chat-error" id="chat-error">
          {problem}
          {!busy && lastAssistant && messages[messages.length - 1] === lastAssistant && (
            <button
              type="button"
              className="link"
              onClick={() => {
                setProblem('');
                regenerate();
              }}
            >
              Retry
            </button>
          )}
        </div>
      )}
      <Composer value={draft} onChange={setDraft} onSend={send} onStop={stopReply} busy={busy} />
    </section>
  );
}
