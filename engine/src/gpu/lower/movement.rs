//! GPU lowering of the movement family.

use super::Lower;
use crate::gpu::kernel::*;
use crate::ops::movement::*;
use crate::shape;

const SHADER: &str = include_str!("../../../../shaders/movement.wgsl");

impl Lower for MovementOp {
    /// GPU kernels.
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
        let (inputs, outputs) = (ctx.inputs, ctx.outputs);
        let (Some(first), Some(output)) = (inputs.first(), outputs.first()) else {
            return Err("internal: a movement needs an input and an output".into());
        };
        let x = &first.shape;
        let xs = signed(&shape::strides(x)?)?;
        let out = &output.shape;
        let contiguous = |s: &[usize]| -> Result<Vec<i64>, String> { signed(&shape::strides(s)?) };
        let io = |input: usize, output: usize| Copy {
            src: Slot::Input(input),
            src_storage: inputs[input].storage,
            dst: Slot::Output(output),
            dst_storage: outputs[output].storage,
        };
        let kernels = match self {
            MovementOp::Blocks { .. } => {
                let (domain, src) = self.block_view(&shape::known(x))?;
                vec![copy_kernel(
                    self.name(),
                    io(0, 0),
                    &domain,
                    0,
                    &signed(&src)?,
                    0,
                    &contiguous(&domain)?,
                )?]
            }
            MovementOp::Pad {
                mode,
                constant_value,
                ..
            } => {
                let pairs = self.pad_pairs(x.len())?;
                let n = outputs[0].numel();
                let constant = if inputs[0].storage == Storage::I32 {
                    // Rust's `as`: truncation toward zero, saturating (as the CPU).
                    (*constant_value as i32).cast_unsigned()
                } else {
                    constant_value.to_bits()
                };
                let mut info = vec![word(n)?, word(x.len())?, mode.code(), constant];
                for &d in out.iter().chain(x.iter()) {
                    info.push(word(d)?);
                }
                for &(begin, _) in &pairs {
                    info.push(signed_word(begin)?);
                }
                let index = variant(SHADER, "pad_index");
                let (source, slots, threads) = if outputs[0].storage.is_half() {
                    let mut b = Bindings::new();
                    b.add("dst", Slot::Output(0), outputs[0].storage, true);
                    b.add("src", Slot::Input(0), inputs[0].storage, false);
                    let (main, threads) = per_element_main(outputs[0].storage, n);
                    (
                        format!(
                            "{}\n{index}\n{}\n{main}",
                            b.wgsl(),
                            variant(SHADER, "pad_value")
                        ),
                        b.slots(),
                        threads,
                    )
                } else {
                    let body = fill(variant(SHADER, "pad_words"), &[("WG", WG.to_string())]);
                    (
                        format!("{}\n{index}\n{body}", words_decls()),
                        vec![Slot::Output(0), Slot::Input(0)],
                        n,
                    )
                };
                vec![Kernel {
                    label: "pad".into(),
                    source,
                    slots,
                    info,
                    workgroups: dispatch_1d(threads, WG)?,
                }]
            }
            MovementOp::Reshape { .. }
            | MovementOp::Flatten { .. }
            | MovementOp::Squeeze { .. }
            | MovementOp::Unsqueeze { .. }
            | MovementOp::Identity { .. } => {
                return Err("internal: views are planned as aliases, not lowered".into())
            }
            MovementOp::Transpose { perm } => {
                let p = permutation(perm, x.len())?;
                let src: Vec<i64> = p.iter().map(|&i| xs[i]).collect();
                vec![copy_kernel(
                    "transpose",
                    io(0, 0),
                    out,
                    0,
                    &src,
                    0,
                    &contiguous(out)?,
                )?]
            }
            MovementOp::Slice { .. } => {
                let (base, src) = self.slice_offsets(x)?;
                vec![copy_kernel(
                    "slice",
                    io(0, 0),
                    out,
                    base,
                    &src,
                    0,
                    &contiguous(out)?,
                )?]
            }
            MovementOp::Expand { .. } => {
                let src = signed(&shape::broadcast_strides(x, out)?)?;
                vec![copy_kernel(
                    "expand",
                    io(0, 0),
                    out,
                    0,
                    &src,
                    0,
                    &contiguous(out)?,
                )?]
            }
            MovementOp::Concat { axis } => {
                let a = shape::existing_axis(*axis, x.len())?;
                let os = contiguous(out)?;
                let packed = outputs[0].storage == Storage::Packed;
                let mut offset = 0i64;
                let mut ks = Vec::new();
                for (i, t) in inputs.iter().enumerate() {
                    if t.numel() > 0 {
                        let base = offset.checked_mul(os[a]).ok_or("concat offsets overflow")?;
                        let mut c = io(i, 0);
                        if packed {
                            // Pieces land in f32 scratch; one pass packs the result.
                            c.dst = Slot::Scratch(0);
                            c.dst_storage = Storage::F32;
                        }
                        ks.push(copy_kernel(
                            "concat",
                            c,
                            &t.shape,
                            0,
                            &contiguous(&t.shape)?,
                            base,
                            &os,
                        )?);
                    }
                    offset = offset
                        .checked_add(i64::try_from(t.shape[a]).map_err(|_| "concat too long")?)
                        .ok_or("concat offsets overflow")?;
                }
                if packed {
                    let n = outputs[0].numel();
                    let mut b = Bindings::new();
                    b.add("dst", Slot::Output(0), Storage::Packed, true);
                    b.add("scratch", Slot::Scratch(0), Storage::F32, false);
                    let (main, threads) = per_element_main(Storage::Packed, n);
                    ks.push(Kernel {
                        label: "concat pack".into(),
                        source: format!("{}\n{}\n{main}", b.wgsl(), variant(SHADER, "convert")),
                        slots: b.slots(),
                        info: vec![word(n)?],
                        workgroups: dispatch_1d(threads, WG)?,
                    });
                    return Ok(Lowering::KernelsWithScratch(ks, vec![n]));
                }
                ks
            }
            MovementOp::Split { axis, .. } => {
                let a = shape::existing_axis(*axis, x.len())?;
                let mut offset = 0i64;
                let mut ks = Vec::new();
                for (j, o) in outputs.iter().enumerate() {
                    if o.numel() > 0 {
                        let base = offset.checked_mul(xs[a]).ok_or("split offsets overflow")?;
                        ks.push(copy_kernel(
                            "split",
                            io(0, j),
                            &o.shape,
                            base,
                            &xs,
                            0,
                            &contiguous(&o.shape)?,
                        )?);
                    }
                    offset = offset
                        .checked_add(i64::try_from(o.shape[a]).map_err(|_| "split too long")?)
                        .ok_or("split offsets overflow")?;
                }
                ks
            }
            MovementOp::Gather { axis } => {
                let a = shape::existing_axis(*axis, x.len())?;
                let n = outputs[0].numel();
                let inner = shape::numel(&x[a + 1..])?;
                let info = vec![
                    word(n)?,
                    word(x[a])?,
                    word(inputs[1].numel().max(1))?,
                    word(inner.max(1))?,
                ];
                let index = variant(SHADER, "gather_index");
                let (source, slots, threads) = if outputs[0].storage.is_half() {
                    let mut b = Bindings::new();
                    b.add("dst", Slot::Output(0), outputs[0].storage, true);
                    b.add("src", Slot::Input(0), inputs[0].storage, false);
                    b.add("indices", Slot::Input(1), Storage::I32, false);
                    let (main, threads) = per_element_main(outputs[0].storage, n);
                    (
                        format!(
                            "{}\n{index}\n{}\n{main}",
                            b.wgsl(),
                            variant(SHADER, "gather_value")
                        ),
                        b.slots(),
                        threads,
                    )
                } else {
                    let decls = words_decls()
                        + "@group(0) @binding(3) var<storage, read> indices: array<i32>;\n";
                    let body = fill(variant(SHADER, "gather_words"), &[("WG", WG.to_string())]);
                    (
                        format!("{decls}\n{index}\n{body}"),
                        vec![Slot::Output(0), Slot::Input(0), Slot::Input(1)],
                        n,
                    )
                };
                vec![Kernel {
                    label: "gather".into(),
                    source,
                    slots,
                    info,
                    workgroups: dispatch_1d(threads, WG)?,
                }]
            }
        };
        Ok(Lowering::Kernels(kernels))
    }
}

/// The source and destination of a copy and how they are stored.
#[derive(Debug, Clone, Copy)]
struct Copy {
    src: Slot,
    src_storage: Storage,
    dst: Slot,
    dst_storage: Storage,
}

/// Strides as the signed words kernels take.
fn signed(strides: &[usize]) -> Result<Vec<i64>, String> {
    strides
        .iter()
        .map(|&s| i64::try_from(s).map_err(|_| format!("stride {s} is too large")))
        .collect()
}

fn words_decls() -> String {
    "@group(0) @binding(0) var<storage, read> info: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<storage, read> src: array<u32>;
"
    .to_string()
}

/// A strided copy over `domain`: raw words for 32-bit storages, element by element for
/// 16-bit ones (whole packed words when the destination is contiguous).
#[allow(clippy::too_many_arguments)]
fn copy_kernel(
    label: &str,
    c: Copy,
    domain: &[usize],
    src_base: i64,
    src: &[i64],
    dst_base: i64,
    dst: &[i64],
) -> Result<Kernel, String> {
    let n = shape::numel(domain)?;
    let mut info = vec![
        word(n)?,
        word(domain.len())?,
        signed_word(src_base)?,
        signed_word(dst_base)?,
    ];
    for &d in domain {
        info.push(word(d)?);
    }
    for &s in src {
        info.push(signed_word(s)?);
    }
    for &s in dst {
        info.push(signed_word(s)?);
    }
    let offsets = variant(SHADER, "offsets");
    let wg = ("WG", WG.to_string());
    let dst_contiguous = dst_base == 0 && *dst == signed(&shape::strides(domain)?)?;
    let half = c.src_storage.is_half() || c.dst_storage.is_half();
    let (source, slots, threads) = if !half {
        let body = fill(variant(SHADER, "copy_words"), &[wg]);
        (
            format!("{}\n{offsets}\n{body}", words_decls()),
            vec![c.dst, c.src],
            n,
        )
    } else {
        let mut b = Bindings::new();
        b.add("dst", c.dst, c.dst_storage, true);
        b.add("src", c.src, c.src_storage, false);
        if c.dst_storage == Storage::Packed {
            if !dst_contiguous {
                return Err("internal: a packed copy needs a contiguous destination".into());
            }
            let (main, threads) = per_element_main(Storage::Packed, n);
            (
                format!(
                    "{}\n{offsets}\n{}\n{main}",
                    b.wgsl(),
                    variant(SHADER, "copy_value")
                ),
                b.slots(),
                threads,
            )
        } else {
            let body = fill(variant(SHADER, "copy_half"), &[wg]);
            (format!("{}\n{offsets}\n{body}", b.wgsl()), b.slots(), n)
        }
    };
    Ok(Kernel {
        label: label.to_string(),
        source,
        slots,
        info,
        workgroups: dispatch_1d(threads, WG)?,
    })
}
