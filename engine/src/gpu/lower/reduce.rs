//! GPU lowering of the reduce family.

use super::elementwise::helpers;
use super::Lower;
use crate::gpu::kernel::*;
use crate::ops::reduce::*;
use crate::shape;

const SHADER: &str = include_str!("../../../../shaders/reduce.wgsl");

impl Lower for ReduceOp {
    /// GPU kernel.
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
        let axes = self.axes(ctx.inputs[0].shape.len())?;
        if ctx.prologue.is_some() && !self.capabilities().prologue {
            return Err(format!("{} takes no prologue", self.name()));
        }
        match self.kind {
            ReduceKind::CumSum { exclusive, reverse } => {
                return cumsum_kernel(&ctx.inputs[0], &ctx.outputs[0], axes[0], exclusive, reverse)
                    .map(|k| Lowering::Kernels(vec![k]))
            }
            ReduceKind::TopK { k, largest } => {
                return top_k_kernels(ctx, axes[0], k, largest).map(Lowering::Kernels)
            }
            _ => {}
        }
        let source = match ctx.prologue {
            Some(prologue) => ReduceSource::Prologue {
                inputs: ctx.inputs,
                prologue,
            },
            None => ReduceSource::Input(&ctx.inputs[0]),
        };
        let label = match ctx.prologue {
            Some(p) => format!("{}{}", self.name(), p.label()),
            None => self.name().to_string(),
        };
        reduce_kernel(
            &label,
            &source,
            &ctx.outputs[0],
            &axes,
            self.kind,
            self.select_last_index,
            ctx.f16_compute,
        )
    }
}

/// What a reduction reads.
pub enum ReduceSource<'a> {
    /// Its input (binding `src`).
    Input(&'a Concrete),
    /// Pointwise work over `inputs` (bindings `pro0..`, each of the reduced tensor's
    /// shape) computed as each element is read.
    Prologue {
        /// The prologue's operands.
        inputs: &'a [Concrete],
        /// Its work.
        prologue: &'a Prologue,
    },
}

impl ReduceSource<'_> {
    /// The reduced tensor's shape.
    fn shape(&self) -> &[usize] {
        match self {
            ReduceSource::Input(c) => &c.shape,
            ReduceSource::Prologue { inputs, .. } => inputs.first().map_or(&[], |c| &c.shape),
        }
    }

    /// Whether every element read is an f32 word (what vec4 reads need).
    fn f32_words(&self) -> bool {
        match self {
            ReduceSource::Input(c) => c.storage == Storage::F32,
            ReduceSource::Prologue { inputs, .. } => {
                inputs.iter().all(|c| c.storage == Storage::F32)
            }
        }
    }

    /// Declares the bindings read into `b` and returns the WGSL defining `ld_src(i)`
    /// beyond them (nothing for a plain input, whose binding defines it).
    fn declare(&self, b: &mut Bindings) -> String {
        match self {
            ReduceSource::Input(c) => {
                b.add("src", Slot::Input(0), c.storage, false);
                String::new()
            }
            ReduceSource::Prologue { inputs, prologue } => {
                let mut loads = Vec::new();
                for (k, c) in inputs.iter().enumerate() {
                    b.add(&format!("pro{k}"), Slot::Input(k), c.storage, false);
                    loads.push(format!("ld_pro{k}(i)"));
                }
                format!(
                    "{}\n{}fn ld_src(i: u32) -> f32 {{\n    return sl_prologue({});\n}}\n",
                    helpers(),
                    prologue.wgsl(inputs.len()),
                    loads.join(", ")
                )
            }
        }
    }

    /// For vec4 reads ([`Self::f32_words`]): after the bindings of `b`, the declarations
    /// of the vec4 arrays read and `ld_src4(i)` (vec4 i of the reduced tensor), and every
    /// slot in binding order.
    fn declare4(&self, b: &Bindings) -> (String, Vec<Slot>) {
        let mut decls = b.wgsl();
        let mut slots = b.slots();
        let binding = |k: usize| slots.len() + 1 + k;
        match self {
            ReduceSource::Input(_) => {
                decls.push_str(&format!(
                    "@group(0) @binding({}) var<storage, read> src4: array<vec4<f32>>;\n\
                     fn ld_src4(i: u32) -> vec4<f32> {{\n    return src4[i];\n}}\n",
                    binding(0)
                ));
                slots.push(Slot::Input(0));
            }
            ReduceSource::Prologue { inputs, prologue } => {
                let mut loads = String::new();
                let first = binding(0);
                for k in 0..inputs.len() {
                    decls.push_str(&format!(
                        "@group(0) @binding({}) var<storage, read> pro{k}: array<vec4<f32>>;\n",
                        first + k
                    ));
                    loads.push_str(&format!("    let v{k} = pro{k}[i];\n"));
                    slots.push(Slot::Input(k));
                }
                let args: Vec<String> = (0..inputs.len()).map(|k| format!("v{k}")).collect();
                decls.push_str(&format!(
                    "{}\n{}fn ld_src4(i: u32) -> vec4<f32> {{\n{loads}    return sl_prologue4({});\n}}\n",
                    helpers(),
                    prologue.lanes4.wgsl("sl_prologue4", inputs.len()),
                    args.join(", ")
                ));
            }
        }
        (decls, slots)
    }
}

/// (outer, axis length, inner) of `dims` around axis `a`, as kernel words.
fn around(dims: &[usize], a: usize) -> Result<[u32; 3], String> {
    Ok([
        word(shape::numel(&dims[..a])?)?,
        word(dims[a])?,
        word(shape::numel(&dims[a + 1..])?.max(1))?,
    ])
}

/// `cumsum` along axis `a`: a thread per element, f32 sums for float storages, wrapping
/// i32 sums for i32.
fn cumsum_kernel(
    input: &Concrete,
    output: &Concrete,
    a: usize,
    exclusive: bool,
    reverse: bool,
) -> Result<Kernel, String> {
    let n = output.numel();
    let [_, len, inner] = around(&input.shape, a)?;
    let info = vec![
        word(n)?,
        len,
        inner,
        u32::from(exclusive),
        u32::from(reverse),
    ];
    let mut b = Bindings::new();
    b.add("dst", Slot::Output(0), output.storage, true);
    b.add("src", Slot::Input(0), input.storage, false);
    let int = input.storage == Storage::I32;
    let at = fill(
        variant(SHADER, "cumsum"),
        &[
            ("T", if int { "i32" } else { "f32" }.into()),
            ("LOAD", if int { "src[k]" } else { "ld_src(k)" }.into()),
        ],
    );
    let (main, threads) = if int {
        let main = fill(variant(SHADER, "cumsum_int"), &[("WG", WG.to_string())]);
        (main, n)
    } else {
        let (main, threads) = per_element_main(output.storage, n);
        (
            format!("{}\n{main}", variant(SHADER, "cumsum_float")),
            threads,
        )
    };
    Ok(Kernel {
        label: "cumsum".into(),
        source: format!("{}\n{at}\n{main}", b.wgsl()),
        slots: b.slots(),
        info,
        workgroups: dispatch_1d(threads, WG)?,
    })
}

/// `top_k` along axis `a`: a pass ranking every element and writing the indices of the
/// first `k`, then a pass gathering their values (so 16-bit values are stored whole).
fn top_k_kernels(ctx: &LowerCtx, a: usize, k: usize, largest: bool) -> Result<Vec<Kernel>, String> {
    let input = &ctx.inputs[0];
    let [values, indices] = ctx.outputs else {
        return Err("top_k has two outputs".into());
    };
    let n_out = values.numel();
    if n_out == 0 {
        return Ok(Vec::new());
    }
    let [_, len, inner] = around(&input.shape, a)?;
    let common = variant(SHADER, "common");
    let mut b = Bindings::new();
    b.add("indices", Slot::Output(1), indices.storage, true);
    b.add("src", Slot::Input(0), input.storage, false);
    let int = input.storage == Storage::I32;
    let rank = fill(
        variant(SHADER, "top_k_rank"),
        &[
            ("WG", WG.to_string()),
            ("T", if int { "i32" } else { "f32" }.into()),
        ],
    );
    let key = variant(
        SHADER,
        if int {
            "top_k_int_key"
        } else {
            "top_k_float_key"
        },
    );
    let n_in = input.numel();
    let first = Kernel {
        label: "top_k rank".into(),
        source: format!("{}\n{common}\n{key}\n{rank}", b.wgsl()),
        slots: b.slots(),
        info: vec![word(n_in)?, len, inner, word(k)?, u32::from(largest)],
        workgroups: dispatch_1d(n_in, WG)?,
    };
    let mut b = Bindings::new();
    b.add("dst", Slot::Output(0), values.storage, true);
    b.add("src", Slot::Input(0), input.storage, false);
    b.add("indices", Slot::Output(1), indices.storage, false);
    // 32-bit values are copied as they are (i32 exactly); 16-bit ones through f32.
    let words =
        values.storage == input.storage && matches!(values.storage, Storage::F32 | Storage::I32);
    let (main, threads) = if words {
        let main = fill(
            variant(SHADER, "top_k_values_words"),
            &[("WG", WG.to_string())],
        );
        (main, n_out)
    } else {
        let (main, threads) = per_element_main(values.storage, n_out);
        (
            format!("{}\n{main}", variant(SHADER, "top_k_values_float")),
            threads,
        )
    };
    let second = Kernel {
        label: "top_k values".into(),
        source: format!("{}\n{}\n{main}", b.wgsl(), variant(SHADER, "top_k_values")),
        slots: b.slots(),
        info: vec![word(n_out)?, len, inner, word(k)?],
        workgroups: dispatch_1d(threads, WG)?,
    };
    Ok(vec![first, second])
}

/// Reductions at least this long into fewer than [`SPLIT_MAX_OUTPUTS`] outputs are split
/// into segments reduced by workgroups of their own (two passes), so that a single sum
/// over a large tensor keeps every core of the device busy.
const SPLIT_MIN_COUNT: usize = 2 * SPLIT_SEGMENT;

/// See [`SPLIT_MIN_COUNT`].
const SPLIT_MAX_OUTPUTS: usize = 256;

/// Elements each workgroup of a split reduction reduces (about): enough that software
/// rasterisers, whose workgroup barriers are dear, spend their time reading.
const SPLIT_SEGMENT: usize = 32768;

/// The kernels reducing `input` over `axes` (sorted) into `output` as `kind` says: sums
/// accumulate in f16 when `f16_compute` (but for split ones), products, norms, extrema and indices always work
/// in f32; `last` (argmax, argmin) gives ties to the last index. Long reductions into few
/// outputs take two passes through f32 scratch (see [`SPLIT_MIN_COUNT`]).
pub fn reduce_kernel(
    label: &str,
    source: &ReduceSource,
    output: &Concrete,
    axes: &[usize],
    kind: ReduceKind,
    last: bool,
    f16_compute: bool,
) -> Result<Lowering, String> {
    let x = source.shape();
    let strides = shape::strides(x)?;
    let kept: Vec<usize> = (0..x.len()).filter(|i| !axes.contains(i)).collect();
    let n_out: usize = kept.iter().map(|&i| x[i]).product();
    let count: usize = axes.iter().map(|&i| x[i]).product();
    // The reduced elements are contiguous when the axes are the trailing ones.
    let contiguous = axes
        .iter()
        .enumerate()
        .all(|(k, &a)| a == x.len() - axes.len() + k);
    let scale = if kind == ReduceKind::Mean && count > 0 {
        1.0 / count as f32
    } else {
        1.0
    };
    let mut info = vec![
        word(n_out)?,
        word(count)?,
        word(kept.len())?,
        word(axes.len())?,
        u32::from(contiguous),
        scale.to_bits(),
    ];
    for &i in &kept {
        info.push(word(x[i])?);
    }
    for &i in &kept {
        info.push(word(strides[i])?);
    }
    for &i in axes {
        info.push(word(x[i])?);
    }
    for &i in axes {
        info.push(word(strides[i])?);
    }
    let common = variant(SHADER, "common");
    let split = count >= SPLIT_MIN_COUNT && n_out < SPLIT_MAX_OUTPUTS;
    // Sums of f32 rows a multiple of 4 long read them four elements at a time.
    let vec4 = split
        && contiguous
        && source.f32_words()
        && count.is_multiple_of(4)
        && matches!(kind, ReduceKind::Sum | ReduceKind::Mean | ReduceKind::L2);
    let mut b = Bindings::new();
    b.add("dst", Slot::Output(0), output.storage, true);
    let reads = source.declare(&mut b);
    if let ReduceKind::ArgMax | ReduceKind::ArgMin = kind {
        if output.storage != Storage::I32 || count == 0 {
            return Err(format!(
                "{label} needs an i32 output and a non-empty axis, got {:?} over {count}",
                output.storage
            ));
        }
        let cmp = match (kind == ReduceKind::ArgMin, last) {
            (false, false) => ">",
            (false, true) => ">=",
            (true, false) => "<",
            (true, true) => "<=",
        };
        let body = fill(
            variant(SHADER, "argmax"),
            &[
                ("WG", WG.to_string()),
                ("CMP", cmp.into()),
                ("STOP", (!last).to_string()),
            ],
        );
        return Ok(Lowering::Kernels(vec![Kernel {
            label: format!("{label} argmax"),
            source: format!("{}\n{reads}\n{common}\n{body}", b.wgsl()),
            slots: b.slots(),
            info,
            workgroups: dispatch_1d(n_out, WG)?,
        }]));
    }
    let (acc, combine, init) = match kind {
        ReduceKind::Max if count == 0 => {
            return Err(format!("{label} over an empty axis has no value"));
        }
        ReduceKind::Max => ("f32", "max", "ld_src(base + red_offset(0u))"),
        // +∞, read through `info` so that no compiler folds it into a constant (Tint
        // refuses an infinite f32 constant).
        ReduceKind::Min => ("f32", "min", "bitcast<f32>(0x7f800000u | (info[0] & 0u))"),
        ReduceKind::Prod => ("f32", "prod", "f32(1.0)"),
        ReduceKind::L2 => ("f32", "sum", "f32(0.0)"),
        // A long f16 running sum loses whole units: split reductions add in f32.
        _ if f16_compute && !split => ("f16", "sum", "f16(0.0)"),
        _ => ("f32", "sum", "f32(0.0)"),
    };
    let (lift, finish) = if kind == ReduceKind::L2 {
        ("v * v", "sqrt(v)")
    } else {
        ("v", "v")
    };
    let combine = format!(
        "{}\n{}",
        fill(variant(SHADER, combine), &[("ACC", acc.into())]),
        fill(
            variant(SHADER, "lift"),
            &[("LIFT", lift.into()), ("FINISH", finish.into())]
        )
    );
    if split {
        // The first pass writes f32 partial results into scratch.
        let mut part = Bindings::new();
        part.add("part", Slot::Scratch(0), Storage::F32, true);
        let first = if vec4 {
            source.declare4(&part)
        } else {
            let reads = source.declare(&mut part);
            (format!("{}\n{reads}", part.wgsl()), part.slots())
        };
        return split_kernels(
            label,
            first,
            output,
            info,
            (common, &combine),
            (acc, init, vec4),
            scale,
        );
    }
    let group = count >= WG as usize && n_out <= (MAX_GROUPS as usize) * (MAX_GROUPS as usize);
    let (name, body, workgroups) = if group {
        let packed = output.storage == Storage::Packed;
        let per = if packed { 2 } else { 1 };
        let store = if packed {
            "        dst[g] = sl_pack2(results);".to_string()
        } else {
            "        st_dst(g, results.x);".to_string()
        };
        let body = fill(
            variant(SHADER, "group"),
            &[
                ("WG", WG.to_string()),
                ("ACC", acc.into()),
                ("INIT", init.into()),
                ("PER_GROUP", per.to_string()),
                ("STORE", store),
            ],
        );
        ("group", body, dispatch_1d(n_out.div_ceil(per), 1)?)
    } else {
        let value = fill(
            variant(SHADER, "thread"),
            &[("ACC", acc.into()), ("INIT", init.into())],
        );
        let (main, threads) = per_element_main(output.storage, n_out);
        (
            "thread",
            format!("{value}\n{main}"),
            dispatch_1d(threads, WG)?,
        )
    };
    Ok(Lowering::Kernels(vec![Kernel {
        label: format!("{label} {name}"),
        source: format!("{}\n{reads}\n{common}\n{combine}\n{body}", b.wgsl()),
        slots: b.slots(),
        info,
        workgroups,
    }]))
}

/// The two passes of a split reduction: segments into f32 scratch, then each output from
/// its segments in order (the same order every run). `decls` and `slots` are the first
/// pass's bindings (`part` and what it reads, defining `ld_src` or, for vec4 reads,
/// `ld_src4`); `info` is the one-pass kernel's; `functions` its shared WGSL and its `combine`/`lift`/`finish`, `acc` and `init` its
/// accumulator type and first value.
fn split_kernels(
    label: &str,
    (decls, slots): (String, Vec<Slot>),
    output: &Concrete,
    info: Vec<u32>,
    functions: (&str, &str),
    (acc, init, vec4): (&str, &str, bool),
    scale: f32,
) -> Result<Lowering, String> {
    let (n_out, count) = (info[0] as usize, info[1] as usize);
    // Segments count elements, or vec4s when the first pass reads four at a time.
    let (items, template) = if vec4 {
        (count / 4, "split4")
    } else {
        (count, "split")
    };
    let seg_len = (SPLIT_SEGMENT / if vec4 { 4 } else { 1 }).min(items);
    let segments = items.div_ceil(seg_len);
    let (common, combine) = functions;
    let marks = |extra: &[(&'static str, String)]| {
        let mut m = vec![
            ("WG", WG.to_string()),
            ("ACC", acc.to_string()),
            ("SEGMENTS", segments.to_string()),
            ("SEG_LEN", seg_len.to_string()),
        ];
        m.extend(extra.iter().cloned());
        m
    };
    let body = fill(variant(SHADER, template), &marks(&[("INIT", init.into())]));
    let groups = n_out * segments;
    let split = Kernel {
        label: format!("{label} split"),
        source: format!("{decls}\n{common}\n{combine}\n{body}"),
        slots,
        info,
        workgroups: dispatch_1d(groups * WG as usize, WG)?,
    };
    let mut second = Bindings::new();
    second.add("dst", Slot::Output(0), output.storage, true);
    second.add("part", Slot::Scratch(0), Storage::F32, false);
    let value = fill(variant(SHADER, "segments"), &marks(&[]));
    let (main, threads) = per_element_main(output.storage, n_out);
    let gather = Kernel {
        label: format!("{label} segments"),
        source: format!("{}\n{common}\n{combine}\n{value}\n{main}", second.wgsl()),
        slots: second.slots(),
        info: vec![word(n_out)?, scale.to_bits()],
        workgroups: dispatch_1d(threads, WG)?,
    };
    Ok(Lowering::KernelsWithScratch(
        vec![split, gather],
        vec![groups],
    ))
}
