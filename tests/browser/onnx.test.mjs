// ONNX models in the editor, in a real headless Chromium: import mlp_tiny through the
// Import button (the engine's importer compiled to wasm), edit it in the properties panel,
// run it in the page with the imported weights, export it with "Export ONNX" and check that
// onnxruntime (the Python oracle) gives what Sluice's CPU reference gives for the edited
// graph; refuse a model with an unsupported operator with the importer's message; drop
// the resnet18_style model and a generated ResNet-101-style model (345 nodes) on the canvas,
// check each opens readably (legible titles, edges around nodes, labels clear), screenshot
// them and time attribute edits on them; run an imported model not yet saved on the server
// and in the browser (the same checksum: the editor sends the model's weights with the
// run), and after a reload, which keeps the graph but not its weights, say so where the
// run starts. The steps share
// one page and run in order. Needs `sluice` with `import` (SLUICE_BIN) and the Python
// oracle (scripts/python-oracle.sh makes its venv: onnxruntime and onnx).

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import {
  assertReadable, closeNotice, draftDoc, launchChromium, layoutReport, noticeAfter, openEditor, readNpy,
  screenshotDir, selectNode, setField, startServer,
} from './support.mjs';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '../..');
const MODELS = join(ROOT, 'tests/data/onnx-models');
const RUN_TIMEOUT = 240_000;

/** The Python with onnxruntime and onnx (scripts/python-oracle.sh makes its venv). */
function oraclePython() {
  return execFileSync('bash', [join(ROOT, 'scripts/python-oracle.sh'), '--python'], { encoding: 'utf8' }).trim();
}

/** The one .npy file a run wrote into `dir`. */
function onlyNpy(dir) {
  const files = readdirSync(dir).filter((f) => f.endsWith('.npy'));
  assert.equal(files.length, 1, `one output in ${dir}: ${files}`);
  return readNpy(readFileSync(join(dir, files[0])));
}

function maxAbsDifference(a, b) {
  assert.deepEqual(a.shape, b.shape);
  let worst = 0;
  for (let i = 0; i < a.values.length; i += 1) worst = Math.max(worst, Math.abs(a.values[i] - b.values[i]));
  return worst;
}

describe('ONNX models in the editor', { timeout: 900_000 }, () => {
  let server;
  let browser;
  let page;
  const work = mkdtempSync(join(tmpdir(), 'sluice-onnx-'));
  const shots = screenshotDir();
  const pageErrors = [];

  before(async () => {
    server = await startServer();
    browser = await launchChromium();
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 }, acceptDownloads: true });
    page = await openEditor(context, server.url, pageErrors);
  });

  after(async () => {
    await browser?.close();
    server?.stop();
  });


  /** Picks `path` in the Import button's file input; resolves to the notice it gives. */
  function importFile(path) {
    return noticeAfter(page, () => page.setInputFiles('#import-file', path));
  }

  /** Drops the file at `path` on the canvas; resolves to the notice it gives. */
  function dropFile(path) {
    const bytes = readFileSync(path).toString('base64');
    return noticeAfter(page, () => page.evaluate(([name, b64]) => {
      const data = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      const transfer = new DataTransfer();
      transfer.items.add(new File([data], name));
      const wrap = document.querySelector('.canvas-wrap');
      wrap.dispatchEvent(new DragEvent('dragover', { dataTransfer: transfer, bubbles: true, cancelable: true }));
      wrap.dispatchEvent(new DragEvent('drop', { dataTransfer: transfer, bubbles: true, cancelable: true }));
    }, [path.split('/').pop(), bytes]));
  }

  /** The ids of the document's nodes with operator `op`. */
  async function nodesOf(op) {
    return (await draftDoc(page)).nodes.filter((n) => n.op === op).map((n) => n.id);
  }

  /** Scrolls the canvas (the wheel pans it) until node `id` is in the middle third. */
  async function bringIntoView(id) {
    const canvas = await page.locator('#canvas').boundingBox();
    await page.mouse.move(canvas.x + canvas.width / 2, canvas.y + canvas.height / 2);
    for (let i = 0; i < 10; i += 1) {
      const box = await page.locator(`g.node[data-id="${id}"] rect.body`).boundingBox();
      const dx = canvas.x + canvas.width / 2 - (box.x + box.width / 2);
      const dy = canvas.y + canvas.height / 2 - (box.y + box.height / 2);
      if (Math.abs(dx) < canvas.width / 3 && Math.abs(dy) < canvas.height / 3) return;
      await page.mouse.wheel(-dx, -dy);
      await settled();
    }
    throw new Error(`cannot bring ${id} into view`);
  }

  /** Waits until the page has handled what was queued and painted a frame. */
  async function settled() {
    await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0))));
  }

  it('imports mlp_tiny.onnx, drops the first bias, runs it with the imported weights, exports what onnxruntime computes alike, and saves it with its weights', async () => {
    const notice = await importFile(join(MODELS, 'mlp_tiny/model.onnx'));
    assert.match(notice, /^imported model\.onnx: opset 17, \d+ ONNX nodes → \d+ nodes/);
    console.log(notice);
    const linears = await nodesOf('linear');
    assert.equal(linears.length, 2, `two linear layers: ${JSON.stringify(await draftDoc(page))}`);
    assert.equal(await page.locator('.problems summary').textContent(), 'graph valid');

    // The edit: the first layer loses its bias (its weight keeps the imported values).
    await selectNode(page, linears[0]);
    const bias = page.locator('input[type="checkbox"][data-attr="bias"]');
    assert.equal(await bias.isChecked(), true);
    await bias.uncheck();
    await settled();
    const edited = await draftDoc(page);
    assert.equal(edited.nodes.find((n) => n.id === linears[0]).attrs.bias, false);

    // Sluice's CPU reference on the edited graph with the imported weights (the CLI's
    // importer writes them next to the graph it makes).
    const sluice = process.env.SLUICE_BIN;
    const dir = join(work, 'mlp');
    execFileSync(sluice, ['import', join(MODELS, 'mlp_tiny/model.onnx'), '--out', dir]);
    const imported = JSON.parse(readFileSync(join(dir, 'model.json'), 'utf8'));
    writeFileSync(join(dir, 'edited.json'), JSON.stringify({ ...edited, params: imported.params }));
    const input = join(MODELS, 'mlp_tiny/input_0.npy');
    execFileSync(sluice, ['run', join(dir, 'edited.json'), '--device', 'cpu', '--batch', '2',
      '--input', `x=${input}`, '--output', join(dir, 'sluice')]);
    const reference = onlyNpy(join(dir, 'sluice'));

    // The editor's browser run uses the imported weights: same answer as the CLI on the
    // same seeded inputs (seed 0, batch 8, the run panel's defaults).
    execFileSync(sluice, ['run', join(dir, 'edited.json'), '--device', 'cpu', '--batch', '8',
      '--seed-inputs', '--output', join(dir, 'seeded')]);
    await page.locator('button[data-tab="Run"]').click();
    await page.locator('#run-target').selectOption('browser');
    await page.locator('#run-button').click();
    await page.waitForSelector('#run-status[data-status="succeeded"], #run-status[data-status="failed"]', { timeout: RUN_TIMEOUT });
    assert.equal(await page.getAttribute('#run-status', 'data-status'), 'succeeded', await page.locator('#run-status').textContent());
    const [npyDownload] = await Promise.all([
      page.waitForEvent('download'),
      page.locator('.output .download-npy').first().click(),
    ]);
    const browserRun = readNpy(readFileSync(await npyDownload.path()));
    const browserWorst = maxAbsDifference(browserRun, onlyNpy(join(dir, 'seeded')));
    console.log(`browser run with the imported weights vs sluice run: max abs difference ${browserWorst.toExponential(2)}`);
    assert.ok(browserWorst <= 1e-4, `browser run differs by ${browserWorst}`);

    // Export ONNX and run the download in onnxruntime on the fixture's input.
    const [download] = await Promise.all([page.waitForEvent('download'), page.locator('#export-onnx').click()]);
    assert.equal(download.suggestedFilename(), 'model.onnx');
    const model = join(dir, 'exported.onnx');
    await download.saveAs(model);
    mkdirSync(join(dir, 'ort'));
    execFileSync(oraclePython(), [join(ROOT, 'scripts/onnx_run.py'), model, join(dir, 'ort'), `x=${input}`]);
    const ort = readNpy(readFileSync(join(dir, 'ort/output_0.npy')));
    const worst = maxAbsDifference(ort, reference);
    console.log(`exported edited mlp_tiny: onnxruntime vs Sluice's CPU reference, ${ort.values.length} values: max abs difference ${worst.toExponential(2)}`);
    assert.ok(worst <= 1e-5, `onnxruntime differs from Sluice by ${worst}`);
    // The edit is in the exported model: the unedited model's outputs differ.
    const original = readNpy(readFileSync(join(MODELS, 'mlp_tiny/output_0.npy')));
    assert.ok(maxAbsDifference(ort, original) > 1e-3, 'the exported model is the edited one');

    // Saved to the workspace with its weights: a server run gives the same answer, and
    // the graph opened again from the workspace runs in the browser with those weights.
    const seeded = onlyNpy(join(dir, 'seeded'));
    await setField(page.locator('#graph-name'), 'tiny_edited');
    await page.evaluate(() => document.activeElement?.blur());
    const saved = await noticeAfter(page, () => page.keyboard.press('Control+s'));
    assert.match(saved, /saved 'tiny_edited' with its weights \(tiny_edited\.safetensors\)/);
    const stored = await (await fetch(`${server.url}/api/graphs/tiny_edited`)).json();
    assert.equal(stored.params.file, 'tiny_edited.safetensors');
    const runOutput = async (target) => {
      await page.locator('button[data-tab="Run"]').click();
      await page.locator('#run-target').selectOption(target);
      await page.locator('#run-button').click();
      await page.waitForSelector('#run-status[data-status="succeeded"], #run-status[data-status="failed"]', { timeout: RUN_TIMEOUT });
      assert.equal(await page.getAttribute('#run-status', 'data-status'), 'succeeded', await page.locator('#run-status').textContent());
      const [file] = await Promise.all([page.waitForEvent('download'), page.locator('.output .download-npy').first().click()]);
      return readNpy(readFileSync(await file.path()));
    };
    const serverWorst = maxAbsDifference(await runOutput('server'), seeded);
    console.log(`saved edited mlp_tiny run on the server vs sluice run: max abs difference ${serverWorst.toExponential(2)}`);
    assert.ok(serverWorst <= 1e-4, `the server run differs by ${serverWorst}`);
    await page.evaluate(() => localStorage.clear());
    await page.reload();
    await page.waitForSelector('body[data-ready-ms]');
    const opened = await noticeAfter(page, () => page.locator('#open-graph').selectOption('tiny_edited'));
    assert.match(opened, /opened 'tiny_edited' with its weights/);
    const reopenedWorst = maxAbsDifference(await runOutput('browser'), seeded);
    console.log(`reopened from the workspace, run in the browser: max abs difference ${reopenedWorst.toExponential(2)}`);
    assert.ok(reopenedWorst <= 1e-4, `the reopened graph's browser run differs by ${reopenedWorst}`);
  });

  it('refuses a model with operators Sluice cannot run, naming every one', async () => {
    const model = join(work, 'unsupported.onnx');
    execFileSync(oraclePython(), ['-c', `
import onnx, sys
from onnx import helper, TensorProto
nodes = [helper.make_node('Relu', ['x'], ['a']),
         helper.make_node('NoSuchOp', ['a'], ['y1'], name='first_bad'),
         helper.make_node('AlsoMissing', ['a'], ['y2'], name='second_bad')]
out = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4])
graph = helper.make_graph(nodes, 'g', [out('x')], [out('y1'), out('y2')])
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid('', 17)]), sys.argv[1])
`, model]);
    const before = await draftDoc(page);
    const notice = await importFile(model);
    assert.equal(await page.locator('.notice.error').count(), 1, notice);
    assert.match(notice, /cannot import unsupported\.onnx/);
    assert.match(notice, /first_bad/);
    assert.match(notice, /second_bad/);
    assert.deepEqual((await draftDoc(page)).nodes, before.nodes, 'the graph is unchanged');
    // Errors stay until closed, even past the fade of the information notice just before.
    await page.waitForTimeout(4500);
    assert.equal(await page.locator('.notice.error').count(), 1, 'the error is still shown');
  });

  /**
   * Drops `model` on the canvas and checks what opens: every node drawn, the graph valid,
   * titles legible at the zoom it opens at, no edge through a node it does not connect and
   * no label over a node or label (over the whole graph, not only what is in view); then
   * times ten edits (the classifier's bias off and on, each until the page has painted).
   */
  async function openReadably(model, name) {
    const start = performance.now();
    const notice = await dropFile(model);
    const importMs = performance.now() - start;
    console.log(notice);
    assert.match(notice, /^imported \S+: opset \d+, \d+ ONNX nodes → \d+ nodes/);
    const doc = await draftDoc(page);
    assert.equal(await page.locator('g.node').count(), doc.nodes.length + Object.keys(doc.inputs).length);
    assert.equal(await page.locator('.problems summary').textContent(), 'graph valid');
    await closeNotice(page);
    await page.locator('button[data-tab="Properties"]').click();
    await page.screenshot({ path: join(shots, `editor-onnx-${name}.png`) });
    const report = await layoutReport(page);
    console.log(`${name}: ${report.nodes} nodes, ${report.edges} edges laid out and routed in ${importMs.toFixed(0)} ms from the drop (import included); titles ${report.minTitlePx.toFixed(1)} px on screen at ${await page.locator('.zoom-level').textContent()}; ${report.throughNodes.length} edges through nodes, ${report.labelOverlaps.length} label overlaps`);
    assertReadable(report, name);

    // The first residual block, its skip connection beside the main path.
    const [add] = await nodesOf('add');
    await bringIntoView(add);
    await page.screenshot({ path: join(shots, `editor-onnx-${name}-block.png`) });

    const [linear] = await nodesOf('linear');
    await bringIntoView(linear);
    await selectNode(page, linear);
    // A closer look at the classifier's end of the network (Ctrl+wheel zooms at the pointer).
    const body = await page.locator(`g.node[data-id="${linear}"] rect.body`).boundingBox();
    await page.mouse.move(body.x + body.width / 2, body.y + body.height / 2);
    await page.keyboard.down('Control');
    await page.mouse.wheel(0, -300);
    await page.keyboard.up('Control');
    await settled();
    await page.screenshot({ path: join(shots, `editor-onnx-${name}-classifier.png`) });
    const bias = page.locator('input[type="checkbox"][data-attr="bias"]');
    const times = [];
    for (let i = 0; i < 10; i += 1) {
      const begin = performance.now();
      await bias.click();
      await settled();
      times.push(performance.now() - begin);
    }
    const mean = times.reduce((x, y) => x + y, 0) / times.length;
    console.log(`${name} (${doc.nodes.length} nodes): ${mean.toFixed(1)} ms per edit (bias toggled 10 times; each: ${times.map((t) => t.toFixed(0)).join(', ')} ms)`);
    assert.equal((await draftDoc(page)).nodes.find((n) => n.id === linear).attrs.bias ?? true, true);
    assert.deepEqual(pageErrors, []);
  }

  it('imports resnet18_style.onnx dropped on the canvas, lays it out readably, and times edits on it', async () => {
    await openReadably(join(MODELS, 'resnet18_style/model.onnx'), 'resnet18');
  });

  it('lays out a ResNet-101-style model of a few hundred nodes readably, and times edits on it', async () => {
    const model = join(work, 'deep_resnet.onnx');
    execFileSync(oraclePython(), [join(ROOT, 'scripts/onnx_deep_resnet.py'), model]);
    await openReadably(model, 'deep-resnet');
    assert.ok((await draftDoc(page)).nodes.length >= 300, 'a few hundred nodes');

    // Find (Ctrl+F) jumps to a node deep in the model: selected, and in the view.
    await page.keyboard.press('Control+f');
    await page.keyboard.type('layer3.17.b.conv');
    await page.keyboard.press('Enter');
    await settled();
    assert.equal(await page.locator('.find-count').textContent(), '1 of 1');
    const found = page.locator('g.node.selected');
    assert.equal(await found.getAttribute('data-id'), 'layer3.17.b.conv');
    const canvas = await page.locator('#canvas').boundingBox();
    const box = await found.locator('rect.body').boundingBox();
    assert.ok(box.x >= canvas.x && box.x + box.width <= canvas.x + canvas.width
      && box.y >= canvas.y && box.y + box.height <= canvas.y + canvas.height, 'the found node is in view');
    await page.screenshot({ path: join(shots, 'editor-find.png') });
    // By operator, stepping through the matches.
    await page.locator('#find').fill('global_avg');
    await page.keyboard.press('Enter');
    assert.match(await page.locator('.find-count').textContent(), /^1 of 1$/);
    assert.equal(await page.locator('g.node.selected').getAttribute('data-id'), 'pool');
  });

  /** Runs the graph on `target` and resolves to its first output: { values, checksum }. */
  async function runFirstOutput(target) {
    await page.locator('button[data-tab="Run"]').click();
    await page.locator('#run-target').selectOption(target);
    await page.locator('#run-button').click();
    await page.waitForSelector('#run-status[data-status="succeeded"], #run-status[data-status="failed"]', { timeout: RUN_TIMEOUT });
    assert.equal(await page.getAttribute('#run-status', 'data-status'), 'succeeded', await page.locator('#run-status').textContent());
    const checksum = Number(await page.locator('.output .checksum').first().getAttribute('data-checksum'));
    const [file] = await Promise.all([page.waitForEvent('download'), page.locator('.output .download-npy').first().click()]);
    return { ...readNpy(readFileSync(await file.path())), checksum };
  }

  /** The run panel's batch and input seed, as a run request's fields (the editor's runs
   * take their inputs from the input seed, so the request asks for seeded inputs). */
  async function runSettings() {
    return {
      batch: Number(await page.locator('#run-batch').inputValue()),
      seed: Number(await page.locator('#run-seed').inputValue()),
      seed_inputs: true,
    };
  }

  /** The first output's checksum of a run the server makes of `body` (POST /api/runs). */
  async function serverChecksum(body) {
    const reply = await fetch(`${server.url}/api/runs`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
    });
    assert.equal(reply.status, 202, await reply.clone().text());
    const { id } = await reply.json();
    for (let i = 0; i < 600; i += 1) {
      const run = await (await fetch(`${server.url}/api/runs/${id}`)).json();
      if (run.status === 'succeeded') return run.outputs[0].checksum;
      assert.ok(['queued', 'running'].includes(run.status), `run ${id}: ${run.status} ${run.error}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    throw new Error(`run ${id} did not finish`);
  }

  it('runs an imported model not yet saved on the server with its own weights, as the browser does, and says when a reload lost them', async () => {
    const notice = await importFile(join(MODELS, 'mlp_tiny/model.onnx'));
    assert.match(notice, /^imported model\.onnx/);
    await closeNotice(page);
    const browserRun = await runFirstOutput('browser');
    const serverRun = await runFirstOutput('server');
    const worst = maxAbsDifference(serverRun, browserRun);
    console.log(`unsaved imported mlp_tiny: checksum ${serverRun.checksum.toFixed(6)} on the server, ${browserRun.checksum.toFixed(6)} in the browser; max abs difference ${worst.toExponential(2)}`);
    assert.ok(worst <= 1e-4, `the server run differs from the browser run by ${worst}`);
    assert.ok(Math.abs(serverRun.checksum - browserRun.checksum) <= 1e-4 * Math.max(1, Math.abs(browserRun.checksum)),
      `checksums ${serverRun.checksum} (server) and ${browserRun.checksum} (browser)`);
    // The model's weights made that answer: the same graph with seeded weights gives another.
    const seeded = await serverChecksum({ graph: await draftDoc(page), ...await runSettings() });
    console.log(`the same graph with seeded weights: checksum ${seeded.toFixed(6)}`);
    assert.ok(Math.abs(seeded - browserRun.checksum) > 1e-3, `seeded weights give ${seeded} too`);
    assert.equal(await page.locator('#run-weights-lost').count(), 0, 'no warning while the weights are here');

    // After a reload the draft has the graph but not its weights: the run panel says runs
    // use seeded weights, and they do.
    await page.reload();
    await page.waitForSelector('body[data-ready-ms]');
    await page.locator('button[data-tab="Run"]').click();
    const warning = page.locator('#run-weights-lost');
    await warning.waitFor();
    const text = await warning.textContent();
    console.log(`after a reload: ${text}`);
    assert.match(text, /not kept when the page reloaded: runs here and on the server use seeded weights/);
    const reloaded = await runFirstOutput('server');
    const seededNow = await serverChecksum({ graph: await draftDoc(page), ...await runSettings() });
    assert.ok(Math.abs(reloaded.checksum - seededNow) <= 1e-4 * Math.max(1, Math.abs(seededNow)),
      `after the reload the server run gives ${reloaded.checksum}, not the seeded ${seededNow}`);
    // Imported again, the model's weights are back and the warning goes.
    await importFile(join(MODELS, 'mlp_tiny/model.onnx'));
    await warning.waitFor({ state: 'detached' });
    assert.deepEqual(pageErrors, []);
  });
});
