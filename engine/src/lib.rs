//! Sluice's engine: the `sluice/graph@1` format, validation and shape inference, the
//! operator set (schema, inference, cost, CPU reference and WGSL kernel per operator),
//! planning, and the wgpu runtime.
//!
//! The engine knows nothing of HTTP or the DOM. Its core compiles for
//! `wasm32-unknown-unknown` with wgpu's `webgpu` backend: every GPU call is async, and the
//! only blocking wait (a native device poll) sits behind the `native` feature.

pub mod autodiff;
pub mod cpu;
pub mod dtype;
pub mod error;
pub mod exec;
pub mod gpu;
pub mod graph;
pub mod limits;
pub mod npy;
pub mod onnx;
pub mod ops;
pub mod plan;
pub mod precision;
pub mod rng;
pub mod shape;
pub mod storage;
pub mod telemetry;
pub mod tensor;
pub mod train;
pub mod weights;

pub use dtype::DType;
pub use error::RunError;
pub use graph::{load_graph, load_graph_with, Graph, Problem, Problems};
pub use shape::{Dim, Shape};
pub use tensor::{Tensor, TensorData};
