// The editor in a real headless Chromium against a real `sluice serve`: build an MLP by
// mouse and keyboard, refuse a misfit connection with the engine's message, undo/redo,
// run on the server with a 2-stage pipeline, run on this browser's WebGPU and compare
// the outputs, and write screenshots. The steps share one page and run in order: each
// builds on the graph and runs of the one before.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import {
  assertReadable, draftDoc, dropFromPalette, edgeLabel, launchChromium, layoutReport, noticeAfter, readNpy,
  screenshotDir, selectNode,
  setField, startServer, wire,
} from './support.mjs';

const RUN_TIMEOUT = 240_000;

describe('the editor', { timeout: 900_000 }, () => {
  let server;
  let browser;
  let page;
  let serverRunId;
  const shots = screenshotDir();
  const pageErrors = [];
  const dialogs = [];

  before(async () => {
    server = await startServer();
    browser = await launchChromium();
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 }, acceptDownloads: true });
    page = await context.newPage();
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    page.on('dialog', (d) => { dialogs.push(d.message()); d.accept(); });
  });

  after(async () => {
    await browser?.close();
    server?.stop();
  });

  async function openEditor() {
    await page.goto(server.url);
    await page.waitForSelector('body[data-ready-ms]', { timeout: 60_000 });
    return Number(await page.getAttribute('body', 'data-ready-ms'));
  }

  /** Leaves any text field, so keys go to the editor's shortcuts. */
  async function leaveFields() {
    await page.evaluate(() => document.activeElement?.blur());
  }

  /** Clicks something that downloads a file; resolves to the file's JSON. */
  async function downloadJson(locator) {
    const [download] = await Promise.all([page.waitForEvent('download'), locator.click()]);
    return JSON.parse(readFileSync(await download.path(), 'utf8'));
  }

  /** Closes the notice, if one shows, so screenshots see what is under it. */
  async function closeNotice() {
    const close = page.locator('.notice-close');
    if (await close.count()) await close.click();
  }

  async function notice() {
    return page.locator('.notice .notice-text').textContent();
  }

  it('builds an MLP from an empty canvas by mouse and keyboard, saves it and finds it after a reload', async () => {
    const readyMs = await openEditor();
    console.log(`editor ready ${readyMs} ms after navigation (local server, 1280x800)`);
    assert.equal(await page.locator('g.node').count(), 0, 'the canvas starts empty');

    await dropFromPalette(page, 'input', 110, 90);
    await dropFromPalette(page, 'linear', 330, 90);
    await dropFromPalette(page, 'relu', 550, 90);
    await dropFromPalette(page, 'linear', 330, 290);
    await dropFromPalette(page, 'softmax', 550, 290);
    const ids = await page.locator('g.node').evaluateAll((els) => els.map((e) => e.dataset.id).sort());
    assert.deepEqual(ids, ['linear1', 'linear2', 'relu1', 'softmax1', 'x']);

    await wire(page, 'x', 0, 'linear1', 0);
    await wire(page, 'linear1', 0, 'relu1', 0);
    await wire(page, 'relu1', 0, 'linear2', 0);
    await wire(page, 'linear2', 0, 'softmax1', 0);
    assert.equal(await page.locator('g.edge').count(), 4, 'four connections made by dragging');

    // Properties: the input's shape, out_features, the graph output.
    await selectNode(page, 'x');
    await setField(page.locator('#prop-shape'), 'N, 784');
    await selectNode(page, 'linear1');
    await setField(page.locator('input[data-attr="out_features"]'), '512');
    await selectNode(page, 'linear2');
    await setField(page.locator('input[data-attr="out_features"]'), '10');
    await selectNode(page, 'softmax1');
    await page.locator('input.graph-output[data-ref="softmax1"]').check();

    const expected = {
      'x>linear1': 'f32 [N, 784]',
      'linear1>relu1': 'f32 [N, 512]',
      'relu1>linear2': 'f32 [N, 512]',
      'linear2>softmax1': 'f32 [N, 10]',
    };
    for (const [edge, label] of Object.entries(expected)) {
      const [from, to] = edge.split('>');
      assert.equal(await edgeLabel(page, from, to), label, `edge ${edge}`);
    }
    assert.equal(await page.locator('.problems summary').textContent(), 'graph valid');
    await page.keyboard.press('Escape');
    await page.screenshot({ path: join(shots, 'editor-mlp.png') });

    // Name it, save with Ctrl+S, reload.
    await setField(page.locator('#graph-name'), 'mlp_drawn');
    await leaveFields();
    assert.match(await noticeAfter(page, () => page.keyboard.press('Control+s')), /saved 'mlp_drawn'/);
    await page.waitForSelector('.dirty[data-dirty="false"]');
    const stored = await (await fetch(`${server.url}/api/graphs/mlp_drawn`)).json();
    assert.deepEqual(stored.nodes.map((n) => n.op), ['linear', 'relu', 'linear', 'softmax']);
    assert.deepEqual(stored.outputs, ['softmax1']);
    assert.deepEqual(stored.inputs.x.shape, ['N', 784]);

    await openEditor();
    assert.equal(await page.locator('#graph-name').inputValue(), 'mlp_drawn');
    assert.equal(await page.locator('g.node').count(), 5);
    for (const [edge, label] of Object.entries(expected)) {
      const [from, to] = edge.split('>');
      assert.equal(await edgeLabel(page, from, to), label, `edge ${edge} after the reload`);
    }
    assert.equal(await page.getAttribute('.dirty', 'data-dirty'), 'false');

    // And from the workspace itself, with the local draft gone.
    await page.evaluate(() => localStorage.clear());
    await openEditor();
    assert.equal(await page.locator('g.node').count(), 0, 'no draft: a new graph');
    assert.equal(await page.locator('.dirty').textContent(), 'new');
    await page.locator('#open-graph').selectOption('mlp_drawn');
    await page.waitForSelector('g.node[data-id="softmax1"]');
    assert.deepEqual(dialogs, [], 'an untouched new graph is replaced without asking');
    assert.equal(await edgeLabel(page, 'linear2', 'softmax1'), 'f32 [N, 10]');
  });

  it('refuses an incompatible connection with the engine\'s message, and undo/redo restore exact states', async () => {
    const s0 = await draftDoc(page);
    await dropFromPalette(page, 'add', 120, 560);
    await page.waitForSelector('g.node[data-id="add1"]');
    const s1 = await draftDoc(page);
    await wire(page, 'linear1', 0, 'add1', 0);
    const s2 = await draftDoc(page);
    assert.deepEqual(s2.nodes.find((n) => n.id === 'add1').inputs, ['linear1', '']);

    // [N, 10] cannot be added to [N, 512]: refused, the reason on screen, nothing changed.
    await wire(page, 'linear2', 0, 'add1', 1);
    const message = await page.locator('.notice.error .notice-text').textContent();
    assert.match(message, /connection refused: 'add1' cannot take 'linear2' at input 1/);
    assert.deepEqual(await draftDoc(page), s2, 'a refused connection changes nothing');
    await page.screenshot({ path: join(shots, 'editor-refused-connection.png') });

    // The reason is the engine's: `sluice validate` says the same of that graph.
    const engineMessage = message.split('at input 1: ')[1];
    const bad = structuredClone(s2);
    bad.nodes.find((n) => n.id === 'add1').inputs = ['linear1', 'linear2'];
    bad.outputs = ['add1'];
    delete bad.layout;
    const file = join(server.workspace, 'misfit.json');
    writeFileSync(file, JSON.stringify(bad));
    let cli = '';
    try {
      execFileSync(process.env.SLUICE_BIN, ['validate', file], { encoding: 'utf8', stdio: 'pipe' });
    } catch (e) {
      cli = `${e.stdout}${e.stderr}`;
    }
    assert.ok(cli.includes(engineMessage), `the CLI says:\n${cli}\nthe editor said: ${engineMessage}`);

    // Undo twice (Ctrl+Z), redo twice (Ctrl+Shift+Z): the exact documents each time.
    await leaveFields();
    await page.keyboard.press('Control+z');
    assert.deepEqual(await draftDoc(page), s1);
    await page.keyboard.press('Control+z');
    assert.deepEqual(await draftDoc(page), s0);
    assert.equal(await page.locator('g.node[data-id="add1"]').count(), 0);
    await page.keyboard.press('Control+Shift+z');
    assert.deepEqual(await draftDoc(page), s1);
    await page.keyboard.press('Control+Shift+z');
    assert.deepEqual(await draftDoc(page), s2);
    // Delete removes the selected node, and undo brings it back.
    await page.locator('g.node[data-id="add1"] rect.body').click();
    await page.keyboard.press('Delete');
    assert.equal(await page.locator('g.node[data-id="add1"]').count(), 0);
    await page.keyboard.press('Control+z');
    assert.deepEqual(await draftDoc(page), s2);

    // Unsaved work survives a reload: the draft comes back, marked unsaved.
    await openEditor();
    assert.deepEqual(await draftDoc(page), s2);
    assert.equal(await page.locator('g.node[data-id="add1"]').count(), 1);
    assert.equal(await page.getAttribute('.dirty', 'data-dirty'), 'true');
    assert.match(await notice(), /restored your unsaved changes to 'mlp_drawn'/);
  });

  it('runs mlp.json on the server: outputs, utilisation, and a Gantt of 2 stages x 4 micro-batches', async () => {
    await page.locator('#open-graph').selectOption('mlp');
    await page.waitForSelector('g.node[data-id="probs"]');
    await page.locator('button[data-tab="Run"]').click();
    await setField(page.locator('#run-batch'), '8');
    await setField(page.locator('#run-microbatches'), '4');
    await setField(page.locator('#run-stages'), '2');
    assert.equal(await page.locator('.stage-row').count(), 2, 'the stage split is shown');
    await page.locator('#run-button').click();
    await page.waitForSelector('#run-status[data-status="succeeded"], #run-status[data-status="failed"]', { timeout: RUN_TIMEOUT });
    const status = await page.locator('#run-status').textContent();
    assert.equal(await page.getAttribute('#run-status', 'data-status'), 'succeeded', status);
    serverRunId = status.match(/server run ([0-9a-f]{16}) succeeded/)[1];

    const output = page.locator('.output[data-output="probs"]');
    assert.match(await output.textContent(), /probs f32 \[8, 10\]/);
    assert.ok(await page.locator('#utilisation-chart polyline.util-line').count() >= 1, 'a utilisation line');
    assert.equal(await page.locator('#gantt-chart g.gantt-row').count(), 2, 'two stage rows');
    for (const stage of [0, 1]) {
      assert.equal(await page.locator(`#gantt-chart g.gantt-block[data-stage="${stage}"]`).count(), 4, `4 blocks on stage ${stage}`);
    }
    const bubble = await page.locator('#run-figures [data-figure="bubble"] .figure-value').textContent();
    assert.match(bubble, /% measured · 20\.0% ideal/);
    console.log(`server run ${serverRunId}: bubble ${bubble}`);
    await closeNotice();
    await page.screenshot({ path: join(shots, 'run-server-pipeline.png') });

    // The run's Chrome trace downloads, with a compute track per stage.
    const trace = await downloadJson(page.locator('#trace-button'));
    const tracks = new Set(trace.traceEvents.filter((e) => e.ph === 'X').map((e) => `${e.pid}/${e.tid}`));
    assert.ok(tracks.size >= 2, `trace tracks: ${[...tracks]}`);

    // Heat map of GPU time per node.
    await page.locator('#heat').check();
    const fills = await page.locator('g.node rect.body').evaluateAll((els) => els.map((e) => e.getAttribute('fill')));
    assert.ok(fills.some((f) => f !== '#ffffff' && f !== '#f4f4f4'), `heat colours: ${fills}`);
    await page.screenshot({ path: join(shots, 'run-server-heatmap.png') });
    await page.locator('#heat').uncheck();
  });

  it('runs mlp.json in this browser on WebGPU with the server\'s outputs for the same seed', async () => {
    await page.waitForFunction(() => document.querySelector('#browser-gpu')?.textContent.startsWith('this browser:'), null, { timeout: 60_000 });
    console.log(await page.locator('#browser-gpu').textContent());
    await page.locator('#run-target').selectOption('browser');
    await page.locator('#run-button').click();
    await page.waitForSelector('#run-status[data-status="succeeded"], #run-status[data-status="failed"]', { timeout: RUN_TIMEOUT });
    const status = await page.locator('#run-status').textContent();
    assert.equal(await page.getAttribute('#run-status', 'data-status'), 'succeeded', status);
    assert.match(status, /browser run/);
    assert.equal(await page.locator('#gantt-chart g.gantt-row').count(), 2);
    await closeNotice();
    await page.screenshot({ path: join(shots, 'run-browser-webgpu.png') });
    const trace = await downloadJson(page.locator('#trace-button'));
    assert.ok(trace.traceEvents.some((e) => e.ph === 'X'), 'the browser run\'s trace has slices');

    const [download] = await Promise.all([
      page.waitForEvent('download'),
      page.locator('.output[data-output="probs"] .download-npy').click(),
    ]);
    const browserNpy = readNpy(readFileSync(await download.path()));
    const serverNpy = readNpy(Buffer.from(await (await fetch(`${server.url}/api/runs/${serverRunId}/outputs/probs`)).arrayBuffer()));
    assert.deepEqual(browserNpy.shape, [8, 10]);
    assert.deepEqual(serverNpy.shape, [8, 10]);
    let worst = 0;
    for (let i = 0; i < serverNpy.values.length; i += 1) {
      worst = Math.max(worst, Math.abs(browserNpy.values[i] - serverNpy.values[i]));
    }
    console.log(`browser vs server, ${serverNpy.values.length} values: max abs difference ${worst.toExponential(2)}`);
    assert.ok(worst <= 1e-4, `max abs difference ${worst}`);
  });

  it('opens the three examples readably: titles legible, edges around nodes, labels clear', async () => {
    const examples = ['mlp', 'cnn', 'transformer_block'];
    for (const name of examples) {
      await page.locator('#open-graph').selectOption(name);
      await page.waitForFunction((n) => document.querySelector('#graph-name')?.value === n, name);
      // The notice says so, even when the previous open's notice was still showing.
      await page.waitForFunction((n) => document.querySelector('.notice .notice-text')?.textContent === `opened '${n}'`, name);
      await page.waitForSelector('g.node');
      const report = await layoutReport(page);
      console.log(`${name}: ${report.nodes} nodes, ${report.edges} edges; titles ${report.minTitlePx.toFixed(1)} px at ${await page.locator('.zoom-level').textContent()}; ${report.throughNodes.length} edges through nodes, ${report.labelOverlaps.length} label overlaps`);
      await page.screenshot({ path: join(shots, `editor-example-${name}.png`) });
      assertReadable(report, name);
    }
  });

  it('follows the system\'s colour scheme: a dark theme with readable node titles', async () => {
    const colours = () => page.evaluate(() => {
      // WCAG relative luminance and contrast of computed colours.
      const lum = (c) => {
        const [r, g, b] = c.match(/[\d.]+/g).slice(0, 3).map((v) => Number(v) / 255)
          .map((v) => (v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4));
        return 0.2126 * r + 0.7152 * g + 0.0722 * b;
      };
      const contrast = (a, b) => (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
      const canvas = lum(getComputedStyle(document.querySelector('#canvas')).backgroundColor);
      const node = lum(getComputedStyle(document.querySelector('g.node rect.body')).fill);
      const title = lum(getComputedStyle(document.querySelector('g.node text.title')).fill);
      const panel = lum(getComputedStyle(document.querySelector('.side')).backgroundColor);
      const text = lum(getComputedStyle(document.querySelector('.side')).color);
      return { canvas, node, titleContrast: contrast(node, title), panelContrast: contrast(panel, text) };
    });
    await page.emulateMedia({ colorScheme: 'dark' });
    const dark = await colours();
    await page.screenshot({ path: join(shots, 'editor-dark.png') });
    await page.emulateMedia({ colorScheme: 'light' });
    const light = await colours();
    console.log(`dark theme: canvas luminance ${dark.canvas.toFixed(3)}, node titles contrast ${dark.titleContrast.toFixed(1)}:1, panel text ${dark.panelContrast.toFixed(1)}:1; light theme: canvas ${light.canvas.toFixed(3)}, titles ${light.titleContrast.toFixed(1)}:1`);
    assert.ok(dark.canvas < 0.05 && dark.node < 0.05, `dark canvas and nodes: ${JSON.stringify(dark)}`);
    assert.ok(light.canvas > 0.8 && light.node > 0.8, `light canvas and nodes: ${JSON.stringify(light)}`);
    for (const theme of [dark, light]) {
      assert.ok(theme.titleContrast >= 4.5 && theme.panelContrast >= 4.5, JSON.stringify(theme));
    }
  });

  it('works at 1024x768: every control reachable, and the palette and side panel fold away', async () => {
    await page.setViewportSize({ width: 1024, height: 768 });
    const fits = await page.evaluate(() => {
      const off = [...document.querySelectorAll('.toolbar button, .toolbar select, .toolbar input, .toolbar summary')]
        .filter((e) => !e.classList.contains('hidden'))
        .filter((e) => { const r = e.getBoundingClientRect(); return r.right > innerWidth + 0.5 || r.width === 0; })
        .map((e) => e.id || e.textContent.trim());
      return { off, scroll: document.documentElement.scrollWidth };
    });
    assert.deepEqual(fits.off, [], `toolbar controls off screen: ${fits.off}`);
    assert.ok(fits.scroll <= 1024, `the page is ${fits.scroll} px wide`);
    await page.locator('button[data-tab="Run"]').click();
    await page.locator('#run-button').scrollIntoViewIfNeeded();
    assert.ok(await page.locator('#run-button').isVisible(), 'the Run button is reachable');
    await page.screenshot({ path: join(shots, 'editor-1024x768.png') });
    const width = async () => (await page.locator('#canvas').boundingBox()).width;
    const before = await width();
    await page.locator('#toggle-palette').click();
    await page.locator('#toggle-side').click();
    const wide = await width();
    console.log(`at 1024x768 the canvas is ${before.toFixed(0)} px wide, ${wide.toFixed(0)} px with both panels folded`);
    assert.ok(wide > before + 300, `folding widens the canvas: ${before} → ${wide}`);
    await page.locator('#toggle-palette').click();
    await page.locator('#toggle-side').click();
    assert.equal(await width(), before);
    await page.setViewportSize({ width: 1280, height: 800 });
  });

  it('passes an automated accessibility check (axe-core) with no critical or serious violations', async () => {
    await page.locator('#open-graph').selectOption('mlp');
    await page.waitForFunction(() => document.querySelector('#graph-name')?.value === 'mlp');
    await page.addScriptTag({ path: join(dirname(fileURLToPath(import.meta.url)), 'node_modules/axe-core/axe.min.js') });
    const violations = await page.evaluate(async () => (await window.axe.run(document)).violations
      .map((v) => ({ impact: v.impact, id: v.id, nodes: v.nodes.length, first: v.nodes[0]?.target.join(' ') })));
    console.log(`axe-core: ${violations.length} rule(s) violated: ${violations.map((v) => `${v.id} (${v.impact}, ${v.nodes})`).join(', ') || 'none'}`);
    const bad = violations.filter((v) => v.impact === 'critical' || v.impact === 'serious');
    assert.deepEqual(bad, [], 'no critical or serious accessibility violations');
  });

  it('shows the help overlay and raised no page errors', async () => {
    await leaveFields();
    await page.keyboard.press('?');
    await page.waitForSelector('#help');
    assert.match(await page.locator('#help').textContent(), /Ctrl\+Shift\+Z/);
    await page.screenshot({ path: join(shots, 'help-overlay.png') });
    await page.keyboard.press('Escape');
    assert.deepEqual(pageErrors, []);
  });
});
