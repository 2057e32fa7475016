// Drives the assistant's web page in headless Chromium as a person would, and prints what it saw as JSON.
//
// Input on stdin: {"url", "chromium", "shots" (a folder for screenshots), "mode": "development" | "supabase",
//                  "authUrl" (the Auth stand-in, supabase mode), "password" (supabase mode)}
// Output: {"steps": {...}, "pageErrors": [...], "consoleErrors": [...]} for the Python test to assert on.

import { writeFile } from 'node:fs/promises';
import { chromium } from 'playwright-core';

const parts = [];
for await (const part of process.stdin) parts.push(part);
const request = JSON.parse(Buffer.concat(parts).toString('utf8'));

const browser = await chromium.launch({
  executablePath: request.chromium,
  args: [
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
});
const steps = {};
const pageErrors = [];
const consoleErrors = [];
let shot = 0;

let lastPage = null;
let tabs = 0;
const chatResponses = [];

function watch(page) {
  lastPage = page;
  page.setDefaultTimeout(10000);
  const tab = (tabs += 1);
  // The chat routes' answers, newest last: a failure says which sends and resumes were refused.
  page.on('response', response => {
    const url = new URL(response.url());
    if (!url.pathname.startsWith('/api/chat')) return;
    chatResponses.push(`tab ${tab}: ${response.request().method()} ${url.pathname} ${response.status()}`);
    if (chatResponses.length > 12) chatResponses.shift();
  });
  page.on('pageerror', error => pageErrors.push(String(error)));
  page.on('console', message => {
    // A refused request is logged by the browser itself; the page shows those in words.
    if (message.type() === 'error' && !/Failed to load resource/.test(message.text())) {
      consoleErrors.push(message.text());
    }
  });
}

async function screenshot(page, name) {
  shot += 1;
  await page.screenshot({ path: `${request.shots}/${String(shot).padStart(2, '0')}-${name}.png` });
}

const visibleText = page => page.evaluate(() => document.body.innerText);
const idle = page => page.waitForSelector('#send');
const assistantTexts = page =>
  page.$$eval('.message.assistant .text', nodes => nodes.map(node => node.innerText));
const lastAssistantText = async page => (await assistantTexts(page)).at(-1) ?? '';
const cardStates = page => page.$$eval('.tool-card', nodes => nodes.map(node => node.dataset.state));
const conversationTitles = page =>
  page.$$eval('#conversations .conversation-title', nodes => nodes.map(node => node.textContent));

async function send(page, text) {
  await page.fill('#prompt', text);
  await page.press('#prompt', 'Enter');
}

// Sent, and its own reply is streaming (word3 shown under that message). Waiting for word3 in the last
// reply alone would match an earlier slow reply before the page has even added the new message.
async function sendUntilReplying(page, text) {
  await send(page, text);
  await page.waitForFunction(asked => {
    const [question, reply] = [...document.querySelectorAll('#messages > article')].slice(-2);
    return question?.innerText === asked && reply?.classList.contains('assistant') && /word3\b/.test(reply.innerText);
  }, text);
}

// The slow reply shown last has streamed its last word.
async function slowReplyEnded(page) {
  await page.waitForFunction(
    last => new RegExp(`\\b${last}\\b`).test(document.querySelector('#messages > article:last-of-type.assistant')?.innerText ?? ''),
    `word${request.slowWords - 1}`,
    { timeout: 30000 },
  );
}

// Sent and answered: a new user message, an assistant message after it, and the Send button back.
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

// The server's run for the conversation has ended (its last run event is not `run.started`).
async function runSettled(page) {
  const id = new URL(page.url()).hash.slice(1);
  const token = await bearer(page);
  for (let tries = 0; tries < 150; tries += 1) {
    const last = await page.evaluate(
      async ([conversation, bearerToken]) => {
        const response = await fetch(`/api/conversations/${conversation}/events`, {
          headers: { authorization: `Bearer ${bearerToken}` },
        });
        const runs = (await response.json()).events.filter(event => event.type.startsWith('run.'));
        return runs.at(-1)?.type ?? null;
      },
      [id, token],
    );
    if (last && last !== 'run.started') return;
    await new Promise(done => setTimeout(done, 100));
  }
  throw new Error('The run did not settle.');
}

// The conversation's messages as the server stored them.
async function storedMessages(page, id) {
  const token = await bearer(page);
  return page.evaluate(
    async ([conversation, bearerToken]) => {
      const response = await fetch(`/api/conversations/${conversation}/messages`, {
        headers: { authorization: `Bearer ${bearerToken}` },
      });
      return (await response.json()).messages;
    },
    [id, token],
  );
}

const storedReplies = async (page, id) =>
  (await storedMessages(page, id))
    .filter(message => message.role === 'assistant')
    .map(message => message.parts.filter(part => part.type === 'text').map(part => part.text).join(''));

async function until(condition) {
  for (let tries = 0; tries < 200 && !condition(); tries += 1) await new Promise(done => setTimeout(done, 50));
}

async function signInDevelopment(page, name) {
  await page.goto(request.url);
  await page.fill('#user-name', name);
  await page.click('#sign-in-form button[type=submit]');
  await page.waitForSelector('#sign-out');
  await page.waitForSelector('#prompt');
}

async function storedKeys(page) {
  return page.evaluate(() => [...Object.keys(localStorage), ...Object.keys(sessionStorage)]);
}

async function bearer(page) {
  return page.evaluate(() => JSON.parse(localStorage.getItem('bastion.auth') || 'null')?.access_token ?? null);
}

function unnamedControls(page) {
  return page.$$eval('button, input, textarea', nodes =>
    nodes
      .filter(node => {
        const labelled = node.getAttribute('aria-label') || node.textContent.trim() || node.placeholder;
        const label = node.id && document.querySelector(`label[for="${node.id}"]`);
        return !labelled && !label;
      })
      .map(node => node.outerHTML.slice(0, 80)),
  );
}

async function development() {
  const context = await browser.newContext({
    viewport: { width: 1200, height: 800 },
    permissions: ['clipboard-read', 'clipboard-write'],
  });
  const page = await context.newPage();
  watch(page);
  const chatRequests = [];
  const feedbackResponses = [];
  page.on('request', r => {
    if (r.url().endsWith('/api/chat') && r.method() === 'POST') chatRequests.push(JSON.parse(r.postData()).trigger);
  });
  page.on('response', r => {
    if (r.url().endsWith('/feedback')) feedbackResponses.push(r.status());
  });

  await page.goto(request.url);
  await page.waitForSelector('#sign-in-form');
  steps.signInPage = {
    devNoteVisible: await page.isVisible('#dev-sign-in-note'),
    demoBadgeVisible: await page.isVisible('#demo'),
    favicon: await page.evaluate(async () => {
      const link = document.querySelector('link[rel=icon]');
      const response = await fetch(link.href);
      return { status: response.status, type: response.headers.get('content-type') };
    }),
  };
  await screenshot(page, 'sign-in-development');

  await signInDevelopment(page, 'ada');
  steps.signedIn = { user: await page.textContent('#user-name-shown'), unnamed: await unnamedControls(page) };

  // Markdown, seen while it streams and once it is done.
  await send(page, 'markdown please');
  await page.waitForSelector('#stop');
  await page.waitForFunction(() => document.querySelector('.message.assistant .markdown li'));
  const whileStreaming = await page.evaluate(() => ({
    stopVisible: Boolean(document.querySelector('#stop')),
    items: document.querySelectorAll('.message.assistant .markdown li').length,
  }));
  await idle(page);
  steps.markdown = {
    whileStreaming,
    code: await page.textContent('.message.assistant .markdown pre code'),
    headers: await page.$$eval('.message.assistant .markdown th', nodes => nodes.map(node => node.textContent)),
    items: await page.$$eval('.message.assistant .markdown li', nodes => nodes.map(node => node.textContent)),
    strong: await page.$$eval('.message.assistant .markdown strong', nodes => nodes.map(node => node.textContent)),
    atBottom: await page.$eval('#messages', node => node.scrollHeight - node.scrollTop - node.clientHeight <= 48),
  };
  await screenshot(page, 'markdown');
  await page.click('.message.assistant .copy-code');
  await page.waitForSelector('.message.assistant .copy-code:text("Copied")');
  steps.markdown.copied = await page.evaluate(() => navigator.clipboard.readText());

  // A multi-line message: Shift+Enter is a new line, Enter sends.
  await page.click('#prompt');
  await page.keyboard.type('first line');
  await page.keyboard.press('Shift+Enter');
  await page.keyboard.type('second line');
  const beforeSend = await page.inputValue('#prompt');
  await page.keyboard.press('Enter');
  await page.waitForFunction(
    () =>
      document.querySelectorAll('.message.user').length === 2 &&
      document.querySelector('#messages > article:last-of-type.assistant') &&
      document.querySelector('#send'),
  );
  steps.multiline = {
    beforeSend,
    bubble: await page.$$eval('.message.user .text', nodes => nodes.at(-1).textContent),
    inputAfter: await page.inputValue('#prompt'),
  };

  // Regenerate the last reply.
  const repliesBefore = await page.$$eval('.message.assistant', nodes => nodes.length);
  const sentBefore = chatRequests.length;
  await page.click('.regenerate');
  await until(() => chatRequests.length > sentBefore);
  await page.waitForSelector('#messages > article:last-of-type.assistant .regenerate');
  steps.regenerated = {
    triggers: [...chatRequests],
    replies: [repliesBefore, await page.$$eval('.message.assistant', nodes => nodes.length)],
    text: await lastAssistantText(page),
  };

  // Feedback with a comment on the regenerated reply (feedback belongs to the message it rates).
  await page.click('.message.assistant:last-of-type .thumb.down');
  await page.fill('.message.assistant:last-of-type .feedback-comment', 'Too short');
  await page.click('.message.assistant:last-of-type .feedback-form button[type=submit]');
  await page.waitForSelector('.feedback-sent');
  steps.feedback = { shown: await page.textContent('.feedback-sent'), statuses: [...feedbackResponses] };
  await screenshot(page, 'feedback');
  // A long reply: scrolling up is respected while it streams; Stop ends it.
  await sendUntilReplying(page, 'slow please');
  await page.$eval('#messages', node => {
    node.scrollTop = 0;
    node.dispatchEvent(new Event('scroll'));
  });
  const grownFrom = (await lastAssistantText(page)).length;
  await page.waitForFunction(
    length => (document.querySelector('#messages > article:last-of-type.assistant')?.innerText.length ?? 0) > length + 20,
    grownFrom,
  );
  steps.scrolledUp = {
    scrollTop: await page.$eval('#messages', node => node.scrollTop),
    jumpVisible: await page.isVisible('#jump-to-latest'),
  };
  await page.click('#stop');
  await idle(page);
  const stoppedText = await lastAssistantText(page);
  const stoppedScroll = await page.$eval('#messages', node => node.scrollTop);
  await screenshot(page, 'stopped');
  await runSettled(page);
  steps.stopped = {
    text: stoppedText,
    textLater: await lastAssistantText(page),
    storedText: (await storedReplies(page, new URL(page.url()).hash.slice(1))).at(-1),
    note: await page.textContent('#messages > article:last-of-type.assistant .stopped-note').catch(() => null),
    notes: await page.$$eval('.stopped-note', nodes => nodes.length),
    errorShown: await page.isVisible('#chat-error'),
    scrollTop: stoppedScroll,
    jumpVisible: await page.isVisible('#jump-to-latest'),
  };
  if (await page.isVisible('#jump-to-latest')) await page.click('#jump-to-latest');
  await screenshot(page, 'stopped-note');

  // A tool that needs approval: approved. Had the stop not ended the turn on the server, the server
  // would finish the stopped reply on its own and the first send would meet its newer copy (recorded
  // as `recovered`, which the test refuses).
  await send(page, 'remember that the launch is on Friday');
  await page.waitForFunction(
    () =>
      document.querySelector('.tool-card[data-state="approval-requested"]') ||
      document.querySelector('#chat-error')?.textContent.includes('changed elsewhere'),
  );
  if (await page.isVisible('#chat-error')) {
    steps.stopped.recovered = {
      error: await page.textContent('#chat-error'),
      input: await page.inputValue('#prompt'),
      text: await lastAssistantText(page),
    };
    await page.press('#prompt', 'Enter');
  }
  await page.waitForSelector('.tool-card[data-tool="save_note"][data-state="approval-requested"] .approve');
  steps.approvalRequested = {
    card: await page.textContent('.tool-card[data-state="approval-requested"]'),
  };
  await screenshot(page, 'approval');
  await page.click('.tool-card[data-state="approval-requested"] .approve');
  await page.waitForSelector('.tool-card[data-tool="save_note"][data-state="output-available"]');
  await idle(page);
  const done = '.tool-card[data-state="output-available"]';
  const rawHidden = !(await page.isVisible(`${done} .tool-raw pre`));
  await page.click(`${done} .tool-raw summary`);
  steps.approved = {
    card: await page.innerText(`${done} .tool-header`) + '\n' + (await page.innerText(`${done} .tool-output`)),
    rawHidden,
    raw: JSON.parse(await page.textContent(`${done} .tool-raw pre`)),
    text: await lastAssistantText(page),
  };

  // And denied, with a reason.
  await send(page, 'remember that the code is 1234');
  await page.waitForSelector('.tool-card[data-state="approval-requested"] .deny');
  await page.click('.tool-card[data-state="approval-requested"] .deny');
  await page.fill('.tool-card .deny-reason', 'Not a secret for notes');
  await page.click('.tool-card .deny-confirm');
  await page.waitForSelector('.tool-card[data-state="output-denied"]');
  await idle(page);
  steps.denied = {
    card: await page.textContent('.tool-card[data-state="output-denied"]'),
    text: await lastAssistantText(page),
  };
  await screenshot(page, 'denied');
  steps.toolCardsText = await page.$$eval('.tool-card', nodes => nodes.map(node => node.innerText).join('\n'));

  // A model that fails: the page says so in words, without the provider's internals.
  await send(page, 'fail please');
  await page.waitForSelector('#chat-error');
  await idle(page);
  steps.modelError = { text: await page.textContent('#chat-error') };
  await screenshot(page, 'model-error');

  // A refused send keeps what was typed.
  await page.route('**/api/chat', route =>
    route.fulfill({
      status: 409,
      contentType: 'application/json',
      body: JSON.stringify({ code: 'history_conflict', message: 'This conversation changed elsewhere. Reload it.' }),
    }),
  );
  const usersBefore = await page.$$eval('.message.user', nodes => nodes.length);
  await send(page, 'a message that is refused');
  await page.waitForFunction(() => document.querySelector('#chat-error')?.textContent.includes('changed elsewhere'));
  await page.waitForFunction(() => document.querySelector('#prompt').value !== '');
  steps.refused = {
    error: await page.textContent('#chat-error'),
    input: await page.inputValue('#prompt'),
    userMessages: [usersBefore, await page.$$eval('.message.user', nodes => nodes.length)],
  };
  await page.unroute('**/api/chat');
  await page.fill('#prompt', '');

  // The conversation is listed; rename it, and it stays renamed after a reload.
  const firstId = new URL(page.url()).hash.slice(1);
  await page.click(`#conversations li[data-id="${firstId}"] .rename`);
  await page.fill('#conversations input[aria-label="Conversation title"]', 'Launch plans');
  await page.press('#conversations input[aria-label="Conversation title"]', 'Enter');
  await page.waitForFunction(() =>
    [...document.querySelectorAll('#conversations .conversation-title')].some(node => node.textContent === 'Launch plans'),
  );
  await page.reload();
  await page.waitForSelector('.tool-card[data-state="output-available"]');
  // The resume route answers the page's reconnect (204 when nothing is in flight).
  const resumeStatus = await page.evaluate(
    async ([id, token]) => (await fetch(`/api/chat/${id}/stream`, { headers: { authorization: `Bearer ${token}` } })).status,
    [firstId, await bearer(page)],
  );
  steps.reloaded = {
    titles: await conversationTitles(page),
    cards: await cardStates(page),
    userTexts: await page.$$eval('.message.user .text', nodes => nodes.map(node => node.textContent)),
    errorShown: await page.isVisible('#chat-error'),
    resumeStatus,
  };

  // Reload in the middle of a reply: the resume route carries the reply on after the reload.
  await sendUntilReplying(page, 'slow please');
  await page.reload();
  await slowReplyEnded(page);
  await idle(page);
  await runSettled(page);
  steps.resumed = {
    text: await lastAssistantText(page),
    replies: await page.$$eval('.message.assistant', nodes => nodes.length),
    stored: await storedReplies(page, firstId),
    notes: await page.$$eval('.stopped-note', nodes => nodes.length),
    errorShown: await page.isVisible('#chat-error'),
  };

  // A message sent from a second tab while the first tab's reply streams is refused as busy: the second
  // tab says so, keeps the message in the box, follows the running reply, and sends the message after.
  const otherTab = await context.newPage();
  watch(otherTab);
  await otherTab.goto(`${request.url}#${firstId}`);
  await otherTab.waitForSelector('.tool-card[data-state="output-available"]');
  await idle(otherTab);
  await sendUntilReplying(page, 'slow please, once more');
  const busyResponse = otherTab.waitForResponse(r => r.url().endsWith('/api/chat') && r.request().method() === 'POST');
  await send(otherTab, 'sent while busy');
  const refusedAs = await (await busyResponse).json().catch(() => null);
  await otherTab.waitForSelector('#chat-error');
  const busyShown = await otherTab.textContent('#chat-error');
  const inputWhileBusy = await otherTab.inputValue('#prompt');
  await slowReplyEnded(otherTab);
  await idle(otherTab);
  const busyRetry = await otherTab.isVisible('#chat-error button');
  await screenshot(otherTab, 'busy');
  const followed = await assistantTexts(otherTab);
  await idle(page);
  await sendAndWait(otherTab, await otherTab.inputValue('#prompt'));
  await idle(otherTab);
  steps.busy = {
    code: refusedAs?.code,
    shown: busyShown,
    retryOffered: busyRetry,
    inputWhileBusy,
    followed,
    firstTab: await assistantTexts(page),
    userTexts: await otherTab.$$eval('.message.user .text', nodes => nodes.map(node => node.textContent)),
    afterwards: await lastAssistantText(otherTab),
    errorAfterwards: await otherTab.isVisible('#chat-error'),
    stored: await storedReplies(otherTab, firstId),
  };
  await otherTab.close();
  lastPage = page;

  // A resume the server refuses (reloaded mid-reply while it has trouble) is said in words; the message
  // that reply answers stays where it is, not moved back into the box as a refused send would be.
  await page.reload(); // the first tab learns of the second tab's turn
  await page.waitForSelector('.tool-card[data-state="output-available"]');
  await sendUntilReplying(page, 'slow please, a third time');
  const resumeRoute = url => url.pathname.endsWith('/stream');
  await page.route(resumeRoute, route => route.fulfill({ status: 503, contentType: 'text/plain', body: 'db-7 down' }));
  await page.reload();
  await page.waitForSelector('#chat-error');
  const refusedError = await page.textContent('#chat-error');
  const refusedUsers = await page.$$eval('.message.user .text', nodes => nodes.map(node => node.textContent));
  const refusedInput = await page.inputValue('#prompt');
  // Retry follows the reply again (or shows the server's copy, had it finished meanwhile).
  await page.unroute(resumeRoute);
  await page.click('#chat-error button');
  await slowReplyEnded(page);
  await idle(page);
  await runSettled(page);
  steps.resumeRefused = {
    error: refusedError,
    userTexts: refusedUsers,
    input: refusedInput,
    retried: await lastAssistantText(page),
    stored: await storedReplies(page, firstId),
    errorAfter: await page.isVisible('#chat-error'),
  };

  // A second conversation, deleted again.
  await page.click('#new');
  await sendAndWait(page, 'a conversation to delete');
  await page.waitForFunction(() => document.querySelectorAll('#conversations li').length === 2);
  const secondId = new URL(page.url()).hash.slice(1);
  await page.click(`#conversations li[data-id="${secondId}"] .delete`);
  await page.click('#conversations .confirming .danger');
  await page.waitForFunction(() => document.querySelectorAll('#conversations li').length === 1);
  await page.reload();
  await page.waitForSelector('#conversations li');
  steps.deleted = { titles: await conversationTitles(page) };
  await page.click(`#conversations li[data-id="${firstId}"] .conversation-title`);
  await page.waitForSelector('.tool-card');
  await screenshot(page, 'conversation');

  // Memory: the panel starts empty; "my name is Ada" is remembered (approving if asked) and the panel
  // learns it after the turn; a new conversation answers from recall; forgetting it empties the panel.
  await page.route('**/api/memories', route =>
    route.fulfill({ status: 503, contentType: 'text/plain', body: 'pool exhausted at db-7:5432' }),
  );
  await page.click('#memory-button');
  await page.waitForSelector('#memory-error');
  const memoryError = await page.textContent('#memory');
  await page.click('#memory-close');
  await page.unroute('**/api/memories');
  await page.click('#memory-button');
  await page.waitForSelector('#memory #memory-empty');
  await page.waitForSelector('#memory-error', { state: 'detached' });
  const memoryBefore = await page.textContent('#memory');
  await page.keyboard.press('Escape');
  await page.waitForFunction(() => !document.querySelector('#memory').open);
  const focusAfterEscape = await page.evaluate(() => document.activeElement?.id);
  await page.click('#new');
  const refreshed = page.waitForResponse(r => r.url().endsWith('/api/memories') && r.request().method() === 'GET');
  await send(page, 'my name is Ada');
  await page.waitForSelector('.tool-card[data-tool="remember"]');
  const rememberAsked = await page.isVisible('.tool-card[data-tool="remember"] .approve');
  if (rememberAsked) await page.click('.tool-card[data-tool="remember"] .approve');
  await page.waitForSelector('.tool-card[data-tool="remember"][data-state="output-available"]');
  await idle(page);
  await refreshed;
  const rememberCard = await page.innerText('.tool-card[data-tool="remember"]');
  await page.click('#memory-button');
  await page.waitForSelector('#memories .memory');
  const remembered = await page.$$eval('#memories .memory', nodes =>
    nodes.map(node => ({
      id: node.dataset.id,
      text: node.querySelector('.memory-text').textContent,
      forget: node.querySelector('.forget').getAttribute('aria-label'),
    })),
  );
  await screenshot(page, 'memory');
  await page.click('#memory-close');
  await page.waitForFunction(() => !document.querySelector('#memory').open);
  await page.click('#new');
  await sendAndWait(page, 'what is my name?');
  await idle(page);
  const recalled = await lastAssistantText(page);
  // Forgotten from the keyboard: the button is reached with Tab and pressed with Enter. The list the
  // panel asked for on opening is held back until the memory is forgotten: arriving late, it is stale.
  let releaseList;
  const listHeld = new Promise(done => (releaseList = done));
  await page.route('**/api/memories', async route => {
    const response = await route.fetch();
    await listHeld;
    await route.fulfill({ response });
  });
  const staleList = page.waitForResponse(r => r.url().endsWith('/api/memories') && r.request().method() === 'GET');
  const forgotten = page.waitForResponse(r => r.request().method() === 'DELETE' && r.url().includes('/api/memories/'));
  await page.focus('#memory-button');
  await page.keyboard.press('Enter');
  await page.waitForSelector('#memories .forget');
  let tabs = 0;
  while (tabs < 5 && !(await page.evaluate(() => document.activeElement?.classList.contains('forget')))) {
    await page.keyboard.press('Tab');
    tabs += 1;
  }
  await page.keyboard.press('Enter');
  await forgotten;
  releaseList();
  await (await staleList).finished();
  await page.unroute('**/api/memories');
  await page.evaluate(() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done))));
  await page.waitForSelector('#memory #memory-empty');
  const memoryToken = await bearer(page);
  steps.memory = {
    error: memoryError,
    before: memoryBefore,
    focusAfterEscape,
    rememberAsked,
    rememberCard,
    remembered,
    recalled,
    afterForget: await page.textContent('#memory'),
    focusAfterForget: await page.evaluate(() => document.activeElement?.id),
    stored: await page.evaluate(
      async token => (await (await fetch('/api/memories', { headers: { authorization: `Bearer ${token}` } })).json()).memories,
      memoryToken,
    ),
  };
  await page.keyboard.press('Escape');
  await page.waitForFunction(() => !document.querySelector('#memory').open);
  // Remembered again, so that sign out has something to clear and the second user something not to see.
  await sendAndWait(page, 'my name is Ada');
  await page.waitForSelector('.tool-card[data-tool="remember"][data-state="output-available"]');
  await idle(page);
  await page.click('#memory-button');
  await page.waitForSelector('#memories .memory');
  const adaMemory = await page.$eval('#memories .memory', node => node.dataset.id);
  await page.click('#memory-close');

  // Sign out: nothing of ada is left on the screen, in storage or in the address.
  await page.click('#sign-out');
  await page.waitForSelector('#sign-in-form');
  steps.signedOut = {
    text: await visibleText(page),
    html: await page.content(),
    stored: await storedKeys(page),
    hash: new URL(page.url()).hash,
  };
  await screenshot(page, 'signed-out');

  // Another user sees nothing of the first, not even through ada's address.
  await signInDevelopment(page, 'bob');
  await page.goto(`${request.url}#${firstId}`);
  await page.waitForSelector('#prompt');
  await page.waitForSelector('.empty-list');
  const probe = await page.evaluate(
    async ([id, token]) => {
      const response = await fetch(`/api/conversations/${id}/messages`, { headers: { authorization: `Bearer ${token}` } });
      return { status: response.status, body: await response.json() };
    },
    [firstId, await bearer(page)],
  );
  await page.click('#memory-button');
  await page.waitForSelector('#memory #memory-empty');
  const memoryShown = await page.textContent('#memory');
  await page.click('#memory-close');
  const memoryProbe = await page.evaluate(
    async ([id, token]) => {
      const headers = { authorization: `Bearer ${token}` };
      const forget = await fetch(`/api/memories/${id}`, { method: 'DELETE', headers });
      const history = await fetch(`/api/memories/${id}/history`, { headers });
      const list = await (await fetch('/api/memories', { headers })).json();
      return { forget: forget.status, history: history.status, memories: list.memories };
    },
    [adaMemory, await bearer(page)],
  );
  steps.secondUser = {
    memoryShown,
    memoryProbe,
    user: await page.textContent('#user-name-shown'),
    titles: await conversationTitles(page),
    messages: await page.$$eval('.message', nodes => nodes.length),
    text: await visibleText(page),
    probe,
  };
  await context.close();
}

async function phone() {
  const context = await browser.newContext({
    viewport: { width: 390, height: 844 },
    deviceScaleFactor: 2,
    isMobile: true,
    hasTouch: true,
    reducedMotion: 'reduce',
  });
  const page = await context.newPage();
  watch(page);
  await page.goto(request.url);
  await page.waitForSelector('#sign-in-form');
  await screenshot(page, 'phone-sign-in');
  await signInDevelopment(page, 'carol');
  await sendAndWait(page, 'markdown please');
  await sendAndWait(page, 'remember that phones work');
  await page.waitForSelector('.tool-card .approve');
  const measure = () =>
    page.evaluate(() => {
      const width = selector => document.querySelector(selector)?.getBoundingClientRect().width ?? 0;
      return {
        scrollWidth: document.documentElement.scrollWidth,
        messages: width('#messages'),
        prompt: width('#prompt'),
        card: width('.tool-card'),
        sidebarVisible: getComputedStyle(document.querySelector('#sidebar')).visibility === 'visible',
      };
    });
  const closed = await measure();
  await screenshot(page, 'phone-chat');
  await page.click('.tool-card .approve');
  await page.waitForSelector('.tool-card[data-state="output-available"]');
  await idle(page);
  await page.click('.menu-button');
  await page.waitForSelector('#sidebar #new');
  await page.waitForFunction(() => getComputedStyle(document.querySelector('#sidebar')).visibility === 'visible');
  const opened = await measure();
  await screenshot(page, 'phone-menu');
  const focused = await page.evaluate(() => document.activeElement?.id);
  await page.keyboard.press('Escape');
  await page.waitForFunction(() => getComputedStyle(document.querySelector('#sidebar')).visibility === 'hidden');
  await page.click('.menu-button');
  await page.waitForFunction(() => getComputedStyle(document.querySelector('#sidebar')).visibility === 'visible');
  await page.click('#conversations .conversation-title');
  await page.waitForFunction(() => getComputedStyle(document.querySelector('#sidebar')).visibility === 'hidden');
  await page.click('#memory-button');
  await page.waitForSelector('#memory #memory-empty');
  const memoryDialog = await page.evaluate(() => {
    const box = document.querySelector('#memory').getBoundingClientRect();
    return { left: box.left, right: box.right, scrollWidth: document.documentElement.scrollWidth };
  });
  await screenshot(page, 'phone-memory');
  await page.keyboard.press('Escape');
  await page.waitForFunction(() => !document.querySelector('#memory').open);
  steps.phone = { closed, opened, focused, memoryDialog, approved: await cardStates(page) };
  await context.close();
}

async function supabase() {
  const context = await browser.newContext({ viewport: { width: 1100, height: 760 } });
  const page = await context.newPage();
  watch(page);
  const chatTokens = [];
  page.on('request', r => {
    if (r.url().endsWith('/api/chat') && r.method() === 'POST') chatTokens.push(r.headers().authorization);
  });

  await page.goto(request.url);
  await page.waitForSelector('#sign-in-form');
  await page.waitForSelector('#guest');
  steps.signInPage = {
    devNoteVisible: await page.isVisible('#dev-sign-in-note'),
    fields: await page.$$eval('#sign-in-form input', nodes => nodes.map(node => node.id)),
    magicLink: await page.isVisible('#magic-link'),
    guest: await page.isVisible('#guest'),
  };
  await screenshot(page, 'sign-in-supabase');

  await page.fill('#email', 'ada@example.com');
  await page.fill('#password', 'wrong password');
  await page.click('#sign-in-form button[type=submit]');
  await page.waitForSelector('#sign-in-error');
  steps.wrongPassword = { error: await page.textContent('#sign-in-error') };

  await page.fill('#password', request.password);
  await page.click('#sign-in-form button[type=submit]');
  await page.waitForSelector('#sign-out');
  await sendAndWait(page, 'who am i?');
  steps.signedIn = {
    user: await page.textContent('#user-name-shown'),
    card: await page.textContent('.tool-card'),
    chatTokens: [...chatTokens],
  };
  await screenshot(page, 'supabase-signed-in');

  await page.click('#sign-out');
  await page.waitForSelector('#sign-in-form');
  steps.signedOut = { stored: await storedKeys(page), text: await visibleText(page) };

  await page.fill('#email', 'grace@example.com');
  await page.click('#magic-link');
  await page.waitForSelector('#sign-in-notice');
  const notice = await page.textContent('#sign-in-notice');
  const { links } = await (await fetch(`${request.authUrl}/outbox`)).json();
  await page.goto(links.at(-1));
  await page.waitForSelector('#sign-out');
  await page.waitForFunction(() => !window.location.hash.includes('access_token'));
  steps.magicLink = {
    notice,
    user: await page.textContent('#user-name-shown'),
    titles: await conversationTitles(page).catch(() => []),
    address: page.url(),
  };
  await page.click('#sign-out');
  await page.waitForSelector('#guest');
  await page.click('#guest');
  await page.waitForSelector('#sign-out');
  await sendAndWait(page, 'hello');
  steps.guest = { user: await page.textContent('#user-name-shown'), reply: await lastAssistantText(page) };

  // A session the Auth server no longer refreshes ends on its own: the page says so, keeping nothing.
  await page.click('#sign-out');
  await page.waitForSelector('#sign-in-form');
  await fetch(`${request.authUrl}/refuse-refresh`, { method: 'POST' });
  await page.fill('#email', 'ada@example.com');
  await page.fill('#password', request.password);
  await page.click('#sign-in-form button[type=submit]');
  await page.waitForSelector('#session-ended');
  steps.sessionEnded = {
    notice: await page.textContent('#session-ended'),
    stored: await storedKeys(page),
    hash: new URL(page.url()).hash,
    signOutVisible: await page.isVisible('#sign-out'),
  };
  await screenshot(page, 'session-ended');
  await context.close();
}

try {
  if (request.mode === 'supabase') await supabase();
  else {
    await development();
    await phone();
  }
} catch (error) {
  steps.failure = `${error.stack || error}\nThe chat routes answered, newest last:\n${chatResponses.join('\n')}`;
  if (lastPage) await screenshot(lastPage, 'failure').catch(() => {});
} finally {
  await browser.close();
}
const seen = JSON.stringify({ steps, pageErrors, consoleErrors });
await writeFile(`${request.shots}/seen-${request.mode}.json`, seen);
process.stdout.write(seen);
