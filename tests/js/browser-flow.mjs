// Drives the assistant's web page in headless Chromium as a person would, and prints what it saw as JSON.
//
// Input on stdin: {"url": ..., "chromium": <path to the browser>, "screenshot": <png path>}
// Output: {"steps": {...}} — each step's observations, for the Python test to assert on.

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

async function signIn(page, name) {
  await page.goto(request.url);
  await page.fill('#user-name', name);
  await page.click('#sign-in-form button[type=submit]');
  await page.waitForSelector('#app:not([hidden])');
}

async function sendMessage(page, text) {
  await page.fill('#prompt', text);
  await page.click('#send');
  await page.waitForFunction(() => document.querySelector('#status').textContent === '');
}

function assistantTexts(page) {
  return page.$$eval('.message.assistant .text', nodes => nodes.map(node => node.textContent));
}

try {
  const context = await browser.newContext();
  const page = await context.newPage();
  page.on('pageerror', error => pageErrors.push(String(error)));

  await page.goto(request.url);
  steps.signInPage = {
    devNoteVisible: await page.isVisible('#dev-sign-in-note'),
    demoBadgeVisible: await page.isVisible('#demo'),
  };

  await signIn(page, 'ada');
  await sendMessage(page, 'hello there');
  await page.waitForSelector('.message.assistant .text');
  steps.firstReply = { texts: await assistantTexts(page), url: page.url() };

  await sendMessage(page, 'remember that the launch is on Friday');
  await page.waitForSelector('.tool-card[data-tool="save_note"] button.approve');
  steps.approvalRequested = {
    cards: await page.$$eval('.tool-card', nodes => nodes.map(node => node.dataset.state)),
  };
  await page.click('.tool-card[data-tool="save_note"] button.approve');
  await page.waitForSelector('.tool-card[data-tool="save_note"][data-state="output-available"]');
  await page.waitForFunction(() => document.querySelector('#status').textContent === '');
  steps.approved = {
    output: await page.textContent('.tool-card[data-tool="save_note"] .tool-output'),
    texts: await assistantTexts(page),
  };

  await page.reload();
  await page.waitForSelector('.tool-card[data-tool="save_note"][data-state="output-available"]');
  steps.reloaded = {
    userTexts: await page.$$eval('.message.user .text', nodes => nodes.map(node => node.textContent)),
    cards: await page.$$eval('.tool-card', nodes => nodes.map(node => node.dataset.state)),
    conversations: await page.$$eval('#conversations button', nodes => nodes.map(node => node.textContent)),
  };
  await page.screenshot({ path: request.screenshot, fullPage: true });
  const adaUrl = page.url();

  await page.click('#new');
  await sendMessage(page, 'my name is Ada');
  await page.waitForSelector('#memories li');
  steps.remembered = {
    memories: await page.$$eval('#memories .memory-text', nodes => nodes.map(node => node.textContent)),
  };
  await page.click('#new');
  await sendMessage(page, 'what is my name?');
  steps.recalled = { texts: await assistantTexts(page) };
  await page.goto(adaUrl);
  await page.reload();
  await page.waitForSelector('.tool-card[data-tool="save_note"]');

  await page.click('#sign-out');
  await signIn(page, 'bob');
  await page.goto(adaUrl);
  await page.waitForSelector('#app:not([hidden])');
  await page.waitForTimeout(300);
  const conversationId = new URL(adaUrl).hash.slice(1);
  const token = await page.evaluate(() => localStorage.getItem('bastion.token'));
  const probe = await page.evaluate(
    async ([id, bearer]) => {
      const response = await fetch(`/api/conversations/${id}/messages`, {
        headers: { authorization: `Bearer ${bearer}` },
      });
      return { status: response.status, body: await response.json() };
    },
    [conversationId, token],
  );
  steps.secondUser = {
    memories: await page.$$eval('#memories li', nodes => nodes.length),
    conversations: await page.$$eval('#conversations button', nodes => nodes.map(node => node.textContent)),
    messages: await page.$$eval('.message', nodes => nodes.length),
    probe,
  };

  await page.click('#sign-out');
  await signIn(page, 'ada');
  await page.waitForSelector('#memories li');
  await page.click('#memories li button.forget');
  await page.waitForSelector('#no-memories:not([hidden])');
  steps.forgotten = { memories: await page.$$eval('#memories li', nodes => nodes.length) };
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify({ steps, pageErrors }));
