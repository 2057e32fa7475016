import { useEffect, useState } from 'react';
import { DEVELOPMENT_DOMAIN, authSettings } from './auth.js';

function authMessage(error) {
  if (!error) return '';
  if (error.name === 'AuthRetryableFetchError' || error.status === 0) {
    return 'Cannot reach the sign-in service. Try again in a moment.';
  }
  if (error.code === 'invalid_credentials') return 'That email and password do not match.';
  if (error.code === 'email_not_confirmed') return 'Confirm your email first: open the link we sent you.';
  return error.message || 'Sign-in failed. Try again.';
}

export default function SignIn({ client, info, ended }) {
  const development = info.auth.mode === 'development';
  const [settings, setSettings] = useState({ anonymous: false, magicLink: !development });
  const [name, setName] = useState('');
  const [email, setEmail] = useState('');
  const [password, setPassword] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState('');
  const [notice, setNotice] = useState('');

  useEffect(() => {
    authSettings(info).then(setSettings);
  }, [info]);

  async function run(action) {
    setBusy(true);
    setError('');
    setNotice('');
    try {
      const { error: failure } = await action();
      if (failure) setError(authMessage(failure));
      return !failure;
    } catch (failure) {
      setError(authMessage(failure));
      return false;
    } finally {
      setBusy(false);
    }
  }

  function signInDevelopment(event) {
    event.preventDefault();
    const user = name.trim();
    run(() => client.auth.signInWithPassword({ email: `${user}${DEVELOPMENT_DOMAIN}`, password: 'development' }));
  }

  function signInWithPassword(event) {
    event.preventDefault();
    run(() => client.auth.signInWithPassword({ email: email.trim(), password }));
  }

  async function sendMagicLink() {
    if (!email.trim()) {
      setError('Enter your email first.');
      return;
    }
    const sent = await run(() =>
      client.auth.signInWithOtp({
        email: email.trim(),
        options: { emailRedirectTo: `${window.location.origin}/`, shouldCreateUser: true },
      }),
    );
    if (sent) setNotice(`Check ${email.trim()} for a sign-in link.`);
  }

  return (
    <main className="sign-in">
      <div className="sign-in-card">
        <h1>
          <img src="/static/favicon.svg" alt="" width="28" height="28" /> bastion assistant
        </h1>
        {ended && !error && (
          <p role="status" className="notice" id="session-ended">
            Your session has ended. Sign in again.
          </p>
        )}
        {info.demo_model && (
          <p className="badge demo-badge" id="demo">
            Demo model: offline and scripted. Set BASTION_MODEL for a real model.
          </p>
        )}
        {development ? (
          <form id="sign-in-form" onSubmit={signInDevelopment}>
            <p className="dev-note" id="dev-sign-in-note">
              <strong>Development sign-in.</strong> This server runs on this machine only and signs its own
              tokens. Pick any user name of letters, digits, dots, dashes or underscores (such as sam or
              jo.lee); no password is needed.
            </p>
            <label htmlFor="user-name">User name</label>
            <input
              id="user-name"
              autoComplete="username"
              required
              maxLength={63}
              pattern="[A-Za-z0-9][A-Za-z0-9._\-]*"
              title="Letters, digits, dots, dashes or underscores, such as sam or jo.lee"
              value={name}
              onChange={event => setName(event.target.value)}
              autoFocus
            />
            <button type="submit" className="primary" disabled={busy}>
              Sign in
            </button>
          </form>
        ) : (
          <form id="sign-in-form" onSubmit={signInWithPassword}>
            <label htmlFor="email">Email</label>
            <input
              id="email"
              type="email"
              autoComplete="email"
              required
              value={email}
              onChange={event => setEmail(event.target.value)}
              autoFocus
            />
            <label htmlFor="password">Password</label>
            <input
              id="password"
              type="password"
              autoComplete="current-password"
              value={password}
              onChange={event => setPassword(event.target.value)}
            />
            <button type="submit" className="primary" disabled={busy || !password}>
              Sign in
            </button>
            {settings.magicLink && (
              <button type="button" id="magic-link" disabled={busy} onClick={sendMagicLink}>
                Email me a sign-in link
              </button>
            )}
            {settings.anonymous && (
              <button
                type="button"
                id="guest"
                disabled={busy}
                onClick={() => run(() => client.auth.signInAnonymously())}
              >
                Continue as a guest
              </button>
            )}
          </form>
        )}
        {error && (
          <p role="alert" className="error-banner" id="sign-in-error">
            {error}
          </p>
        )}
        {notice && (
          <p role="status" className="notice" id="sign-in-notice">
            {notice}
          </p>
        )}
      </div>
    </main>
  );
}
