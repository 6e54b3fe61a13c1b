// Saving in the editor, in a real headless Chromium against a real `sluice serve`:
// saving over another graph's name asks first (and declining stores nothing); Save as,
// Rename and Delete; and a replaced or deleted graph restored from the Versions panel.
// The steps share one page and run in order.

import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { launchChromium, noticeAfter, openEditor, screenshotDir, setField, startServer } from './support.mjs';

describe('saving to the workspace', { timeout: 300_000 }, () => {
  let server;
  let browser;
  let page;
  const shots = screenshotDir();
  const pageErrors = [];

  before(async () => {
    server = await startServer();
    browser = await launchChromium();
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    page = await openEditor(context, server.url, pageErrors, { acceptDialogs: false });
  });

  after(async () => {
    await browser?.close();
    server?.stop();
  });

  /** The stored graph `name` (null when there is none). */
  async function stored(name) {
    const r = await fetch(`${server.url}/api/graphs/${name}`);
    return r.status === 404 ? null : r.json();
  }

  /** Runs `action`, answering the one dialog it opens with `answer` (false dismisses, true
   * accepts, a string accepts a prompt with it); resolves to the dialog's message. */
  async function answering(answer, action) {
    const seen = new Promise((resolve) => {
      page.once('dialog', async (d) => {
        const message = d.message();
        if (answer === false) await d.dismiss();
        else if (answer === true) await d.accept();
        else await d.accept(answer);
        resolve(message);
      });
    });
    await action();
    return seen;
  }

  /** Picks an entry of the toolbar's Graph menu (closing any notice first). */
  async function menu(id) {
    const close = page.locator('.notice-close');
    if (await close.count()) await close.click();
    await page.locator('#graph-menu summary').click();
    await page.locator(`#${id}`).click();
  }

  async function openGraph(name) {
    await noticeAfter(page, () => page.locator('#open-graph').selectOption(name));
    await page.waitForFunction((n) => document.querySelector('#graph-name')?.value === n, name);
  }

  it('asks before saving over another graph, and stores nothing when declined', async () => {
    const cnn = await stored('cnn');
    await openGraph('mlp');
    await setField(page.locator('#graph-name'), 'cnn');
    await page.evaluate(() => document.activeElement?.blur());
    const message = await answering(false, () => page.keyboard.press('Control+s'));
    assert.match(message, /A graph named 'cnn' is already in the workspace\. Replace it\?/);
    assert.deepEqual(await stored('cnn'), cnn, 'declined: cnn is untouched');
    // Accepted: cnn now holds the MLP, and the CNN it replaced is kept as a version.
    await answering(true, () => page.keyboard.press('Control+s'));
    await page.waitForSelector('.dirty[data-dirty="false"]');
    const mlp = await stored('mlp');
    assert.deepEqual((await stored('cnn')).nodes, mlp.nodes);
    const versions = await (await fetch(`${server.url}/api/graphs/cnn/versions`)).json();
    assert.equal(versions.versions.length, 1);
  });

  it('restores the replaced graph from the Versions panel', async () => {
    const original = await (await fetch(`${server.url}/api/graphs/cnn/versions`)).json();
    const kept = await (await fetch(`${server.url}/api/graphs/cnn/versions/${original.versions[0].version}`)).json();
    await menu('versions-button');
    await page.waitForSelector('#versions button.restore');
    await page.screenshot({ path: join(shots, 'editor-versions.png') });
    assert.equal(await page.locator('#versions button.restore').count(), 1);
    await page.locator('#versions button.restore').first().click();
    await page.waitForFunction(() => document.querySelectorAll('g.node[data-id="conv1"]').length === 1);
    assert.deepEqual(await stored('cnn'), kept, 'the CNN is back');
    await page.waitForFunction(() => document.querySelectorAll('g.node[data-id="conv1"]').length === 1);
    // The MLP that was saved over it is kept in turn.
    const now = await (await fetch(`${server.url}/api/graphs/cnn/versions`)).json();
    assert.equal(now.versions.length, 2);
  });

  it('saves as a new name, renames, deletes, and restores the deleted graph', async () => {
    await answering('cnn_copy', () => menu('save-as'));
    await page.waitForSelector('.dirty[data-dirty="false"]');
    assert.equal((await stored('cnn_copy')).name, 'cnn_copy');
    assert.notEqual(await stored('cnn'), null, 'Save as leaves the original');

    await answering('cnn_renamed', () => menu('rename'));
    await page.waitForFunction(() => document.querySelector('#graph-name')?.value === 'cnn_renamed');
    await page.waitForFunction(async () => (await fetch('/api/graphs/cnn_copy')).status === 404);
    assert.equal((await stored('cnn_renamed')).name, 'cnn_renamed');

    const message = await answering(true, () => menu('delete-graph'));
    assert.match(message, /Delete 'cnn_renamed' from the workspace\?/);
    await page.waitForFunction(async () => (await fetch('/api/graphs/cnn_renamed')).status === 404);
    // The open graph is now unsaved (once the editor has the server's answer).
    await page.waitForSelector('.dirty[data-dirty="true"]');

    await menu('versions-button');
    await page.waitForSelector('#versions button.restore');
    await answering(true, () => page.locator('#versions button.restore').first().click());
    await page.waitForFunction(async () => (await fetch('/api/graphs/cnn_renamed')).status === 200);
    assert.equal((await stored('cnn_renamed')).name, 'cnn_renamed');
    assert.deepEqual(pageErrors, []);
  });
});
