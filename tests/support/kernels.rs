//! Every WGSL kernel the engine generates: for every case of the operator catalogue and
//! the example and benchmark graphs, fused and unfused, on f32 and the three 16-bit
//! paths, with every matmul variant the autotuner may choose. `tests/shaders.rs`
//! validates them with naga; the `kernels` example hands the portable ones (no `shader-f16`,
//! no subgroups) to the browser tests, which compile them with Chromium's WebGPU.

use crate::op_cases::op_cases;
use crate::{graph, root};
use sluice_engine::gpu::program::lower_plan_tuned;
use sluice_engine::gpu::tuning::MatmulVariant;
use sluice_engine::gpu::tuning::Tuning;
use sluice_engine::plan::{HalfStorage, Plan, PlanOptions, Precision};
use std::collections::BTreeMap;

/// One generated kernel.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GeneratedKernel {
    /// Where it came from: node, kernel label, precision and storage.
    pub label: String,
    /// The WGSL source.
    pub source: String,
    /// Whether it needs the adapter feature `shader-f16` (native 16-bit storage).
    pub needs_f16: bool,
    /// Whether it uses subgroup operations (native adapters only: browsers want
    /// `enable subgroups;`, which naga does not parse).
    pub needs_subgroups: bool,
}

/// The plan options every graph is planned with (the first three are f32 fused, f32
/// unfused and mixed precision with packed storage).
pub const OPTIONS: [PlanOptions; 5] = [
    PlanOptions {
        fuse: true,
        precision: Precision::F32,
        half: HalfStorage::Packed,
    },
    PlanOptions {
        fuse: false,
        precision: Precision::F32,
        half: HalfStorage::Packed,
    },
    PlanOptions {
        fuse: true,
        precision: Precision::Mixed,
        half: HalfStorage::Packed,
    },
    PlanOptions {
        fuse: true,
        precision: Precision::Mixed,
        half: HalfStorage::Native,
    },
    PlanOptions {
        fuse: true,
        precision: Precision::F16,
        half: HalfStorage::Native,
    },
];

/// Every distinct kernel source with the first place it was generated.
pub fn generated_kernels() -> Vec<GeneratedKernel> {
    let mut graphs: Vec<sluice_engine::Graph> = op_cases().iter().map(|c| graph(&c.doc)).collect();
    for name in [
        "graphs/mlp",
        "graphs/cnn",
        "graphs/transformer_block",
        "bench/w3_chain",
        "bench/w5_pipeline",
    ] {
        let path = root().join(format!("assets/{name}.json"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let g = sluice_engine::load_graph(&text).unwrap_or_else(|p| panic!("{name}: {p}"));
        graphs.push(
            g.bind(&[("N".to_string(), 2)].into())
                .unwrap_or_else(|p| panic!("{name}: {p}")),
        );
    }
    let mut sources: BTreeMap<String, GeneratedKernel> = BTreeMap::new();
    for g in &graphs {
        for o in OPTIONS {
            let plan = Plan::with_options(g, o).unwrap_or_else(|e| panic!("plan failed: {e}"));
            // The default kernels, and every matmul variant the autotuner may choose.
            let tunings = std::iter::once(Tuning::none())
                .chain(MatmulVariant::ALL.into_iter().map(Tuning::forced));
            let passes = tunings.flat_map(|t| {
                lower_plan_tuned(&plan, &t)
                    .unwrap_or_else(|e| panic!("lowering failed: {e}"))
                    .passes
            });
            for pass in passes {
                let source = pass.kernel.source.clone();
                sources.entry(source.clone()).or_insert(GeneratedKernel {
                    label: format!(
                        "{} ({}, {:?} {:?})",
                        plan.steps[pass.step].node, pass.kernel.label, o.precision, o.half
                    ),
                    needs_f16: source.contains("enable f16;"),
                    needs_subgroups: source.contains("@builtin(subgroup_invocation_id)"),
                    source,
                });
            }
        }
    }
    sources.into_values().collect()
}
