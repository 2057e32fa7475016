// Drives the support inbox in headless Chromium: a visitor on the demo widget page talks to the bot, a
// signed-in member of staff reads the conversation, takes it over, replies and hands it back, and the
// bot hands it to a person when asked. Prints what both pages saw as JSON.
//
// Input on stdin: {"url", "chromium", "shots"}. Output: {"steps", "pageErrors", "consoleErrors"}.

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
    if (message.type() === 'error' && !/Failed to load resource/.test(message.text())) consoleErrors.push(message.text());
  });
}

async function screenshot(page, name) {
  shot += 1;
  await page.screenshot({ path: `${request.shots}/inbox-${String(shot).padStart(2, '0')}-${name}.png` });
}

const messages = (page, list) =>
  page.$$eval(`${list} .inbox-message`, nodes =>
    nodes.map(node => [node.dataset.author, node.querySelector('.inbox-text').innerText]),
  );

// Waits until the list holds `count` messages, the last by `author`.
const waitForMessages = (page, list, count, author) =>
  page.waitForFunction(
    ([selector, wanted, by]) => {
      const nodes = document.querySelectorAll(`${selector} .inbox-message`);
      return nodes.length === wanted && nodes[nodes.length - 1].dataset.author === by;
    },
    [list, count, author],
  );

async function say(widget, text) {
  await widget.fill('#widget-text', text);
  await widget.click('#widget-send');
}

try {
  const widgetContext = await browser.newContext({ viewport: { width: 600, height: 800 } });
  const widget = await widgetContext.newPage();
  watch(widget);
  await widget.goto(`${request.url}/widget`);
  await widget.fill('#widget-name', 'Vera');
  await widget.click('#widget-start button[type=submit]');
  await widget.waitForSelector('#widget-form');
  await say(widget, 'Hello there');
  await waitForMessages(widget, '#widget-messages', 2, 'bot');
  steps.botAnswered = { messages: await messages(widget, '#widget-messages'), mode: await widget.textContent('#widget-mode') };
  await screenshot(widget, 'widget-bot-answered');

  const staffContext = await browser.newContext({ viewport: { width: 1200, height: 800 } });
  const staff = await staffContext.newPage();
  watch(staff);
  await staff.goto(`${request.url}/`);
  await staff.fill('#user-name', 'sam');
  await staff.click('#sign-in-form button[type=submit]');
  await staff.waitForSelector('#inbox-button');
  await staff.click('#inbox-button');
  await staff.waitForSelector('#inbox-conversations .inbox-item');
  steps.inboxList = await staff.$$eval('#inbox-conversations .inbox-item', nodes =>
    nodes.map(node => [node.querySelector('.inbox-contact').innerText, node.querySelector('.badge').innerText]),
  );
  await staff.click('#inbox-conversations .inbox-item');
  await waitForMessages(staff, '#inbox-messages', 2, 'bot');
  steps.staffSees = await messages(staff, '#inbox-messages');
  await screenshot(staff, 'staff-conversation');

  await staff.click('#take-over');
  await staff.waitForSelector('#hand-back');
  steps.takenOver = await staff.textContent('#inbox-mode');
  await widget.waitForSelector('#widget-mode[data-mode=human]');
  steps.widgetAfterTakeOver = await widget.textContent('#widget-mode');
  await say(widget, 'Are you a person?');
  await waitForMessages(staff, '#inbox-messages', 3, 'contact');
  await staff.fill('#staff-reply', 'Yes, I am Sam. How can I help?');
  await staff.click('#staff-send');
  await waitForMessages(widget, '#widget-messages', 4, 'staff');
  steps.humanConversation = await messages(widget, '#widget-messages');
  await screenshot(widget, 'widget-staff-answered');
  await screenshot(staff, 'staff-replied');

  await staff.click('#hand-back');
  await staff.waitForSelector('#take-over');
  await widget.waitForSelector('#widget-mode[data-mode=bot]');
  await say(widget, 'Thanks, bot');
  await waitForMessages(widget, '#widget-messages', 6, 'bot');
  steps.backWithTheBot = (await messages(widget, '#widget-messages')).slice(4);

  await say(widget, 'I want to talk to a human');
  await waitForMessages(widget, '#widget-messages', 8, 'bot');
  await widget.waitForSelector('#widget-mode[data-mode=human]');
  await staff.waitForSelector('#hand-back');
  steps.handedOff = {
    widgetMode: await widget.textContent('#widget-mode'),
    staffMode: await staff.textContent('#inbox-mode'),
    reason: await staff.textContent('#inbox-handoff-reason'),
  };
  await screenshot(staff, 'staff-handed-off');
} catch (error) {
  steps.failure = String(error.stack || error);
  if (lastPage) await screenshot(lastPage, 'failure').catch(() => {});
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify({ steps, pageErrors, consoleErrors }));
