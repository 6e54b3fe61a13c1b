//! The wgpu backend (native and browser): adapters and devices ([`context`]), plans
//! lowered to WGSL passes ([`program`], one lowering file per operator family in
//! [`lower`], kernel building blocks in [`kernel`]), compiled executables
//! ([`executable`]), the [`Device`](crate::exec::device::Device) seam ([`device`]), the
//! 16-bit storage probe and the rate calibration ([`probe`]), and the matmul kernel
//! variants and choices ([`tuning`]) the autotuner measures per adapter
//! ([`variant_timing`]) and keeps ([`autotune`]).

pub mod autotune;
pub mod context;
pub mod device;
pub mod executable;
pub mod kernel;
pub mod lower;
mod mapped;
pub mod probe;
pub mod program;
mod readback;
pub mod texture;
pub mod tuning;
pub mod variant_timing;

pub use context::{AdapterSummary, GpuContext};
#[cfg(all(feature = "native", not(target_arch = "wasm32")))]
pub use device::session;
pub use device::GpuDevice;
pub use executable::{GpuExecutable, PassTiming};
