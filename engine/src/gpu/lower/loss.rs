//! GPU lowering of the loss family: an element pass (into the output for "none", into an
//! f32 scratch buffer otherwise) and, for "mean" and "sum", one workgroup summing it.

use super::Lower;
use crate::gpu::kernel::*;
use crate::ops::loss::*;

const SHADER: &str = include_str!("../../../../shaders/loss.wgsl");

impl Lower for LossOp {
    /// GPU kernels.
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
        let (src, aux, out) = match (ctx.inputs, ctx.outputs) {
            ([src, aux], [out]) => (src, aux, out),
            _ => return Err(format!("internal: {} takes two inputs", self.name())),
        };
        let (n, classes) = if self.has_labels() {
            if aux.storage != Storage::I32 {
                return Err(format!("{} needs i32 labels", self.name()));
            }
            (aux.numel(), src.shape.last().copied().unwrap_or(0))
        } else {
            (src.numel(), 1)
        };
        let scale = match self.reduction {
            Reduction::Mean if n == 0 => f32::NAN,
            Reduction::Mean => 1.0 / n as f32,
            _ => 1.0,
        };
        let smoothing = match self.kind {
            LossKind::SoftmaxCrossEntropy { label_smoothing } => label_smoothing,
            _ => 0.0,
        };
        // Every element index of the logits must fit a kernel word too.
        word(src.numel())?;
        let info = vec![
            word(n)?,
            word(classes)?,
            scale.to_bits(),
            smoothing.to_bits(),
            f32::NAN.to_bits(),
        ];
        let inputs = |b: &mut Bindings| {
            b.add("src", Slot::Input(0), src.storage, false);
            b.add("aux", Slot::Input(1), aux.storage, false);
        };
        let labels = if self.has_labels() {
            variant(SHADER, "labels")
        } else {
            ""
        };
        let value = format!(
            "{}\n{labels}\n{}",
            variant(SHADER, "common"),
            variant(SHADER, self.name())
        );
        let wg = [("WG", WG.to_string())];
        if self.reduction == Reduction::None {
            let mut b = Bindings::new();
            b.add("dst", Slot::Output(0), out.storage, true);
            inputs(&mut b);
            let (main, threads) = per_element_main(out.storage, n);
            return Ok(Lowering::Kernels(vec![Kernel {
                label: format!("{} none", self.name()),
                source: format!("{}\n{value}\n{main}", b.wgsl()),
                slots: b.slots(),
                info,
                workgroups: dispatch_1d(threads, WG)?,
            }]));
        }
        let mut b = Bindings::new();
        b.add("scratch", Slot::Scratch(0), Storage::F32, true);
        inputs(&mut b);
        let elements = Kernel {
            label: format!("{} elements", self.name()),
            source: format!(
                "{}\n{value}\n{}",
                b.wgsl(),
                fill(variant(SHADER, "elements"), &wg)
            ),
            slots: b.slots(),
            info: info.clone(),
            workgroups: dispatch_1d(n, WG)?,
        };
        let mut b = Bindings::new();
        b.add("dst", Slot::Output(0), out.storage, true);
        b.add("scratch", Slot::Scratch(0), Storage::F32, false);
        let store = if out.storage == Storage::Packed {
            "        dst[0] = sl_pack2(vec2<f32>(v, 0.0));"
        } else {
            "        st_dst(0u, v);"
        };
        let total = Kernel {
            label: format!("{} {}", self.name(), self.reduction.name()),
            source: format!(
                "{}\n{}",
                b.wgsl(),
                fill(
                    variant(SHADER, "total"),
                    &[("WG", WG.to_string()), ("STORE", store.into())]
                )
            ),
            slots: b.slots(),
            info,
            workgroups: [1, 1, 1],
        };
        // A scratch buffer of at least one element: bindings cannot be empty.
        Ok(Lowering::KernelsWithScratch(
            vec![elements, total],
            vec![n.max(1)],
        ))
    }
}
