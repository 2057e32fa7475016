import { StrictMode } from 'react';
import { createRoot } from 'react-dom/client';
import Widget from './Widget.jsx';
import './styles.css';

createRoot(document.getElementById('root')).render(
  <StrictMode>
    <Widget />
  </StrictMode>,
);
