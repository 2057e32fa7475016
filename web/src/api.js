// Calls to the assistant's API with the signed-in user's token, and errors a person can read.

export class ApiError extends Error {
  constructor(message, { status = 0, code = 'unknown' } = {}) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const SESSION_ENDED = 'Your session has ended. Sign in again.';
const UNAVAILABLE = 'The server could not complete this. Try again in a moment.';
const UNREACHABLE = 'Cannot reach the server. Check your connection and try again.';

// The server's own error messages are written for people and carry no internals; anything else
// (a proxy's page, a crash) is replaced by a plain sentence.
export function messageFor(status, body) {
  if (status === 401) return SESSION_ENDED;
  if (status >= 500 || status === 0) return UNAVAILABLE;
  try {
    const parsed = typeof body === 'string' ? JSON.parse(body) : body;
    // Too large: the server names its limit; sending the same again cannot help.
    const limit = status === 413 && /at most ([^.]+)/.exec(parsed?.message ?? '')?.[1];
    if (limit) return `Your message is too large to send: this server takes at most ${limit}. Shorten it, then send it again.`;
    if (parsed && typeof parsed.message === 'string' && parsed.message) return parsed.message;
  } catch {
    // not JSON: fall through
  }
  if (status === 413) return 'Your message is too large to send. Shorten it, then send it again.';
  if (status === 404) return 'Not found: it may have been deleted, or it belongs to another account.';
  return 'The request was refused. Try again.';
}

export function describeError(error) {
  if (error instanceof ApiError) return error.message;
  if (error && typeof error.statusCode === 'number') return messageFor(error.statusCode, error.responseBody);
  if (error instanceof TypeError) return UNREACHABLE;
  return UNAVAILABLE;
}

export function makeApi(getToken) {
  return async function api(path, { method = 'GET', body } = {}) {
    const token = await getToken();
    let response;
    try {
      response = await fetch(path, {
        method,
        headers: {
          ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
          ...(token ? { authorization: `Bearer ${token}` } : {}),
        },
        body: body !== undefined ? JSON.stringify(body) : undefined,
      });
    } catch {
      throw new ApiError(UNREACHABLE);
    }
    if (!response.ok) {
      const text = await response.text().catch(() => '');
      let code = 'unknown';
      try {
        code = JSON.parse(text).code || code;
      } catch {
        // keep unknown
      }
      throw new ApiError(messageFor(response.status, text), { status: response.status, code });
    }
    if (response.status === 204) return null;
    return response.json();
  };
}
