//! Short measurements on a device: which 16-bit storage runs faster, and the rates the
//! partitioner weighs compute, memory traffic, pass overhead and stage transfers with.
//! Each takes a fraction of a second and is cached per adapter in this process; the
//! fronts keep calibrations across processes.

use super::context::GpuContext;
use super::executable::GpuExecutable;
use super::readback::map_read;
use crate::error::RunError;
use crate::graph::Graph;
use crate::plan::cost::Rates;
use crate::plan::{HalfStorage, Plan, PlanOptions, Precision};
use crate::weights::Weights;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use web_time::Instant;

fn graph(json: serde_json::Value) -> Result<Graph, RunError> {
    let doc = crate::graph::doc::decode_value(&json)
        .map_err(|p| RunError::Internal(format!("probe graph: {p:?}")))?;
    Graph::build(doc).map_err(|p| RunError::Internal(format!("probe graph: {p}")))
}

/// Seconds per repetition of a graph's passes on resident inputs (after a warm-up).
async fn seconds_per_run(
    ctx: &GpuContext,
    graph: &Graph,
    options: PlanOptions,
    reps: usize,
) -> Result<f64, RunError> {
    let mut exe =
        GpuExecutable::compile(ctx, Plan::with_options(graph, options)?, &Weights::new(), 1)
            .await?;
    exe.upload_inputs(&crate::exec::dataset::random_inputs(graph, 0)?)?;
    exe.run_resident(2).await?;
    let t = Instant::now();
    exe.run_resident(reps).await?;
    Ok(t.elapsed().as_secs_f64() / reps as f64)
}

fn adapter_key(ctx: &GpuContext) -> String {
    format!("{} {}", ctx.adapter.name, ctx.adapter.driver)
}

/// Which 16-bit storage runs a matmul-and-activation probe faster on this device: packed
/// where the adapter lacks `shader-f16` (and in browsers, where no probe runs), else
/// measured once per adapter and driver in this process.
pub async fn faster_half_storage(ctx: &GpuContext) -> Result<HalfStorage, RunError> {
    if !ctx.adapter.shader_f16 || cfg!(target_arch = "wasm32") {
        return Ok(HalfStorage::Packed);
    }
    static CHOICES: OnceLock<Mutex<HashMap<String, HalfStorage>>> = OnceLock::new();
    let cache = CHOICES.get_or_init(|| Mutex::new(HashMap::new()));
    let key = adapter_key(ctx);
    if let Some(h) = cache.lock().ok().and_then(|c| c.get(&key).copied()) {
        return Ok(h);
    }
    let probe = graph(serde_json::json!({
        "format": "sluice/graph@1",
        "inputs": { "a": { "shape": [256, 256] }, "b": { "shape": [256, 256] } },
        "nodes": [
            { "id": "c", "op": "matmul", "inputs": ["a", "b"] },
            { "id": "r", "op": "relu", "inputs": ["c"] }
        ],
        "outputs": ["r"]
    }))?;
    let mut best = (HalfStorage::Packed, f64::INFINITY);
    for half in [HalfStorage::Packed, HalfStorage::Native] {
        let options = PlanOptions {
            fuse: true,
            precision: Precision::Mixed,
            half,
        };
        let secs = seconds_per_run(ctx, &probe, options, 8).await?;
        tracing::info!(?half, ms = secs * 1e3, "16-bit storage probe");
        if secs < best.1 {
            best = (half, secs);
        }
    }
    if let Ok(mut c) = cache.lock() {
        c.insert(key, best.0);
    }
    Ok(best.0)
}

/// Seconds to read `bytes` back to the host and upload them again (a stage transfer).
async fn round_trip_seconds(ctx: &GpuContext, bytes: u64, reps: usize) -> Result<f64, RunError> {
    let device = &ctx.device;
    let src = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("calibration source"),
        size: bytes,
        usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let readback = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("calibration readback"),
        size: bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let data = vec![0u8; bytes as usize];
    let mut total = 0.0;
    for rep in 0..=reps {
        let t = Instant::now();
        ctx.queue.write_buffer(&src, 0, &data);
        let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("calibration transfer"),
        });
        enc.copy_buffer_to_buffer(&src, 0, &readback, 0, bytes);
        ctx.queue.submit([enc.finish()]);
        map_read(device, &readback).await?;
        {
            let view = readback
                .get_mapped_range(..)
                .map_err(|e| RunError::Device(format!("calibration readback failed: {e:?}")))?;
            std::hint::black_box(view.first().copied());
        }
        readback.unmap();
        if rep > 0 {
            total += t.elapsed().as_secs_f64();
        }
    }
    Ok(total / reps as f64)
}

/// Measures a device's rates: a 512³ matmul (compute), a 4 Mi-element elementwise pass
/// (memory traffic), a 64-element pass (per-pass overhead) and an 8 MiB round trip to the
/// host (stage transfers). Cached per adapter and driver in this process unless `fresh`.
pub async fn calibrate(ctx: &GpuContext, fresh: bool) -> Result<Rates, RunError> {
    static RATES: OnceLock<Mutex<HashMap<String, Rates>>> = OnceLock::new();
    let cache = RATES.get_or_init(|| Mutex::new(HashMap::new()));
    let key = adapter_key(ctx);
    if !fresh {
        if let Some(r) = cache.lock().ok().and_then(|c| c.get(&key).copied()) {
            return Ok(r);
        }
    }
    let f32_options = PlanOptions::default();
    let matmul = graph(serde_json::json!({
        "format": "sluice/graph@1",
        "inputs": { "a": { "shape": [512, 512] }, "b": { "shape": [512, 512] } },
        "nodes": [ { "id": "c", "op": "matmul", "inputs": ["a", "b"] } ],
        "outputs": ["c"]
    }))?;
    let elementwise = |n: usize| {
        graph(serde_json::json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": [n] } },
            "nodes": [ { "id": "y", "op": "relu", "inputs": ["x"] } ],
            "outputs": ["y"]
        }))
    };
    let overhead = seconds_per_run(ctx, &elementwise(64)?, f32_options, 64).await?;
    let matmul_s = seconds_per_run(ctx, &matmul, f32_options, 4).await?;
    let n = 1usize << 22;
    let stream_s = seconds_per_run(ctx, &elementwise(n)?, f32_options, 8).await?;
    let transfer_bytes = 8u64 << 20;
    let transfer_s = round_trip_seconds(ctx, transfer_bytes, 4).await?;
    let positive = |s: f64| s.max(1e-9);
    let rates = Rates {
        flops_per_s: 2.0 * 512f64.powi(3) / positive(matmul_s - overhead),
        bytes_per_s: (8 * n) as f64 / positive(stream_s - overhead),
        transfer_bytes_per_s: transfer_bytes as f64 / positive(transfer_s),
        pass_overhead_s: overhead,
    };
    tracing::info!(?rates, adapter = %ctx.adapter.name, "calibrated");
    if let Ok(mut c) = cache.lock() {
        c.insert(key, rates);
    }
    Ok(rates)
}
