//! The GPU device: adapter choice (`SLUICE_ADAPTER`, `WGPU_BACKEND`), device creation with
//! the adapter's real limits, adapter summaries for `sluice devices`, and the device's
//! pipeline cache (a kernel compiled once per device, whatever plan uses it).

use crate::error::RunError;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What `sluice devices` shows about an adapter.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct AdapterSummary {
    /// Adapter name.
    pub name: String,
    /// Backend (Vulkan, Metal, Dx12, Gl, BrowserWebGpu).
    pub backend: String,
    /// Discrete, integrated, virtual, CPU.
    pub device_type: String,
    /// Driver and version.
    pub driver: String,
    /// `shader-f16` is available.
    pub shader_f16: bool,
    /// Timestamp queries are available.
    pub timestamp_query: bool,
    /// Subgroup operations are available.
    pub subgroups: bool,
    /// Lanes of every subgroup, where subgroup operations are available to Sluice's
    /// kernels and the size does not vary (lavapipe: 8 at 256 bits). Browsers get none:
    /// their WGSL needs `enable subgroups;`, which naga does not parse.
    #[serde(default)]
    pub subgroup_lanes: Option<u32>,
    /// Largest buffer, in bytes.
    pub max_buffer_size: u64,
    /// Largest storage binding, in bytes.
    pub max_storage_binding: u64,
    /// Largest workgroup count per dimension.
    pub max_workgroups_per_dimension: u32,
    /// Most invocations per workgroup.
    pub max_invocations_per_workgroup: u32,
}

impl AdapterSummary {
    /// How Sluice's caches (rate calibrations, matmul tuning) name the adapter: name,
    /// backend and driver (a new driver measures afresh).
    pub fn cache_key(&self) -> String {
        format!("{} | {} | {}", self.name, self.backend, self.driver)
    }

    fn of(adapter: &wgpu::Adapter) -> AdapterSummary {
        let info = adapter.get_info();
        let f = adapter.features();
        let l = adapter.limits();
        AdapterSummary {
            name: info.name,
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: format!("{} {}", info.driver, info.driver_info)
                .trim()
                .to_string(),
            shader_f16: f.contains(wgpu::Features::SHADER_F16),
            timestamp_query: f.contains(wgpu::Features::TIMESTAMP_QUERY),
            subgroups: f.contains(wgpu::Features::SUBGROUP),
            subgroup_lanes: (cfg!(not(target_arch = "wasm32"))
                && f.contains(wgpu::Features::SUBGROUP)
                && info.subgroup_min_size == info.subgroup_max_size)
                .then_some(info.subgroup_min_size),
            max_buffer_size: l.max_buffer_size,
            max_storage_binding: l.max_storage_buffer_binding_size,
            max_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
            max_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
        }
    }
}

/// An open device and queue on the chosen adapter.
#[derive(Debug, Clone)]
pub struct GpuContext {
    /// The device.
    pub device: wgpu::Device,
    /// Its queue.
    pub queue: wgpu::Queue,
    /// The adapter's description.
    pub adapter: AdapterSummary,
    /// Limits in force on the device (the adapter's own).
    pub limits: wgpu::Limits,
    /// Compute pipelines created on this device, by WGSL source.
    pipelines: Arc<Mutex<HashMap<String, wgpu::ComputePipeline>>>,
    /// Chooses matmul kernels for this adapter (shared by the process's devices).
    pub autotuner: Arc<super::autotune::Autotuner>,
    /// See [`GpuContext::inputs_in_place`].
    inputs_in_place: bool,
}

/// Pipelines kept per device; past this the cache starts again (a long-running server
/// sees many graphs).
const MAX_CACHED_PIPELINES: usize = 2048;

/// Where no adapter is found, what to install.
pub const INSTALL_HINT: &str =
    "install a Vulkan driver: on Debian/Ubuntu `apt-get install mesa-vulkan-drivers` \
     (Mesa's lavapipe, a software GPU; on Debian 12 take it from bookworm-backports: \
     `apt-get install -t bookworm-backports mesa-vulkan-drivers`), or your GPU vendor's driver; \
     or run with `--device cpu`";

fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env())
}

#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
fn rank(a: &wgpu::Adapter) -> u32 {
    let info = a.get_info();
    let ty = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 40,
        wgpu::DeviceType::IntegratedGpu => 30,
        wgpu::DeviceType::VirtualGpu => 20,
        wgpu::DeviceType::Cpu => 10,
        wgpu::DeviceType::Other => 0,
    };
    let backend = match info.backend {
        wgpu::Backend::Gl => 0,
        _ => 1,
    };
    ty + backend
}

/// Every adapter this machine offers (native only; the browser offers one).
#[cfg(not(target_arch = "wasm32"))]
pub async fn list_adapters() -> Vec<AdapterSummary> {
    instance()
        .enumerate_adapters(wgpu::Backends::all())
        .await
        .iter()
        .map(AdapterSummary::of)
        .collect()
}

async fn choose_adapter() -> Result<wgpu::Adapter, RunError> {
    let inst = instance();
    #[cfg(not(target_arch = "wasm32"))]
    {
        let mut adapters = inst.enumerate_adapters(wgpu::Backends::all()).await;
        if let Ok(want) = std::env::var("SLUICE_ADAPTER") {
            let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
            let pick = match want.parse::<usize>() {
                Ok(i) if i < adapters.len() => Some(i),
                _ => names
                    .iter()
                    .position(|n| n.to_lowercase().contains(&want.to_lowercase())),
            };
            return match pick {
                Some(i) => Ok(adapters.swap_remove(i)),
                None => Err(RunError::NoAdapter(format!(
                    "SLUICE_ADAPTER='{want}' matches none of: {}",
                    if names.is_empty() {
                        "(no adapters)".to_string()
                    } else {
                        names.join(", ")
                    }
                ))),
            };
        }
        adapters.sort_by_key(|a| std::cmp::Reverse(rank(a)));
        adapters
            .into_iter()
            .next()
            .ok_or_else(|| RunError::NoAdapter(INSTALL_HINT.into()))
    }
    #[cfg(target_arch = "wasm32")]
    {
        inst.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        })
        .await
        .map_err(|e| RunError::NoAdapter(format!("{e}: this browser offers no WebGPU adapter")))
    }
}

/// The adapter [`GpuContext::new`] would open, described (in browsers: the page's
/// WebGPU adapter).
pub async fn best_adapter() -> Result<AdapterSummary, RunError> {
    Ok(AdapterSummary::of(&choose_adapter().await?))
}

impl GpuContext {
    /// Opens the best adapter (or the one `SLUICE_ADAPTER` names) with its real limits.
    pub async fn new() -> Result<GpuContext, RunError> {
        GpuContext::open(choose_adapter().await?).await
    }

    /// Opens `count` devices for a pipeline: distinct adapters of the best kind while there
    /// are enough, then further logical devices on the same adapters.
    #[cfg(not(target_arch = "wasm32"))]
    pub async fn new_many(count: usize) -> Result<Vec<GpuContext>, RunError> {
        let mut out = Vec::new();
        for i in 0..count {
            let adapters = if std::env::var("SLUICE_ADAPTER").is_ok() {
                vec![choose_adapter().await?]
            } else {
                let mut all = instance().enumerate_adapters(wgpu::Backends::all()).await;
                all.sort_by_key(|a| std::cmp::Reverse(rank(a)));
                let best = all
                    .first()
                    .map(rank)
                    .ok_or_else(|| RunError::NoAdapter(INSTALL_HINT.into()))?;
                all.into_iter()
                    .filter(|a| rank(a) == best)
                    .collect::<Vec<_>>()
            };
            let n = adapters.len();
            let adapter = adapters
                .into_iter()
                .nth(i % n)
                .ok_or_else(|| RunError::NoAdapter(INSTALL_HINT.into()))?;
            out.push(GpuContext::open(adapter).await?);
        }
        Ok(out)
    }

    async fn open(adapter: wgpu::Adapter) -> Result<GpuContext, RunError> {
        let summary = AdapterSummary::of(&adapter);
        let mut wanted = wgpu::Features::SHADER_F16
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        // Only where device memory is host memory: elsewhere mappable storage buffers would
        // live in memory the device reads slowly.
        if adapter.get_info().device_type == wgpu::DeviceType::Cpu {
            wanted |= wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
        }
        // For the subgroup matmul variants (`MatmulVariant::runs_on`).
        if summary.subgroup_lanes.is_some() {
            wanted |= wgpu::Features::SUBGROUP;
        }
        let limits = adapter.limits();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("sluice"),
                required_features: adapter.features() & wanted,
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| RunError::RequestDevice(e.to_string()))?;
        device.on_uncaptured_error(Arc::new(|e: wgpu::Error| {
            tracing::error!("uncaptured GPU error: {e}");
        }));
        tracing::info!(adapter = %summary.name, backend = %summary.backend, "opened GPU device");
        let inputs_in_place = device
            .features()
            .contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);
        Ok(GpuContext {
            device,
            queue,
            adapter: summary,
            limits,
            pipelines: Arc::default(),
            autotuner: super::autotune::Autotuner::from_env(),
            inputs_in_place,
        })
    }

    /// Whether inputs are written in place, straight into the device buffers the passes
    /// read: on CPU adapters (lavapipe), whose device memory is host memory and whose
    /// device work runs on the host's cores, so that a staging copy would only take cores
    /// from the passes (each prefetch slot has its own copy of the input buffers).
    /// Elsewhere inputs go through upload buffers.
    pub fn inputs_in_place(&self) -> bool {
        self.inputs_in_place
    }

    /// The same device with inputs always sent through upload buffers, as on adapters
    /// whose memory is not the host's (tests compare both ways).
    pub fn with_staged_inputs(mut self) -> GpuContext {
        self.inputs_in_place = false;
        self
    }

    /// The same device with kernels chosen by `autotuner` (tests, tools).
    pub fn with_autotuner(mut self, autotuner: Arc<super::autotune::Autotuner>) -> GpuContext {
        self.autotuner = autotuner;
        self
    }

    /// The device for people: `adapter (backend)`.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.adapter.name, self.adapter.backend)
    }

    /// The compute pipeline of a WGSL kernel (entry point `main`, bindings in group 0),
    /// created on first use and reused after; `true` when it was created now. Errors
    /// name `context` (the pass) and carry the driver's or validator's message.
    pub async fn pipeline(
        &self,
        label: &str,
        source: &str,
        context: &str,
    ) -> Result<(wgpu::ComputePipeline, bool), RunError> {
        if let Some(p) = self
            .pipelines
            .lock()
            .ok()
            .and_then(|cache| cache.get(source).cloned())
        {
            return Ok((p, false));
        }
        let device = &self.device;
        let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let memory = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let oom = memory.pop().await;
        let invalid = validation.pop().await;
        if let Some(e) = oom {
            return Err(RunError::Device(format!(
                "{context}: out of device memory: {e}"
            )));
        }
        if let Some(e) = invalid {
            return Err(RunError::Shader {
                label: context.to_string(),
                message: e.to_string(),
            });
        }
        if let Ok(mut cache) = self.pipelines.lock() {
            if cache.len() >= MAX_CACHED_PIPELINES {
                cache.clear();
            }
            cache.insert(source.to_string(), pipeline.clone());
        }
        Ok((pipeline, true))
    }
}
