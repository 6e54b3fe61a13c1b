// Every kernel the engine generates that runs without `shader-f16` compiles in
// Chromium's WebGPU (Tint), not only in naga: the browser is stricter in places (a NaN
// constant expression, for one). The list comes from `cargo run -p sluice-tests
// --example kernels`, which `cargo xtask test` runs first.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, it } from 'node:test';
import { launchChromium, startServer } from './support.mjs';

let server;
let browser;

before(async () => {
  server = await startServer();
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  server?.stop();
});

it('every portable generated kernel builds a compute pipeline in Chromium\'s WebGPU', { timeout: 600_000 }, async () => {
  const file = process.env.SLUICE_KERNELS;
  assert.ok(file, 'SLUICE_KERNELS is not set: run these tests with `cargo xtask test`');
  const kernels = JSON.parse(readFileSync(file, 'utf8'));
  assert.ok(kernels.length > 100, `only ${kernels.length} kernels listed`);
  const page = await browser.newPage();
  // Any page of the server: WebGPU needs a secure context, which 127.0.0.1 is.
  await page.goto(`${server.url}/api/openapi.json`);
  const result = await page.evaluate(async (list) => {
    const adapter = await navigator.gpu.requestAdapter();
    if (!adapter) return { adapter: null, failures: [] };
    // The engine asks for the adapter's own limits (gpu/context.rs); so does this test.
    const device = await adapter.requestDevice({
      requiredFeatures: [...adapter.features],
      requiredLimits: { maxStorageBuffersPerShaderStage: adapter.limits.maxStorageBuffersPerShaderStage },
    });
    const failures = [];
    for (const k of list) {
      device.pushErrorScope('validation');
      const module = device.createShaderModule({ code: k.source, label: k.label });
      const info = await module.getCompilationInfo();
      const messages = info.messages.filter((m) => m.type === 'error').map((m) => `${m.lineNum}:${m.linePos} ${m.message}`);
      try {
        await device.createComputePipelineAsync({ layout: 'auto', compute: { module } });
      } catch (e) {
        messages.push(String(e.message ?? e));
      }
      const error = await device.popErrorScope();
      if (error) messages.push(error.message);
      if (messages.length) failures.push(`${k.label}: ${messages.join('; ')}`);
    }
    const i = adapter.info ?? {};
    return { adapter: `${i.vendor} ${i.architecture}`, failures };
  }, kernels);
  assert.ok(result.adapter, 'Chromium offered no WebGPU adapter (is --enable-unsafe-webgpu passed?)');
  console.log(`${kernels.length} kernels compiled on ${result.adapter}: ${result.failures.length} failed`);
  assert.deepEqual(result.failures, []);
});
