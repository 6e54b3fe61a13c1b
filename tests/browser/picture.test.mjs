// The canvas as a picture, in a real headless Chromium against a real `sluice serve`:
// an example graph imported, zoomed in so most of it is off screen, then downloaded from
// the Graph menu as an SVG that stands alone (it parses, has a view box around every
// node, each node with its title and real colours, no CSS variables) and as a PNG twice
// its size; the dark theme's SVG has the dark canvas colour.

import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import { launchChromium, noticeAfter, openEditor, screenshotDir, startServer } from './support.mjs';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const CNN = join(ROOT, 'assets', 'graphs', 'cnn.json');

/** A PNG's width and height, read from its IHDR chunk (after checking the signature). */
function pngSize(bytes) {
  const signature = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  assert.ok(bytes.subarray(0, 8).equals(signature), 'the file has the PNG signature');
  assert.equal(bytes.subarray(12, 16).toString('latin1'), 'IHDR');
  return { width: bytes.readUInt32BE(16), height: bytes.readUInt32BE(20) };
}

describe('the canvas as a picture', { timeout: 600_000 }, () => {
  let server;
  let browser;
  let page;
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

  /** Picks `id` in the Graph menu; resolves to the downloaded file's name and bytes. */
  async function download(id) {
    await page.click('#graph-menu summary');
    const [file] = await Promise.all([page.waitForEvent('download'), page.click(`#${id}`)]);
    return { name: file.suggestedFilename(), bytes: readFileSync(await file.path()) };
  }

  /** What a test needs of an SVG's text, read by the browser's XML parser. */
  function readSvg(text) {
    return page.evaluate((t) => {
      const doc = new DOMParser().parseFromString(t, 'image/svg+xml');
      const root = doc.documentElement;
      const nodes = [...doc.querySelectorAll('g.node')].map((g) => {
        const m = (g.getAttribute('transform') ?? '').match(/translate\(([-\d.e]+),\s*([-\d.e]+)\)/);
        const body = g.querySelector('rect.body');
        return {
          title: g.querySelector('text.title')?.textContent ?? '',
          at: m ? [Number(m[1]), Number(m[2])] : null,
          width: Number(body?.getAttribute('width')),
          height: Number(body?.getAttribute('height')),
          fill: body?.style.fill ?? '',
        };
      });
      return {
        parserError: doc.querySelector('parsererror')?.textContent ?? null,
        root: root.localName,
        namespace: root.namespaceURI,
        viewBox: (root.getAttribute('viewBox') ?? '').split(/\s+/).map(Number),
        topTransform: root.querySelector(':scope > g')?.getAttribute('transform') ?? null,
        background: root.firstElementChild?.localName === 'rect'
          ? root.firstElementChild.getAttribute('fill') : null,
        hitAreas: doc.querySelectorAll('.hit, .edge-hit').length,
        edges: doc.querySelectorAll('.edge-line').length,
        nodes,
      };
    }, text);
  }

  it('downloads the whole graph as a standalone SVG and a PNG twice its size', async () => {
    const notice = await noticeAfter(page, () => page.setInputFiles('#import-file', CNN));
    assert.match(notice, /cnn/);
    await page.waitForSelector('#canvas g.node');
    const cnn = JSON.parse(readFileSync(CNN, 'utf8'));
    const expected = cnn.nodes.length + Object.keys(cnn.inputs).length;
    const titles = await page.$$eval('#canvas g.node text.title', (ts) => ts.map((t) => t.textContent));
    assert.equal(titles.length, expected, 'every node and input is drawn');
    // Zoom in on one corner: most of the graph is now off screen, and the picture must
    // still hold all of it.
    const box = await page.locator('#canvas').boundingBox();
    await page.mouse.move(box.x + 40, box.y + 40);
    for (let i = 0; i < 8; i += 1) await page.mouse.wheel(0, -300);
    await page.waitForTimeout(200);

    const svg = await download('export-svg');
    assert.equal(svg.name, 'cnn.svg');
    const text = svg.bytes.toString('utf8');
    writeFileSync(join(shots, 'canvas-export.svg'), text);
    assert.doesNotMatch(text, /var\(/, 'no CSS variables are left');
    const read = await readSvg(text);
    assert.equal(read.parserError, null, 'the SVG parses');
    assert.equal(read.root, 'svg');
    assert.equal(read.namespace, 'http://www.w3.org/2000/svg');
    assert.equal(read.viewBox.length, 4, 'the SVG has a view box');
    assert.ok(read.viewBox.every(Number.isFinite) && read.viewBox[2] > 0 && read.viewBox[3] > 0);
    assert.equal(read.topTransform, null, 'no pan or zoom');
    assert.match(read.background ?? '', /^rgb/, 'a background in the canvas colour');
    assert.equal(read.hitAreas, 0, 'no hit areas');
    assert.equal(read.edges, cnn.nodes.reduce((n, node) => n + (node.inputs?.length ?? 0), 0));
    assert.deepEqual(read.nodes.map((n) => n.title).sort(), [...titles].sort(), 'every node with its title');
    const [vx, vy, vw, vh] = read.viewBox;
    for (const n of read.nodes) {
      assert.match(n.fill, /^rgb/, `${n.title} is filled with a real colour`);
      assert.ok(n.at, `${n.title} has a position`);
      assert.ok(
        n.at[0] >= vx && n.at[1] >= vy && n.at[0] + n.width <= vx + vw && n.at[1] + n.height <= vy + vh,
        `${n.title} at ${n.at} lies inside the view box ${read.viewBox}`,
      );
    }

    const png = await download('export-png');
    assert.equal(png.name, 'cnn.png');
    writeFileSync(join(shots, 'canvas-export.png'), png.bytes);
    const size = pngSize(png.bytes);
    console.log(`SVG ${vw}×${vh} (${svg.bytes.length} bytes), PNG ${size.width}×${size.height} (${png.bytes.length} bytes)`);
    assert.ok(Math.abs(size.width - 2 * vw) <= 1 && Math.abs(size.height - 2 * vh) <= 1, 'drawn at 2×');
    assert.ok(Math.abs(size.width / size.height - vw / vh) < 0.01, 'with the SVG\'s aspect');

    // The dark theme's picture is drawn in the dark theme's colours.
    await page.emulateMedia({ colorScheme: 'dark' });
    const dark = await readSvg((await download('export-svg')).bytes.toString('utf8'));
    await page.emulateMedia({ colorScheme: 'light' });
    assert.notEqual(dark.background, read.background, 'the canvas colour follows the theme');
    assert.deepEqual(pageErrors, []);
  });
});
