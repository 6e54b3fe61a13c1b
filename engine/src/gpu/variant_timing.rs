//! Times every matmul variant the adapter can run on the sizes of each tunable problem a
//! plan holds, and keeps the fastest in the device's autotuner (`super::autotune`), whose
//! cache answers instead when it already knows the class.

use super::autotune::{Trial, TuneRecord};
use super::context::GpuContext;
use super::kernel::{Epilogue, Kernel, Slot};
use super::lower::matmul::matmul_kernels;
use super::readback::wait_idle;
use super::texture;
use super::tuning::{textured_fits, MatmulClass, MatmulTask, MatmulTypes, MatmulVariant};
use crate::error::RunError;
use crate::ops::matmul::Problem;
use crate::telemetry::now_ns;
use std::collections::HashMap;

/// A variant another must beat by this fraction to replace the default (timing noise must
/// not flip the choice between runs).
const MARGIN: f64 = 0.03;

/// Measurements per variant aim at about this much device time each.
const TARGET_NS: u64 = 25_000_000;

/// The variant of each task's class on `ctx`: from the autotuner's cache, else measured
/// now (and kept). Classes whose sizes the adapter cannot hold keep the default.
pub async fn tuned_variants(
    ctx: &GpuContext,
    tasks: &[MatmulTask],
) -> Result<HashMap<MatmulClass, MatmulVariant>, RunError> {
    let tuner = &ctx.autotuner;
    let mut out = HashMap::new();
    if !tuner.enabled() {
        return Ok(out);
    }
    let adapter = ctx.adapter.cache_key();
    for task in tasks {
        let class = task.class.key();
        let (record, measured) = match tuner.cached(&adapter, &class) {
            Some(r) => (r, false),
            None => match measure(ctx, task).await? {
                Some(r) => (r, true),
                None => continue,
            },
        };
        if let Some(v) = MatmulVariant::parse(&record.chosen).filter(|&v| fits(ctx, v)) {
            out.insert(task.class, v);
        }
        tuner.remember(&adapter, &class, record, measured);
    }
    Ok(out)
}

/// Whether the adapter can run a variant at all.
pub fn fits(ctx: &GpuContext, v: MatmulVariant) -> bool {
    let l = &ctx.limits;
    let (x, y) = match v {
        // Declared one-dimensional in WGSL.
        MatmulVariant::Subgroup { .. } => (v.invocations(), 1),
        v => v.workgroup(),
    };
    let shared = if v == MatmulVariant::Tiled { 8192 } else { 0 };
    v.runs_on(ctx.adapter.subgroup_lanes)
        && v.invocations() <= l.max_compute_invocations_per_workgroup
        && x <= l.max_compute_workgroup_size_x
        && y <= l.max_compute_workgroup_size_y
        && shared <= l.max_compute_workgroup_storage_size
}

/// Times every variant the adapter can run on the task's sizes (one batch, zeros in, no
/// epilogue) and picks the fastest; `None` when the sizes do not fit the adapter.
async fn measure(ctx: &GpuContext, task: &MatmulTask) -> Result<Option<TuneRecord>, RunError> {
    let types = task.class.types;
    let problem = Problem {
        m: task.m,
        n: task.n,
        k: task.k,
        offsets: vec![(0, 0)],
    };
    let sizes = [
        types.a.bytes(task.m.saturating_mul(task.k)),
        types.b.bytes(task.k.saturating_mul(task.n)),
        types.c.bytes(task.m.saturating_mul(task.n)),
    ];
    let limit = ctx
        .limits
        .max_storage_buffer_binding_size
        .min(ctx.limits.max_buffer_size);
    if sizes.iter().any(|&b| b > limit) {
        return Ok(None);
    }
    let device = &ctx.device;
    let operands: Vec<wgpu::Buffer> = sizes
        .iter()
        .map(|&bytes| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("autotune operand"),
                size: bytes.max(4).div_ceil(4) * 4,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        })
        .collect();
    let (mut tried, mut skipped) = (Vec::new(), Vec::new());
    for variant in MatmulVariant::ALL {
        match time_variant(ctx, &problem, types, variant, &operands).await? {
            Some(ns) => tried.push(Trial {
                variant: variant.name(),
                ms: ns as f64 / 1e6,
            }),
            None => skipped.push(variant.name()),
        }
    }
    let default = MatmulVariant::DEFAULT.name();
    let default_ms = tried
        .iter()
        .find(|t| t.variant == default)
        .map_or(f64::INFINITY, |t| t.ms);
    let Some(fastest) = tried.iter().min_by(|a, b| a.ms.total_cmp(&b.ms)) else {
        return Ok(None);
    };
    let chosen = if fastest.ms < default_ms * (1.0 - MARGIN) {
        fastest.variant.clone()
    } else {
        default
    };
    Ok(Some(TuneRecord {
        chosen,
        measured_on: [task.m, task.n, task.k],
        tried,
        skipped,
    }))
}

/// Nanoseconds per product of `variant` on the problem (its pack passes included), or
/// `None` when the adapter cannot run it or the sizes do not suit it.
async fn time_variant(
    ctx: &GpuContext,
    problem: &Problem,
    types: MatmulTypes,
    variant: MatmulVariant,
    operands: &[wgpu::Buffer],
) -> Result<Option<u64>, RunError> {
    let device = &ctx.device;
    if !fits(ctx, variant) {
        return Ok(None);
    }
    if variant.textured() && !textured_fits(problem) {
        return Ok(None);
    }
    let (kernels, texture_sizes) = matmul_kernels(
        problem,
        Slot::Input(1),
        false,
        &Epilogue::identity(),
        types,
        variant,
    )
    .map_err(RunError::Internal)?;
    if kernels.iter().any(|k| {
        k.workgroups
            .iter()
            .any(|&g| g > ctx.limits.max_compute_workgroups_per_dimension)
    }) {
        return Ok(None);
    }
    let textures: Vec<wgpu::TextureView> = texture_sizes
        .iter()
        .map(|&size| {
            texture::create(device, "autotune operand", size)
                .create_view(&wgpu::TextureViewDescriptor::default())
        })
        .collect();
    // A variant the driver refuses is left out, never the compile that asked.
    let mut passes = Vec::new();
    for kernel in &kernels {
        match bound_pass(ctx, kernel, operands, &textures).await {
            Ok(pass) => passes.push(pass),
            Err(e) => {
                tracing::warn!("autotune: {} does not build here: {e}", variant.name());
                return Ok(None);
            }
        }
    }
    // Host time from submission to completion of `reps` products (each with its pack
    // passes), per product.
    let passes = &passes;
    let time = |reps: u32| async move {
        let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("autotune"),
        });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("autotune"),
                timestamp_writes: None,
            });
            for _ in 0..reps {
                for (pipeline, bind_group, [x, y, z]) in passes {
                    pass.set_pipeline(pipeline);
                    pass.set_bind_group(0, bind_group, &[]);
                    pass.dispatch_workgroups(*x, *y, *z);
                }
            }
        }
        let t0 = now_ns();
        ctx.queue.submit([enc.finish()]);
        wait_idle(device, &ctx.queue).await?;
        Ok::<u64, RunError>(now_ns().saturating_sub(t0).max(1) / u64::from(reps))
    };
    // The first dispatch pays for first use; it only sizes the measurements.
    let first = time(1).await?;
    let reps = (TARGET_NS / first).clamp(1, 8) as u32;
    Ok(Some(time(reps).await?.min(time(reps).await?)))
}

/// A kernel's pipeline, bind group and workgroups, its slots bound to the tuner's operands
/// (A, B, C) and textures.
async fn bound_pass(
    ctx: &GpuContext,
    kernel: &Kernel,
    operands: &[wgpu::Buffer],
    textures: &[wgpu::TextureView],
) -> Result<(wgpu::ComputePipeline, wgpu::BindGroup, [u32; 3]), RunError> {
    let device = &ctx.device;
    let (pipeline, _) = ctx
        .pipeline(&kernel.label, &kernel.source, "autotune")
        .await?;
    let info = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("autotune info"),
        size: (4 * kernel.info.len() as u64).div_ceil(8) * 8,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    ctx.queue
        .write_buffer(&info, 0, bytemuck::cast_slice(&kernel.info));
    let mut entries = vec![wgpu::BindGroupEntry {
        binding: 0,
        resource: info.as_entire_binding(),
    }];
    for (i, slot) in kernel.slots.iter().enumerate() {
        let resource = match *slot {
            Slot::Input(0) => operands[0].as_entire_binding(),
            Slot::Input(1) => operands[1].as_entire_binding(),
            Slot::Output(0) => operands[2].as_entire_binding(),
            Slot::Texture(t) if t < textures.len() => {
                wgpu::BindingResource::TextureView(&textures[t])
            }
            other => {
                return Err(RunError::Internal(format!(
                    "autotune: kernel '{}' binds {other:?}, which the tuner does not hold",
                    kernel.label
                )))
            }
        };
        entries.push(wgpu::BindGroupEntry {
            binding: i as u32 + 1,
            resource,
        });
    }
    let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("autotune"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    });
    Ok((pipeline, bind_group, kernel.workgroups))
}
