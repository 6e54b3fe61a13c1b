//! Running plans: the seam between plans and devices ([`device`]), the one stage-pipeline
//! driver ([`driver`]) following a [`schedule`], datasets cut into micro-batches and
//! joined back ([`dataset`]), the inputs micro-batches carry ([`input`]), the run configuration and the rules every front shares
//! about it ([`config`]), and sessions that compile a graph on devices and run datasets
//! ([`session`]).

pub mod config;
pub mod dataset;
pub mod device;
pub mod driver;
pub mod input;
pub mod schedule;
pub mod session;

pub use config::{check_run, RunConfig, RunReport};
pub use device::{Device, Executable, Values};
pub use driver::Concurrency;
pub use input::{Input, Inputs};
pub use session::{RunContext, Session};

#[cfg(all(feature = "native", not(target_arch = "wasm32")))]
mod native {
    use super::{RunConfig, RunContext, RunReport, Session, Values};
    use crate::error::RunError;
    use crate::exec::device::Device;
    use crate::graph::Graph;
    use crate::telemetry::Event;
    use crate::weights::Weights;

    impl Session {
        /// Compiles on `devices`, blocking until done.
        pub fn compile_blocking(
            graph: &Graph,
            weights: &Weights,
            config: &RunConfig,
            devices: Vec<Box<dyn Device>>,
        ) -> Result<Session, RunError> {
            pollster::block_on(Session::compile(graph, weights, config, devices, &|_| {}))
        }

        /// Runs a dataset, blocking until done.
        pub fn run_blocking(
            &mut self,
            data: &Values,
            ctx: &RunContext<'_>,
        ) -> Result<RunReport, RunError> {
            pollster::block_on(self.run(data, ctx))
        }

        /// A warm-up pass ([`Session::warm_up`]), blocking until done.
        pub fn warm_up_blocking(
            &mut self,
            data: &Values,
            ctx: &RunContext<'_>,
        ) -> Result<Vec<Event>, RunError> {
            pollster::block_on(self.warm_up(data, ctx))
        }
    }
}
