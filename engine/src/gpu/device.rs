//! The wgpu backend behind the execution seam: a [`GpuDevice`] is an open device with the
//! rates the partitioner uses for it.

use super::context::GpuContext;
use super::executable::{GpuExecutable, PassTiming};
use super::probe;
use crate::error::RunError;
use crate::exec::device::{Device, Executable};
use crate::limits::BufferLimit;
use crate::plan::cost::Rates;
use crate::plan::{HalfStorage, Plan};
use crate::weights::Weights;
use futures_util::future::LocalBoxFuture;

/// A wgpu device as an execution device.
#[derive(Debug, Clone)]
pub struct GpuDevice {
    /// The open device.
    pub ctx: GpuContext,
    /// Measured rates, when calibrated.
    pub rates: Option<Rates>,
    /// Which micro-batches have their passes timed with timestamp queries.
    pub pass_timing: PassTiming,
}

impl GpuDevice {
    /// A device with assumed rates until [`GpuDevice::rates`] is set from a calibration,
    /// timing passes as [`PassTiming::DEFAULT`] says.
    pub fn new(ctx: GpuContext) -> GpuDevice {
        GpuDevice {
            ctx,
            rates: None,
            pass_timing: PassTiming::DEFAULT,
        }
    }

    /// Opens the best adapter (or the one `SLUICE_ADAPTER` names).
    pub async fn open() -> Result<GpuDevice, RunError> {
        Ok(GpuDevice::new(GpuContext::new().await?))
    }

    /// Opens `count` devices for a pipeline (distinct adapters while there are enough,
    /// then further logical devices on them; in browsers, logical devices on the page's
    /// adapter).
    pub async fn open_many(count: usize) -> Result<Vec<GpuDevice>, RunError> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            Ok(GpuContext::new_many(count)
                .await?
                .into_iter()
                .map(GpuDevice::new)
                .collect())
        }
        #[cfg(target_arch = "wasm32")]
        {
            let mut out = Vec::new();
            for _ in 0..count {
                out.push(GpuDevice::open().await?);
            }
            Ok(out)
        }
    }
}

/// Opens one GPU device per stage (distinct adapters while there are enough) and compiles
/// a session on them, blocking until done.
#[cfg(all(feature = "native", not(target_arch = "wasm32")))]
pub fn session(
    graph: &crate::graph::Graph,
    weights: &Weights,
    config: &crate::exec::RunConfig,
) -> Result<crate::exec::Session, RunError> {
    let devices = pollster::block_on(GpuDevice::open_many(config.stages))?
        .into_iter()
        .map(|d| Box::new(d) as Box<dyn Device>)
        .collect();
    crate::exec::Session::compile_blocking(graph, weights, config, devices)
}

impl Device for GpuDevice {
    fn name(&self) -> String {
        self.ctx.describe()
    }

    fn compile<'a>(
        &'a self,
        plan: Plan,
        weights: &'a Weights,
        prefetch: usize,
    ) -> LocalBoxFuture<'a, Result<Box<dyn Executable>, RunError>> {
        Box::pin(async move {
            let exe =
                GpuExecutable::compile_timed(&self.ctx, plan, weights, prefetch, self.pass_timing)
                    .await?;
            Ok(Box::new(exe) as Box<dyn Executable>)
        })
    }

    fn native_f16(&self) -> bool {
        self.ctx.adapter.shader_f16
    }

    fn faster_half(&self) -> LocalBoxFuture<'_, Result<HalfStorage, RunError>> {
        Box::pin(probe::faster_half_storage(&self.ctx))
    }

    fn rates(&self) -> Rates {
        self.rates.unwrap_or(Rates::ASSUMED)
    }

    fn buffer_limit(&self) -> Option<BufferLimit> {
        let l = &self.ctx.limits;
        Some(if l.max_storage_buffer_binding_size < l.max_buffer_size {
            BufferLimit {
                bytes: l.max_storage_buffer_binding_size,
                what: "maximum storage binding size",
            }
        } else {
            BufferLimit {
                bytes: l.max_buffer_size,
                what: "maximum buffer size",
            }
        })
    }
}
