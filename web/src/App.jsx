import { useCallback, useEffect, useMemo, useRef, useState } from 'react';
import { authClient, forgetUser } from './auth.js';
import { ConnectionCallback } from './Connections.jsx';
import SignIn from './SignIn.jsx';
import Workspace from './Workspace.jsx';

export default function App({ callback = null }) {
  const [info, setInfo] = useState(null);
  const [failed, setFailed] = useState(false);
  const [tries, setTries] = useState(0);

  useEffect(() => {
    fetch('/api/info')
      .then(response => (response.ok ? response.json() : Promise.reject(new Error('info'))))
      .then(setInfo)
      .catch(() => setFailed(true));
  }, [tries]);

  if (failed) {
    return (
      <div className="center-page">
        <p role="alert" className="error-banner" id="unreachable">
          Cannot reach the assistant: the server may be stopped, or your connection is down.{' '}
          <button
            type="button"
            className="link"
            id="retry-connect"
            onClick={() => {
              setFailed(false);
              setTries(count => count + 1);
            }}
          >
            Retry
          </button>
        </p>
      </div>
    );
  }
  if (!info) return <div className="center-page" aria-busy="true" />;
  return <Session info={info} callback={callback} />;
}

function Session({ info, callback }) {
  const client = useMemo(() => authClient(info), [info]);
  const [session, setSession] = useState(undefined);
  const [ended, setEnded] = useState(false);
  const signingOut = useRef(false);

  useEffect(() => {
    if (!client) return undefined;
    let live = true;
    client.auth.getSession().then(({ data }) => live && setSession(data.session ?? null));
    const { data } = client.auth.onAuthStateChange((event, next) => {
      // A session that ends by itself (a refresh refused) leaves no more behind than Sign out does.
      if (event === 'SIGNED_OUT') {
        forgetUser();
        setEnded(!signingOut.current);
        signingOut.current = false;
      }
      if (event === 'SIGNED_IN') setEnded(false);
      setSession(next ?? null);
    });
    return () => {
      live = false;
      data.subscription.unsubscribe();
    };
  }, [client]);

  // Always a fresh token: supabase-js refreshes the session when it is close to expiring.
  const getToken = useCallback(async () => {
    const { data } = await client.auth.getSession();
    return data.session?.access_token ?? null;
  }, [client]);

  const signOut = useCallback(async () => {
    signingOut.current = true;
    const { error } = await client.auth.signOut();
    if (error) await client.auth.signOut({ scope: 'local' });
    forgetUser();
    setSession(null);
    setEnded(false);
  }, [client]);

  // The server refused the session (expired, or signed by a key it no longer has): sign out here too,
  // and say so on the sign-in page.
  const endSession = useCallback(async () => {
    await signOut();
    setEnded(true);
  }, [signOut]);

  if (!client) {
    return (
      <div className="center-page">
        <p role="alert" className="error-banner">
          Sign-in is not set up on this server: it needs SUPABASE_PUBLISHABLE_KEY beside SUPABASE_URL.
        </p>
      </div>
    );
  }
  if (session === undefined) return <div className="center-page" aria-busy="true" />;
  if (!session) return <SignIn client={client} info={info} ended={ended} />;
  if (callback) return <ConnectionCallback callback={callback} getToken={getToken} />;
  // Keyed by user: another user gets a new workspace, with nothing of the previous one in memory.
  return (
    <Workspace
      key={session.user.id}
      info={info}
      user={session.user}
      getToken={getToken}
      onSignOut={signOut}
      onSessionEnded={endSession}
    />
  );
}
