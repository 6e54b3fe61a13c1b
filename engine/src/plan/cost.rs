//! The cost model: the seconds a device takes for a step and for moving activations
//! between stages, from the device's rates. Rates are measured per adapter by a short
//! calibration (`crate::gpu::calibrate`, `crate::cpu::calibrate`); [`Rates::ASSUMED`]
//! stands in where nothing was measured.

use crate::ops::Cost;
use serde::{Deserialize, Serialize};

/// How fast a device works, as the partitioner weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// Floating-point operations per second in compute passes.
    pub flops_per_s: f64,
    /// Bytes per second of device memory traffic in compute passes.
    pub bytes_per_s: f64,
    /// Bytes per second of activations leaving the device for another stage (readback to
    /// the host and upload to the next device).
    pub transfer_bytes_per_s: f64,
    /// Fixed seconds per pass (dispatch and synchronisation).
    pub pass_overhead_s: f64,
}

impl Rates {
    /// Assumed rates where nothing was measured: a software rasteriser on two cores.
    pub const ASSUMED: Rates = Rates {
        flops_per_s: 1e10,
        bytes_per_s: 1e10,
        transfer_bytes_per_s: 2e9,
        pass_overhead_s: 0.0,
    };

    /// Predicted seconds of one step of this cost.
    pub fn seconds(&self, cost: &Cost) -> f64 {
        cost.flops as f64 / self.flops_per_s.max(1.0)
            + (cost.bytes_read + cost.bytes_written) as f64 / self.bytes_per_s.max(1.0)
            + self.pass_overhead_s
    }

    /// Predicted seconds of moving `bytes` of activations to another stage.
    pub fn transfer_seconds(&self, bytes: u64) -> f64 {
        bytes as f64 / self.transfer_bytes_per_s.max(1.0)
    }

    /// The rates of the slowest of several devices in each respect (what a pipeline over
    /// them is limited by).
    pub fn slowest(rates: &[Rates]) -> Rates {
        rates.iter().fold(
            Rates {
                flops_per_s: f64::INFINITY,
                bytes_per_s: f64::INFINITY,
                transfer_bytes_per_s: f64::INFINITY,
                pass_overhead_s: 0.0,
            },
            |a, r| Rates {
                flops_per_s: a.flops_per_s.min(r.flops_per_s),
                bytes_per_s: a.bytes_per_s.min(r.bytes_per_s),
                transfer_bytes_per_s: a.transfer_bytes_per_s.min(r.transfer_bytes_per_s),
                pass_overhead_s: a.pass_overhead_s.max(r.pass_overhead_s),
            },
        )
    }
}

impl Default for Rates {
    fn default() -> Self {
        Rates::ASSUMED
    }
}
