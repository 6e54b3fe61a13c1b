//! GPU lowering of the matmul family.

use super::Lower;
use crate::gpu::kernel::variant as variant_of;
use crate::gpu::kernel::*;
use crate::gpu::tuning::{vectorised, MatmulTypes, MatmulVariant};
use crate::ops::matmul::*;

const SHADER: &str = include_str!("../../../../shaders/matmul.wgsl");

impl Lower for MatMulOp {
    /// GPU kernels, with fused elementwise work in the epilogue.
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
        let (inputs, outputs) = (ctx.inputs, ctx.outputs);
        let (problem, b_slot, bias, b_storage) = match self {
            MatMulOp::MatMul => (
                batched_problem(&inputs[0].shape, &inputs[1].shape)?,
                Slot::Input(1),
                false,
                inputs[1].storage,
            ),
            MatMulOp::Linear { out_features, bias } => {
                let x = &inputs[0].shape;
                let k = x.last().copied().unwrap_or(1);
                // Rows: every axis but the last (inference refuses k = 0).
                let m = x[..x.len().saturating_sub(1)].iter().product::<usize>();
                let p = Problem {
                    m,
                    n: *out_features,
                    k,
                    offsets: vec![(0, 0)],
                };
                let w = ctx.params.first().map_or(Storage::F32, |c| c.storage);
                (p, Slot::Param(0), *bias, w)
            }
        };
        debug_assert_eq!(
            outputs[0].numel(),
            problem.m * problem.n * problem.offsets.len()
        );
        let types = MatmulTypes {
            a: inputs[0].storage,
            b: b_storage,
            c: outputs[0].storage,
            bias: ctx.params.get(1).map_or(Storage::F32, |c| c.storage),
            f16_accumulate: ctx.f16_compute,
        };
        let variant = ctx.tuning.matmul_variant(&problem, types);
        Ok(Lowering::Kernels(vec![matmul_kernel(
            &problem,
            b_slot,
            bias,
            ctx.epilogue,
            types,
            variant,
        )?]))
    }
}

/// Declares a binding read (and written) four elements at a time: `ld4_NAME(i)` and
/// `st4_NAME(i, v)` with `i` counted in vec4s.
fn vec4_binding(decls: &mut String, binding: u32, name: &str, storage: Storage, write: bool) {
    let access = if write { "read_write" } else { "read" };
    let (ty, load, store) = match storage {
        Storage::F16 => (
            "vec4<f16>",
            format!("vec4<f32>({name}[i])"),
            format!("{name}[i] = vec4<f16>(v);"),
        ),
        Storage::Packed => (
            "vec2<u32>",
            format!("vec4<f32>(unpack2x16float({name}[i].x), unpack2x16float({name}[i].y))"),
            format!("{name}[i] = vec2<u32>(sl_pack2(v.xy), sl_pack2(v.zw));"),
        ),
        _ => ("vec4<f32>", format!("{name}[i]"), format!("{name}[i] = v;")),
    };
    decls.push_str(&format!(
        "@group(0) @binding({binding}) var<storage, {access}> {name}: array<{ty}>;\n"
    ));
    decls.push_str(&format!(
        "fn ld4_{name}(i: u32) -> vec4<f32> {{\n    return {load};\n}}\n"
    ));
    if write {
        if storage == Storage::Packed && !decls.contains("fn sl_pack2") {
            decls.push_str(crate::gpu::kernel::PACK_HALF);
        }
        decls.push_str(&format!(
            "fn st4_{name}(i: u32, v: vec4<f32>) {{\n    {store}\n}}\n"
        ));
    }
}

/// The statements of a register block of `rows` × `cols` vec4 columns (see the `blocked`
/// variant of `shaders/matmul.wgsl`): clamped row and column indices, the products of one
/// vec4 step along K, and the guarded stores.
fn blocked(rows: u32, cols: u32) -> [(&'static str, String); 3] {
    let acc = "vec4<{{ACC}}>";
    let mut setup = String::new();
    for c in 0..cols {
        setup.push_str(&format!(
            "    let bc{c} = b_base + min(col4 + {c}u, n4 - 1u);\n"
        ));
    }
    for r in 0..rows {
        setup.push_str(&format!(
            "    let ra{r} = a_base + min(row0 + {r}u, m - 1u) * k4;\n"
        ));
        for c in 0..cols {
            setup.push_str(&format!("    var acc{r}_{c} = {acc}(0.0);\n"));
        }
    }
    let mut step = String::new();
    for c in 0..cols {
        for j in 0..4 {
            let plus = ["", " + n4", " + 2u * n4", " + 3u * n4"][j];
            step.push_str(&format!(
                "        let b{c}_{j} = {acc}(ld4_b(bc{c} + kb{plus}));\n"
            ));
        }
    }
    for r in 0..rows {
        step.push_str(&format!("        let a{r} = {acc}(ld4_a(ra{r} + k));\n"));
        for c in 0..cols {
            step.push_str(&format!(
                "        acc{r}_{c} = fma({acc}(a{r}.x), b{c}_0, fma({acc}(a{r}.y), b{c}_1, fma({acc}(a{r}.z), b{c}_2, fma({acc}(a{r}.w), b{c}_3, acc{r}_{c}))));\n"
            ));
        }
    }
    let mut store = String::new();
    for r in 0..rows {
        for c in 0..cols {
            store.push_str(&format!(
                "    if (row0 + {r}u < m && col4 + {c}u < n4) {{\n        st4_c(c_base + (row0 + {r}u) * n4 + col4 + {c}u, epilogue(vec4<f32>(acc{r}_{c}), col4 + {c}u));\n    }}\n"
            ));
        }
    }
    [("SETUP", setup), ("STEP", step), ("STORE", store)]
}

/// Builds the kernel for a problem; `bias` binds the weight slot after B; `variant` says
/// how vec4 kernels share out C (problems without vec4 loads take the scalar kernel).
pub fn matmul_kernel(
    p: &Problem,
    b_slot: Slot,
    bias: bool,
    epilogue: &Epilogue,
    types: MatmulTypes,
    variant: MatmulVariant,
) -> Result<Kernel, String> {
    let batches = p.offsets.len();
    if batches > MAX_GROUPS as usize {
        return Err(format!(
            "{batches} matmul batches exceed the dispatch limit"
        ));
    }
    let mut info = vec![word(p.m)?, word(p.n)?, word(p.k)?, word(batches)?];
    for &(oa, ob) in &p.offsets {
        info.push(word(oa)?);
        info.push(word(ob)?);
    }
    let vec4 = vectorised(p);
    let acc = if types.f16_accumulate { "f16" } else { "f32" };
    let mut decls = String::from("@group(0) @binding(0) var<storage, read> info: array<u32>;\n");
    let mut slots = vec![Slot::Input(0), b_slot, Slot::Output(0)];
    let (name, workgroups, body) = if vec4 {
        vec4_binding(&mut decls, 1, "a", types.a, false);
        vec4_binding(&mut decls, 2, "b", types.b, false);
        vec4_binding(&mut decls, 3, "c", types.c, true);
        let bias_read = if bias {
            vec4_binding(&mut decls, 4, "bias", types.bias, false);
            "ld4_bias(col4)"
        } else {
            "vec4<f32>(0.0)"
        };
        let n4 = p.n / 4;
        let epilogue = fill(
            variant_of(SHADER, "epilogue"),
            &[("BIAS", bias_read.into())],
        );
        let (template, marks, groups) = match variant {
            MatmulVariant::Blocked { rows, cols, wx, wy } => {
                let mut marks = blocked(rows, cols).to_vec();
                marks.extend([
                    ("ROWS", rows.to_string()),
                    ("COLS", cols.to_string()),
                    ("WX", wx.to_string()),
                    ("WY", wy.to_string()),
                ]);
                let groups = (
                    n4.div_ceil((cols * wx) as usize),
                    p.m.div_ceil((rows * wy) as usize),
                );
                ("blocked", marks, groups)
            }
            MatmulVariant::Tiled => ("tiled", Vec::new(), (n4.div_ceil(16), p.m.div_ceil(64))),
        };
        // The generated block holds {{ACC}} too, so it is filled in last.
        let mut marks = marks;
        marks.push(("ACC", acc.into()));
        let body = fill(variant_of(SHADER, template), &marks);
        (
            template,
            [word(groups.0)?, word(groups.1)?, batches as u32],
            format!("{epilogue}\n{body}"),
        )
    } else {
        let mut b = Bindings::new();
        b.add("a", Slot::Input(0), types.a, false);
        b.add("b", b_slot, types.b, false);
        b.add("dst", Slot::Output(0), types.c, true);
        if bias {
            b.add("bias", Slot::Param(1), types.bias, false);
        }
        decls = b.wgsl();
        let bias_read = if bias { "ld_bias(col)" } else { "0.0" };
        let value = fill(
            variant_of(SHADER, "scalar"),
            &[("BIAS", bias_read.into()), ("ACC", acc.into())],
        );
        let n = p.m * p.n * batches;
        let (main, threads) = per_element_main(types.c, n);
        (
            "scalar",
            dispatch_1d(threads, WG)?,
            format!("{value}\n{main}"),
        )
    };
    if bias {
        slots.push(Slot::Param(1));
    }
    let first_extra = slots.len() as u32 + 1;
    slots.extend(epilogue.extra_slots.iter().copied());
    let uses_f16 =
        types.f16_accumulate || [types.a, types.b, types.c, types.bias].contains(&Storage::F16);
    let enable = if uses_f16 && !decls.starts_with("enable f16;") {
        "enable f16;\n"
    } else {
        ""
    };
    let source = format!(
        "{enable}{decls}\n{}\n{}\n{body}",
        super::elementwise::helpers(),
        epilogue.wgsl(first_extra)
    );
    let name = match (vec4, variant) {
        (true, v) if v != MatmulVariant::DEFAULT => format!("vec4 {}", v.name()),
        (true, _) => "vec4".to_string(),
        (false, _) => name.to_string(),
    };
    Ok(Kernel {
        label: format!("matmul {name}{}", epilogue.label()),
        source,
        slots,
        info,
        workgroups,
    })
}
