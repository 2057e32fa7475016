import { StrictMode } from 'react';
import { createRoot } from 'react-dom/client';
import App from './App.jsx';
import { takeCallback } from './Connections.jsx';
import './styles.css';

// The page before this one kept its token here; nothing of it should outlive the upgrade.
localStorage.removeItem('bastion.token');

// A sign-in at an MCP server coming back: taken out of the address before supabase-js reads it.
const callback = takeCallback();

createRoot(document.getElementById('root')).render(
  <StrictMode>
    <App callback={callback} />
  </StrictMode>,
);
