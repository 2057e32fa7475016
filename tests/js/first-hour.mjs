// A new user's first hour on the assistant's page, in headless Chromium at desktop (1280×800) and phone
// (390×844) sizes, with the offline demo model: long titles, code blocks, Stop and resume, every error
// state the page can meet, the phone's top bar and inbox, and the API reference at /docs.
//
// Input on stdin: {"url", "chromium", "shots" (a folder for screenshots)}
// Output: {"steps": {...}, "pageErrors": [...], "consoleErrors": [...]} for the Python test to assert on.

import { chromium } from 'playwright-core';

const parts = [];
for await (const part of process.stdin) parts.push(part);
const request = JSON.parse(Buffer.concat(parts).toString('utf8'));

const browser = await chromium.launch({
  executablePath: request.chromium,
  args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-sync'],
});
const steps = {};
const pageErrors = [];
const consoleErrors = [];
let shot = 0;

function watch(page) {
  page.setDefaultTimeout(15000);
  page.on('pageerror', error => pageErrors.push(String(error)));
  page.on('console', message => {
    // A refused request is logged by the browser itself; the page shows those in words. A policy
    // violation is an error like any other, and fails the test.
    if (message.type() === 'error' && !/Failed to load resource|net::ERR_FAILED/.test(message.text())) {
      consoleErrors.push(message.text());
    }
  });
}

async function screenshot(page, name) {
  shot += 1;
  await page.screenshot({ path: `${request.shots}/${String(shot).padStart(2, '0')}-${name}.png` });
}

const idle = page => page.waitForSelector('#send');
const lastAssistantText = page =>
  page.$$eval('.message.assistant .text', nodes => nodes.at(-1)?.innerText ?? '');
const lastReply = '#messages > article:last-of-type.assistant';

async function send(page, text) {
  await page.fill('#prompt', text);
  await page.press('#prompt', 'Enter');
}

async function sendAndWait(page, text) {
  const users = await page.$$eval('.message.user', nodes => nodes.length);
  await send(page, text);
  await page.waitForFunction(
    count =>
      document.querySelectorAll('.message.user').length > count &&
      document.querySelector('#messages > article:last-of-type.assistant') &&
      document.querySelector('#send'),
    users,
  );
}

async function signIn(page, name) {
  await page.goto(request.url);
  await page.fill('#user-name', name);
  await page.click('#sign-in-form button[type=submit]');
  await page.waitForSelector('#sign-out');
  await page.waitForSelector('#prompt');
}

const bearer = page =>
  page.evaluate(() => JSON.parse(localStorage.getItem('bastion.auth') || 'null')?.access_token ?? null);

// Two rectangles share some area.
const overlap = (a, b) => a.x < b.x + b.width && b.x < a.x + a.width && a.y < b.y + b.height && b.y < a.y + a.height;
const inside = (inner, outer) =>
  inner.x >= outer.x - 0.5 &&
  inner.y >= outer.y - 0.5 &&
  inner.x + inner.width <= outer.x + outer.width + 0.5 &&
  inner.y + inner.height <= outer.y + outer.height + 0.5;
const box = (page, selector) => page.locator(selector).first().boundingBox();

async function desktop() {
  const context = await browser.newContext({
    viewport: { width: 1280, height: 800 },
    permissions: ['clipboard-read', 'clipboard-write'],
  });
  const page = await context.newPage();
  watch(page);
  await page.goto(request.url);
  await page.waitForSelector('#sign-in-form');
  steps.signInNote = await page.textContent('#dev-sign-in-note');
  await signIn(page, 'ada');

  // (1) Long titles: one line, ellipsized, the row's actions reachable, the list never wider.
  await sendAndWait(
    page,
    'Please plan the launch of the new pricing page with the marketing team before Friday afternoon, and more',
  );
  await page.click('#new');
  await sendAndWait(page, 'Supercalifragilisticexpialidocious-and-then-some-more-words-without-spaces-at-all-here');
  await page.waitForFunction(() => document.querySelectorAll('#conversations .conversation').length === 2);
  const sidebar = await box(page, '#sidebar');
  steps.longTitles = await page.evaluate(() => {
    const list = document.querySelector('#sidebar');
    return {
      titles: [...document.querySelectorAll('#conversations .conversation-title')].map(node => node.textContent),
      clipped: [...document.querySelectorAll('#conversations .conversation-title')].map(node => ({
        oneLine: getComputedStyle(node).whiteSpace === 'nowrap',
        ellipsis: getComputedStyle(node).textOverflow === 'ellipsis',
        cut: node.scrollWidth > node.clientWidth,
      })),
      sidewaysScroll: list.scrollWidth > list.clientWidth,
    };
  });
  const rows = await page.$$('#conversations .conversation');
  steps.longTitles.actionsInside = [];
  for (const row of rows) {
    for (const action of ['.rename', '.delete']) {
      const actionBox = await (await row.$(action)).boundingBox();
      steps.longTitles.actionsInside.push(Boolean(actionBox) && inside(actionBox, sidebar));
    }
  }
  steps.longTitles.newInside = inside(await box(page, '#new'), sidebar);
  await screenshot(page, 'desktop-long-titles');
  // The rename form: Save and Cancel on one line.
  await page.click('#conversations .conversation:first-child .rename');
  const save = await box(page, '.rename-form button[type=submit]');
  const cancel = await box(page, '.rename-form button[type=button]');
  steps.renameForm = { sameLine: Math.abs(save.y - cancel.y) < 2, cancelInside: inside(cancel, sidebar) };
  await screenshot(page, 'desktop-rename-form');
  await page.click('.rename-form button[type=button]');

  // (2) The demo model's markdown, with a highlighted code block whose Copy button covers nothing.
  await page.click('#new');
  await sendAndWait(page, 'show me markdown');
  const code = await box(page, `${lastReply} pre`);
  const copy = await box(page, `${lastReply} .copy-code`);
  steps.markdown = {
    heading: await page.textContent(`${lastReply} .markdown h2`),
    items: await page.$$eval(`${lastReply} .markdown li`, nodes => nodes.length),
    headers: await page.$$eval(`${lastReply} .markdown th`, nodes => nodes.map(node => node.textContent)),
    language: await page.textContent(`${lastReply} .code-language`),
    keywords: await page.$$eval(`${lastReply} pre .hljs-keyword`, nodes => nodes.map(node => node.textContent)),
    copyCoversCode: overlap(copy, code),
  };
  await page.click(`${lastReply} .copy-code`);
  await page.waitForSelector(`${lastReply} .copy-code:text("Copied")`);
  steps.markdown.copied = await page.evaluate(() => navigator.clipboard.readText());
  await page.locator(`${lastReply} .code-block`).scrollIntoViewIfNeeded();
  await screenshot(page, 'desktop-code-block');

  // Tool results in words; a guide's card names it once.
  await sendAndWait(page, 'who am I?');
  steps.identity = await lastAssistantText(page);
  await sendAndWait(page, 'how should I write notes?');
  steps.skillCard = await page.innerText(`${lastReply} .tool-card`);

  // The deny reason's form in full view above the message box.
  await send(page, 'remember that the code is 1234');
  await page.waitForSelector('.tool-card[data-state="approval-requested"] .deny');
  await page.click('.tool-card[data-state="approval-requested"] .deny');
  await page.waitForSelector('.tool-card .deny-confirm');
  await page.waitForTimeout(300);
  steps.denyForm = {
    buttonsInView: inside(await box(page, '.tool-card .deny-confirm'), await box(page, '#messages')),
  };
  await screenshot(page, 'desktop-deny-reason');
  await page.click('.tool-card .deny-confirm');
  await page.waitForSelector('.tool-card[data-state="output-denied"]');
  await idle(page);

  // Stop a long reply.
  await page.click('#new');
  await send(page, 'explain bastion in detail');
  await page.waitForFunction(
    selector => (document.querySelector(selector)?.innerText.split(/\s+/).length ?? 0) > 12,
    lastReply,
  );
  await page.click('#stop');
  await idle(page);
  await page.waitForSelector(`${lastReply} .stopped-note`);
  steps.stopped = { note: await page.textContent(`${lastReply} .stopped-note`), text: await lastAssistantText(page) };
  await screenshot(page, 'desktop-stopped');

  // Reload in the middle of a long reply: it carries on to its end.
  await send(page, 'write a long story');
  await page.waitForFunction(
    selector => (document.querySelector(selector)?.innerText.split(/\s+/).length ?? 0) > 12,
    lastReply,
  );
  await page.waitForFunction(() => window.location.hash.length > 1);
  const beforeReload = await lastAssistantText(page);
  await page.reload();
  await page.waitForSelector('#stop');
  await screenshot(page, 'desktop-resuming');
  await idle(page);
  steps.resumed = { before: beforeReload, after: await lastAssistantText(page), stopNotes: await page.$$eval(`${lastReply} .stopped-note`, n => n.length) };
  await screenshot(page, 'desktop-resumed');

  // (5) Errors. An empty message, asked of the API directly.
  const token = await bearer(page);
  steps.api = await page.evaluate(async authorization => {
    const headers = { authorization: `Bearer ${authorization}`, 'content-type': 'application/json' };
    const post = body => fetch('/api/chat', { method: 'POST', headers, body: JSON.stringify(body) });
    const empty = await post({
      id: crypto.randomUUID(),
      trigger: 'submit-message',
      messages: [{ id: 'm1', role: 'user', parts: [{ type: 'text', text: '   ' }] }],
    });
    const badId = await post({
      id: 'not-a-conversation',
      trigger: 'submit-message',
      messages: [{ id: 'm1', role: 'user', parts: [{ type: 'text', text: 'hello' }] }],
    });
    const missing = await fetch('/api/no-such-route', { headers: { accept: 'text/html' } });
    const wrong = await fetch('/no-such-page', { headers: { accept: 'application/json' } });
    return {
      empty: { status: empty.status, body: await empty.json() },
      badId: { status: badId.status, body: await badId.json() },
      apiNotFound: { status: missing.status, type: missing.headers.get('content-type') },
      jsonNotFound: { status: wrong.status, body: await wrong.json() },
    };
  }, token);

  // A message over the server's limit: refused at once, the limit said, no Retry; emptying the box
  // dismisses it.
  await page.click('#new');
  await page.fill('#prompt', 'x'.repeat(1_100_000));
  await page.press('#prompt', 'Enter');
  await page.waitForSelector('#chat-error');
  steps.tooLarge = {
    error: await page.textContent('#chat-error'),
    retry: await page.isVisible('#chat-error button'),
    kept: (await page.inputValue('#prompt')).length,
  };
  await screenshot(page, 'desktop-too-large');
  await page.fill('#prompt', '');
  await page.waitForSelector('#chat-error', { state: 'detached' });
  steps.tooLarge.dismissed = true;

  // The server out of reach while sending: said so, and Retry sends the message once it is back.
  await page.route('**/api/chat', route => route.abort('connectionrefused'));
  await send(page, 'hello again');
  await page.waitForSelector('#chat-error');
  steps.unreachable = { error: await page.innerText('#chat-error') };
  await screenshot(page, 'desktop-unreachable');
  await page.unroute('**/api/chat');
  await page.click('#chat-error button');
  await idle(page);
  await page.waitForFunction(
    selector => /hello again/.test(document.querySelector(selector)?.innerText ?? ''),
    lastReply,
  );
  steps.unreachable.after = {
    reply: await lastAssistantText(page),
    users: await page.$$eval('.message.user', nodes => nodes.map(node => node.innerText)),
    error: await page.isVisible('#chat-error'),
  };

  // A conversation link that names nothing of this user's: a "not found" page, not an empty chat.
  const ownConversation = new URL(page.url()).hash.slice(1);
  steps.ownConversation = ownConversation;
  await page.goto(`${request.url}#${crypto.randomUUID()}`);
  await page.reload(); // a link opened afresh, as from another tab or a message
  await page.waitForSelector('#not-found');
  steps.notFound = { text: await page.innerText('#not-found'), prompt: await page.isVisible('#prompt') };
  await screenshot(page, 'desktop-conversation-not-found');
  await page.click('#start-new');
  await page.waitForSelector('#prompt');

  // A wrong address in the browser: a page, with a way back.
  const wrong = await page.goto(`${request.url}no-such-page`);
  steps.wrongAddress = {
    status: wrong.status(),
    type: wrong.headers()['content-type'],
    text: await page.innerText('body'),
    links: await page.$$eval('a', nodes => nodes.map(node => node.getAttribute('href'))),
  };
  await screenshot(page, 'desktop-page-not-found');

  // The API reference, linked from the page's header, bundled and under the strict policy.
  await page.goto(request.url);
  await page.waitForSelector('#docs-link');
  steps.docsLink = await page.getAttribute('#docs-link', 'href');
  const docs = await page.goto(`${request.url}docs`);
  await page.waitForSelector('.swagger-ui .opblock-summary');
  steps.docs = {
    policy: docs.headers()['content-security-policy'],
    title: await page.innerText('.swagger-ui .info .title'),
    operations: await page.$$eval('.swagger-ui .opblock-summary-path', nodes => nodes.map(node => node.innerText)),
    scripts: await page.$$eval('script[src]', nodes => nodes.map(node => node.getAttribute('src'))),
  };
  await screenshot(page, 'desktop-docs');

  // A session the server no longer takes: back to sign-in, saying the session ended.
  await page.goto(request.url);
  await page.waitForSelector('#prompt');
  await page.evaluate(() => {
    const stored = JSON.parse(localStorage.getItem('bastion.auth'));
    stored.access_token = `${stored.access_token.split('.').slice(0, 2).join('.')}.bm90LXRoZS1zaWduYXR1cmU`;
    localStorage.setItem('bastion.auth', JSON.stringify(stored));
  });
  await page.reload();
  await page.waitForSelector('#session-ended');
  steps.sessionEnded = {
    notice: await page.textContent('#session-ended'),
    signInShown: await page.isVisible('#sign-in-form'),
  };
  await screenshot(page, 'desktop-session-ended');

  // Another user opening ada's conversation: not found.
  await signIn(page, 'bob');
  await page.goto(`${request.url}#${ownConversation}`);
  await page.reload();
  await page.waitForSelector('#not-found');
  steps.othersConversation = await page.innerText('#not-found');

  // The server unreachable when the page loads: said so, with Retry.
  await page.route('**/api/info', route => route.abort('connectionrefused'));
  await page.goto(request.url);
  await page.waitForSelector('#unreachable');
  steps.serverDown = { text: await page.innerText('#unreachable') };
  await screenshot(page, 'desktop-server-down');
  await page.unroute('**/api/info');
  await page.click('#retry-connect');
  await page.waitForSelector('#prompt');
  steps.serverDown.recovered = true;
  await context.close();
}

async function phone() {
  const context = await browser.newContext({
    viewport: { width: 390, height: 844 },
    isMobile: true,
    hasTouch: true,
    permissions: ['clipboard-read', 'clipboard-write'],
  });
  const page = await context.newPage();
  watch(page);
  await signIn(page, 'ada');
  const reachable = async selector => {
    const found = await box(page, selector);
    return Boolean(found) && (await page.isVisible(selector)) && found.x >= 0 && found.x + found.width <= 390;
  };
  steps.phone = {
    inbox: await reachable('#inbox-button'),
    name: await reachable('#user-name-shown'),
    nameText: await page.textContent('#user-name-shown'),
    memory: await reachable('#memory-button'),
    signOut: await reachable('#sign-out'),
    scrollWidth: await page.evaluate(() => document.documentElement.scrollWidth),
  };
  await screenshot(page, 'phone-top-bar');
  await sendAndWait(page, 'show me markdown');
  await page.locator(`${lastReply} .code-block`).scrollIntoViewIfNeeded();
  steps.phone.copyCoversCode = overlap(await box(page, `${lastReply} .copy-code`), await box(page, `${lastReply} pre`));
  steps.phone.codeInside = (await box(page, `${lastReply} .code-block`)).width <= 390;
  await screenshot(page, 'phone-code-block');
  await page.click('#inbox-button');
  await page.waitForSelector('.inbox');
  steps.phone.inboxOpened = await page.isVisible('.inbox');
  steps.phone.inboxScrollWidth = await page.evaluate(() => document.documentElement.scrollWidth);
  await screenshot(page, 'phone-inbox');
  await context.close();
}

try {
  await desktop();
  await phone();
} catch (error) {
  steps.failure = String(error?.stack ?? error);
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify({ steps, pageErrors, consoleErrors }));
