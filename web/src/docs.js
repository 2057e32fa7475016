// The API reference at /docs: Swagger UI, bundled into the package (no CDN), reading this server's
// OpenAPI document. It runs under the pages' strict policy: no inline script or style.
import SwaggerUIBundle from 'swagger-ui-dist/swagger-ui-bundle.js';
import 'swagger-ui-dist/swagger-ui.css';
import './docs.css';

SwaggerUIBundle({
  url: '/api/openapi.json',
  dom_id: '#docs',
  deepLinking: true,
  tryItOutEnabled: false,
  // No outside validator badge: the page talks only to this server.
  validatorUrl: null,
});
