//! A plan compiled on a device: buffers allocated (after checking the adapter's limits),
//! weights and constants uploaded once, pipelines and bind groups created once. Each run
//! uploads the inputs, records every pass into one command encoder, and reads all outputs
//! back through one staging buffer.

use super::gpu::GpuContext;
use super::plan::Plan;
use super::readback::{map_read, wait_idle};
use super::RunError;
use crate::tensor::{Tensor, TensorData};
use crate::weights::Weights;
use std::collections::HashMap;

struct Pass {
    label: String,
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    workgroups: [u32; 3],
}

/// A plan ready to run on one device.
pub struct GpuExecutable {
    ctx: GpuContext,
    plan: Plan,
    buffers: Vec<wgpu::Buffer>,
    passes: Vec<Pass>,
    readback: wgpu::Buffer,
    /// (value, byte offset in the readback buffer).
    readback_layout: Vec<(usize, u64)>,
}

fn padded(bytes: u64) -> u64 {
    bytes.max(4).div_ceil(4) * 4
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

impl GpuExecutable {
    /// Allocates, uploads weights and constants, and builds every pipeline and bind group.
    pub async fn new(
        ctx: &GpuContext,
        plan: Plan,
        weights: &Weights,
    ) -> Result<GpuExecutable, RunError> {
        let device = &ctx.device;
        let limits = &ctx.limits;
        // Check every size against the adapter's limits before allocating anything.
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
                        "{} workgroups exceed the adapter's limit of {} per dimension",
                        g, limits.max_compute_workgroups_per_dimension
                    ),
                });
            }
            if s.kernel.slots.len() + 1 > limits.max_storage_buffers_per_shader_stage as usize {
                return Err(RunError::Op {
                    node: s.node.clone(),
                    message: "kernel needs more storage bindings than the adapter allows".into(),
                });
            }
        }
        let buffers = scoped(device, "allocating tensors", || {
            plan.buffers
                .iter()
                .enumerate()
                .map(|(i, &bytes)| {
                    device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some(&format!("buffer {i}")),
                        size: padded(bytes),
                        usage: wgpu::BufferUsages::STORAGE
                            | wgpu::BufferUsages::COPY_DST
                            | wgpu::BufferUsages::COPY_SRC,
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
            ctx.queue
                .write_buffer(&buffers[plan.values[*v].buffer], 0, &w.to_device_bytes());
        }
        for (v, t) in &plan.constants {
            if !t.is_empty() {
                ctx.queue
                    .write_buffer(&buffers[plan.values[*v].buffer], 0, &t.to_device_bytes());
            }
        }
        let mut pipelines: HashMap<String, wgpu::ComputePipeline> = HashMap::new();
        let mut passes = Vec::new();
        for step in &plan.steps {
            let k = &step.kernel;
            if k.workgroups.contains(&0) {
                continue;
            }
            let label = format!("{} ({})", step.node, k.label);
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
            let info = scoped(device, &label, || {
                let buf = device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("info"),
                    size: padded(4 * k.info.len() as u64),
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                ctx.queue
                    .write_buffer(&buf, 0, bytemuck::cast_slice(&k.info));
                buf
            })
            .await?;
            let bind_group = scoped(device, &label, || {
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
            readback_layout.push((*v, offset));
            offset += padded(plan.buffers[plan.values[*v].buffer]);
        }
        let readback = scoped(device, "readback buffer", || {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: offset.max(4),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })
        .await?;
        Ok(GpuExecutable {
            ctx: ctx.clone(),
            plan,
            buffers,
            passes,
            readback,
            readback_layout,
        })
    }

    /// The plan this executable runs.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The device it runs on.
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    fn check_indices(&self, inputs: &HashMap<String, Tensor>) -> Result<(), RunError> {
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

    /// Checks and uploads the inputs of a run.
    pub fn upload_inputs(&self, inputs: &HashMap<String, Tensor>) -> Result<(), RunError> {
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
        self.check_indices(inputs)?;
        for (name, v) in &self.plan.inputs {
            if let Some(t) = inputs.get(name).filter(|t| !t.is_empty()) {
                self.ctx.queue.write_buffer(
                    &self.buffers[self.plan.values[*v].buffer],
                    0,
                    &t.to_device_bytes(),
                );
            }
        }
        Ok(())
    }

    /// Records every pass of the plan, `repeat` times, into one compute pass.
    fn encode_passes(&self, encoder: &mut wgpu::CommandEncoder, repeat: usize) {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("passes"),
            timestamp_writes: None,
        });
        for _ in 0..repeat {
            for p in &self.passes {
                pass.push_debug_group(&p.label);
                pass.set_pipeline(&p.pipeline);
                pass.set_bind_group(0, &p.bind_group, &[]);
                pass.dispatch_workgroups(p.workgroups[0], p.workgroups[1], p.workgroups[2]);
                pass.pop_debug_group();
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
        self.encode_passes(&mut encoder, repeat);
        self.ctx.queue.submit([encoder.finish()]);
        wait_idle(&self.ctx.device, &self.ctx.queue).await
    }

    /// Runs once: upload inputs, one command buffer of all passes, one readback.
    pub async fn run(
        &self,
        inputs: &HashMap<String, Tensor>,
    ) -> Result<Vec<(String, Tensor)>, RunError> {
        self.upload_inputs(inputs)?;
        let device = &self.ctx.device;
        let mut encoder =
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("run") });
        self.encode_passes(&mut encoder, 1);
        for &(v, offset) in &self.readback_layout {
            let bytes = self.plan.buffers[self.plan.values[v].buffer];
            if bytes > 0 {
                encoder.copy_buffer_to_buffer(
                    &self.buffers[self.plan.values[v].buffer],
                    0,
                    &self.readback,
                    offset,
                    padded(bytes),
                );
            }
        }
        self.ctx.queue.submit([encoder.finish()]);
        map_read(device, &self.readback).await?;
        let mut outputs = Vec::new();
        {
            let view = self
                .readback
                .get_mapped_range(..)
                .map_err(|e| RunError::Device(format!("reading back outputs failed: {e:?}")))?;
            for ((name, v), &(_, offset)) in self.plan.outputs.iter().zip(&self.readback_layout) {
                let value = &self.plan.values[*v];
                let bytes =
                    (value.shape.iter().product::<usize>() * value.dtype.size_bytes()) as u64;
                let slice = &view[offset as usize..(offset + bytes) as usize];
                outputs.push((
                    name.clone(),
                    Tensor::from_device_bytes(value.shape.clone(), value.dtype, slice),
                ));
            }
        }
        self.readback.unmap();
        Ok(outputs)
    }
}
