//! GPU lowering of the matmul family.

use super::Lower;
use crate::gpu::kernel::variant as variant_of;
use crate::gpu::kernel::*;
use crate::gpu::tuning::{textured_fits, vectorised, MatmulTypes, MatmulVariant};
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
        let (kernels, textures) =
            matmul_kernels(&problem, b_slot, bias, ctx.epilogue, types, variant)?;
        Ok(if textures.is_empty() {
            Lowering::Kernels(kernels)
        } else {
            Lowering::KernelsWithTextures(kernels, textures)
        })
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

/// Where a register block reads A and B: storage buffers (`blocked`) or the textures the
/// pack passes fill (`textured`; `subgroup` with each row of A fetched once per subgroup).
#[derive(Clone, Copy, PartialEq)]
enum Operands {
    Buffers,
    Textures,
    /// Textures, each row of A fetched by one of `lanes` lanes and broadcast.
    SubgroupTextures {
        lanes: u32,
    },
}

/// The statements of a register block of `rows` × `cols` vec4 columns (see the `blocked`
/// and `textured` variants of `shaders/matmul.wgsl`): clamped row and column indices, the
/// products of one vec4 step along K, and the guarded stores.
fn blocked(rows: u32, cols: u32, from: Operands) -> [(&'static str, String); 3] {
    let acc = "vec4<{{ACC}}>";
    let buffers = from == Operands::Buffers;
    let mut setup = String::new();
    for c in 0..cols {
        let base = if buffers { "b_base + " } else { "" };
        setup.push_str(&format!(
            "    let bc{c} = {base}min(col4 + {c}u, n4 - 1u);\n"
        ));
    }
    let lanes = match from {
        Operands::SubgroupTextures { lanes } => Some(lanes),
        _ => None,
    };
    // With shared rows, fetch q of lane l is row row0 + q * lanes + l.
    if let Some(lanes) = lanes {
        for q in 0..rows.div_ceil(lanes) {
            setup.push_str(&format!(
                "    let rq{q} = min(row0 + {}u + lane, m - 1u);\n",
                q * lanes
            ));
        }
    }
    for r in 0..rows {
        let (base, stride) = if buffers {
            ("a_base + ", " * k4")
        } else {
            ("", "")
        };
        if lanes.is_none() {
            setup.push_str(&format!(
                "    let ra{r} = {base}min(row0 + {r}u, m - 1u){stride};\n"
            ));
        }
        for c in 0..cols {
            setup.push_str(&format!("    var acc{r}_{c} = {acc}(0.0);\n"));
        }
    }
    let mut step = String::new();
    if buffers {
        step.push_str("        let kb = k * 4u * n4;\n");
    }
    for c in 0..cols {
        for j in 0..4 {
            let load = if buffers {
                let plus = ["", " + n4", " + 2u * n4", " + 3u * n4"][j];
                format!("ld4_b(bc{c} + kb{plus})")
            } else {
                format!("textureLoad(tex_b, vec2<u32>(bc{c}, k * 4u + {j}u), 0)")
            };
            step.push_str(&format!("        let b{c}_{j} = {acc}({load});\n"));
        }
    }
    if let Some(lanes) = lanes {
        for q in 0..rows.div_ceil(lanes) {
            step.push_str(&format!(
                "        let aq{q} = textureLoad(tex_a, vec2<u32>(k, rq{q}), 0);\n"
            ));
        }
    }
    for r in 0..rows {
        let load = match (from, lanes) {
            (Operands::Buffers, _) => format!("ld4_a(ra{r} + k)"),
            (_, Some(lanes)) => format!("subgroupBroadcast(aq{}, {}u)", r / lanes, r % lanes),
            _ => format!("textureLoad(tex_a, vec2<u32>(k, ra{r}), 0)"),
        };
        step.push_str(&format!("        let a{r} = {acc}({load});\n"));
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

/// The kernels of a matmul problem and the textures they stage A and B in (none unless
/// the variant is [`MatmulVariant::textured`]); `bias` binds the weight slot after B;
/// `variant` says how vec4 kernels share out C (problems without vec4 loads take the
/// scalar kernel; a textured variant the problem does not fit takes the default).
pub fn matmul_kernels(
    p: &Problem,
    b_slot: Slot,
    bias: bool,
    epilogue: &Epilogue,
    types: MatmulTypes,
    variant: MatmulVariant,
) -> Result<(Vec<Kernel>, Vec<[u32; 2]>), String> {
    let variant = match variant {
        v if v.textured() && !textured_fits(p) => MatmulVariant::DEFAULT,
        v => v,
    };
    let product = matmul_kernel(p, b_slot, bias, epilogue, types, variant)?;
    // A textured variant here fits, so the problem is vectorised.
    if !variant.textured() {
        return Ok((vec![product], Vec::new()));
    }
    let (k4, n4) = (p.k / 4, p.n / 4);
    let (a_base, b_base) = p.offsets.first().copied().unwrap_or((0, 0));
    let pack_a = pack_kernel("a", 0, p.m, k4, a_base / 4, Slot::Input(0), types.a)?;
    let pack_b = pack_kernel("b", 1, p.k, n4, b_base / 4, b_slot, types.b)?;
    let textures = vec![[word(k4)?, word(p.m)?], [word(n4)?, word(p.k)?]];
    Ok((vec![pack_a, pack_b, product], textures))
}

/// The pass copying operand `name` (`rows` × `cols4` vec4s from vec4 `base` of `slot`)
/// into texture `texture`.
fn pack_kernel(
    name: &str,
    texture: usize,
    rows: usize,
    cols4: usize,
    base: usize,
    slot: Slot,
    storage: Storage,
) -> Result<Kernel, String> {
    let mut decls = String::from("@group(0) @binding(0) var<storage, read> info: array<u32>;\n");
    vec4_binding(&mut decls, 1, "src", storage, false);
    Ok(Kernel {
        label: format!("matmul pack {name}"),
        source: with_f16_enable(format!("{decls}\n{}", variant_of(SHADER, "pack"))),
        slots: vec![slot, Slot::Texture(texture)],
        info: vec![word(rows)?, word(cols4)?, word(base)?],
        workgroups: [word(cols4.div_ceil(8))?, word(rows.div_ceil(8))?, 1],
    })
}

/// Builds the kernel computing C (for a textured variant: from the two textures).
fn matmul_kernel(
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
    let textured = variant.textured();
    let mut slots = if textured && vec4 {
        vec![Slot::Texture(0), Slot::Texture(1), Slot::Output(0)]
    } else {
        vec![Slot::Input(0), b_slot, Slot::Output(0)]
    };
    let (name, workgroups, body) = if vec4 {
        if !textured {
            vec4_binding(&mut decls, 1, "a", types.a, false);
            vec4_binding(&mut decls, 2, "b", types.b, false);
        }
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
            MatmulVariant::Blocked { rows, cols, wx, wy }
            | MatmulVariant::Textured { rows, cols, wx, wy } => {
                let from = if textured {
                    Operands::Textures
                } else {
                    Operands::Buffers
                };
                let mut marks = blocked(rows, cols, from).to_vec();
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
                (if textured { "textured" } else { "blocked" }, marks, groups)
            }
            MatmulVariant::Subgroup {
                rows,
                cols,
                lanes,
                wy,
            } => {
                let mut marks = blocked(rows, cols, Operands::SubgroupTextures { lanes }).to_vec();
                marks.extend([
                    ("ROWS", rows.to_string()),
                    ("COLS", cols.to_string()),
                    ("LANES", lanes.to_string()),
                    ("WY", wy.to_string()),
                    ("INVOCATIONS", (lanes * wy).to_string()),
                ]);
                let groups = (
                    n4.div_ceil((cols * lanes) as usize),
                    p.m.div_ceil((rows * wy) as usize),
                );
                ("subgroup", marks, groups)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::tuning::TEXTURE_SIDE;

    const TEXTURED: MatmulVariant = MatmulVariant::Textured {
        rows: 8,
        cols: 2,
        wx: 8,
        wy: 8,
    };

    fn f32_types() -> MatmulTypes {
        MatmulTypes {
            a: Storage::F32,
            b: Storage::F32,
            c: Storage::F32,
            bias: Storage::F32,
            f16_accumulate: false,
        }
    }

    fn problem(m: usize, n: usize, k: usize, batches: usize) -> Problem {
        Problem {
            m,
            n,
            k,
            offsets: (0..batches).map(|b| (b * m * k, b * k * n)).collect(),
        }
    }

    fn kernels(p: &Problem, v: MatmulVariant) -> (Vec<Kernel>, Vec<[u32; 2]>) {
        let id = Epilogue::identity();
        matmul_kernels(p, Slot::Input(1), false, &id, f32_types(), v).expect("lowers")
    }

    #[test]
    fn a_textured_product_packs_a_and_b_into_textures_first() {
        let (ks, textures) = kernels(&problem(130, 68, 36, 1), TEXTURED);
        let labels: Vec<&str> = ks.iter().map(|k| k.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "matmul pack a",
                "matmul pack b",
                "matmul vec4 textured 8x2 8x8"
            ]
        );
        // A: K/4 × M texels; B: N/4 × K.
        assert_eq!(textures, [[9, 130], [17, 36]]);
        assert_eq!(ks[0].slots, [Slot::Input(0), Slot::Texture(0)]);
        assert_eq!(ks[1].slots, [Slot::Input(1), Slot::Texture(1)]);
        assert_eq!(
            ks[2].slots,
            [Slot::Texture(0), Slot::Texture(1), Slot::Output(0)]
        );
        assert_eq!(ks[0].workgroups, [2, 17, 1]);
    }

    #[test]
    fn problems_a_texture_cannot_hold_take_the_default_kernel() {
        for p in [
            problem(64, 64, 64, 3),
            problem(TEXTURE_SIDE + 1, 64, 64, 1),
            problem(64, 64, TEXTURE_SIDE + 4, 1),
        ] {
            let (ks, textures) = kernels(&p, TEXTURED);
            assert!(textures.is_empty(), "{p:?}");
            assert_eq!(ks.len(), 1);
            assert_eq!(ks[0].label, "matmul vec4", "{p:?}");
        }
        // Not vec4-aligned: the scalar kernel, whatever the variant.
        let (ks, textures) = kernels(&problem(5, 6, 7, 1), TEXTURED);
        assert!(textures.is_empty());
        assert_eq!(ks[0].label, "matmul scalar");
    }

    #[test]
    fn a_subgroup_product_fetches_each_row_of_a_once_per_subgroup() {
        let v = MatmulVariant::Subgroup {
            rows: 16,
            cols: 4,
            lanes: 8,
            wy: 8,
        };
        let (ks, textures) = kernels(&problem(130, 68, 36, 1), v);
        assert_eq!(textures, [[9, 130], [17, 36]]);
        let product = &ks[2];
        assert_eq!(product.label, "matmul vec4 subgroup 16x4 8x8");
        // 17 vec4 columns in blocks of 4 × 8 lanes; 130 rows in 16 × 8 subgroups.
        assert_eq!(product.workgroups, [1, 2, 1]);
        let src = &product.source;
        assert!(src.contains("@workgroup_size(64, 1, 1)"), "{src}");
        // Two fetches of A per step (rows l and 8 + l of the subgroup's 16), 16 of B.
        assert_eq!(src.matches("textureLoad(tex_a").count(), 2, "{src}");
        assert_eq!(src.matches("textureLoad(tex_b").count(), 16, "{src}");
        assert!(src.contains("subgroupBroadcast(aq0, 0u)"), "{src}");
        assert!(src.contains("subgroupBroadcast(aq1, 7u)"), "{src}");
        assert!(!src.contains("subgroupBroadcast(aq2"), "{src}");
    }
}
