// How the page talks to the chat routes: the AI SDK's transport with the signed-in user's token, the
// resume request that asks for `reset-step` retractions, and a note of every reply the server stopped.
import { DefaultChatTransport } from 'ai';

function authorization(token) {
  return token ? { authorization: `Bearer ${token}` } : {};
}

// A server without the resume route answers 404: that is "nothing to resume", like 204. Any other
// refused resume is told to `onResumeRefused` before the AI SDK reports it as an error.
function resumeAwareFetch(onResumeRefused) {
  return async (input, init) => {
    const response = await fetch(input, init);
    const method = (init?.method ?? 'GET').toUpperCase();
    const path = new URL(String(input), window.location.href).pathname;
    if (method !== 'GET' || !path.endsWith('/stream')) return response;
    if (response.status === 404) return new Response(null, { status: 204 });
    if (!response.ok) onResumeRefused();
    return response;
  };
}

// The server ends a stopped turn's stream with an `abort` chunk (the AI SDK keeps no trace of it in the
// message): `onStopped(messageId)` is told, whichever tab or process asked for the stop.
class StopNoticingTransport extends DefaultChatTransport {
  constructor({ onStopped, ...options }) {
    super(options);
    this.onStopped = onStopped;
  }

  processResponseStream(stream) {
    let messageId = null;
    const onStopped = this.onStopped;
    return super.processResponseStream(stream).pipeThrough(
      new TransformStream({
        transform(chunk, controller) {
          if (chunk.type === 'start' && chunk.messageId) messageId = chunk.messageId;
          if (chunk.type === 'abort') onStopped(messageId);
          controller.enqueue(chunk);
        },
      }),
    );
  }
}

export function makeTransport(getToken, { onStopped, onResumeRefused }) {
  return new StopNoticingTransport({
    api: '/api/chat',
    headers: async () => authorization(await getToken()),
    fetch: resumeAwareFetch(onResumeRefused),
    // A reply resumed after its worker died may re-run a step: `reset-step` retracts what that step
    // had shown, where an AI SDK 6 client would be closed and replay instead.
    prepareReconnectToStreamRequest: ({ api, id, headers }) => ({
      api: `${api}/${encodeURIComponent(id)}/stream?resetStep=1`,
      headers,
    }),
    onStopped,
  });
}

// Ask the server to stop the conversation's running turn, in whichever process runs it. True once it
// stopped (or nothing ran); false when the server has no stop route or could not be reached.
export async function stopTurn(conversationId, getToken) {
  try {
    const response = await fetch(`/api/chat/${conversationId}/stop`, {
      method: 'POST',
      headers: authorization(await getToken()),
    });
    return response.ok;
  } catch {
    return false;
  }
}

// Whether a turn of the conversation is in flight right now (the resume route streams one).
export async function turnInFlight(conversationId, getToken) {
  try {
    const response = await fetch(`/api/chat/${conversationId}/stream`, { headers: authorization(await getToken()) });
    await response.body?.cancel();
    return response.status === 200;
  } catch {
    return false;
  }
}
