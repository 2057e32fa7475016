import { useChat } from '@ai-sdk/react';
import { lastAssistantMessageIsCompleteWithApprovalResponses } from 'ai';
import { useEffect, useLayoutEffect, useMemo, useRef, useState } from 'react';
import { describeError } from './api.js';
import Composer from './Composer.jsx';
import { ArrowDown } from './icons.jsx';
import Message from './Message.jsx';
import { makeTransport, stopTurn, turnInFlight } from './transport.js';

// How near the bottom (in pixels) still counts as following the reply.
const FOLLOW_MARGIN = 48;

function streamError(error) {
  if (error && typeof error.statusCode === 'number') return describeError(error);
  if (error instanceof TypeError) return describeError(error);
  // An error chunk from the stream: the server's words for a failed model or tool run.
  const words = error?.message && !error.message.startsWith('{') ? `: ${error.message}` : '. Try again.';
  return `The assistant could not finish this reply${words}`;
}

const CHANGED =
  'This conversation changed elsewhere; it now shows the latest. Your message is still in the box: send it again.';
const BUSY =
  'The assistant is still answering in this conversation (perhaps in another tab), shown below. Your message is still in the box: send it once that reply has finished.';
// Notices about the conversation, not a failed reply: there is nothing to retry.
const NOT_A_FAILURE = new Set([CHANGED, BUSY]);

export default function Chat({ conversation, api, getToken, onTurnFinished, onSessionEnded }) {
  // The replies the server stopped, by message id, to show them as stopped.
  const [stopped, setStopped] = useState(() => new Set());
  // Set when the server refused to resume a reply: the error that follows is no refused send.
  const resumeRefused = useRef(false);
  const transport = useMemo(
    () =>
      makeTransport(getToken, {
        onStopped: id => id && setStopped(ids => new Set(ids).add(id)),
        onResumeRefused: () => {
          resumeRefused.current = true;
        },
      }),
    [getToken],
  );
  const [draft, setDraft] = useState('');
  const [problem, setProblem] = useState('');
  // What Retry does for the problem shown: regenerate a failed reply, follow again a reply the page
  // could not follow ('resume'), send again a message that never reached the server ('send'), or
  // nothing, for a message the server refused (too large, say): sending it again cannot help.
  const [retryKind, setRetryKind] = useState('regenerate');
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
      // The server refused a send, or the stream failed (a resume refused, a dropped connection).
      const wasResume = resumeRefused.current;
      resumeRefused.current = false;
      if (wasResume || typeof error?.statusCode !== 'number') {
        // Read at once from the SDK's current messages: is the last one the message that did not go?
        let unsent = false;
        chat.setMessages(list => {
          unsent = error instanceof TypeError && list[list.length - 1]?.role === 'user';
          return list;
        });
        setRetryKind(wasResume ? 'resume' : unsent ? 'send' : 'regenerate');
        setProblem(streamError(error));
        return;
      }
      // A refused send is no lost message: it goes back into the input, as typed.
      // (The SDK applies this update at once, to its own current messages.)
      chat.setMessages(messages => {
        const last = messages[messages.length - 1];
        if (last?.role !== 'user') return messages;
        const text = last.parts.filter(part => part.type === 'text').map(part => part.text).join('');
        setDraft(current => current || text || lastSent.current);
        return messages.slice(0, -1);
      });
      setRetryKind('none');
      if (error.statusCode === 409) refused(streamError(error));
      else setProblem(streamError(error));
    },
  });
  const { messages, status, sendMessage, regenerate, stop, addToolApprovalResponse, resumeStream } = chat;
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
    setRetryKind('regenerate');
    lastSent.current = text;
    toBottom();
    sendMessage({ text });
  }

  // A send the server refused as a conflict. Either a turn is running (another tab sent a message): the
  // page follows that reply; or the server's copy moved on (a reply it finished after this page stopped
  // reading): the page shows it. Either way the next send continues from the server's copy.
  async function refused(answer) {
    const busyElsewhere = await turnInFlight(conversation.id, getToken);
    const reloaded = await reloadFromServer();
    if (busyElsewhere) {
      setProblem(BUSY);
      await resumeStream();
      await reloadFromServer();
    } else {
      setProblem(reloaded ? CHANGED : answer);
    }
  }

  async function stopReply() {
    // Ask the server to stop the turn (the AI SDK's own stop() only disconnects), then stop reading.
    const stoppedThere = await stopTurn(conversation.id, getToken);
    await stop();
    // The server kept what was said before the stop: continue from its copy.
    if (stoppedThere) await reloadFromServer();
  }

  function answer(approvalId, approved, reason) {
    setProblem('');
    addToolApprovalResponse({ id: approvalId, approved, reason: reason || undefined });
  }

  const lastAssistant = [...messages].reverse().find(message => message.role === 'assistant');
  const canRetry =
    !busy &&
    !NOT_A_FAILURE.has(problem) &&
    (retryKind === 'resume' ||
      retryKind === 'send' ||
      (retryKind === 'regenerate' && lastAssistant && messages[messages.length - 1] === lastAssistant));

  // A refused message back in the box: emptying the box dismisses what was said about it.
  function edit(value) {
    setDraft(value);
    if (!value.trim() && retryKind === 'none') setProblem('');
  }

  async function retry() {
    setProblem('');
    if (retryKind === 'send') {
      setRetryKind('regenerate');
      chat.setMessages(list => (list[list.length - 1]?.role === 'user' ? list.slice(0, -1) : list));
      sendMessage({ text: lastSent.current });
      return;
    }
    if (retryKind !== 'resume') {
      regenerate();
      return;
    }
    setRetryKind('regenerate');
    await resumeStream();
    // The reply may have finished meanwhile (nothing left to resume): show the server's copy.
    await reloadFromServer();
  }
  return (
    <section className="chat" aria-label="Conversation">
      <div className="messages" ref={scroller} onScroll={onScroll} id="messages" aria-live="polite">
        {messages.length === 0 && (
          <div className="welcome">
            <h2>How can I help?</h2>
            <p>
              Try “who am I?”, “remember that the launch is on Friday”, “show my notes”, “show me markdown” or
              “explain bastion in detail”.
            </p>
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
            stopped={stopped.has(message.id)}
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
          {canRetry && (
            <button type="button" className="link" onClick={retry}>
              Retry
            </button>
          )}
        </div>
      )}
      <Composer value={draft} onChange={edit} onSend={send} onStop={stopReply} busy={busy} />
    </section>
  );
}
