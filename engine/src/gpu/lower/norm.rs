//! GPU lowering of the norm family.

use super::Lower;
use crate::gpu::kernel::*;
use crate::ops::norm::*;
use crate::shape;

const SHADER: &str = include_str!("../../../../shaders/norm.wgsl");

impl Lower for NormOp {
    /// GPU kernels: one row pass for f32 and f16 storage; for packed 16-bit outputs a
    /// statistics pass into f32 scratch, then an element pass that writes whole words.
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
        let (input, output) = (&ctx.inputs[0], &ctx.outputs[0]);
        let x = &input.shape;
        let n: usize = x.iter().product();
        let packed = output.storage == Storage::Packed;
        let wg = || ("WG", WG.to_string());
        let mut b = Bindings::new();
        b.add("dst", Slot::Output(0), output.storage, true);
        b.add("src", Slot::Input(0), input.storage, false);
        let param = |k: usize| ctx.params.get(k).map_or(Storage::F32, |c| c.storage);
        let two_pass = |b: Bindings,
                        rows: usize,
                        info: Vec<u32>,
                        common: &str,
                        stats: &str,
                        value: String|
         -> Result<Lowering, String> {
            // Pass 1 reads src and writes the scratch statistics.
            let mut sb = Bindings::new();
            sb.add("src", Slot::Input(0), input.storage, false);
            sb.add("stats", Slot::Scratch(0), Storage::F32, true);
            let pass1 = Kernel {
                label: format!("{} stats", self.name()),
                source: format!(
                    "{}\n{common}\n{}",
                    sb.wgsl(),
                    fill(variant(SHADER, stats), &[wg()])
                ),
                slots: sb.slots(),
                info: info.clone(),
                workgroups: dispatch_1d(rows, WG)?,
            };
            let mut b = b;
            b.add("stats", Slot::Scratch(0), Storage::F32, false);
            let (main, threads) = per_element_main(output.storage, n);
            let pass2 = Kernel {
                label: self.name().into(),
                source: format!("{}\n{value}\n{main}", b.wgsl()),
                slots: b.slots(),
                info,
                workgroups: dispatch_1d(threads, WG)?,
            };
            Ok(Lowering::KernelsWithScratch(
                vec![pass1, pass2],
                vec![2 * rows],
            ))
        };
        match self {
            NormOp::Softmax { axis, log } => {
                let a = shape::existing_axis(*axis, x.len())?;
                let len = x[a];
                let inner: usize = x[a + 1..].iter().product();
                let rows = n.checked_div(len).unwrap_or(0);
                let out = if *log { "v - log(s)" } else { "exp(v) / s" };
                let info = vec![word(rows)?, word(len)?, word(inner.max(1))?];
                if packed {
                    return two_pass(
                        b,
                        rows,
                        info,
                        variant(SHADER, "softmax_common"),
                        "softmax_stats",
                        fill(variant(SHADER, "softmax_value"), &[("OUT", out.into())]),
                    );
                }
                Ok(Lowering::Kernels(vec![Kernel {
                    label: self.name().into(),
                    source: format!(
                        "{}\n{}\n{}",
                        b.wgsl(),
                        variant(SHADER, "softmax_common"),
                        fill(
                            variant(SHADER, "softmax_rows"),
                            &[wg(), ("OUT", out.into())]
                        )
                    ),
                    slots: b.slots(),
                    info,
                    workgroups: dispatch_1d(rows, WG)?,
                }]))
            }
            NormOp::LayerNorm { .. }
            | NormOp::RmsNorm { .. }
            | NormOp::InstanceNorm { .. }
            | NormOp::GroupNorm { .. } => {
                let rows = self
                    .rows(x)?
                    .ok_or("internal: not a row-wise normalisation")?;
                b.add("scale", Slot::Param(0), param(0), false);
                let bias = if rows.bias {
                    b.add("bias", Slot::Param(1), param(1), false);
                    " + ld_bias(p)"
                } else {
                    ""
                };
                let bias = ("BIAS", bias.to_string());
                let info = vec![
                    word(rows.rows)?,
                    word(rows.len)?,
                    self.epsilon().to_bits(),
                    word(rows.param_div)?,
                    word(rows.param_mod)?,
                    u32::from(rows.center),
                ];
                if packed {
                    return two_pass(
                        b,
                        rows.rows,
                        info,
                        variant(SHADER, "layer_norm_common"),
                        "layer_norm_stats",
                        format!(
                            "{}\n{}",
                            variant(SHADER, "weight_index"),
                            fill(variant(SHADER, "layer_norm_value"), &[bias])
                        ),
                    );
                }
                Ok(Lowering::Kernels(vec![Kernel {
                    label: self.name().into(),
                    source: format!(
                        "{}\n{}\n{}\n{}",
                        b.wgsl(),
                        variant(SHADER, "layer_norm_common"),
                        variant(SHADER, "weight_index"),
                        fill(variant(SHADER, "layer_norm_rows"), &[wg(), bias])
                    ),
                    slots: b.slots(),
                    info,
                    workgroups: dispatch_1d(rows.rows, WG)?,
                }]))
            }
            NormOp::BatchNorm { epsilon, .. } => {
                let inner: usize = x[2..].iter().product();
                for (k, name) in ["scale", "bias", "mean", "variance"].iter().enumerate() {
                    b.add(name, Slot::Param(k), param(k), false);
                }
                let (main, threads) = per_element_main(output.storage, n);
                Ok(Lowering::Kernels(vec![Kernel {
                    label: "batch_norm".into(),
                    source: format!("{}\n{}\n{main}", b.wgsl(), variant(SHADER, "batch_norm")),
                    slots: b.slots(),
                    info: vec![
                        word(n)?,
                        word(x[1])?,
                        word(inner.max(1))?,
                        epsilon.to_bits(),
                    ],
                    workgroups: dispatch_1d(threads, WG)?,
                }]))
            }
        }
    }
}
