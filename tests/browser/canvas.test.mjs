// The canvas for real graphs, in a real headless Chromium against a real `sluice serve`:
// a generated graph of 300 nodes opened readably, found with Ctrl+F, crossed with the
// minimap, and timed (drag frames and attribute edits, measured in the page); a wire
// drawn with the inputs that can take it marked and dropped on the empty canvas for
// quick-add; a graph built and connected with the keyboard alone; malformed graph files
// refused with exactly the CLI's problems; copy and paste through the system clipboard
// between two tabs.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import {
  assertReadable, centre, closeNotice, draftDoc, launchChromium, layoutReport, noticeAfter, openEditor,
  screenshotDir, selectNode, startServer,
} from './support.mjs';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** A residual MLP of `blocks` blocks (linear, relu, linear, add around them) and a head:
 * 4 × blocks + 2 nodes, with a skip edge around every block. */
function residualGraph(blocks) {
  const nodes = [];
  let prev = 'x';
  for (let b = 0; b < blocks; b += 1) {
    nodes.push({ id: `b${b}_fc1`, op: 'linear', inputs: [prev], attrs: { out_features: 32 } });
    nodes.push({ id: `b${b}_act`, op: 'relu', inputs: [`b${b}_fc1`] });
    nodes.push({ id: `b${b}_fc2`, op: 'linear', inputs: [`b${b}_act`], attrs: { out_features: 32 } });
    nodes.push({ id: `b${b}_add`, op: 'add', inputs: [`b${b}_fc2`, prev] });
    prev = `b${b}_add`;
  }
  nodes.push({ id: 'head', op: 'linear', inputs: [prev], attrs: { out_features: 10 } });
  nodes.push({ id: 'probs', op: 'softmax', inputs: ['head'], attrs: { axis: -1 } });
  return {
    format: 'sluice/graph@1', name: `residual${nodes.length}`,
    inputs: { x: { shape: ['N', 32], dtype: 'f32' } }, nodes, outputs: ['probs'], params: { seed: 1 },
  };
}

describe('the canvas', { timeout: 900_000 }, () => {
  let server;
  let browser;
  let context;
  let page;
  let work;
  const shots = screenshotDir();
  const pageErrors = [];

  before(async () => {
    work = mkdtempSync(join(tmpdir(), 'sluice-canvas-'));
    server = await startServer();
    browser = await launchChromium();
    context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: server.url });
    page = await openPage();
  });

  after(async () => {
    await browser?.close();
    server?.stop();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  const openPage = () => openEditor(context, server.url, pageErrors);

  /** Writes `text` to a file of the test's folder; resolves to its path. */
  function file(name, text) {
    const path = join(work, name);
    writeFileSync(path, text);
    return path;
  }

  /** Picks `path` in the Import button's file input; resolves to the notice it gives. */
  function importFile(path, on = page) {
    return noticeAfter(on, () => on.setInputFiles('#import-file', path));
  }

  /** Whether node `id` is drawn wholly inside the canvas. */
  async function inView(id) {
    const canvas = await page.locator('#canvas').boundingBox();
    const box = await page.locator(`g.node[data-id="${id}"] rect.body`).boundingBox();
    return box.x >= canvas.x && box.y >= canvas.y
      && box.x + box.width <= canvas.x + canvas.width && box.y + box.height <= canvas.y + canvas.height;
  }

  it('refuses malformed graph files with exactly the problems `sluice validate` prints', async () => {
    const cases = {
      'wrong_types.json': '{"inputs": [1,2,3], "nodes": "abc"}',
      'unknown_field.json': JSON.stringify({
        format: 'sluice/graph@1', inputs: { x: { shape: [2], dtype: 'f32' } },
        nodes: [{ id: 'r', op: 'relu', inputs: ['x'], colour: 'red' }], outputs: ['r'], extra: 1,
      }),
      'not_an_object.json': '[1, 2]',
      'cut_short.json': '{"format": "sluice/graph@1", "nodes": [',
    };
    for (const [name, text] of Object.entries(cases)) {
      const path = file(name, text);
      let cli;
      try {
        execFileSync(process.env.SLUICE_BIN, ['validate', path], { encoding: 'utf8', stdio: 'pipe' });
        assert.fail(`sluice validate accepted ${name}`);
      } catch (e) {
        assert.equal(e.status, 1, `${name}: ${e.stderr}`);
        cli = e.stderr.trim();
      }
      const problems = cli.slice(`${path}: `.length);
      const shown = await importFile(path);
      console.log(`${name}: the CLI says\n${cli}\nthe editor says\n${shown}`);
      assert.equal(shown, `cannot import '${name}': ${problems}`);
      await closeNotice(page);
    }
    // The editor kept the graph it had: nothing was half-imported.
    assert.equal(await page.locator('g.node').count(), 0);
  });

  it('opens a generated 300-node graph readably, finds a node, moves the view with the minimap, and times drags and edits', async () => {
    const graph = residualGraph(75);
    const notice = await importFile(file('residual.json', JSON.stringify(graph)));
    assert.match(notice, /^imported 'residual\.json'/);
    await closeNotice(page);
    const count = graph.nodes.length + 1;
    assert.equal(await page.locator('g.node').count(), count);
    assert.equal(await page.locator('.problems summary').textContent(), 'graph valid');
    const report = await layoutReport(page);
    console.log(`${graph.name}: ${report.nodes} nodes, ${report.edges} edges; titles ${report.minTitlePx.toFixed(1)} px at ${await page.locator('.zoom-level').textContent()}; ${report.throughNodes.length} edges through nodes, ${report.labelOverlaps.length} label overlaps`);
    assertReadable(report, graph.name);
    await page.screenshot({ path: join(shots, 'canvas-residual300-open.png') });

    // Find: Ctrl+F, an id, Enter: the node is selected and brought into view.
    assert.equal(await inView('b60_fc2'), false, 'the node starts out of view');
    await page.keyboard.press('Control+f');
    await page.keyboard.type('b60_fc2');
    await page.keyboard.press('Enter');
    assert.equal(await inView('b60_fc2'), true, 'find brought the node into view');
    assert.match(await page.locator('g.node[data-id="b60_fc2"]').getAttribute('class'), /selected/);
    await page.keyboard.press('Escape');
    await page.evaluate(() => document.activeElement?.blur());

    // The minimap: a click at the bottom of the graph's sketch shows the graph's end.
    const minimap = page.locator('svg.minimap');
    await minimap.waitFor();
    const sketch = await page.locator('.minimap-nodes').boundingBox();
    assert.equal(await inView('probs'), false);
    const before = await page.locator('#canvas > g').getAttribute('transform');
    // The sketch's outline (a pixel wide at any scale) may reach past the minimap's edge.
    const edge = await minimap.boundingBox();
    const bottom = Math.min(sketch.y + sketch.height, edge.y + edge.height) - 1;
    await page.mouse.click(sketch.x + sketch.width / 2, bottom);
    const moved = await page.locator('#canvas > g').getAttribute('transform');
    assert.notEqual(moved, before, 'the minimap moved the view');
    assert.equal(await inView('probs'), true, 'the view shows the end of the graph');
    // Dragging on the minimap moves the view along, past its edge too: back to the top.
    const top = { x: edge.x + edge.width / 2, y: edge.y - 20 };
    await page.mouse.move(sketch.x + sketch.width / 2, sketch.y + sketch.height / 2);
    await page.mouse.down();
    await page.mouse.move(top.x, top.y, { steps: 5 });
    await page.mouse.up();
    assert.equal(await inView('x'), true, 'dragging the minimap to the top shows the graph input');
    await page.screenshot({ path: join(shots, 'canvas-residual300-minimap.png') });

    // Responsiveness, measured in the page: each pointer move is dispatched at the start
    // of an animation frame and timed until that frame has been rendered.
    await page.keyboard.press('Control+f');
    await page.keyboard.type('b3_act');
    await page.keyboard.press('Enter');
    await page.keyboard.press('Escape');
    await page.evaluate(() => document.activeElement?.blur());
    const body = await centre(page.locator('g.node[data-id="b3_act"] rect.body'));
    const frames = await page.evaluate(async ({ x, y }) => {
      const at = (cx, cy) => ({
        bubbles: true, cancelable: true, clientX: cx, clientY: cy, button: 0, buttons: 1, pointerId: 1, isPrimary: true,
      });
      document.elementFromPoint(x, y).dispatchEvent(new PointerEvent('pointerdown', at(x, y)));
      const times = [];
      for (let i = 1; i <= 30; i += 1) {
        times.push(await new Promise((resolve) => requestAnimationFrame(() => {
          const t0 = performance.now();
          window.dispatchEvent(new PointerEvent('pointermove', at(x + 4 * i, y + 2 * i)));
          setTimeout(() => resolve(performance.now() - t0), 0);
        })));
      }
      window.dispatchEvent(new PointerEvent('pointerup', at(x + 120, y + 60)));
      return times;
    }, body);
    const sorted = [...frames].sort((a, b) => a - b);
    const mean = frames.reduce((a, b) => a + b, 0) / frames.length;
    console.log(`drag on ${count} nodes: ${mean.toFixed(1)} ms per frame on average, median ${sorted[15].toFixed(1)}, worst ${sorted.at(-1).toFixed(1)} (30 frames: ${frames.map((t) => t.toFixed(1)).join(', ')})`);
    const afterDrag = (await draftDoc(page)).layout.b3_act;
    assert.ok(afterDrag, 'the dragged node kept a position');

    // An attribute edit: the bias of a linear layer off and on, each timed from the click
    // at the start of a frame until that frame has been rendered.
    await selectNode(page, 'b3_act');
    await page.keyboard.press('Control+f');
    await page.keyboard.type('b3_fc2');
    await page.keyboard.press('Enter');
    await page.keyboard.press('Escape');
    await page.locator('input[type="checkbox"][data-attr="bias"]').waitFor();
    const edits = await page.evaluate(async () => {
      const times = [];
      for (let i = 0; i < 10; i += 1) {
        times.push(await new Promise((resolve) => requestAnimationFrame(() => {
          const t0 = performance.now();
          document.querySelector('input[type="checkbox"][data-attr="bias"]').click();
          setTimeout(() => resolve(performance.now() - t0), 0);
        })));
      }
      return times;
    });
    const editMean = edits.reduce((a, b) => a + b, 0) / edits.length;
    console.log(`attribute edit on ${count} nodes: ${editMean.toFixed(1)} ms until painted on average, worst ${Math.max(...edits).toFixed(1)} (10 edits: ${edits.map((t) => t.toFixed(0)).join(', ')})`);
    const fc2 = (await draftDoc(page)).nodes.find((n) => n.id === 'b3_fc2');
    assert.equal(fc2.attrs.bias ?? true, true, 'ten toggles leave the bias on');

    // Collapsible blocks: B collapses every block (b0_…, b1_…) into one box whose ports
    // are the block's connections outside; the document does not change.
    await page.evaluate(() => document.activeElement?.blur());
    const nodesBefore = JSON.stringify((await draftDoc(page)).nodes);
    await page.keyboard.press('b');
    await page.locator('g.node.block').first().waitFor();
    assert.equal(await page.locator('g.node.block').count(), 75);
    assert.equal(await page.locator('g.node').count(), 78, '75 boxes, the input, the head and the softmax');
    assert.equal(await page.locator('g.edge').count(), 77);
    assert.equal(await page.locator('g.edge[data-from="⊞b3"][data-to="⊞b4"]').count(), 1);
    assert.equal(JSON.stringify((await draftDoc(page)).nodes), nodesBefore);
    const collapsed = await layoutReport(page);
    console.log(`collapsed: ${collapsed.nodes} boxes and nodes, ${collapsed.edges} edges; ${collapsed.throughNodes.length} edges through nodes, ${collapsed.labelOverlaps.length} label overlaps`);
    assertReadable(collapsed, 'collapsed blocks');
    await page.screenshot({ path: join(shots, 'canvas-blocks-collapsed.png') });
    // A double-click opens one; find opens the block of what it finds.
    await page.keyboard.press('Control+f');
    await page.keyboard.type('b0_act');
    await page.keyboard.press('Enter');
    await page.keyboard.press('Escape');
    assert.equal(await page.locator('g.node.block').count(), 74);
    assert.equal(await inView('b0_act'), true);
    await closeNotice(page);
    const box = await centre(page.locator('g.node[data-id="⊞b1"] rect.body'));
    await page.mouse.dblclick(box.x, box.y);
    assert.equal(await page.locator('g.node.block').count(), 73);
    assert.equal(await page.locator('g.node[data-id="b1_add"]').count(), 1);
    await page.evaluate(() => document.activeElement?.blur());
    await page.keyboard.press('b'); // not all collapsed: collapse all
    await page.keyboard.press('b'); // all collapsed: open all
    assert.equal(await page.locator('g.node').count(), count);
    assert.deepEqual(pageErrors, []);
  });

  it('marks the inputs that can take a wire while it is drawn, and quick-adds a connected node where it is dropped', async () => {
    const notice = await importFile(join(ROOT, 'assets/graphs/mlp.json'));
    assert.match(notice, /^imported 'mlp\.json'/);
    await closeNotice(page);
    await page.locator('.zoom button[title^="Zoom out"]').click();
    const from = await centre(page.locator('g.port.out[data-node="act1"] circle.hit'));
    const canvas = await page.locator('#canvas').boundingBox();
    const empty = { x: canvas.x + canvas.width - 330, y: canvas.y + canvas.height / 2 };
    await page.mouse.move(from.x, from.y);
    await page.mouse.down();
    await page.mouse.move((from.x + empty.x) / 2, (from.y + empty.y) / 2, { steps: 5 });
    // Downstream inputs can take act1's [N, 512]; act1 itself and what feeds it cannot.
    const marked = await page.evaluate(() => ({
      compatible: [...document.querySelectorAll('g.port.in.compatible')].map((g) => g.dataset.node).sort(),
      incompatible: [...document.querySelectorAll('g.port.in.incompatible')].map((g) => g.dataset.node).sort(),
    }));
    console.log(`while wiring from act1: compatible ${marked.compatible.join(', ')}; dimmed ${marked.incompatible.join(', ')}`);
    assert.deepEqual(marked.compatible, ['act2', 'fc2', 'fc3', 'probs']);
    assert.deepEqual(marked.incompatible, ['act1', 'fc1']);
    await page.screenshot({ path: join(shots, 'canvas-wiring.png') });
    await page.mouse.move(empty.x, empty.y, { steps: 5 });
    await page.mouse.up();

    // Quick-add lists what can take a [N, 512] wire: relu, not a pooling over NCHW.
    const menu = page.locator('.search-menu');
    await menu.waitFor();
    const offered = await menu.locator('.menu-label').allTextContents();
    assert.ok(offered.includes('relu') && offered.includes('linear'), offered.join(' '));
    assert.ok(!offered.includes('global_avg_pool'), 'a rank-4 pooling is not offered for a rank-2 wire');
    assert.ok(!offered.includes('input'), 'a graph input takes no wire');
    await page.keyboard.type('sigmoid');
    await page.screenshot({ path: join(shots, 'canvas-quick-add.png') });
    await page.keyboard.press('Enter');
    await menu.waitFor({ state: 'detached' });
    const doc = await draftDoc(page);
    const added = doc.nodes.find((n) => n.op === 'sigmoid');
    assert.ok(added, 'a sigmoid node was added');
    assert.deepEqual(added.inputs, ['act1']);
    const box = await page.locator(`g.node[data-id="${added.id}"] rect.body`).boundingBox();
    assert.ok(Math.abs(box.x + box.width / 2 - empty.x) < box.width, 'the node sits where the wire was dropped');
    assert.equal(await page.locator(`g.edge[data-from="act1"][data-to="${added.id}"]`).count(), 1);
    // Nothing reads the new node: it is flagged, as a note rather than a problem.
    assert.match(await page.locator(`g.node[data-id="${added.id}"]`).getAttribute('class'), /unused/);
    assert.equal(await page.locator('.problems summary').textContent(), 'graph valid · 1 note');
    // Nodes show their key attributes and weight counts; ports say type and producer.
    assert.equal(await page.locator('g.node[data-id="fc2"] text.subtitle').textContent(), 'linear · out_features 512');
    assert.equal(await page.locator('g.node[data-id="fc2"] text.weights').textContent(), '262.7k');
    assert.equal(await page.locator('g.node[data-id="fc2"] > title').textContent(), 'fc2 · linear · out_features 512 · 262656 weight values');
    assert.equal(await page.locator('g.port.in[data-node="fc2"] > title').textContent(), "input 0 'x' of fc2: f32 [N, 512] from 'act1'");
    assert.equal(await page.locator('g.port.out[data-node="fc2"] > title').textContent(), "output 0 'y' of fc2: f32 [N, 512], read by act2");

    // A double-click on the empty canvas opens quick-add with every operator.
    await page.mouse.dblclick(empty.x, empty.y + 150);
    await menu.waitFor();
    const all = await menu.locator('.menu-label').allTextContents();
    assert.ok(all.includes('input') && all.includes('global_avg_pool'), 'unfiltered without a wire');
    await page.keyboard.press('Escape');
    await menu.waitFor({ state: 'detached' });
  });

  it('builds and connects a graph with the keyboard alone', async () => {
    await page.locator('button', { hasText: 'New' }).first().click();
    await page.evaluate(() => document.activeElement?.blur());
    assert.equal(await page.locator('.problems').count(), 0, 'an empty canvas shows no problem');
    const menu = page.locator('.search-menu');
    /** Opens quick-add with A and picks `op`. */
    async function add(op) {
      await page.keyboard.press('a');
      await menu.waitFor();
      await page.keyboard.type(op);
      await page.keyboard.press('Enter');
      await menu.waitFor({ state: 'detached' });
      await page.waitForFunction(() => document.activeElement?.matches?.('g.node'));
    }
    const focused = () => page.evaluate(() => document.activeElement?.dataset?.id ?? null);

    await add('input');
    const input = await focused();
    assert.ok(input, 'the new input has keyboard focus');
    await add('linear'); // below the input, reading it
    const linear = await focused();
    await page.keyboard.press('e');
    await page.waitForFunction(() => document.activeElement?.dataset?.attr === 'out_features');
    await page.keyboard.type('8');
    await page.keyboard.press('Enter');
    await page.keyboard.press('Escape'); // back to the node
    await page.waitForFunction((id) => document.activeElement?.dataset?.id === id, linear);
    await add('relu');
    const relu = await focused();
    // A second relu, unconnected: Escape clears the selection, so A adds it on its own.
    await page.keyboard.press('Escape');
    await page.evaluate(() => document.activeElement?.blur());
    await add('tanh');
    const tanh = await focused();
    // Back to the linear layer with Shift+Tab (focus selects as it goes), C, pick tanh's
    // input, Enter.
    for (let i = 0; i < 10 && (await focused()) !== linear; i += 1) await page.keyboard.press('Shift+Tab');
    assert.equal(await focused(), linear, 'Shift+Tab reaches the linear layer');
    await page.keyboard.press('c');
    await menu.waitFor();
    await page.keyboard.type(tanh);
    await page.keyboard.press('Enter');
    await menu.waitFor({ state: 'detached' });
    // Arrows move the selection, as one undoable edit each.
    const x0 = (await draftDoc(page)).layout[linear][0];
    await page.keyboard.press('ArrowRight');
    await page.keyboard.press('ArrowRight');
    assert.equal((await draftDoc(page)).layout[linear][0], x0 + 40);
    await page.waitForFunction((id) => document.activeElement?.dataset?.id === id, linear);

    const doc = await draftDoc(page);
    const node = (id) => doc.nodes.find((n) => n.id === id);
    assert.ok(doc.inputs[input], `'${input}' is a graph input`);
    assert.deepEqual(node(linear).inputs, [input]);
    assert.equal(node(linear).attrs.out_features, 8);
    assert.deepEqual(node(relu).inputs, [linear]);
    assert.deepEqual(node(tanh).inputs, [linear]);
    console.log(`built with the keyboard: ${input} → ${linear} (out_features 8) → ${relu}, ${tanh}`);
    await page.screenshot({ path: join(shots, 'canvas-keyboard.png') });
  });

  it('right-click menus insert a node into an edge, duplicate, and delete', async () => {
    const notice = await importFile(join(ROOT, 'assets/graphs/mlp.json'));
    assert.match(notice, /^imported 'mlp\.json'/);
    await closeNotice(page);
    const context = page.locator('.context-menu');
    const edge = await centre(page.locator('g.edge[data-edge="act1>fc2:0"] path.edge-hit'));
    await page.mouse.click(edge.x, edge.y, { button: 'right' });
    await context.waitFor();
    await page.screenshot({ path: join(shots, 'canvas-context-menu.png') });
    await context.locator('.context-item', { hasText: 'Insert a node here' }).click();
    await page.locator('.search-menu').waitFor();
    await page.keyboard.type('gelu');
    await page.keyboard.press('Enter');
    let doc = await draftDoc(page);
    const gelu = doc.nodes.find((n) => n.op === 'gelu');
    assert.deepEqual(gelu.inputs, ['act1']);
    assert.deepEqual(doc.nodes.find((n) => n.id === 'fc2').inputs, [gelu.id], 'fc2 now reads the inserted node');
    assert.equal(await page.locator('.problems summary').textContent(), 'graph valid');

    const body = await centre(page.locator(`g.node[data-id="${gelu.id}"] rect.body`));
    await page.mouse.click(body.x, body.y, { button: 'right' });
    await context.locator('.context-item', { hasText: 'Duplicate' }).click();
    doc = await draftDoc(page);
    assert.equal(doc.nodes.filter((n) => n.op === 'gelu').length, 2, 'duplicated');
    await page.mouse.click(body.x, body.y, { button: 'right' });
    await context.locator('.context-item', { hasText: 'Delete' }).click();
    doc = await draftDoc(page);
    assert.ok(!doc.nodes.some((n) => n.id === gelu.id), 'deleted');

    const canvas = await page.locator('#canvas').boundingBox();
    await page.mouse.click(canvas.x + canvas.width - 330, canvas.y + 100, { button: 'right' });
    const items = await context.locator('.context-item span').allTextContents();
    assert.deepEqual(items, ['Add a node here…', 'Paste', 'Select all', 'Lay out', 'Fit']);
    await page.keyboard.press('Escape');
    await context.waitFor({ state: 'detached' });
  });

  it('copies a selection through the system clipboard as graph JSON and pastes it in another tab', async () => {
    const notice = await importFile(join(ROOT, 'assets/graphs/mlp.json'));
    assert.match(notice, /^imported 'mlp\.json'/);
    await closeNotice(page);
    await selectNode(page, 'fc2');
    await page.keyboard.down('Shift');
    await selectNode(page, 'act2');
    await page.keyboard.up('Shift');
    await page.evaluate(() => document.activeElement?.blur());
    const copied = await noticeAfter(page, () => page.keyboard.press('Control+c'));
    assert.equal(copied, 'copied 2 nodes to the clipboard as graph JSON');
    const text = await page.evaluate(() => navigator.clipboard.readText());
    const clip = JSON.parse(text);
    assert.equal(clip.format, 'sluice/graph@1');
    assert.deepEqual(clip.nodes.map((n) => n.id), ['fc2', 'act2']);
    assert.deepEqual(clip.outputs, ['act2']);

    // Pasting in the same tab: fresh ids, beside the originals rather than on them.
    await noticeAfter(page, () => page.keyboard.press('Control+v'));
    const here = await draftDoc(page);
    const pasted = here.nodes.filter((n) => !['fc1', 'act1', 'fc2', 'act2', 'fc3', 'probs'].includes(n.id));
    assert.equal(pasted.length, 2);
    for (const n of pasted) {
      const box = await page.locator(`g.node[data-id="${n.id}"] rect.body`).boundingBox();
      for (const other of ['fc1', 'act1', 'fc2', 'act2', 'fc3', 'probs']) {
        const o = await page.locator(`g.node[data-id="${other}"] rect.body`).boundingBox();
        const overlaps = box.x < o.x + o.width && o.x < box.x + box.width && box.y < o.y + o.height && o.y < box.y + box.height;
        assert.ok(!overlaps, `pasted ${n.id} covers ${other}`);
      }
    }

    // Another tab: a new graph, Ctrl+V.
    const other = await openPage();
    await other.locator('button', { hasText: 'New' }).first().click();
    await other.evaluate(() => document.activeElement?.blur());
    const shown = await noticeAfter(other, () => other.keyboard.press('Control+v'));
    assert.equal(shown, 'pasted 2 nodes');
    const there = await draftDoc(other);
    assert.equal(there.nodes.length, 2);
    const [lin, act] = [there.nodes.find((n) => n.op === 'linear'), there.nodes.find((n) => n.op === 'relu')];
    assert.equal(lin.attrs.out_features, 512, 'attributes travel');
    assert.deepEqual(act.inputs, [lin.id], 'the connection inside the copy travels');
    assert.deepEqual(lin.inputs, [''], 'the input from outside the copy is left open');
    await other.screenshot({ path: join(shots, 'canvas-pasted-other-tab.png') });
    // Text that is not a graph is refused with the reason, and changes nothing.
    await other.evaluate(() => navigator.clipboard.writeText('hello'));
    const refused = await noticeAfter(other, () => other.keyboard.press('Control+v'));
    assert.match(refused, /^the clipboard holds no Sluice nodes to paste: /);
    assert.equal((await draftDoc(other)).nodes.length, 2);
    await other.close();
    assert.deepEqual(pageErrors, []);
  });
});
