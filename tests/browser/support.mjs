// What the editor's browser tests share: a real `sluice serve` on a fresh workspace, Debian's
// Chromium driven headless by playwright-core (never a downloaded browser), pointer
// gestures on the SVG canvas, the editor's draft and .npy files.

import { spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { chromium } from 'playwright-core';

/** Debian's Chromium with the flags docs/browser.md records (WebGPU included). */
export async function launchChromium() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: [
      '--no-sandbox', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--enable-unsafe-webgpu',
    ],
  });
}

function required(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run these tests with \`cargo xtask test\``);
  return v;
}

/** Starts `sluice serve` on a free port with a fresh workspace; resolves to { url, stop }. */
export async function startServer() {
  const workspace = mkdtempSync(join(tmpdir(), 'sluice-browser-'));
  const child = spawn(required('SLUICE_BIN'), [
    'serve', '--addr', '127.0.0.1:0', '--workspace', workspace,
    '--editor', required('SLUICE_EDITOR'),
  ], { stdio: ['ignore', 'pipe', 'inherit'] });
  const lines = createInterface({ input: child.stdout });
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('sluice serve printed no URL in 60 s')), 60_000);
    child.once('exit', (code) => reject(new Error(`sluice serve exited (${code})`)));
    lines.on('line', (line) => {
      const m = line.match(/http:\/\/\S+/);
      if (m) { clearTimeout(timer); resolve(m[0]); }
    });
  });
  return {
    url,
    workspace,
    stop() {
      child.kill('SIGINT');
      rmSync(workspace, { recursive: true, force: true });
    },
  };
}

/**
 * Opens the editor at `url` in a new page of `context` and resolves to the page once the
 * editor is ready. Page errors are pushed to `errors`; every dialog is accepted unless
 * `acceptDialogs` is false (tests that answer dialogs themselves).
 */
export async function openEditor(context, url, errors, { acceptDialogs = true } = {}) {
  const page = await context.newPage();
  page.on('pageerror', (e) => errors.push(String(e)));
  if (acceptDialogs) page.on('dialog', (d) => d.accept());
  await page.goto(url);
  await page.waitForSelector('body[data-ready-ms]', { timeout: 60_000 });
  return page;
}

/** Closes the editor's notice, if one shows (screenshots then see what is under it). */
export async function closeNotice(page) {
  const close = page.locator('.notice-close');
  if (await close.count()) await close.click();
}

/** Where the tests write screenshots (target/screenshots). */
export function screenshotDir() {
  const dir = process.env.SLUICE_SCREENSHOTS ?? join(tmpdir(), 'sluice-screenshots');
  mkdirSync(dir, { recursive: true });
  return dir;
}

/** The centre of an element, in page coordinates. */
export async function centre(locator) {
  const box = await locator.boundingBox();
  if (!box) throw new Error(`${locator} is not visible`);
  return { x: box.x + box.width / 2, y: box.y + box.height / 2 };
}

/** Presses the mouse at `from`, moves in steps to `to` and releases it there. */
export async function dragBetween(page, from, to) {
  await page.mouse.move(from.x, from.y);
  await page.mouse.down();
  await page.mouse.move(from.x + (to.x - from.x) / 3, from.y + (to.y - from.y) / 3, { steps: 4 });
  await page.mouse.move(to.x, to.y, { steps: 8 });
  await page.mouse.up();
}

/** Drags a palette entry onto the canvas at (x, y) relative to the canvas's corner. */
export async function dropFromPalette(page, op, x, y) {
  const canvas = await page.locator('#canvas').boundingBox();
  // The palette scrolls: an entry below its fold must be brought into view first.
  const item = page.locator(`.palette-item[data-op="${op}"]`);
  await item.scrollIntoViewIfNeeded();
  const from = await centre(item);
  await dragBetween(page, from, { x: canvas.x + x, y: canvas.y + y });
}

/** Drags from output port `fromPort` of `from` to input port `toPort` of `to`. */
export async function wire(page, from, fromPort, to, toPort) {
  const a = await centre(page.locator(`g.port.out[data-node="${from}"][data-out-port="${fromPort}"] circle.hit`));
  const b = await centre(page.locator(`g.port.in[data-node="${to}"][data-in-port="${toPort}"] circle.hit`));
  await dragBetween(page, a, b);
}

/** Clicks a node's body (selects it and shows its properties), left of its title, away
 * from the ports along its top and bottom edges. */
export async function selectNode(page, id) {
  const body = page.locator(`g.node[data-id="${id}"] rect.body`);
  const box = await body.boundingBox();
  await page.mouse.click(box.x + 5, box.y + box.height / 2);
}

/** Types into a field and commits it (the editor applies fields on change). */
export async function setField(locator, text) {
  await locator.fill(text);
  await locator.press('Enter');
}

/**
 * Runs `action` and resolves to the text of the first notice shown after it started.
 * Information notices fade after a few seconds, so a MutationObserver records every
 * notice as it appears instead of polling for one (a busy page could show and fade a
 * notice between two polls). A notice already showing is closed first.
 */
export async function noticeAfter(page, action, timeout = 60_000) {
  const close = page.locator('.notice-close');
  if (await close.count()) {
    await close.click();
    await page.locator('.notice').waitFor({ state: 'detached' });
  }
  await page.evaluate(() => {
    window.sluiceNotices = [];
    const observer = new MutationObserver(() => {
      const text = document.querySelector('.notice .notice-text')?.textContent;
      if (text !== undefined && window.sluiceNotices.at(-1) !== text) window.sluiceNotices.push(text);
    });
    observer.observe(document.body, { childList: true, subtree: true, characterData: true });
  });
  await action();
  const handle = await page.waitForFunction(() => window.sluiceNotices[0], null, { timeout });
  return handle.jsonValue();
}

/** The document the editor holds, from its draft in local storage (kept after every edit). */
export async function draftDoc(page) {
  const text = await page.evaluate(() => localStorage.getItem('sluice.draft'));
  if (!text) throw new Error('the editor kept no draft');
  return JSON.parse(text).doc;
}

/** The label of the edge from reference `from` to input `port` of `to`. */
export async function edgeLabel(page, from, to, port = 0) {
  return page.locator(`text.edge-label[data-edge="${from}>${to}:${port}"]`).textContent();
}

/** Reads a little-endian float32 .npy file: { shape, values }. */
export function readNpy(bytes) {
  const buf = Buffer.from(bytes);
  if (buf.subarray(0, 6).toString('latin1') !== '\x93NUMPY') throw new Error('not an .npy file');
  const major = buf[6];
  const headerLen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = (major === 1 ? 10 : 12);
  const header = buf.subarray(start, start + headerLen).toString('latin1');
  if (!header.includes("'descr': '<f4'")) throw new Error(`not float32: ${header}`);
  const shape = header.match(/'shape': \(([^)]*)\)/)[1].split(',').map((s) => s.trim()).filter(Boolean).map(Number);
  const data = buf.subarray(start + headerLen);
  const values = new Float32Array(data.buffer.slice(data.byteOffset, data.byteOffset + data.length));
  return { shape, values };
}

/**
 * Checks the canvas as drawn, in screen pixels: the smallest node title, every place an
 * edge passes through a node it does not connect (its path sampled every 3 px), and every
 * edge label that overlaps a node or another label. Resolves to
 * { nodes, edges, labels, minTitlePx, throughNodes: [...], labelOverlaps: [...] }.
 */
export async function layoutReport(page) {
  return page.evaluate(() => {
    const nodes = [...document.querySelectorAll('g.node')].map((g) => ({
      id: g.dataset.id,
      box: g.querySelector('rect.body').getBoundingClientRect(),
    }));
    const inside = (p, r) => p.x > r.left + 1 && p.x < r.right - 1 && p.y > r.top + 1 && p.y < r.bottom - 1;
    const overlap = (a, b) => a.left < b.right - 0.5 && b.left < a.right - 0.5 && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
    const throughNodes = [];
    const edges = [...document.querySelectorAll('g.edge')];
    for (const e of edges) {
      const path = e.querySelector('path.edge-line');
      const m = path.getScreenCTM();
      const length = path.getTotalLength();
      const others = nodes.filter((n) => n.id !== e.dataset.from && n.id !== e.dataset.to);
      for (let s = 0; s <= length; s += 3 / m.a) {
        const p = new DOMPoint(path.getPointAtLength(s).x, path.getPointAtLength(s).y).matrixTransform(m);
        const hit = others.find((n) => inside(p, n.box));
        if (hit) {
          throughNodes.push(`${e.dataset.edge} passes through ${hit.id}`);
          break;
        }
      }
    }
    const labels = [...document.querySelectorAll('text.edge-label')].map((t) => ({ edge: t.dataset.edge, box: t.getBoundingClientRect() }));
    const labelOverlaps = [];
    labels.forEach((l, i) => {
      const node = nodes.find((n) => overlap(l.box, n.box));
      if (node) labelOverlaps.push(`label of ${l.edge} overlaps node ${node.id}`);
      const other = labels.slice(0, i).find((o) => overlap(l.box, o.box));
      if (other) labelOverlaps.push(`label of ${l.edge} overlaps label of ${other.edge}`);
    });
    const titles = [...document.querySelectorAll('g.node text.title')]
      .map((t) => parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a);
    return {
      nodes: nodes.length,
      edges: edges.length,
      labels: labels.length,
      minTitlePx: Math.min(...titles),
      throughNodes,
      labelOverlaps,
    };
  });
}

/** Asserts that `report` (from layoutReport) shows a readable canvas. */
export function assertReadable(report, what) {
  if (report.minTitlePx < 11) throw new Error(`${what}: node titles are ${report.minTitlePx.toFixed(1)} px on screen, under 11`);
  if (report.throughNodes.length) throw new Error(`${what}: ${report.throughNodes.length} edge(s) pass through nodes: ${report.throughNodes.slice(0, 5).join('; ')}`);
  if (report.labelOverlaps.length) throw new Error(`${what}: ${report.labelOverlaps.length} label overlap(s): ${report.labelOverlaps.slice(0, 5).join('; ')}`);
}
