// Drives the AI SDK's own chat client (AbstractChat + DefaultChatTransport, what useChat runs) against
// a bastion stream, and prints the messages it assembled as JSON.
//
// Input on stdin: {"sdk": "7" | "6", "url": ..., "chatId": ..., "messages": [...], "actions": [action, ...],
//                  "headers"?: {...}}
//   action: {"type": "send", "text": ...}
//         | {"type": "approve", "approvalId"?: ..., "approved": bool, "reason"?: ...}
//           (without approvalId, the approval the latest message waits for)
// The actions run one after another on the same chat, as a user would in a browser. Output on stdout,
// one entry per action: [{"status": ..., "error": string | null, "finishReason": ..., "messages": [...]}]

const packages = { 7: 'ai7', 6: 'ai6' };

async function readStdin() {
  const parts = [];
  for await (const part of process.stdin) parts.push(part);
  return JSON.parse(Buffer.concat(parts).toString('utf8'));
}

function createState(initialMessages) {
  return {
    status: 'ready',
    error: undefined,
    messages: initialMessages,
    pushMessage(message) {
      this.messages = this.messages.concat(message);
    },
    popMessage() {
      this.messages = this.messages.slice(0, -1);
    },
    replaceMessage(index, message) {
      this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
    },
    snapshot: value => structuredClone(value),
  };
}

const request = await readStdin();
const sdk = await import(packages[request.sdk]);

class HarnessChat extends sdk.AbstractChat {}

let finishReason = null;
const chat = new HarnessChat({
  id: request.chatId,
  transport: new sdk.DefaultChatTransport({ api: request.url, headers: request.headers ?? {} }),
  state: createState(request.messages),
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

async function perform(action) {
  finishReason = null;
  if (action.type === 'send') {
    await chat.sendMessage({ text: action.text });
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
  };
}

const results = [];
for (const action of request.actions) {
  results.push(await perform(action));
}
process.stdout.write(JSON.stringify(results));
