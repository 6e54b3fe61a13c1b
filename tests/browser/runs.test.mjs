// The Run tab's charts explain themselves, against a freshly started (cold) `sluice
// serve`: an impossible stage split turns Run off with the reason; the first run of a
// 2-stage, 4-micro-batch pipeline shows its warm-up (compiling pipelines) apart from the
// measured micro-batches; the Gantt, the heat map and the utilisation chart have legends
// and tooltips in milliseconds; every figure says what it means; the same run again,
// compiled already, has no warm-up; opening another graph clears the charts; a browser
// run of a large matrix product tunes its kernel for the page's adapter and lists every
// variant tried. Timings are printed, never asserted.

import assert from 'node:assert/strict';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import { closeNotice, launchChromium, noticeAfter, openEditor, screenshotDir, setField, startServer } from './support.mjs';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const RUN_TIMEOUT = 240_000;
const MS = /\d+\.\d+ ms/;

describe('the run charts', { timeout: 600_000 }, () => {
  let server;
  let browser;
  let page;
  const shots = screenshotDir();
  const pageErrors = [];

  before(async () => {
    server = await startServer();
    browser = await launchChromium();
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    page = await openEditor(context, server.url, pageErrors, { acceptDialogs: false });
  });

  after(async () => {
    await browser?.close();
    server?.stop();
  });

  async function run() {
    await page.locator('#run-button').click();
    await page.waitForSelector('#run-status[data-status="succeeded"], #run-status[data-status="failed"]', { timeout: RUN_TIMEOUT });
    const status = await page.locator('#run-status').textContent();
    assert.equal(await page.getAttribute('#run-status', 'data-status'), 'succeeded', status);
  }


  /** The figures as { name: [value, explanation] }. */
  async function figures() {
    return page.locator('#run-figures .figure').evaluateAll((els) => Object.fromEntries(els.map((e) => [
      e.dataset.figure,
      [e.querySelector('.figure-value').textContent, e.querySelector('.figure-doc').textContent],
    ])));
  }

  it('turns Run off with the reason when the stage split is impossible', async () => {
    await page.locator('#open-graph').selectOption('mlp');
    await page.waitForSelector('g.node[data-id="probs"]');
    await page.locator('button[data-tab="Run"]').click();
    await setField(page.locator('#run-batch'), '8');
    await setField(page.locator('#run-microbatches'), '4');
    await setField(page.locator('#run-stages'), '40');
    const refused = page.locator('#run-refused');
    await refused.waitFor();
    const reason = await refused.textContent();
    console.log(`40 stages: ${reason}`);
    assert.match(reason, /cannot be split into 40 stages: 40 stages for \d+ operator nodes/);
    assert.doesNotMatch(reason, /node 'stages'/);
    assert.ok(await page.locator('#run-button').isDisabled(), 'Run is off');
    await setField(page.locator('#run-stages'), '2');
    await refused.waitFor({ state: 'detached' });
    assert.ok(await page.locator('#run-button').isEnabled(), 'Run is on again');
  });

  it('shows a cold run\'s warm-up apart from the measured micro-batches, with legends and tooltips', async () => {
    await run();
    const gantt = page.locator('#gantt-chart');
    // The warm-up: a labelled band with one block per stage, left of every measured block.
    const label = await gantt.locator('#gantt-warmup .warmup-label').textContent();
    assert.match(label, /^warm-up \d+\.\d+ ms$/);
    assert.equal(await gantt.locator('g.gantt-warmup').count(), 2, 'a warm-up block per stage');
    for (const stage of [0, 1]) {
      assert.equal(await gantt.locator(`g.gantt-block[data-stage="${stage}"]`).count(), 4, `4 measured blocks on stage ${stage}`);
    }
    const warmRight = Math.max(...await gantt.locator('g.gantt-warmup rect').evaluateAll((rs) => rs.map((r) => {
      const b = r.getBBox();
      return b.x + b.width;
    })));
    const measuredLeft = Math.min(...await gantt.locator('g.gantt-block rect').evaluateAll((rs) => rs.map((r) => r.getBBox().x)));
    assert.ok(warmRight < measuredLeft, `warm-up ends at x=${warmRight}, measured blocks start at x=${measuredLeft}`);
    const warmTitle = await gantt.locator('g.gantt-warmup title').first().textContent();
    assert.match(warmTitle, /stage 0 · warm-up \(compiling pipelines, first dispatch\) · \d+\.\d+ ms · not measured/);

    // Tooltips with milliseconds: blocks, transfers, heat cells, utilisation lines and bins.
    const blockTitles = await gantt.locator('g.gantt-block > title').allTextContents();
    assert.equal(blockTitles.length, 8);
    for (const t of blockTitles) assert.match(t, /^stage \d · micro-batch \d · \d+\.\d\d ms \(\d+\.\d–\d+\.\d ms\)$/);
    const transferTitles = await gantt.locator('rect.gantt-transfer > title').allTextContents();
    assert.ok(transferTitles.length > 0, 'transfers between the stages are drawn');
    assert.match(transferTitles[0], /^transfer on stage \d · micro-batch \d · .+ · \d+\.\d\d ms/);
    const heatTitles = await page.locator('#heat-map .heat-cell').evaluateAll((els) => els.map((e) => e.title));
    assert.ok(heatTitles.length >= 2, `heat cells: ${heatTitles}`);
    for (const t of heatTitles) assert.match(t, /^\S+ \(\w+\): \d+\.\d\d ms GPU, \d+% of the run's GPU time$/);
    const utilTitles = await page.locator('#utilisation-chart polyline.util-line > title').allTextContents();
    assert.equal(utilTitles.length, 2);
    for (const t of utilTitles) assert.match(t, /busy \d+\.\d\d ms of \d+\.\d\d ms/);
    assert.match(await page.locator('#utilisation-chart rect.util-bin > title').first().textContent(), /^\d+\.\d\d–\d+\.\d\d ms: device 0 /);

    // Legends: what a Gantt block, row, transfer and the warm-up are; the heat map's scale.
    const ganttLegend = await page.locator('#gantt-legend').textContent();
    for (const word of ['block', 'stages', 'transfer', 'warm-up (compiling pipelines)']) {
      assert.ok(ganttLegend.includes(word), `the Gantt legend says "${word}": ${ganttLegend}`);
    }
    assert.match(await page.locator('#heat-legend').textContent(), /^0 ms.*\d+\.\d\d ms/);
    const devices = await page.locator('#utilisation-legend .legend-item').evaluateAll((els) => els.map((e) => [e.textContent, e.title]));
    assert.equal(devices.length, 2);
    assert.notEqual(devices[0][0], devices[1][0], 'the two devices\' legends differ');
    for (const [text, title] of devices) assert.ok(title.length > 0 && text.length > 0, `device legend ${text} / ${title}`);

    // Figures: every one explained; the measured ones say numbers, the warm-up its time.
    const figs = await figures();
    for (const [name, [value, doc]] of Object.entries(figs)) {
      console.log(`cold run ${name}: ${value}`);
      assert.ok(doc.length > 15, `figure ${name} is explained`);
    }
    assert.match(figs['warm-up'][0], MS);
    assert.match(figs.throughput[0], /samples\/s \(4 of 4 micro-batches back\)/);
    assert.match(figs.bubble[0], /% measured · 20\.0% ideal/);
    assert.match(figs.overlap[1], /upload/);
    assert.match(figs.timing[1], /times/);
    console.log(`devices: ${devices.map(([t, full]) => `${t} (${full})`).join(' | ')}`);
    await closeNotice(page);
    await page.locator('#charts').screenshot({ path: join(shots, 'run-charts-cold.png') });
    await page.screenshot({ path: join(shots, 'run-charts-cold-page.png') });
  });

  it('runs the same pipeline again, already compiled, without a warm-up', async () => {
    await run();
    assert.equal(await page.locator('#gantt-chart g.gantt-warmup').count(), 0, 'no warm-up on a warm run');
    assert.match(await page.locator('#gantt-warmup-legend').textContent(), /warm-up: none/);
    const figs = await figures();
    assert.equal(figs['warm-up'][0], 'none');
    for (const [name, [value]] of Object.entries(figs)) console.log(`warm run ${name}: ${value}`);
    await page.locator('#charts').screenshot({ path: join(shots, 'run-charts-warm.png') });
  });

  /**
   * The heat map's cells against the busy time the utilisation chart shows: the cells of
   * each stage sum to exactly its device's busy nanoseconds, every node has one cell, and
   * every stage's time lands on its own nodes.
   */
  async function checkHeatAgainstBusy(what) {
    const cells = await page.locator('#heat-map .heat-cell').evaluateAll((els) => els.map((e) => ({
      node: e.dataset.node, stage: Number(e.dataset.stage), ns: BigInt(e.dataset.ns),
    })));
    const busy = await page.locator('#utilisation-chart polyline.util-line').evaluateAll((els) => els.map((e) => ({
      device: Number(e.dataset.device), ns: e.dataset.busyNs,
    })));
    assert.equal(busy.length, 2, `${what}: two devices`);
    assert.equal(new Set(cells.map((c) => c.node)).size, cells.length, `${what}: one cell per node`);
    for (const { device, ns } of busy) {
      assert.ok(ns !== undefined, `${what}: device ${device} says its busy time`);
      const own = cells.filter((c) => c.stage === device);
      assert.ok(own.length > 0, `${what}: stage ${device} has nodes in the heat map`);
      const sum = own.reduce((a, c) => a + c.ns, 0n);
      console.log(`${what}: stage ${device} busy ${ns} ns, its ${own.length} nodes sum to ${sum} ns`);
      assert.equal(sum, BigInt(ns), `${what}: the nodes of stage ${device} sum to its busy time`);
    }
    // The same split as the run's own: the first layer on stage 0, the output on stage 1.
    assert.equal(cells.find((c) => c.node === 'fc1')?.stage, 0, `${what}: ${JSON.stringify(cells.map((c) => [c.node, c.stage]))}`);
    assert.equal(cells.find((c) => c.node === 'probs')?.stage, 1, `${what}: ${JSON.stringify(cells.map((c) => [c.node, c.stage]))}`);
  }

  it('charges each stage\'s busy time to its own nodes, on the server and in the browser', async () => {
    await checkHeatAgainstBusy('server run');
    await page.waitForFunction(() => document.querySelector('#browser-gpu')?.textContent.startsWith('this browser:'), null, { timeout: 60_000 });
    await page.locator('#run-target').selectOption('browser');
    await run();
    await checkHeatAgainstBusy('browser run');
    await page.locator('#run-target').selectOption('server');
  });

  it('clears the charts when another graph is opened', async () => {
    await page.locator('#open-graph').selectOption('cnn');
    await page.locator('#charts').waitFor({ state: 'detached' });
    assert.equal(await page.getAttribute('#run-status', 'data-status'), 'idle');
    assert.deepEqual(pageErrors, []);
  });

  it('tunes a large matrix product for this browser\'s WebGPU adapter and says what it tried and chose', async () => {
    await page.waitForFunction(() => document.querySelector('#browser-gpu')?.textContent.startsWith('this browser:'), null, { timeout: 60_000 });
    const notice = await noticeAfter(page, () => page.setInputFiles('#import-file', join(ROOT, 'assets/bench/w1_matmul.json')));
    assert.match(notice, /^imported 'w1_matmul\.json'/);
    await closeNotice(page);
    await page.locator('button[data-tab="Run"]').click();
    await setField(page.locator('#run-batch'), '128');
    await setField(page.locator('#run-microbatches'), '1');
    await setField(page.locator('#run-stages'), '1');
    await page.locator('#run-target').selectOption('browser');
    await run();
    const figure = page.locator('#run-figures .figure[data-figure="kernels"]');
    const value = await figure.locator('.figure-value').textContent();
    const lines = (await figure.getAttribute('title')).split('\n').slice(1);
    console.log(`browser run of w1_matmul at batch 128, kernels: ${value}`);
    for (const line of lines) console.log(`  ${line}`);
    assert.equal(value, '1 tuned');
    assert.equal(lines.length, 1);
    const variant = '(?:(?:blocked|textured) \\d+x\\d+ \\d+x\\d+|tiled 64x64)';
    assert.match(lines[0], new RegExp(`^m128 n1024 k1024 f32·f32→f32 f32: chose ${variant} \\(measured; tried `));
    const tried = [...lines[0].matchAll(new RegExp(`(${variant}) (\\d+\\.\\d+) ms`, 'g'))];
    assert.ok(tried.length >= 2, `tried ${tried.length} variants`);
    const chosen = lines[0].match(new RegExp(`chose (${variant})`))[1];
    assert.ok(tried.some((t) => t[1] === chosen), 'the chosen variant was among those tried');
    await page.locator('#charts').screenshot({ path: join(shots, 'run-browser-tuned.png') });
    assert.deepEqual(pageErrors, []);
  });
});
