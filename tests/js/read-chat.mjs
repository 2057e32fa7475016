// Drives the AI SDK's own chat client (AbstractChat + DefaultChatTransport, what useChat runs) against
// a bastion stream, and prints the messages it assembled as JSON.
//
// Input on stdin: {"sdk": "7" | "6", "url": ..., "chatId": ..., "messages": [...], "actions": [action, ...],
//                  "headers"?: {...}, "resetStep"?: bool}
//   action: {"type": "send", "text": ..., "interrupt"?: {"when": text, "by": "disconnect" | "stop"}}
//           (with interrupt, once the reply's text contains `when`: "disconnect" calls the client's own
//            stop(), which only closes the connection; "stop" asks the server's stop route, as the page
//            does, and lets the stream end by itself)
//         | {"type": "approve", "approvalId"?: ..., "approved": bool, "reason"?: ...}
//           (without approvalId, the approval the latest message waits for)
//         | {"type": "resume"} (resumeStream(), what useChat({ resume: true }) calls on mount)
// With resetStep, the client reconnects with `?resetStep=1` through prepareReconnectToStreamRequest.
// The actions run one after another on the same chat, as a user would in a browser. Output on stdout,
// one entry per action: [{"status": ..., "error": string | null, "finishReason": ..., "messages": [...],
//                         "requests": [{"method", "path", "status"}, ...] (the HTTP requests it made)}]

const packages = { 7: 'ai7', 6: 'ai6' };

async function readStdin() {
  const parts = [];
  for await (const part of process.stdin) parts.push(part);
  return JSON.parse(Buffer.concat(parts).toString('utf8'));
}

function createState(initialMessages, onChange) {
  return {
    status: 'ready',
    error: undefined,
    messages: initialMessages,
    pushMessage(message) {
      this.messages = this.messages.concat(message);
      onChange(this.messages);
    },
    popMessage() {
      this.messages = this.messages.slice(0, -1);
    },
    replaceMessage(index, message) {
      this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
      onChange(this.messages);
    },
    snapshot: value => structuredClone(value),
  };
}

const request = await readStdin();
const sdk = await import(packages[request.sdk]);

class HarnessChat extends sdk.AbstractChat {}

let finishReason = null;
let requests = [];
// Called with the messages after each update; an action may watch them (to interrupt a reply).
let watcher = () => {};

async function recordingFetch(input, init) {
  const response = await fetch(input, init);
  const url = new URL(String(input));
  requests.push({ method: init?.method ?? 'GET', path: url.pathname + url.search, status: response.status });
  return response;
}

const transport = new sdk.DefaultChatTransport({
  api: request.url,
  headers: request.headers ?? {},
  fetch: recordingFetch,
  ...(request.resetStep
    ? {
        prepareReconnectToStreamRequest: ({ api, id, headers }) => ({
          api: `${api}/${encodeURIComponent(id)}/stream?resetStep=1`,
          headers,
        }),
      }
    : {}),
});

const chat = new HarnessChat({
  id: request.chatId,
  transport,
  state: createState(request.messages, messages => watcher(messages)),
  onFinish: options => {
    finishReason = options.finishReason ?? null;
  },
});

// The approval the latest assistant message waits for, for actions that do not name one.
function pendingApprovalId() {
  const last = chat.messages[chat.messages.length - 1];
  const part = last?.parts.find(p => p.state === 'approval-requested');
  if (!part) throw new Error('no approval is pending');
  return part.approval.id;
}

// What the page's Stop button does first: ask the server to stop the turn, wherever it runs.
async function askToStop() {
  const response = await recordingFetch(`${request.url}/${encodeURIComponent(request.chatId)}/stop`, {
    method: 'POST',
    headers: request.headers ?? {},
  });
  await response.body?.cancel();
}

const replyText = message =>
  message?.role === 'assistant'
    ? message.parts.filter(part => part.type === 'text').map(part => part.text).join('')
    : '';

async function perform(action) {
  finishReason = null;
  requests = [];
  if (action.type === 'send') {
    let interrupted = null;
    const interrupt = action.interrupt;
    if (interrupt !== undefined) {
      watcher = messages => {
        if (interrupted === null && replyText(messages.at(-1)).includes(interrupt.when)) {
          interrupted = new Promise(done => setTimeout(done, 0)).then(() =>
            interrupt.by === 'disconnect' ? chat.stop() : askToStop(),
          );
        }
      };
    }
    await chat.sendMessage({ text: action.text });
    await interrupted;
    watcher = () => {};
  } else if (action.type === 'resume') {
    await chat.resumeStream();
  } else if (action.type === 'approve') {
    await chat.addToolApprovalResponse({
      id: action.approvalId ?? pendingApprovalId(),
      approved: action.approved,
      ...(action.reason !== undefined ? { reason: action.reason } : {}),
    });
    await chat.sendMessage();
  } else {
    throw new Error(`unknown action ${action.type}`);
  }
  return {
    status: chat.status,
    error: chat.error ? String(chat.error.message ?? chat.error) : null,
    finishReason,
    messages: chat.messages,
    requests,
  };
}

const results = [];
for (const action of request.actions) {
  results.push(await perform(action));
}
process.stdout.write(JSON.stringify(results));
