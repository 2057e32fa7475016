// Connects an MCP server from a conversation in headless Chromium: the Connect card, the server's sign-in
// in its own window, the page the server sends it back to, and the turn going on by itself; then the
// connections list. Prints what it saw as JSON.
//
// Input on stdin: {"url", "chromium", "shots" (a folder for screenshots), "phase": "connect" | "refused" | "later"}
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
let lastPage = null;

function watch(page) {
  lastPage = page;
  page.setDefaultTimeout(15000);
  page.on('pageerror', error => pageErrors.push(String(error)));
  page.on('console', message => {
    if (message.type() === 'error' && !/Failed to load resource/.test(message.text())) {
      consoleErrors.push(message.text());
    }
  });
}

async function screenshot(page, name) {
  shot += 1;
  await page.screenshot({ path: `${request.shots}/${String(shot).padStart(2, '0')}-${name}.png` });
}

async function connect() {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const page = await context.newPage();
  watch(page);
  await page.goto(request.url);
  await page.fill('#user-name', 'ada');
  await page.click('#sign-in-form button[type=submit]');
  await page.waitForSelector('#prompt');
  await page.waitForSelector('#connections-button');

  await page.fill('#prompt', 'search the pricing page');
  await page.press('#prompt', 'Enter');
  await page.waitForSelector('.connect-card button.connect');
  steps.card = {
    title: await page.textContent('.tool-card .tool-title'),
    status: await page.textContent('.tool-card .tool-status'),
    button: await page.textContent('.connect-card button.connect'),
  };
  await screenshot(page, 'connect-card');

  const [popup] = await Promise.all([context.waitForEvent('page'), page.click('.connect-card button.connect')]);
  watch(popup);
  await popup.waitForSelector('#connection-outcome');
  steps.callback = {
    path: new URL(popup.url()).pathname,
    search: new URL(popup.url()).search,
    outcome: await popup.textContent('#connection-outcome'),
  };
  await screenshot(popup, 'callback-page');
  lastPage = page;

  // The card answered itself: the turn went on, and the server's search asks for approval as usual.
  await page.waitForSelector('.tool-card[data-tool="mcp__search"] button.approve');
  steps.connectedCard = await page.$$eval('.tool-card', nodes => nodes.map(node => node.dataset.state));
  await page.click('.tool-card[data-tool="mcp__search"] button.approve');
  await page.waitForFunction(() => document.querySelector('.message.assistant:last-of-type')?.innerText.includes('The pricing page.'));
  steps.answer = await page.$$eval('.message.assistant .text', nodes => nodes.map(node => node.innerText).at(-1));
  await screenshot(page, 'turn-resumed');

  await page.click('#connections-button');
  await page.waitForSelector('#connection-list .connection[data-status="connected"]');
  steps.list = await page.textContent('#connection-list');
  await screenshot(page, 'connections-list');
  await page.click('#connection-list button.disconnect');
  await page.waitForSelector('#connection-list .connection[data-status="not_connected"]');
  steps.disconnected = await page.textContent('#connection-list');
  await context.close();
}

// The server refuses the sign-in: both windows say so in words, and the assistant goes on without it.
async function refused() {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const page = await context.newPage();
  watch(page);
  await page.goto(request.url);
  await page.fill('#user-name', 'bob');
  await page.click('#sign-in-form button[type=submit]');
  await page.waitForSelector('#prompt');
  await page.fill('#prompt', 'search the pricing page');
  await page.press('#prompt', 'Enter');
  await page.waitForSelector('.connect-card button.connect');
  const [popup] = await Promise.all([context.waitForEvent('page'), page.click('.connect-card button.connect')]);
  watch(popup);
  await popup.waitForSelector('#connection-outcome');
  steps.callback = await popup.textContent('#connection-outcome');
  await screenshot(popup, 'callback-refused');
  lastPage = page;
  await page.waitForSelector('.connect-refused');
  await page.waitForFunction(() => document.querySelector('.message.assistant:last-of-type')?.innerText.includes('Without it'));
  steps.card = await page.textContent('.connect-refused');
  steps.status = await page.textContent('.tool-card .tool-status');
  await screenshot(page, 'connect-refused');
  await context.close();
}

// The tab with the card is closed; the user connects from the Connections list in another one, and the
// card, shown again, goes on by itself.
async function later() {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const first = await context.newPage();
  watch(first);
  await first.goto(request.url);
  await first.fill('#user-name', 'cy');
  await first.click('#sign-in-form button[type=submit]');
  await first.waitForSelector('#prompt');
  await first.fill('#prompt', 'search the pricing page');
  await first.press('#prompt', 'Enter');
  await first.waitForSelector('.connect-card button.connect');
  const conversation = first.url();
  await first.close();

  const second = await context.newPage();
  watch(second);
  await second.goto(request.url);
  await second.waitForSelector('#connections-button');
  await second.click('#connections-button');
  await second.waitForSelector('#connection-list .connection[data-status="not_connected"] button.connect');
  const [popup] = await Promise.all([
    context.waitForEvent('page'),
    second.click('#connection-list button.connect'),
  ]);
  watch(popup);
  await popup.waitForSelector('#connection-outcome');
  steps.callback = await popup.textContent('#connection-outcome');
  await second.waitForSelector('#connection-list .connection[data-status="connected"]');
  await second.close();

  const third = await context.newPage();
  watch(third);
  await third.goto(conversation);
  await third.waitForSelector('.tool-card[data-tool="mcp__search"] button.approve');
  steps.cards = await third.$$eval('.tool-card', nodes => nodes.map(node => [node.dataset.tool, node.dataset.state]));
  await screenshot(third, 'card-went-on');
  await context.close();
}

try {
  if (request.phase === 'refused') await refused();
  else if (request.phase === 'later') await later();
  else await connect();
} catch (error) {
  steps.failure = String(error.stack || error);
  if (lastPage) await screenshot(lastPage, 'failure').catch(() => {});
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify({ steps, pageErrors, consoleErrors }));
