//! A plan compiled on a device: buffers allocated (after checking the adapter's limits),
//! weights and constants uploaded once, pipelines and bind groups created once. A run
//! streams micro-batches through a ring of `prefetch` slots: the host uploads micro-batch
//! m+1.. into free input slots while the device computes m, and reads results back
//! through a ring of output slots with `map_async`. Each pass carries timestamp queries
//! when the adapter has them, so every pass becomes a compute event.

use super::gpu::GpuContext;
use super::plan::Plan;
use super::readback::{finish_map, map_read, start_map, wait_idle, MapPending};
use super::RunError;
use crate::telemetry::{now_ns, Event, EventKind, TimingSource};
use crate::tensor::{Tensor, TensorData};
use crate::weights::Weights;
use std::collections::HashMap;

struct Pass {
    label: String,
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    workgroups: [u32; 3],
}

/// Timestamp queries around every pass, and how device ticks map to the host clock.
struct Timestamps {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    /// Nanoseconds per tick.
    period: f64,
    /// Host-clock ns (see [`now_ns`]) minus device ns.
    offset: i128,
}

/// One prefetch slot: staging buffers for the inputs, and a readback buffer for the
/// outputs and timestamps.
struct Ring {
    staging: Vec<wgpu::Buffer>,
    readback: wgpu::Buffer,
}

/// A submitted micro-batch: index, its readback map, submission, host submit time.
type Pending = (usize, MapPending, wgpu::SubmissionIndex, u64);

/// What an input source has next.
pub enum Next {
    /// Micro-batch `m` (relative to the trace's first micro-batch) with its inputs.
    Ready(usize, HashMap<String, Tensor>),
    /// Nothing yet (only when not asked to block).
    NotReady,
    /// No more micro-batches.
    Done,
}

/// Options of an executable.
#[derive(Debug, Clone, Copy)]
pub struct ExecOptions {
    /// Prefetch slots K (1 = no overlap of upload and compute).
    pub prefetch: usize,
    /// Device index reported in events.
    pub device: usize,
    /// Pipeline stage reported in events.
    pub stage: usize,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            prefetch: 1,
            device: 0,
            stage: 0,
        }
    }
}

/// What a traced run reports about its events.
#[derive(Debug, Clone)]
pub struct Traced {
    /// Outputs of each micro-batch, in order.
    pub outputs: Vec<Vec<(String, Tensor)>>,
    /// Events, times relative to the run's start.
    pub events: Vec<Event>,
}

/// Labels events of a run.
#[derive(Clone, Copy)]
pub struct TraceContext<'a> {
    /// Run id.
    pub run: &'a str,
    /// [`now_ns`] at the start of the run.
    pub start_ns: u64,
    /// Index of this call's first micro-batch within the run.
    pub first_micro_batch: usize,
    /// Inputs that come from another stage (their uploads are transfers).
    pub transferred_inputs: &'a [String],
    /// Outputs that go to another stage (their downloads are transfers).
    pub transferred_outputs: &'a [String],
    /// Called with every event as soon as it is known (the live event stream).
    pub observer: Option<&'a (dyn Fn(&Event) + Sync)>,
    /// Set to stop the run: no further micro-batch is submitted.
    pub cancel: Option<&'a std::sync::atomic::AtomicBool>,
}

impl<'a> TraceContext<'a> {
    /// A run starting now-ish at `start_ns`, on one device, with no observer or cancel flag.
    pub fn new(run: &'a str, start_ns: u64) -> TraceContext<'a> {
        TraceContext {
            run,
            start_ns,
            first_micro_batch: 0,
            transferred_inputs: &[],
            transferred_outputs: &[],
            observer: None,
            cancel: None,
        }
    }
}

/// A plan ready to run on one device.
pub struct GpuExecutable {
    ctx: GpuContext,
    plan: Plan,
    options: ExecOptions,
    buffers: Vec<wgpu::Buffer>,
    passes: Vec<Pass>,
    timestamps: Option<Timestamps>,
    ring: Vec<Ring>,
    /// (value, byte offset in a readback slot, bytes).
    readback_layout: Vec<(usize, u64, u64)>,
    /// Offset of the timestamps in a readback slot.
    timestamp_offset: u64,
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

fn check_limits(plan: &Plan, limits: &wgpu::Limits) -> Result<(), RunError> {
    for v in &plan.values {
        let bytes = plan.buffers[v.buffer];
        if bytes > limits.max_buffer_size {
            return Err(RunError::TooLarge {
                value: v.name.clone(),
                bytes,
                limit: limits.max_buffer_size,
                what: "maximum buffer size",
            });
        }
        if bytes > limits.max_storage_buffer_binding_size {
            return Err(RunError::TooLarge {
                value: v.name.clone(),
                bytes,
                limit: limits.max_storage_buffer_binding_size,
                what: "maximum storage binding size",
            });
        }
    }
    for s in &plan.steps {
        if let Some(&g) = s
            .kernel
            .workgroups
            .iter()
            .find(|&&g| g > limits.max_compute_workgroups_per_dimension)
        {
            return Err(RunError::Op {
                node: s.node.clone(),
                message: format!(
                    "{g} workgroups exceed the adapter's limit of {} per dimension",
                    limits.max_compute_workgroups_per_dimension
                ),
            });
        }
        if s.kernel.slots.len() + 1 > limits.max_storage_buffers_per_shader_stage as usize {
            return Err(RunError::Op {
                node: s.node.clone(),
                message: format!(
                    "kernel '{}' needs {} storage bindings; the adapter allows {}",
                    s.kernel.label,
                    s.kernel.slots.len() + 1,
                    limits.max_storage_buffers_per_shader_stage
                ),
            });
        }
    }
    Ok(())
}

impl GpuExecutable {
    /// Compiles a plan with one slot and no event labels.
    pub async fn new(
        ctx: &GpuContext,
        plan: Plan,
        weights: &Weights,
    ) -> Result<GpuExecutable, RunError> {
        GpuExecutable::with_options(ctx, plan, weights, ExecOptions::default()).await
    }

    /// Allocates, uploads weights and constants, builds every pipeline and bind group, and
    /// the prefetch ring.
    pub async fn with_options(
        ctx: &GpuContext,
        plan: Plan,
        weights: &Weights,
        options: ExecOptions,
    ) -> Result<GpuExecutable, RunError> {
        let device = &ctx.device;
        check_limits(&plan, &ctx.limits)?;
        let native_half = plan
            .values
            .iter()
            .any(|v| v.layout == crate::ops::Storage::F16);
        if native_half && !device.features().contains(wgpu::Features::SHADER_F16) {
            return Err(RunError::Unsupported(format!(
                "native f16 storage needs the adapter feature shader-f16, which '{}' lacks (the packed 16-bit storage works everywhere)",
                ctx.adapter.name
            )));
        }
        if plan
            .values
            .iter()
            .any(|v| v.layout == crate::ops::Storage::F16)
            && !device.features().contains(wgpu::Features::SHADER_F16)
        {
            return Err(RunError::Unsupported(format!(
                "native f16 storage needs the adapter feature shader-f16, which '{}' lacks (use the packed 16-bit storage)",
                ctx.adapter.name
            )));
        }
        let storage_usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let buffers = scoped(device, "allocating tensors", || {
            plan.buffers
                .iter()
                .enumerate()
                .map(|(i, &bytes)| {
                    device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some(&format!("buffer {i}")),
                        size: padded(bytes),
                        usage: storage_usage,
                        mapped_at_creation: false,
                    })
                })
                .collect::<Vec<_>>()
        })
        .await?;
        for (key, v) in &plan.params {
            let w = weights
                .get(key)
                .ok_or_else(|| RunError::MissingWeight(key.clone()))?;
            if w.shape != plan.values[*v].shape {
                return Err(RunError::Input {
                    name: key.clone(),
                    message: format!(
                        "weight has shape {:?}, expected {:?}",
                        w.shape, plan.values[*v].shape
                    ),
                });
            }
            // Weights are converted to their device storage once, here.
            let bytes = w.to_storage_bytes(plan.values[*v].layout);
            ctx.queue
                .write_buffer(&buffers[plan.values[*v].buffer], 0, &bytes);
        }
        for (v, t) in &plan.constants {
            if !t.is_empty() {
                let bytes = t.to_storage_bytes(plan.values[*v].layout);
                ctx.queue
                    .write_buffer(&buffers[plan.values[*v].buffer], 0, &bytes);
            }
        }
        let mut pipelines: HashMap<String, wgpu::ComputePipeline> = HashMap::new();
        let mut passes = Vec::new();
        for step in &plan.steps {
            let k = &step.kernel;
            if k.workgroups.contains(&0) {
                continue;
            }
            let label = if step.nodes.len() > 1 {
                format!("{} (fused)", step.nodes.join("+"))
            } else {
                step.node.clone()
            };
            let pipeline = match pipelines.get(&k.source) {
                Some(p) => p.clone(),
                None => {
                    let p = scoped(device, &label, || {
                        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                            label: Some(&k.label),
                            source: wgpu::ShaderSource::Wgsl(k.source.as_str().into()),
                        });
                        device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                            label: Some(&k.label),
                            layout: None,
                            module: &module,
                            entry_point: Some("main"),
                            compilation_options: Default::default(),
                            cache: None,
                        })
                    })
                    .await?;
                    pipelines.insert(k.source.clone(), p.clone());
                    p
                }
            };
            let bind_group = scoped(device, &label, || {
                let info = device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("info"),
                    size: padded(4 * k.info.len() as u64),
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                ctx.queue
                    .write_buffer(&info, 0, bytemuck::cast_slice(&k.info));
                let mut entries = vec![wgpu::BindGroupEntry {
                    binding: 0,
                    resource: info.as_entire_binding(),
                }];
                for (i, &v) in step.bindings.iter().enumerate() {
                    entries.push(wgpu::BindGroupEntry {
                        binding: i as u32 + 1,
                        resource: buffers[plan.values[v].buffer].as_entire_binding(),
                    });
                }
                device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(&label),
                    layout: &pipeline.get_bind_group_layout(0),
                    entries: &entries,
                })
            })
            .await?;
            passes.push(Pass {
                label,
                pipeline,
                bind_group,
                workgroups: k.workgroups,
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
        let use_timestamps = ctx
            .device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY)
            && !passes.is_empty()
            && passes.len() * 2 <= wgpu::QUERY_SET_MAX_QUERIES as usize;
        let ts_bytes = if use_timestamps {
            16 * passes.len() as u64
        } else {
            0
        };
        let k = options.prefetch.max(1);
        let ring = scoped(device, "prefetch ring", || {
            (0..k)
                .map(|slot| Ring {
                    staging: plan
                        .inputs
                        .iter()
                        .map(|(name, v)| {
                            device.create_buffer(&wgpu::BufferDescriptor {
                                label: Some(&format!("staging {name} slot {slot}")),
                                size: padded(plan.values[*v].bytes()),
                                usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                                mapped_at_creation: false,
                            })
                        })
                        .collect(),
                    readback: device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some(&format!("readback slot {slot}")),
                        size: (offset + ts_bytes).max(8),
                        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    }),
                })
                .collect::<Vec<_>>()
        })
        .await?;
        let mut exe = GpuExecutable {
            ctx: ctx.clone(),
            plan,
            options,
            buffers,
            passes,
            timestamps: None,
            ring,
            readback_layout,
            timestamp_offset,
        };
        if use_timestamps {
            exe.timestamps = Some(exe.calibrate_timestamps().await?);
        }
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
        let device_mid = (ticks[0] as f64 + ticks[1] as f64) / 2.0 * period;
        let host_mid = (h0 as f64 + h1 as f64) / 2.0;
        Ok(Timestamps {
            queries,
            resolve,
            period,
            offset: (host_mid - device_mid) as i128,
        })
    }

    /// Bytes of every device buffer this executable created (tensors, ring, queries).
    pub fn allocated_bytes(&self) -> u64 {
        let tensors: u64 = self.buffers.iter().map(|b| b.size()).sum();
        let ring: u64 = self
            .ring
            .iter()
            .map(|r| r.readback.size() + r.staging.iter().map(|s| s.size()).sum::<u64>())
            .sum();
        let queries = self.timestamps.as_ref().map_or(0, |t| t.resolve.size());
        tensors + ring + queries
    }

    /// The plan this executable runs.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The device it runs on.
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// Where compute event times come from.
    pub fn timing_source(&self) -> TimingSource {
        if self.timestamps.is_some() {
            TimingSource::TimestampQueries
        } else {
            TimingSource::HostCompletion
        }
    }

    fn check_inputs(&self, inputs: &HashMap<String, Tensor>) -> Result<(), RunError> {
        for (name, v) in &self.plan.inputs {
            let t = inputs.get(name).ok_or_else(|| RunError::Input {
                name: name.clone(),
                message: "missing".into(),
            })?;
            let value = &self.plan.values[*v];
            if t.shape != value.shape || t.dtype() != value.dtype {
                return Err(RunError::Input {
                    name: name.clone(),
                    message: format!(
                        "has {} {:?} but the plan expects {} {:?}",
                        t.dtype(),
                        t.shape,
                        value.dtype,
                        value.shape
                    ),
                });
            }
        }
        for check in &self.plan.index_checks {
            let Some(TensorData::I32(idx)) = inputs.get(&check.input).map(|t| &t.data) else {
                continue;
            };
            let len = check.axis_len as i64;
            if let Some(bad) = idx
                .iter()
                .find(|&&k| i64::from(k) < -len || i64::from(k) >= len)
            {
                return Err(RunError::Input {
                    name: check.input.clone(),
                    message: format!(
                        "index {bad} is out of range for axis length {len} of gather '{}'",
                        check.node
                    ),
                });
            }
        }
        Ok(())
    }

    /// Checks and uploads the inputs straight into their device buffers.
    pub fn upload_inputs(&self, inputs: &HashMap<String, Tensor>) -> Result<(), RunError> {
        self.check_inputs(inputs)?;
        for (name, v) in &self.plan.inputs {
            if let Some(t) = inputs.get(name).filter(|t| !t.is_empty()) {
                let bytes = t.to_storage_bytes(self.plan.values[*v].layout);
                self.ctx
                    .queue
                    .write_buffer(&self.buffers[self.plan.values[*v].buffer], 0, &bytes);
            }
        }
        Ok(())
    }

    /// Records every pass, each its own compute pass (timestamped when possible).
    fn encode_passes(&self, encoder: &mut wgpu::CommandEncoder, repeat: usize, timestamps: bool) {
        for _ in 0..repeat {
            for (i, p) in self.passes.iter().enumerate() {
                let writes = self.timestamps.as_ref().filter(|_| timestamps).map(|t| {
                    wgpu::ComputePassTimestampWrites {
                        query_set: &t.queries,
                        beginning_of_pass_write_index: Some(2 * i as u32),
                        end_of_pass_write_index: Some(2 * i as u32 + 1),
                    }
                });
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some(&p.label),
                    timestamp_writes: writes,
                });
                pass.set_pipeline(&p.pipeline);
                pass.set_bind_group(0, &p.bind_group, &[]);
                pass.dispatch_workgroups(p.workgroups[0], p.workgroups[1], p.workgroups[2]);
            }
        }
    }

    /// Runs the passes `repeat` times on the inputs already on the device, without
    /// uploading or reading back (for measuring kernels on resident data).
    pub async fn run_resident(&self, repeat: usize) -> Result<(), RunError> {
        let mut encoder = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("resident"),
            });
        self.encode_passes(&mut encoder, repeat, false);
        self.ctx.queue.submit([encoder.finish()]);
        wait_idle(&self.ctx.device, &self.ctx.queue).await
    }

    /// Runs one micro-batch and returns its outputs.
    pub async fn run(
        &self,
        inputs: &HashMap<String, Tensor>,
    ) -> Result<Vec<(String, Tensor)>, RunError> {
        let trace = TraceContext::new("", now_ns());
        let mut out = self
            .run_stream(std::slice::from_ref(inputs), &trace, &mut |_| {})
            .await?;
        out.outputs
            .pop()
            .ok_or_else(|| RunError::Internal("no outputs".into()))
    }

    /// Streams micro-batches through the prefetch ring, returning every micro-batch's
    /// outputs and the events of the run. `progress` is called after each micro-batch.
    pub async fn run_stream(
        &self,
        batches: &[HashMap<String, Tensor>],
        trace: &TraceContext<'_>,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Traced, RunError> {
        // Each micro-batch's inputs are checked by run_source before it is submitted.
        let mut next = 0;
        let mut source = |_block: bool| {
            let item = batches.get(next).map(|b| (next, b.clone()));
            next += 1;
            match item {
                Some((m, b)) => Next::Ready(m, b),
                None => Next::Done,
            }
        };
        let mut outputs = vec![Vec::new(); batches.len()];
        let mut sink = |m: usize, outs: Vec<(String, Tensor)>| {
            if let Some(slot) = outputs.get_mut(m) {
                *slot = outs;
            }
            progress(m);
            Ok(())
        };
        let mut events = Vec::new();
        self.run_source(&mut source, &mut sink, trace, &mut events)
            .await?;
        Ok(Traced { outputs, events })
    }

    /// Streams micro-batches from `source` through the prefetch ring: a new micro-batch is
    /// submitted while a slot is free (the host uploads it while the device computes the
    /// earlier ones); otherwise the oldest is read back and handed to `sink`. `source` is
    /// asked to block only when nothing is in flight. Micro-batch indices are relative to
    /// `trace.first_micro_batch`.
    pub async fn run_source(
        &self,
        source: &mut dyn FnMut(bool) -> Next,
        sink: &mut dyn FnMut(usize, Vec<(String, Tensor)>) -> Result<(), RunError>,
        trace: &TraceContext<'_>,
        events: &mut Vec<Event>,
    ) -> Result<(), RunError> {
        let k = self.ring.len();
        let mut in_flight: std::collections::VecDeque<(usize, Pending)> =
            std::collections::VecDeque::new();
        let mut next_slot = 0usize;
        loop {
            if trace
                .cancel
                .is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed))
            {
                while let Some((slot, p)) = in_flight.pop_front() {
                    self.finish(slot, p, trace, events).await?;
                }
                return Err(RunError::Cancelled);
            }
            let next = if in_flight.len() < k {
                source(in_flight.is_empty())
            } else {
                Next::NotReady
            };
            match next {
                Next::Ready(m, inputs) => {
                    self.check_inputs(&inputs)?;
                    let slot = next_slot % k;
                    next_slot += 1;
                    let p = self.submit(m, slot, &inputs, trace, events)?;
                    in_flight.push_back((slot, p));
                }
                Next::NotReady => match in_flight.pop_front() {
                    Some((slot, p)) => {
                        let (m, outs) = self.finish(slot, p, trace, events).await?;
                        sink(m, outs)?;
                    }
                    None => {
                        return Err(RunError::Internal(
                            "the input source stalled with nothing in flight".into(),
                        ))
                    }
                },
                Next::Done => {
                    while let Some((slot, p)) = in_flight.pop_front() {
                        let (m, outs) = self.finish(slot, p, trace, events).await?;
                        sink(m, outs)?;
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Hands an event to the run's observer (live) and keeps it.
    fn record(&self, trace: &TraceContext<'_>, events: &mut Vec<Event>, e: Event) {
        if let Some(observe) = trace.observer {
            observe(&e);
        }
        events.push(e);
    }

    fn event(
        &self,
        trace: &TraceContext<'_>,
        m: usize,
        node: String,
        kind: EventKind,
        start: u64,
        end: u64,
    ) -> Event {
        Event {
            run: trace.run.to_string(),
            device: self.options.device,
            stage: self.options.stage,
            micro_batch: trace.first_micro_batch + m,
            node,
            kind,
            start_ns: start.saturating_sub(trace.start_ns),
            end_ns: end.saturating_sub(trace.start_ns),
        }
    }

    fn submit(
        &self,
        m: usize,
        slot: usize,
        inputs: &HashMap<String, Tensor>,
        trace: &TraceContext<'_>,
        events: &mut Vec<Event>,
    ) -> Result<Pending, RunError> {
        let ring = &self.ring[slot];
        for (i, (name, v)) in self.plan.inputs.iter().enumerate() {
            if let Some(t) = inputs.get(name).filter(|t| !t.is_empty()) {
                let t0 = now_ns();
                let bytes = t.to_storage_bytes(self.plan.values[*v].layout);
                self.ctx.queue.write_buffer(&ring.staging[i], 0, &bytes);
                let kind = if trace.transferred_inputs.contains(name) {
                    EventKind::Transfer
                } else {
                    EventKind::Upload
                };
                self.record(
                    trace,
                    events,
                    self.event(trace, m, name.clone(), kind, t0, now_ns()),
                );
            }
        }
        let mut enc = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("micro-batch"),
            });
        for (i, (_, v)) in self.plan.inputs.iter().enumerate() {
            let bytes = self.plan.values[*v].bytes();
            if bytes > 0 {
                enc.copy_buffer_to_buffer(
                    &ring.staging[i],
                    0,
                    &self.buffers[self.plan.values[*v].buffer],
                    0,
                    bytes.div_ceil(4) * 4,
                );
            }
        }
        self.encode_passes(&mut enc, 1, true);
        for &(v, offset, bytes) in &self.readback_layout {
            if bytes > 0 {
                enc.copy_buffer_to_buffer(
                    &self.buffers[self.plan.values[v].buffer],
                    0,
                    &ring.readback,
                    offset,
                    bytes.div_ceil(4) * 4,
                );
            }
        }
        if let Some(ts) = &self.timestamps {
            let n = 2 * self.passes.len() as u32;
            enc.resolve_query_set(&ts.queries, 0..n, &ts.resolve, 0);
            enc.copy_buffer_to_buffer(
                &ts.resolve,
                0,
                &ring.readback,
                self.timestamp_offset,
                8 * u64::from(n),
            );
        }
        let submitted = now_ns();
        let index = self.ctx.queue.submit([enc.finish()]);
        let map = start_map(&ring.readback);
        Ok((m, map, index, submitted))
    }

    async fn finish(
        &self,
        slot: usize,
        (m, map, index, submitted): Pending,
        trace: &TraceContext<'_>,
        events: &mut Vec<Event>,
    ) -> Result<(usize, Vec<(String, Tensor)>), RunError> {
        let ring = &self.ring[slot];
        finish_map(&self.ctx.device, map, Some(index)).await?;
        let done = now_ns();
        let mut outs = Vec::new();
        {
            let view = ring
                .readback
                .get_mapped_range(..)
                .map_err(|e| RunError::Device(format!("reading back outputs failed: {e:?}")))?;
            for ((name, v), &(_, offset, bytes)) in
                self.plan.outputs.iter().zip(&self.readback_layout)
            {
                let value = &self.plan.values[*v];
                let slice = &view[offset as usize..(offset + bytes) as usize];
                outs.push((
                    name.clone(),
                    Tensor::from_storage_bytes(
                        value.shape.clone(),
                        value.dtype,
                        value.layout,
                        slice,
                    ),
                ));
            }
            match &self.timestamps {
                Some(ts) => {
                    let base = self.timestamp_offset as usize;
                    for (i, p) in self.passes.iter().enumerate() {
                        let at = |j: usize| {
                            let o = base + 8 * j;
                            u64::from_le_bytes(view[o..o + 8].try_into().unwrap_or([0; 8]))
                        };
                        let to_host = |ticks: u64| {
                            ((ticks as f64 * ts.period) as i128 + ts.offset).max(0) as u64
                        };
                        let (s, e) = (to_host(at(2 * i)), to_host(at(2 * i + 1)));
                        self.record(
                            trace,
                            events,
                            self.event(trace, m, p.label.clone(), EventKind::Compute, s, e.max(s)),
                        );
                    }
                }
                None => self.record(
                    trace,
                    events,
                    self.event(
                        trace,
                        m,
                        "all passes (host timing)".into(),
                        EventKind::Compute,
                        submitted,
                        done,
                    ),
                ),
            }
        }
        ring.readback.unmap();
        let copied = now_ns();
        let any_final = self
            .plan
            .outputs
            .iter()
            .any(|(n, _)| !trace.transferred_outputs.contains(n));
        let kind = if any_final {
            EventKind::Download
        } else {
            EventKind::Transfer
        };
        self.record(
            trace,
            events,
            self.event(trace, m, "outputs".into(), kind, done, copied.max(done + 1)),
        );
        Ok((m, outs))
    }
}
