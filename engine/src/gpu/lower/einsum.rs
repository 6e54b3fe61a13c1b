//! GPU lowering of the einsum family.

use super::Lower;
use crate::gpu::kernel::*;
use crate::ops::einsum::*;

const SHADER: &str = include_str!("../../../../shaders/einsum.wgsl");

impl Lower for EinsumOp {
    /// One pass, one invocation per output element: the sum over the summed indices.
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
        let shapes: Vec<&[usize]> = ctx.inputs.iter().map(|c| c.shape.as_slice()).collect();
        let (sizes, strides) = self.layout(&shapes)?;
        let output = &ctx.outputs[0];
        let mut info = vec![word(output.shape.len())?, word(sizes.len())?];
        for s in &sizes {
            info.push(word(*s)?);
        }
        for k in 0..2 {
            for p in 0..sizes.len() {
                info.push(word(strides.get(k).map_or(0, |s| s[p]))?);
            }
        }
        let mut b = Bindings::new();
        b.add("dst", Slot::Output(0), output.storage, true);
        b.add("a", Slot::Input(0), ctx.inputs[0].storage, false);
        let term = if let Some(second) = ctx.inputs.get(1) {
            b.add("b", Slot::Input(1), second.storage, false);
            "ld_a(o.x) * ld_b(o.y)"
        } else {
            "ld_a(o.x)"
        };
        let (main, threads) = per_element_main(output.storage, output.numel());
        Ok(Lowering::Kernels(vec![Kernel {
            label: "einsum".into(),
            source: format!(
                "{}\n{}\n{main}",
                b.wgsl(),
                fill(variant(SHADER, "einsum"), &[("TERM", term.into())])
            ),
            slots: b.slots(),
            info,
            workgroups: dispatch_1d(threads, WG)?,
        }]))
    }
}
