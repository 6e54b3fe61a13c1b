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
        let x = &inputs[0].shape;
        let xs = shape::strides(x);
        let out = &outputs[0].shape;
        let contiguous = |s: &[usize]| {
            shape::strides(s)
                .iter()
                .map(|&v| v as i64)
                .collect::<Vec<_>>()
        };
        let io = |input: usize, output: usize| Copy {
            src: Slot::Input(input),
            src_storage: inputs[input].storage,
            dst: Slot::Output(output),
            dst_storage: outputs[output].storage,
        };
        let kernels = match self {
            MovementOp::Reshape { .. }
            | MovementOp::Flatten { .. }
            | MovementOp::Squeeze { .. }
            | MovementOp::Unsqueeze { .. }
            | MovementOp::Identity { .. } => {
                return Err("internal: views are planned as aliases, not lowered".into())
            }
            MovementOp::Transpose { perm } => {
                let p = permutation(perm, x.len())?;
                let src: Vec<i64> = p.iter().map(|&i| xs[i] as i64).collect();
                vec![copy_kernel(
                    "transpose",
                    io(0, 0),
                    out,
                    0,
                    &src,
                    0,
                    &contiguous(out),
                )?]
            }
            MovementOp::Slice { .. } => {
                let dims = shape::known(x);
                let mut src: Vec<i64> = xs.iter().map(|&v| v as i64).collect();
                let mut base = 0i64;
                for (a, start, step, _) in self.slice_axes(&dims)? {
                    base += start * xs[a] as i64;
                    src[a] = step * xs[a] as i64;
                }
                vec![copy_kernel(
                    "slice",
                    io(0, 0),
                    out,
                    base,
                    &src,
                    0,
                    &contiguous(out),
                )?]
            }
            MovementOp::Expand { .. } => {
                let src: Vec<i64> = shape::broadcast_strides(x, out)
                    .iter()
                    .map(|&v| v as i64)
                    .collect();
                vec![copy_kernel(
                    "expand",
                    io(0, 0),
                    out,
                    0,
                    &src,
                    0,
                    &contiguous(out),
                )?]
            }
            MovementOp::Concat { axis } => {
                let a = shape::axis(*axis, x.len())?;
                let os = contiguous(out);
                let packed = outputs[0].storage == Storage::Packed;
                let mut offset = 0usize;
                let mut ks = Vec::new();
                for (i, t) in inputs.iter().enumerate() {
                    if t.numel() > 0 {
                        let base = offset as i64 * os[a];
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
                            &contiguous(&t.shape),
                            base,
                            &os,
                        )?);
                    }
                    offset += t.shape[a];
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
                let a = shape::axis(*axis, x.len())?;
                let src: Vec<i64> = xs.iter().map(|&v| v as i64).collect();
                let mut offset = 0usize;
                let mut ks = Vec::new();
                for (j, o) in outputs.iter().enumerate() {
                    if o.numel() > 0 {
                        let base = (offset * xs[a]) as i64;
                        ks.push(copy_kernel(
                            "split",
                            io(0, j),
                            &o.shape,
                            base,
                            &src,
                            0,
                            &contiguous(&o.shape),
                        )?);
                    }
                    offset += o.shape[a];
                }
                ks
            }
            MovementOp::Gather { axis } => {
                let a = shape::axis(*axis, x.len())?;
                let n = outputs[0].numel();
                let inner: usize = x[a + 1..].iter().product();
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
    let n: usize = domain.iter().product();
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
    let dst_contiguous = dst_base == 0
        && dst
            == shape::strides(domain)
                .iter()
                .map(|&v| v as i64)
                .collect::<Vec<_>>();
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
