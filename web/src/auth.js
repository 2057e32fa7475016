// One sign-in code path for both modes: supabase-js talks to the Supabase project, or in development
// to the small Supabase-compatible Auth API the assistant itself serves on this machine.
import { createClient } from '@supabase/supabase-js';

export const STORAGE_KEY = 'bastion.auth';
export const DEVELOPMENT_DOMAIN = '@localhost';

export function authClient(info) {
  const development = info.auth.mode === 'development';
  const url = development ? window.location.origin : info.auth.url;
  // supabase-js needs a key; the development Auth API takes none, so any word will do there.
  const key = development ? 'development' : info.auth.publishable_key;
  if (!url || !key) return null;
  return createClient(url, key, {
    auth: {
      storageKey: STORAGE_KEY,
      persistSession: true,
      autoRefreshToken: true,
      detectSessionInUrl: true,
      flowType: 'implicit',
    },
  });
}

// Which extra ways in the project allows (anonymous sign-in); a failure just hides them.
export async function authSettings(info) {
  if (info.auth.mode === 'development') return { anonymous: false, magicLink: false };
  try {
    const response = await fetch(`${info.auth.url}/auth/v1/settings`, {
      headers: { apikey: info.auth.publishable_key },
    });
    const settings = await response.json();
    return {
      anonymous: Boolean(settings?.external?.anonymous_users),
      magicLink: settings?.external?.email !== false,
    };
  } catch {
    return { anonymous: false, magicLink: true };
  }
}

// Removes every trace of a signed-in user this page keeps: the stored session and the open
// conversation in the address bar (React state goes with the unmounted workspace).
export function forgetUser() {
  for (const key of Object.keys(localStorage)) {
    if (key.startsWith(STORAGE_KEY) || key.startsWith('bastion.')) localStorage.removeItem(key);
  }
  sessionStorage.clear();
  history.replaceState(null, '', window.location.pathname);
}
