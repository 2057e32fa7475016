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
      output: {
        entryFileNames: 'app.js',
        chunkFileNames: '[name].js',
        assetFileNames: '[name][extname]',
      },
    },
  },
});
