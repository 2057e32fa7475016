// Small inline icons: an emoji needs a font the reader may not have.
function Icon({ children }) {
  return (
    <svg viewBox="0 0 24 24" width="16" height="16" aria-hidden="true" focusable="false" className="svg-icon">
      {children}
    </svg>
  );
}

const stroke = { fill: 'none', stroke: 'currentColor', strokeWidth: 2, strokeLinecap: 'round', strokeLinejoin: 'round' };

export const ThumbUp = () => (
  <Icon>
    <path {...stroke} d="M7 11v9H4v-9zM7 11l4-8a2 2 0 0 1 2 2v4h5.5a2 2 0 0 1 2 2.3l-1.2 7A2 2 0 0 1 17.3 20H7" />
  </Icon>
);
export const ThumbDown = () => (
  <Icon>
    <path {...stroke} d="M17 13V4h3v9zM17 13l-4 8a2 2 0 0 1-2-2v-4H5.5a2 2 0 0 1-2-2.3l1.2-7A2 2 0 0 1 6.7 4H17" />
  </Icon>
);
export const Pencil = () => (
  <Icon>
    <path {...stroke} d="M4 20h4L19 9l-4-4L4 16zM13.5 6.5l4 4" />
  </Icon>
);
export const Trash = () => (
  <Icon>
    <path {...stroke} d="M4 7h16M10 11v6M14 11v6M6 7l1 13h10l1-13M9 7V4h6v3" />
  </Icon>
);
export const Menu = () => (
  <Icon>
    <path {...stroke} d="M4 6h16M4 12h16M4 18h16" />
  </Icon>
);
export const Refresh = () => (
  <Icon>
    <path {...stroke} d="M20 11a8 8 0 1 0-2.3 5.7M20 4v7h-7" />
  </Icon>
);
export const StopSquare = () => (
  <Icon>
    <rect x="6" y="6" width="12" height="12" rx="2" fill="currentColor" />
  </Icon>
);
export const ArrowDown = () => (
  <Icon>
    <path {...stroke} d="M12 5v14M6 13l6 6 6-6" />
  </Icon>
);
