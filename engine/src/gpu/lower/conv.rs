//! GPU lowering of the conv family.

use super::Lower;
use crate::gpu::kernel::*;
use crate::ops::conv::*;

const SHADER: &str = include_str!("../../../../shaders/conv.wgsl");
/// conv_transpose2d runs conv2d's input-gradient kernel.
const GRAD_SHADER: &str = include_str!("../../../../shaders/grad.wgsl");

impl Lower for ConvOp {
    /// GPU kernel; a convolution applies the epilogue to each result.
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
        let (input, output) = (&ctx.inputs[0], &ctx.outputs[0]);
        // 1-D operators compute on [N, C, 1, L].
        let x = &as_2d(&input.shape, 1);
        let o = &as_2d(&output.shape, 1);
        let n_out = output.numel();
        if let ConvOp::GlobalAvgPool = self {
            let spatial: Vec<usize> = (2..input.shape.len()).collect();
            return super::reduce::reduce_kernel(
                "global_avg_pool",
                &super::reduce::ReduceSource::Input(input),
                output,
                &spatial,
                crate::ops::reduce::ReduceKind::Mean,
                false,
                ctx.f16_compute,
            );
        }
        let param = |k: usize| ctx.params.get(k).map_or(Storage::F32, |c| c.storage);
        if let ConvOp::Resize(r) = self {
            let (shape, taps) = r.plan(&input.shape)?;
            let rank = shape.len();
            if rank > MAX_RESIZE_RANK {
                return Err(format!(
                    "resize: rank {rank} is above {MAX_RESIZE_RANK} on the GPU"
                ));
            }
            // info = [n, rank, output shape, input shape, table offsets, tables of
            // (low, high, weight bits) per output index].
            let mut info = vec![word(n_out)?, word(rank)?];
            for &d in shape.iter().chain(&input.shape) {
                info.push(word(d)?);
            }
            let mut at = info.len() + rank;
            for t in &taps {
                info.push(word(at)?);
                at = at
                    .checked_add(3 * t.len())
                    .ok_or("resize tables overflow")?;
            }
            for &(lo, hi, w) in taps.iter().flatten() {
                info.extend([word(lo)?, word(hi)?, w.to_bits()]);
            }
            let mut b = Bindings::new();
            b.add("dst", Slot::Output(0), output.storage, true);
            b.add("src", Slot::Input(0), input.storage, false);
            let (main, threads) = per_element_main(output.storage, n_out);
            return Ok(Lowering::Kernels(vec![Kernel {
                label: "resize".into(),
                source: format!("{}\n{}\n{main}", b.wgsl(), variant(SHADER, "resize")),
                slots: b.slots(),
                info,
                workgroups: dispatch_1d(threads, WG)?,
            }]));
        }
        if let ConvOp::ConvTranspose2d { groups, bias, .. } = self {
            // conv2d's input-gradient kernel is the transposed convolution: x plays dy.
            let (_, window) = self.transpose_geometry([x[2], x[3]])?;
            let mut info = [o[0], o[1], o[2], o[3], x[1], x[2], x[3]]
                .iter()
                .map(|&v| word(v))
                .collect::<Result<Vec<_>, _>>()?;
            info.extend(window_info(&window)?);
            info.extend([word(*groups)?, word(window.pads[2])?, word(window.pads[3])?]);
            let mut b = Bindings::new();
            b.add("dst", Slot::Output(0), output.storage, true);
            b.add("weight", Slot::Param(0), param(0), false);
            b.add("dy", Slot::Input(0), input.storage, false);
            let bias = if *bias {
                b.add("bias", Slot::Param(1), param(1), false);
                " + ld_bias(ci)"
            } else {
                ""
            };
            let (main, threads) = per_element_main(output.storage, n_out);
            return Ok(Lowering::Kernels(vec![Kernel {
                label: "conv_transpose2d".into(),
                source: format!(
                    "{}\n{}\n{}\n{main}",
                    b.wgsl(),
                    variant(GRAD_SHADER, "window_taps"),
                    fill(
                        variant(GRAD_SHADER, "conv2d_grad_input_value"),
                        &[("BIAS", bias.into())]
                    )
                ),
                slots: b.slots(),
                info,
                workgroups: dispatch_1d(threads, WG)?,
            }]));
        }
        let mut b = Bindings::new();
        b.add("dst", Slot::Output(0), output.storage, true);
        b.add("src", Slot::Input(0), input.storage, false);
        let (label, value, info) = match self {
            ConvOp::Conv2d {
                window,
                groups,
                bias,
                ..
            } => {
                let mut info: Vec<u32> = [x[0], x[1], x[2], x[3], o[1], o[2], o[3]]
                    .iter()
                    .map(|&v| word(v))
                    .collect::<Result<_, _>>()?;
                info.extend(window_info(window)?);
                info.push(word(*groups)?);
                b.add("weight", Slot::Param(0), param(0), false);
                let out = if *bias {
                    b.add("bias", Slot::Param(1), param(1), false);
                    "ep(f32(acc) + ld_bias(oc), oc)"
                } else {
                    "ep(f32(acc), oc)"
                };
                let acc = if ctx.f16_compute { "f16" } else { "f32" };
                let value = fill(
                    variant(SHADER, "conv2d"),
                    &[("ACC", acc.into()), ("OUT", out.into())],
                );
                let first_extra = b.slots().len() as u32 + 1;
                let ep = format!(
                    "{}\n{}",
                    super::elementwise::helpers(),
                    ctx.epilogue.wgsl(first_extra)
                );
                (
                    format!("conv2d{}", ctx.epilogue.label()),
                    format!("{ep}\n{value}"),
                    info,
                )
            }
            ConvOp::MaxPool(window) | ConvOp::AvgPool { window, .. } => {
                let include = matches!(
                    self,
                    ConvOp::AvgPool {
                        count_include_pad: true,
                        ..
                    }
                );
                let mut info: Vec<u32> = [x[0] * x[1], x[2], x[3], o[2], o[3]]
                    .iter()
                    .map(|&v| word(v))
                    .collect::<Result<_, _>>()?;
                info.extend(window_info(window)?);
                info.push(u32::from(include));
                info.push(word(window.pads[2])?);
                info.push(word(window.pads[3])?);
                let out = if let ConvOp::MaxPool(_) = self {
                    "best"
                } else {
                    "sum / count"
                };
                (
                    self.name().to_string(),
                    fill(variant(SHADER, "pool"), &[("OUT", out.into())]),
                    info,
                )
            }
            ConvOp::GlobalAvgPool | ConvOp::ConvTranspose2d { .. } | ConvOp::Resize(_) => {
                return Err("internal: lowered above".into())
            }
        };
        let mut slots = b.slots();
        if let ConvOp::Conv2d { .. } = self {
            slots.extend(ctx.epilogue.extra_slots.iter().copied());
        }
        let (main, threads) = per_element_main(output.storage, n_out);
        Ok(Lowering::Kernels(vec![Kernel {
            label,
            source: format!("{}\n{value}\n{main}", b.wgsl()),
            slots,
            info,
            workgroups: dispatch_1d(threads, WG)?,
        }]))
    }
}

/// The largest rank `resize` takes on the GPU (the kernel's per-axis arrays).
const MAX_RESIZE_RANK: usize = 8;

/// The window's geometry as kernel words (the conv family's backwards use it too).
pub(super) fn window_info(w: &Window) -> Result<Vec<u32>, String> {
    [
        w.kernel[0],
        w.kernel[1],
        w.strides[0],
        w.strides[1],
        w.pads[0],
        w.pads[1],
        w.dilations[0],
        w.dilations[1],
    ]
    .iter()
    .map(|&v| word(v))
    .collect()
}
