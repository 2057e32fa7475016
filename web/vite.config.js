// Builds the page into the Python package's static folder with fixed file names and no source maps,
// so the same lock file always gives the same bytes and the committed build can be checked against it.
import { fileURLToPath } from 'node:url';
import react from '@vitejs/plugin-react';
import { defineConfig } from 'vite';

export default defineConfig({
  plugins: [react()],
  base: '/static/',
  build: {
    outDir: fileURLToPath(new URL('../src/bastion/assistant/static', import.meta.url)),
    emptyOutDir: true,
    assetsDir: '',
    sourcemap: false,
    chunkSizeWarningLimit: 2000,
    modulePreload: { polyfill: false },
    rollupOptions: {
      // The chat page, the support widget's demo page, and the API reference.
      input: {
        index: fileURLToPath(new URL('index.html', import.meta.url)),
        widget: fileURLToPath(new URL('widget.html', import.meta.url)),
        docs: fileURLToPath(new URL('docs.html', import.meta.url)),
      },
      output: {
        entryFileNames: chunk => (chunk.name === 'index' ? 'app.js' : '[name].js'),
        // What both pages use (React, the API helper, the styles) is one file with a fixed name.
        manualChunks: id =>
          /node_modules\/(react|react-dom|scheduler)\/|\/src\/(api\.js|styles\.css|inbox\.css)$/.test(id)
            ? 'shared'
            : undefined,
        chunkFileNames: '[name].js',
        assetFileNames: '[name][extname]',
      },
    },
  },
});
