//! A plan compiled on a wgpu device: the plan lowered to WGSL passes
//! ([`super::program`]), buffers allocated (after checking the adapter's limits), weights
//! and constants uploaded once, pipelines (shared per device) and bind groups created
//! once. Up to `prefetch` micro-batches are in flight: the host writes the inputs of
//! micro-batch m+1.. into a slot's upload buffer, copied into the inputs' buffers by the
//! micro-batch's commands (which the queue orders after the passes reading the previous
//! values), while the device computes m, and results come back through a ring of readback
//! slots with `map_async`. On a CPU adapter the inputs are written in place instead, into
//! the slot's own copies of the input buffers ([`GpuContext::inputs_in_place`]). A
//! micro-batch's passes are
//! recorded into one compute pass; when timed ([`PassTiming`]), each is bracketed by
//! timestamp queries (inside that compute pass where the adapter allows it), so every pass
//! becomes a compute event; micro-batches between samples report the latest measured pass
//! times.

use super::context::GpuContext;
use super::kernel::Slot;
use super::mapped::MappedBuffer;
use super::program::{lower_plan_tuned, Buffer, Pass, Program};
use super::readback::{finish_map, map_read, start_map, wait_idle, MapPending};
use super::texture;
use super::tuning::{MatmulVariant, Tuning};
use crate::error::RunError;
use crate::exec::device::{CompileStats, Executable, TraceContext, Values};
use crate::exec::input::{Input, Inputs};
use crate::plan::Plan;
use crate::storage::Storage;
use crate::telemetry::{now_ns, Event, EventKind, TimingSource};
use crate::tensor::Tensor;
use crate::weights::Weights;
use futures_util::future::LocalBoxFuture;
use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap, VecDeque};

struct CompiledPass {
    label: String,
    pipeline: wgpu::ComputePipeline,
    /// One per prefetch slot where the pass binds an input written in place (each slot
    /// has its own copy of those), else one for every slot.
    bind_groups: Vec<wgpu::BindGroup>,
    workgroups: [u32; 3],
    /// The graph input (index in the plan's inputs) this pass stages into a texture of its
    /// own, when that is all it does: reading only that input, writing only the texture
    /// (see [`stages_input`]). Its texture then stays valid while the input is unchanged.
    stages: Option<usize>,
}

impl CompiledPass {
    /// Records the pass for a micro-batch in prefetch slot `slot`.
    fn dispatch(&self, pass: &mut wgpu::ComputePass<'_>, slot: usize) {
        let Some(group) = self.bind_groups.get(slot).or(self.bind_groups.first()) else {
            return;
        };
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, group, &[]);
        let [x, y, z] = self.workgroups;
        pass.dispatch_workgroups(x, y, z);
    }
}

/// Which micro-batches a GPU times pass by pass with timestamp queries (where the adapter
/// has them). Each timestamp can cost the device a wait (about 0.25 ms on lavapipe), so by
/// default only a sample of micro-batches is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassTiming {
    /// None: a micro-batch's compute is one event from its submission to its completion
    /// seen on the host.
    Off,
    /// Every pass of every micro-batch.
    Every,
    /// The first two micro-batches an executable runs (the first pays for first use),
    /// then one in `n`; the passes of the others are reported with the latest measured
    /// pass times, placed at the end of their host completion.
    Sampled(u32),
}

impl PassTiming {
    /// What runs use unless told otherwise: one micro-batch in 16 after the first two.
    pub const DEFAULT: PassTiming = PassTiming::Sampled(16);

    /// Whether an executable's `count`-th micro-batch (from 0) is timed.
    pub fn times(self, count: u64) -> bool {
        match self {
            PassTiming::Off => false,
            PassTiming::Every => true,
            PassTiming::Sampled(n) => count < 2 || count.is_multiple_of(u64::from(n.max(1))),
        }
    }
}

/// Timestamp queries around every pass, and how device ticks map to the host clock.
struct Timestamps {
    queries: wgpu::QuerySet,
    /// Written between dispatches inside one compute pass (the adapter allows it), not as
    /// a compute pass's beginning and end.
    inside_passes: bool,
    resolve: wgpu::Buffer,
    /// Nanoseconds per tick.
    period: f64,
    /// Host-clock ns (see [`now_ns`]) minus device ns.
    offset: i128,
}

impl Timestamps {
    /// The queries bounding pass `i`: inside one compute pass, one timestamp between
    /// consecutive dispatches serves as the end of one and the start of the next (each
    /// write costs a software rasteriser a wait); else each pass's own two.
    fn bounds(&self, i: usize) -> (usize, usize) {
        if self.inside_passes {
            (i, i + 1)
        } else {
            (2 * i, 2 * i + 1)
        }
    }

    /// How many queries a micro-batch of `passes` passes writes.
    fn written(&self, passes: usize) -> u32 {
        let n = if self.inside_passes {
            passes + 1
        } else {
            2 * passes
        };
        n as u32
    }
}

/// One prefetch slot: a readback buffer for the outputs and timestamps, and an upload
/// buffer for the inputs (made at the slot's first micro-batch that uploads any).
struct Ring {
    readback: wgpu::Buffer,
    staging: Option<MappedBuffer>,
}

/// An input's bytes in its device layout, as the pieces to write in order: samples
/// borrowed from the dataset and stored as f32 go uncopied, run by run (empty runs left
/// out).
fn device_bytes<'a>(input: &'a Input<'_>, layout: Storage) -> Vec<Cow<'a, [u8]>> {
    match input {
        Input::Owned(t) => vec![t.to_storage_bytes(layout)],
        Input::Rows(rows) if layout == Storage::F32 => rows
            .runs()
            .filter(|run| !run.is_empty())
            .map(|run| Cow::Borrowed(bytemuck::cast_slice(run)))
            .collect(),
        Input::Rows(rows) => vec![Cow::Owned(
            rows.to_tensor().to_storage_bytes(layout).into_owned(),
        )],
    }
}

/// How a micro-batch's inputs went to the device; what must be mapped again once it is
/// submitted.
enum Uploaded {
    /// No input was given (all kept, or none).
    Nothing,
    /// Written by the queue.
    Queued,
    /// Through the slot's upload buffer.
    Staged,
    /// Into these in-place buffers.
    InPlace(Vec<usize>),
}

/// A submitted micro-batch.
struct Pending {
    m: usize,
    slot: usize,
    map: MapPending,
    submission: wgpu::SubmissionIndex,
    submitted_ns: u64,
    /// Whether its passes write timestamps.
    timed: bool,
}

/// A plan ready to run on one wgpu device.
pub struct GpuExecutable {
    ctx: GpuContext,
    plan: Plan,
    buffers: Vec<wgpu::Buffer>,
    scratch: Vec<wgpu::Buffer>,
    /// Views of the program's textures (the views keep the textures alive).
    textures: Vec<wgpu::TextureView>,
    passes: Vec<CompiledPass>,
    timestamps: Option<Timestamps>,
    /// Which micro-batches write timestamps.
    pass_timing: PassTiming,
    /// Micro-batches submitted so far.
    submitted: u64,
    /// Inputs kept on the device ([`Executable::keep_inputs`]).
    kept: BTreeSet<String>,
    /// Per pass: whether it staged the current kept value of its input
    /// ([`CompiledPass::stages`]), so that micro-batches leaving that input out need not
    /// run it again. Cleared whenever the input's buffers are written.
    staged: Vec<bool>,
    /// On a CPU adapter ([`GpuContext::inputs_in_place`]), the inputs' device buffers, by
    /// plan buffer, one copy per prefetch slot: the host writes each micro-batch's inputs
    /// straight into its slot's copies while the micro-batches in the other slots run.
    /// Slot 0's copies are also in `buffers`. Empty elsewhere.
    in_place: HashMap<usize, Vec<MappedBuffer>>,
    /// Each pass's device nanoseconds in the latest timed micro-batch.
    latest_pass_ns: Vec<u64>,
    /// Host-clock end of the latest compute event reported (passes on one queue do not
    /// overlap, so neither do the ones placed between samples).
    compute_end_ns: u64,
    ring: Vec<Ring>,
    /// (value, byte offset in a readback slot, bytes).
    readback_layout: Vec<(usize, u64, u64)>,
    /// Offset of the timestamps in a readback slot.
    timestamp_offset: u64,
    in_flight: VecDeque<Pending>,
    next_slot: usize,
    stats: CompileStats,
}

fn padded(bytes: u64) -> u64 {
    bytes.max(4).div_ceil(8) * 8
}

async fn scoped<T>(
    device: &wgpu::Device,
    label: &str,
    f: impl FnOnce() -> T,
) -> Result<T, RunError> {
    let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let memory = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let out = f();
    let oom = memory.pop().await;
    let invalid = validation.pop().await;
    if let Some(e) = oom {
        return Err(RunError::Device(format!(
            "{label}: out of device memory: {e}"
        )));
    }
    if let Some(e) = invalid {
        return Err(RunError::Shader {
            label: label.to_string(),
            message: e.to_string(),
        });
    }
    Ok(out)
}

fn check_limits(plan: &Plan, program: &Program, limits: &wgpu::Limits) -> Result<(), RunError> {
    let sizes = plan
        .values
        .iter()
        .map(|v| (v.name.clone(), plan.buffers[v.buffer]))
        .chain(
            program
                .scratch
                .iter()
                .enumerate()
                .map(|(i, &b)| (format!("scratch {i}"), b)),
        );
    for (name, bytes) in sizes {
        if bytes > limits.max_buffer_size {
            return Err(RunError::TooLarge {
                value: name,
                bytes,
                limit: limits.max_buffer_size,
                what: "maximum buffer size",
            });
        }
        if bytes > limits.max_storage_buffer_binding_size {
            return Err(RunError::TooLarge {
                value: name,
                bytes,
                limit: limits.max_storage_buffer_binding_size,
                what: "maximum storage binding size",
            });
        }
    }
    let side = limits.max_texture_dimension_2d;
    if let Some((i, size)) = program
        .textures
        .iter()
        .enumerate()
        .find(|(_, s)| s[0] > side || s[1] > side)
    {
        return Err(RunError::Internal(format!(
            "texture {i} is {}×{} texels; the adapter allows {side} per side",
            size[0], size[1]
        )));
    }
    for p in &program.passes {
        let node = || plan.steps[p.step].node.clone();
        if let Some(&g) = p
            .kernel
            .workgroups
            .iter()
            .find(|&&g| g > limits.max_compute_workgroups_per_dimension)
        {
            return Err(RunError::Op {
                node: node(),
                message: format!(
                    "{g} workgroups exceed the adapter's limit of {} per dimension",
                    limits.max_compute_workgroups_per_dimension
                ),
            });
        }
        let storage_bindings = 1 + p
            .kernel
            .slots
            .iter()
            .filter(|s| !matches!(s, Slot::Texture(_)))
            .count();
        if storage_bindings > limits.max_storage_buffers_per_shader_stage as usize {
            return Err(RunError::Op {
                node: node(),
                message: format!(
                    "kernel '{}' needs {} storage bindings; the adapter allows {}",
                    p.kernel.label, storage_bindings, limits.max_storage_buffers_per_shader_stage
                ),
            });
        }
    }
    Ok(())
}

/// The plan lowered with the matmul variants the device's autotuner chooses for the
/// problems it holds (measured now for classes the cache lacks).
async fn tuned_program(ctx: &GpuContext, plan: &Plan) -> Result<Program, RunError> {
    if let Some(v) = ctx.autotuner.forced() {
        // A variant this adapter cannot run gives way to the default.
        let v = if super::variant_timing::fits(ctx, v) {
            v
        } else {
            MatmulVariant::DEFAULT
        };
        return lower_plan_tuned(plan, &Tuning::forced(v));
    }
    let defaults = Tuning::none();
    let program = lower_plan_tuned(plan, &defaults)?;
    let tasks = defaults.met();
    if tasks.is_empty() || !ctx.autotuner.enabled() {
        return Ok(program);
    }
    let chosen = super::variant_timing::tuned_variants(ctx, &tasks).await?;
    if chosen.is_empty() {
        return Ok(program);
    }
    lower_plan_tuned(plan, &Tuning::with(chosen))
}

impl GpuExecutable {
    /// Compiles a plan with `prefetch` slots: lowers it, allocates, uploads weights and
    /// constants, builds (or reuses) every pipeline and every bind group, and the ring.
    pub async fn compile(
        ctx: &GpuContext,
        plan: Plan,
        weights: &Weights,
        prefetch: usize,
    ) -> Result<GpuExecutable, RunError> {
        Self::compile_timed(ctx, plan, weights, prefetch, PassTiming::Every).await
    }

    /// [`GpuExecutable::compile`], timing the passes of the micro-batches `pass_timing`
    /// picks with timestamp queries where the adapter has them (what per-pass telemetry
    /// costs is the difference to [`PassTiming::Off`]).
    pub async fn compile_timed(
        ctx: &GpuContext,
        plan: Plan,
        weights: &Weights,
        prefetch: usize,
        pass_timing: PassTiming,
    ) -> Result<GpuExecutable, RunError> {
        let started = now_ns();
        let device = &ctx.device;
        plan.validate()?;
        plan.check_weights(weights)?;
        let program = tuned_program(ctx, &plan).await?;
        check_limits(&plan, &program, &ctx.limits)?;
        if plan.values.iter().any(|v| v.layout == Storage::F16)
            && !device.features().contains(wgpu::Features::SHADER_F16)
        {
            return Err(RunError::Unsupported(format!(
                "native f16 storage needs the adapter feature shader-f16, which '{}' lacks (the packed 16-bit storage works everywhere)",
                ctx.adapter.name
            )));
        }
        let storage_usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let allocate = |label: String, bytes: u64| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(&label),
                size: padded(bytes),
                usage: storage_usage,
                mapped_at_creation: false,
            })
        };
        let input_buffers: BTreeSet<usize> = if ctx.inputs_in_place() {
            plan.inputs
                .iter()
                .map(|(_, v)| plan.values[*v].buffer)
                .collect()
        } else {
            BTreeSet::new()
        };
        let slots = prefetch.max(1);
        let (buffers, in_place, scratch, textures) = scoped(device, "allocating tensors", || {
            let mut in_place = HashMap::new();
            let buffers: Vec<wgpu::Buffer> = plan
                .buffers
                .iter()
                .enumerate()
                .map(|(i, &bytes)| {
                    let label = format!("buffer {i}");
                    if !input_buffers.contains(&i) {
                        return allocate(label, bytes);
                    }
                    let copies: Vec<MappedBuffer> = (0..slots)
                        .map(|slot| {
                            let label = format!("{label} slot {slot}");
                            MappedBuffer::new(device, &label, padded(bytes), storage_usage)
                        })
                        .collect();
                    let buffer = copies[0].buffer().clone();
                    in_place.insert(i, copies);
                    buffer
                })
                .collect();
            let scratch: Vec<wgpu::Buffer> = program
                .scratch
                .iter()
                .enumerate()
                .map(|(i, &bytes)| allocate(format!("scratch {i}"), bytes))
                .collect();
            let textures: Vec<wgpu::TextureView> = program
                .textures
                .iter()
                .enumerate()
                .map(|(i, &size)| {
                    texture::create(device, &format!("texture {i}"), size)
                        .create_view(&wgpu::TextureViewDescriptor::default())
                })
                .collect();
            (buffers, in_place, scratch, textures)
        })
        .await?;
        upload_weights(ctx, &plan, &buffers, weights)?;
        for (v, t) in &plan.constants {
            if !t.is_empty() {
                let bytes = t.to_storage_bytes(plan.values[*v].layout);
                ctx.queue
                    .write_buffer(&buffers[plan.values[*v].buffer], 0, &bytes);
            }
        }
        let mut passes = Vec::new();
        let mut created = 0;
        for pass in &program.passes {
            let k = &pass.kernel;
            let (pipeline, new) = ctx.pipeline(&k.label, &k.source, &pass.label).await?;
            created += usize::from(new);
            let per_slot = pass.buffers.iter().any(
                |b| matches!(*b, Buffer::Value(v) if in_place.contains_key(&plan.values[v].buffer)),
            );
            let bind_groups = scoped(device, &pass.label, || {
                let info = device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("info"),
                    size: padded(4 * k.info.len() as u64),
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                ctx.queue
                    .write_buffer(&info, 0, bytemuck::cast_slice(&k.info));
                let groups = if per_slot { slots } else { 1 };
                (0..groups)
                    .map(|slot| {
                        let mut entries = vec![wgpu::BindGroupEntry {
                            binding: 0,
                            resource: info.as_entire_binding(),
                        }];
                        for (i, b) in pass.buffers.iter().enumerate() {
                            let resource = match *b {
                                Buffer::Value(v) => {
                                    let b = plan.values[v].buffer;
                                    in_place
                                        .get(&b)
                                        .and_then(|copies| copies.get(slot))
                                        .map_or(&buffers[b], MappedBuffer::buffer)
                                        .as_entire_binding()
                                }
                                Buffer::Scratch(s) => scratch[s].as_entire_binding(),
                                Buffer::Texture(t) => {
                                    wgpu::BindingResource::TextureView(&textures[t])
                                }
                            };
                            entries.push(wgpu::BindGroupEntry {
                                binding: i as u32 + 1,
                                resource,
                            });
                        }
                        device.create_bind_group(&wgpu::BindGroupDescriptor {
                            label: Some(&pass.label),
                            layout: &pipeline.get_bind_group_layout(0),
                            entries: &entries,
                        })
                    })
                    .collect::<Vec<_>>()
            })
            .await?;
            let stages = stages_input(&plan, &program.passes, passes.len());
            passes.push(CompiledPass {
                label: pass.label.clone(),
                pipeline,
                bind_groups,
                workgroups: k.workgroups,
                stages,
            });
        }
        let mut readback_layout = Vec::new();
        let mut offset = 0u64;
        for (_, v) in &plan.outputs {
            let bytes = plan.values[*v].bytes();
            readback_layout.push((*v, offset, bytes));
            offset += padded(bytes);
        }
        let timestamp_offset = offset;
        let use_timestamps = pass_timing != PassTiming::Off
            && device.features().contains(wgpu::Features::TIMESTAMP_QUERY)
            && !passes.is_empty()
            && passes.len() * 2 <= wgpu::QUERY_SET_MAX_QUERIES as usize;
        let ts_bytes = if use_timestamps {
            16 * passes.len() as u64
        } else {
            0
        };
        let ring = scoped(device, "prefetch ring", || {
            (0..slots)
                .map(|slot| Ring {
                    readback: device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some(&format!("readback slot {slot}")),
                        size: (offset + ts_bytes).max(8),
                        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    }),
                    staging: None,
                })
                .collect::<Vec<_>>()
        })
        .await?;
        let pass_count = passes.len();
        let mut exe = GpuExecutable {
            ctx: ctx.clone(),
            plan,
            buffers,
            scratch,
            textures,
            passes,
            timestamps: None,
            pass_timing,
            submitted: 0,
            kept: BTreeSet::new(),
            staged: vec![false; pass_count],
            in_place,
            latest_pass_ns: Vec::new(),
            compute_end_ns: 0,
            ring,
            readback_layout,
            timestamp_offset,
            in_flight: VecDeque::new(),
            next_slot: 0,
            stats: CompileStats::default(),
        };
        if use_timestamps {
            exe.timestamps = Some(exe.calibrate_timestamps().await?);
        }
        exe.stats = CompileStats {
            pipelines_created: created,
            passes: pass_count,
            millis: now_ns().saturating_sub(started) as f64 / 1e6,
        };
        Ok(exe)
    }

    /// Creates the query set and finds the offset from device ticks to the host clock: an
    /// empty timestamped pass, bracketed by host times.
    async fn calibrate_timestamps(&self) -> Result<Timestamps, RunError> {
        let device = &self.ctx.device;
        let count = (2 * self.passes.len()) as u32;
        let (queries, resolve, probe) = scoped(device, "timestamp queries", || {
            (
                device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("pass timestamps"),
                    ty: wgpu::QueryType::Timestamp,
                    count,
                }),
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("timestamp resolve"),
                    size: 8 * u64::from(count),
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                }),
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("timestamp probe"),
                    size: 16,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
            )
        })
        .await?;
        let period = f64::from(self.ctx.queue.get_timestamp_period());
        let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("calibrate"),
        });
        {
            let _pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("calibrate"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &queries,
                    beginning_of_pass_write_index: Some(0),
                    end_of_pass_write_index: Some(1),
                }),
            });
        }
        enc.resolve_query_set(&queries, 0..2, &resolve, 0);
        enc.copy_buffer_to_buffer(&resolve, 0, &probe, 0, 16);
        let h0 = now_ns();
        self.ctx.queue.submit([enc.finish()]);
        map_read(device, &probe).await?;
        let h1 = now_ns();
        let ticks: Vec<u64> = {
            let view = probe
                .get_mapped_range(..)
                .map_err(|e| RunError::Device(format!("reading timestamps failed: {e:?}")))?;
            view.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect()
        };
        probe.unmap();
        let (t0, t1) = match ticks.as_slice() {
            [a, b, ..] => (*a, *b),
            _ => (0, 0),
        };
        let device_mid = (t0 as f64 + t1 as f64) / 2.0 * period;
        let host_mid = (h0 as f64 + h1 as f64) / 2.0;
        Ok(Timestamps {
            queries,
            inside_passes: device
                .features()
                .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
            resolve,
            period,
            offset: (host_mid - device_mid) as i128,
        })
    }

    /// Runs one micro-batch and returns its outputs in the plan's output order (for tests
    /// and tools; runs go through the driver).
    pub async fn run_once(&mut self, inputs: &Values) -> Result<Vec<(String, Tensor)>, RunError> {
        let trace = TraceContext::new("", now_ns());
        let mut events = Vec::new();
        self.submit(
            0,
            crate::exec::input::owned(inputs.clone()),
            &trace,
            &mut events,
        )?;
        let (_, mut outs) = self.finish(&trace, &mut events).await?;
        self.plan
            .outputs
            .iter()
            .map(|(name, _)| {
                outs.remove(name)
                    .map(|t| (name.clone(), t))
                    .ok_or_else(|| RunError::Internal(format!("output '{name}' missing")))
            })
            .collect()
    }

    /// The device it runs on.
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// Checks and uploads the inputs straight into their device buffers (for measuring
    /// kernels on resident data with [`GpuExecutable::run_resident`]).
    pub fn upload_inputs(&mut self, inputs: &Values) -> Result<(), RunError> {
        crate::exec::dataset::check_plan_inputs(&self.plan, inputs, &BTreeSet::new())?;
        self.write_inputs(inputs)
    }

    /// Writes the given inputs into their device buffers, ordered by the queue after the
    /// micro-batches already submitted (in place on a CPU adapter, once those have run).
    /// Inputs have buffers of their own that no pass writes, so the values stay until
    /// replaced.
    fn write_inputs(&mut self, inputs: &Values) -> Result<(), RunError> {
        for (i, p) in self.passes.iter().enumerate() {
            if p.stages
                .is_some_and(|k| inputs.contains_key(&self.plan.inputs[k].0))
            {
                self.staged[i] = false;
            }
        }
        for (name, v) in &self.plan.inputs {
            if let Some(t) = inputs.get(name).filter(|t| !t.is_empty()) {
                let value = &self.plan.values[*v];
                let bytes = t.to_storage_bytes(value.layout);
                match self.in_place.get_mut(&value.buffer) {
                    // Every slot's copy: the value stays for the micro-batches of all.
                    Some(copies) => {
                        for mapped in copies {
                            mapped.wait_mapped(&self.ctx.device, name)?;
                            mapped.write(0, &bytes)?;
                            mapped.unmap();
                        }
                    }
                    None => self
                        .ctx
                        .queue
                        .write_buffer(&self.buffers[value.buffer], 0, &bytes),
                }
            }
        }
        Ok(())
    }

    /// Makes slot `slot`'s in-place input buffers usable by a submission: maps under way
    /// are waited for, mapped buffers unmapped (their contents stay).
    fn release_in_place(&mut self, slot: usize) -> Result<(), RunError> {
        for (buffer, copies) in &mut self.in_place {
            let Some(mapped) = copies.get_mut(slot) else {
                continue;
            };
            if mapped.mapping() {
                mapped.wait_mapped(&self.ctx.device, &format!("input buffer {buffer}"))?;
            }
            mapped.unmap();
        }
        Ok(())
    }

    /// The buffer prefetch slot `slot` uses for plan buffer `buffer` (its own copy of an
    /// input written in place).
    fn slot_buffer(&self, buffer: usize, slot: usize) -> &wgpu::Buffer {
        self.in_place
            .get(&buffer)
            .and_then(|copies| copies.get(slot))
            .map_or(&self.buffers[buffer], MappedBuffer::buffer)
    }

    /// Records every pass `repeat` times. Untimed, all go into one compute pass (wgpu orders
    /// each dispatch after the writes it reads); timed, timestamps are written inside that
    /// one compute pass before the first dispatch and after each (see
    /// [`Timestamps::bounds`]) where the adapter allows it, else each dispatch becomes its
    /// own timestamped compute pass.
    ///
    /// Passes with `skip[i]` set are left out (their timestamps are still written, so a
    /// left-out pass reports no time).
    fn encode_passes(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        slot: usize,
        repeat: usize,
        timestamps: bool,
        skip: &[bool],
    ) {
        let timed = self.timestamps.as_ref().filter(|_| timestamps);
        let runs = |i: usize| !skip.get(i).copied().unwrap_or(false);
        if let Some(t) = timed.filter(|t| !t.inside_passes) {
            for _ in 0..repeat {
                for (i, p) in self.passes.iter().enumerate() {
                    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some(&p.label),
                        timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                            query_set: &t.queries,
                            beginning_of_pass_write_index: Some(2 * i as u32),
                            end_of_pass_write_index: Some(2 * i as u32 + 1),
                        }),
                    });
                    if runs(i) {
                        p.dispatch(&mut pass, slot);
                    }
                }
            }
            return;
        }
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("passes"),
            timestamp_writes: None,
        });
        for _ in 0..repeat {
            if let Some(t) = timed {
                pass.write_timestamp(&t.queries, 0);
            }
            for (i, p) in self.passes.iter().enumerate() {
                if runs(i) {
                    p.dispatch(&mut pass, slot);
                }
                if let Some(t) = timed {
                    pass.write_timestamp(&t.queries, i as u32 + 1);
                }
            }
        }
    }

    /// Which passes a micro-batch given `inputs` can leave out: those that staged the
    /// current value of a kept input the micro-batch does not give again.
    fn skip_staged(&self, inputs: &Inputs<'_>) -> Vec<bool> {
        self.passes
            .iter()
            .enumerate()
            .map(|(i, p)| {
                p.stages.is_some_and(|k| {
                    let name = self.plan.inputs[k].0.as_str();
                    self.staged[i]
                        && self.kept.contains(name)
                        && inputs.get(name).is_none_or(|t| t.is_empty())
                })
            })
            .collect()
    }

    /// Writes micro-batch `m`'s inputs where its passes will read them: in place on a CPU
    /// adapter, else through slot `slot`'s upload buffer. Kept inputs left out are already
    /// there.
    fn upload(
        &mut self,
        slot: usize,
        m: usize,
        inputs: &Inputs<'_>,
        enc: &mut wgpu::CommandEncoder,
        trace: &TraceContext<'_>,
        events: &mut Vec<Event>,
    ) -> Result<Uploaded, RunError> {
        let given: Vec<(String, usize)> = self
            .plan
            .inputs
            .iter()
            .filter(|(name, _)| inputs.get(name.as_str()).is_some_and(|t| !t.is_empty()))
            .cloned()
            .collect();
        if given.is_empty() {
            self.release_in_place(slot)?;
            return Ok(Uploaded::Nothing);
        }
        if !self.in_place.is_empty() {
            return self.write_in_place(slot, m, &given, inputs, trace, events);
        }
        Ok(
            if self.stage(slot, m, &given, inputs, enc, trace, events)? {
                Uploaded::Staged
            } else {
                Uploaded::Queued
            },
        )
    }

    /// Writes the `given` inputs into slot `slot`'s copies of their device buffers, mapped
    /// (a CPU adapter's device memory is host memory), then unmaps the slot's buffers for
    /// the submission. A kept input given again goes into every slot's copy, so that it
    /// stays for the micro-batches after. Returns the buffers written, to map again once
    /// the micro-batch is submitted.
    fn write_in_place(
        &mut self,
        slot: usize,
        m: usize,
        given: &[(String, usize)],
        inputs: &Inputs<'_>,
        trace: &TraceContext<'_>,
        events: &mut Vec<Event>,
    ) -> Result<Uploaded, RunError> {
        let mut written = Vec::new();
        for (name, v) in given {
            let (Some(t), value) = (inputs.get(name), &self.plan.values[*v]) else {
                continue;
            };
            let copies = self.in_place.get_mut(&value.buffer).ok_or_else(|| {
                RunError::Internal(format!("input '{name}' has no in-place buffer"))
            })?;
            let kept = self.kept.contains(name);
            let t0 = now_ns();
            let pieces = device_bytes(t, value.layout);
            for (s, mapped) in copies.iter_mut().enumerate() {
                if s != slot && !kept {
                    continue;
                }
                mapped.wait_mapped(&self.ctx.device, name)?;
                let mut offset = 0u64;
                for piece in &pieces {
                    mapped.write(offset, piece)?;
                    offset += piece.len() as u64;
                }
                if s != slot {
                    mapped.unmap();
                }
            }
            written.push(value.buffer);
            let e = trace.event(m, name.clone(), trace.input_kind(name), t0, now_ns());
            trace.record(events, e);
        }
        self.release_in_place(slot)?;
        Ok(Uploaded::InPlace(written))
    }

    /// Writes the `given` inputs into slot `slot`'s upload buffer and records their copies
    /// into their device buffers at the start of `enc`. Each input has a buffer of its own
    /// that no pass writes, and the copies run after the micro-batches already submitted
    /// (which read the previous values). When the upload buffer is not mapped yet (a
    /// micro-batch whose completion was never awaited) the queue writes the inputs
    /// instead. Returns whether the upload buffer was used.
    #[allow(clippy::too_many_arguments)]
    fn stage(
        &mut self,
        slot: usize,
        m: usize,
        given: &[(String, usize)],
        inputs: &Inputs<'_>,
        enc: &mut wgpu::CommandEncoder,
        trace: &TraceContext<'_>,
        events: &mut Vec<Event>,
    ) -> Result<bool, RunError> {
        let staging = match &mut self.ring[slot].staging {
            Some(s) => s,
            empty => {
                let bytes = given.iter().fold(0u64, |a, (_, v)| {
                    a.saturating_add(padded(self.plan.values[*v].bytes()))
                });
                empty.insert(MappedBuffer::new(
                    &self.ctx.device,
                    &format!("upload slot {slot}"),
                    bytes,
                    wgpu::BufferUsages::COPY_SRC,
                ))
            }
        };
        let mapped = staging.ready();
        let mut copies = Vec::new();
        let mut offset = 0u64;
        for (name, v) in given {
            let Some(t) = inputs.get(name) else {
                continue;
            };
            let t0 = now_ns();
            let value = &self.plan.values[*v];
            let pieces = device_bytes(t, value.layout);
            let len = pieces.iter().map(|p| p.len() as u64).sum::<u64>();
            let fits = offset
                .checked_add(len)
                .is_some_and(|end| end <= staging.size());
            if mapped && fits && len.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT) {
                let mut at = offset;
                for piece in &pieces {
                    staging.write(at, piece)?;
                    at += piece.len() as u64;
                }
                copies.push((value.buffer, offset, len));
                offset += padded(len);
            } else {
                let mut at = 0u64;
                for piece in &pieces {
                    self.ctx
                        .queue
                        .write_buffer(&self.buffers[value.buffer], at, piece);
                    at += piece.len() as u64;
                }
            }
            let e = trace.event(m, name.clone(), trace.input_kind(name), t0, now_ns());
            trace.record(events, e);
        }
        if mapped {
            staging.unmap();
            for (buffer, offset, len) in copies {
                enc.copy_buffer_to_buffer(staging.buffer(), offset, &self.buffers[buffer], 0, len);
            }
        }
        Ok(mapped)
    }

    /// Runs the passes `repeat` times on the inputs already on the device, without
    /// uploading or reading back (for measuring kernels on resident data).
    pub async fn run_resident(&mut self, repeat: usize) -> Result<(), RunError> {
        self.release_in_place(0)?;
        let mut encoder = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("resident"),
            });
        self.encode_passes(&mut encoder, 0, repeat, false, &[]);
        self.ctx.queue.submit([encoder.finish()]);
        wait_idle(&self.ctx.device, &self.ctx.queue).await
    }

    async fn finish(
        &mut self,
        trace: &TraceContext<'_>,
        events: &mut Vec<Event>,
    ) -> Result<(usize, Values), RunError> {
        let Some(p) = self.in_flight.pop_front() else {
            return Err(RunError::Internal(
                "completion awaited with nothing in flight".into(),
            ));
        };
        finish_map(&self.ctx.device, p.map, Some(p.submission)).await?;
        let ring = &mut self.ring[p.slot];
        if let Some(s) = ring.staging.as_mut() {
            s.settle().await;
        }
        for copies in self.in_place.values_mut() {
            if let Some(mapped) = copies.get_mut(p.slot) {
                mapped.settle().await;
            }
        }
        let ring = &self.ring[p.slot];
        let done = now_ns();
        let mut outs = Values::new();
        {
            let view = ring
                .readback
                .get_mapped_range(..)
                .map_err(|e| RunError::Device(format!("reading back outputs failed: {e:?}")))?;
            for ((name, v), &(_, offset, bytes)) in
                self.plan.outputs.iter().zip(&self.readback_layout)
            {
                let value = &self.plan.values[*v];
                let slice = view
                    .get(offset as usize..(offset + bytes) as usize)
                    .ok_or_else(|| RunError::Internal("readback slot too small".into()))?;
                outs.insert(
                    name.clone(),
                    Tensor::from_storage_bytes(
                        value.shape.clone(),
                        value.dtype,
                        value.layout,
                        slice,
                    ),
                );
            }
            match self.timestamps.as_ref().filter(|_| p.timed) {
                Some(ts) => {
                    let base = self.timestamp_offset as usize;
                    let at = |j: usize| {
                        let o = base + 8 * j;
                        view.get(o..o + 8)
                            .and_then(|b| b.try_into().ok())
                            .map_or(0, u64::from_le_bytes)
                    };
                    let to_host =
                        |ticks: u64| ((ticks as f64 * ts.period) as i128 + ts.offset).max(0) as u64;
                    self.latest_pass_ns.clear();
                    for (i, pass) in self.passes.iter().enumerate() {
                        let (s, e) = ts.bounds(i);
                        let (s, e) = (to_host(at(s)), to_host(at(e)));
                        self.latest_pass_ns.push(e.saturating_sub(s));
                        self.compute_end_ns = self.compute_end_ns.max(e);
                        let event =
                            trace.event(p.m, pass.label.clone(), EventKind::Compute, s, e.max(s));
                        trace.record(events, event);
                    }
                }
                None if !self.latest_pass_ns.is_empty() => {
                    let from = p.submitted_ns.max(self.compute_end_ns).min(done);
                    let spans = sampled_spans(&self.latest_pass_ns, from, done);
                    self.compute_end_ns = done;
                    for (pass, (s, e)) in self.passes.iter().zip(spans) {
                        let event = trace.event(p.m, pass.label.clone(), EventKind::Compute, s, e);
                        trace.record(events, event);
                    }
                }
                None => {
                    let from = p.submitted_ns.max(self.compute_end_ns).min(done);
                    self.compute_end_ns = done;
                    let event = trace.event(
                        p.m,
                        "all passes (host timing)".into(),
                        EventKind::Compute,
                        from,
                        done,
                    );
                    trace.record(events, event);
                }
            }
        }
        ring.readback.unmap();
        let copied = now_ns();
        let kind = trace.output_kind(self.plan.outputs.iter().map(|(n, _)| n.as_str()));
        let event = trace.event(p.m, "outputs".into(), kind, done, copied.max(done + 1));
        trace.record(events, event);
        Ok((p.m, outs))
    }
}

/// Host-clock spans for the passes of an untimed micro-batch that could start at `from`
/// (its submission, or the end of the work before it) and was seen complete at `done`: the
/// latest measured pass times back to back, ending at `done`, shrunk in proportion where
/// they would not fit between the two.
fn sampled_spans(latest_ns: &[u64], from: u64, done: u64) -> Vec<(u64, u64)> {
    let total = latest_ns.iter().fold(0u64, |a, &b| a.saturating_add(b));
    let window = done.saturating_sub(from);
    let scale = if total > window {
        window as f64 / total as f64
    } else {
        1.0
    };
    let mut start = done.saturating_sub(total.min(window));
    latest_ns
        .iter()
        .map(|&ns| {
            let end = (start + (ns as f64 * scale) as u64).min(done);
            let span = (start, end);
            start = end;
            span
        })
        .collect()
}

/// Converts every weight of `plan` to its device storage and queues its upload (ordered
/// after work already submitted, before work submitted next).
fn upload_weights(
    ctx: &GpuContext,
    plan: &Plan,
    buffers: &[wgpu::Buffer],
    weights: &Weights,
) -> Result<(), RunError> {
    for (key, v) in &plan.params {
        let w = weights
            .get(key)
            .ok_or_else(|| RunError::MissingWeight(key.clone()))?;
        let bytes = w.to_storage_bytes(plan.values[*v].layout);
        ctx.queue
            .write_buffer(&buffers[plan.values[*v].buffer], 0, &bytes);
    }
    Ok(())
}

impl Executable for GpuExecutable {
    fn plan(&self) -> &Plan {
        &self.plan
    }

    fn capacity(&self) -> usize {
        self.ring.len()
    }

    fn submit(
        &mut self,
        m: usize,
        inputs: Inputs<'_>,
        trace: &TraceContext<'_>,
        events: &mut Vec<Event>,
    ) -> Result<(), RunError> {
        if self.in_flight.len() >= self.ring.len() {
            return Err(RunError::Internal(format!(
                "micro-batch {m} submitted while all {} slots are in flight",
                self.ring.len()
            )));
        }
        crate::exec::dataset::check_plan_inputs(&self.plan, &inputs, &self.kept)?;
        let slot = self.next_slot % self.ring.len();
        self.next_slot += 1;
        let mut enc = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("micro-batch"),
            });
        let uploaded = self.upload(slot, m, &inputs, &mut enc, trace, events)?;
        let timed = self.timestamps.is_some() && self.pass_timing.times(self.submitted);
        self.submitted += 1;
        let skip = self.skip_staged(&inputs);
        self.encode_passes(&mut enc, slot, 1, timed, &skip);
        for (i, p) in self.passes.iter().enumerate() {
            if let Some(input) = p.stages {
                // What it staged (now or before) is the input's kept value, if kept.
                self.staged[i] = self.kept.contains(&self.plan.inputs[input].0);
            }
        }
        for &(v, offset, bytes) in &self.readback_layout {
            if bytes > 0 {
                enc.copy_buffer_to_buffer(
                    self.slot_buffer(self.plan.values[v].buffer, slot),
                    0,
                    &self.ring[slot].readback,
                    offset,
                    bytes.div_ceil(4) * 4,
                );
            }
        }
        if let Some(ts) = self.timestamps.as_ref().filter(|_| timed) {
            let n = ts.written(self.passes.len());
            enc.resolve_query_set(&ts.queries, 0..n, &ts.resolve, 0);
            enc.copy_buffer_to_buffer(
                &ts.resolve,
                0,
                &self.ring[slot].readback,
                self.timestamp_offset,
                8 * u64::from(n),
            );
        }
        let submitted_ns = now_ns();
        let submission = self.ctx.queue.submit([enc.finish()]);
        let ring = &mut self.ring[slot];
        match uploaded {
            Uploaded::Staged => {
                if let Some(s) = ring.staging.as_mut() {
                    s.remap();
                }
            }
            Uploaded::InPlace(written) => {
                for b in written {
                    if let Some(mapped) = self.in_place.get_mut(&b).and_then(|c| c.get_mut(slot)) {
                        mapped.remap();
                    }
                }
            }
            Uploaded::Nothing | Uploaded::Queued => {}
        }
        let map = start_map(&ring.readback);
        self.in_flight.push_back(Pending {
            m,
            slot,
            map,
            submission,
            submitted_ns,
            timed,
        });
        Ok(())
    }

    fn complete<'a>(
        &'a mut self,
        trace: &'a TraceContext<'a>,
        events: &'a mut Vec<Event>,
    ) -> LocalBoxFuture<'a, Result<(usize, Values), RunError>> {
        Box::pin(self.finish(trace, events))
    }

    fn keep_inputs(&mut self, inputs: &Values) -> Result<(), RunError> {
        crate::exec::dataset::check_kept_inputs(&self.plan, inputs)?;
        self.write_inputs(inputs)?;
        self.kept.extend(inputs.keys().cloned());
        Ok(())
    }

    fn write_weights(&mut self, weights: &Weights) -> Result<(), RunError> {
        self.plan.check_weights(weights)?;
        upload_weights(&self.ctx, &self.plan, &self.buffers, weights)
    }

    fn allocated_bytes(&self) -> u64 {
        let tensors: u64 = self.buffers.iter().map(|b| b.size()).sum();
        let scratch: u64 = self.scratch.iter().map(|b| b.size()).sum();
        let textures: u64 = self
            .textures
            .iter()
            .map(|t| {
                let size = t.texture().size();
                texture::bytes([size.width, size.height])
            })
            .sum();
        let ring: u64 = self
            .ring
            .iter()
            .map(|r| r.readback.size() + r.staging.as_ref().map_or(0, MappedBuffer::size))
            .sum();
        // Slot 0's copies of in-place inputs are in `buffers`.
        let copies: u64 = self
            .in_place
            .values()
            .flat_map(|copies| copies.iter().skip(1))
            .map(MappedBuffer::size)
            .sum();
        let queries = self.timestamps.as_ref().map_or(0, |t| t.resolve.size());
        tensors + scratch + textures + ring + copies + queries
    }

    fn timing(&self) -> TimingSource {
        match (&self.timestamps, self.pass_timing) {
            (None, _) | (_, PassTiming::Off) => TimingSource::HostCompletion,
            (Some(_), PassTiming::Every) => TimingSource::TimestampQueries,
            (Some(_), PassTiming::Sampled(_)) => TimingSource::SampledTimestampQueries,
        }
    }

    fn device_name(&self) -> String {
        self.ctx.describe()
    }

    fn compile_stats(&self) -> CompileStats {
        self.stats
    }
}

/// The graph input (index in `plan.inputs`) pass `index` of `passes` only stages: it binds
/// that input's value and one texture and nothing else, and is the first pass to bind the
/// texture (so it writes it; the passes after read it). No pass writes an input's buffer
/// and textures are never shared between nodes, so the texture holds what the pass made
/// of the input until the input is written again.
fn stages_input(plan: &Plan, passes: &[Pass], index: usize) -> Option<usize> {
    let [a, b] = passes.get(index)?.buffers[..] else {
        return None;
    };
    let (value, texture) = match (a, b) {
        (Buffer::Value(v), Buffer::Texture(t)) | (Buffer::Texture(t), Buffer::Value(v)) => (v, t),
        _ => return None,
    };
    let first_to_bind = !passes[..index]
        .iter()
        .any(|p| p.buffers.contains(&Buffer::Texture(texture)));
    first_to_bind
        .then(|| plan.inputs.iter().position(|(_, v)| *v == value))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::{sampled_spans, PassTiming};

    #[test]
    fn sampled_timing_takes_the_first_two_micro_batches_then_one_in_n() {
        let timed: Vec<u64> = (0..40)
            .filter(|&c| PassTiming::Sampled(16).times(c))
            .collect();
        assert_eq!(timed, [0, 1, 16, 32]);
        assert!((0..40).all(|c| PassTiming::Every.times(c)));
        assert!((0..40).all(|c| !PassTiming::Off.times(c)));
        assert!(
            PassTiming::Sampled(0).times(7),
            "a zero interval times every one"
        );
    }

    #[test]
    fn untimed_passes_take_the_latest_times_back_to_back_ending_at_completion() {
        assert_eq!(sampled_spans(&[10, 30], 100, 200), [(160, 170), (170, 200)]);
        // Longer than the host saw: shrunk in proportion to fit from submission on.
        assert_eq!(
            sampled_spans(&[100, 300], 100, 200),
            [(100, 125), (125, 200)]
        );
        assert_eq!(sampled_spans(&[5], 50, 50), [(50, 50)]);
    }
}
