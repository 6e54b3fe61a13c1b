//! GPU lowering of the elementwise family: the WGSL expression of every operator (what
//! fusion composes) and the generated per-element kernel.

use super::Lower;
use crate::dtype::DType;
use crate::gpu::kernel::*;
use crate::ops::elementwise::*;
use crate::shape::broadcast_strides;

const SHADER: &str = include_str!("../../../../shaders/elementwise.wgsl");

/// The WGSL expression of a unary operator applied to `x` (an f32 expression). Results
/// are the CPU reference's IEEE ones: WGSL leaves NaN through `max`, `min` and `clamp`
/// and `pow` of a negative or zero base undefined, so the helpers (`sl_maximum`,
/// `sl_pow`, ...) spell those cases out.
pub fn unary_wgsl(u: Unary, x: &str) -> String {
    match u {
        Unary::Relu => format!("sl_maximum({x}, 0.0)"),
        Unary::Sigmoid => format!("sl_sigmoid({x})"),
        Unary::Tanh => format!("sl_tanh({x})"),
        Unary::Gelu { tanh: false } => format!("(0.5 * ({x}) * (1.0 + sl_erf(({x}) * 0.70710678118654752)))"),
        Unary::Gelu { tanh: true } => format!(
            "(0.5 * ({x}) * (1.0 + sl_tanh(0.79788456080286536 * (({x}) + 0.044715 * ({x}) * ({x}) * ({x})))))"
        ),
        Unary::Exp => format!("exp({x})"),
        Unary::Log => format!("log({x})"),
        Unary::Sqrt => format!("sqrt({x})"),
        Unary::Erf => format!("sl_erf({x})"),
        Unary::Clip { min, max } => {
            let mut e = x.to_string();
            if let Some(lo) = min {
                e = format!("sl_maximum({e}, {})", f32_literal(lo));
            }
            if let Some(hi) = max {
                e = format!("sl_minimum({e}, {})", f32_literal(hi));
            }
            e
        }
        Unary::LeakyRelu { alpha } => {
            format!("select({x}, {} * ({x}), ({x}) < 0.0)", f32_literal(alpha))
        }
        Unary::Elu { alpha } => format!(
            "select({x}, {} * (exp({x}) - 1.0), ({x}) < 0.0)",
            f32_literal(alpha)
        ),
        Unary::Selu { alpha, gamma } => {
            let a = f32_literal(alpha);
            format!(
                "({} * select({a} * exp({x}) - {a}, {x}, ({x}) > 0.0))",
                f32_literal(gamma)
            )
        }
        Unary::Softplus => format!("sl_softplus({x})"),
        Unary::Softsign => format!("(({x}) / (1.0 + abs({x})))"),
        Unary::HardSigmoid { alpha, beta } => format!(
            "sl_hard_sigmoid({x}, {}, {})",
            f32_literal(alpha),
            f32_literal(beta)
        ),
        Unary::HardSwish => format!(
            "(({x}) * sl_hard_sigmoid({x}, {}, 0.5))",
            f32_literal(HARD_SWISH_ALPHA)
        ),
        Unary::Silu => format!("(({x}) * sl_sigmoid({x}))"),
        Unary::Swish { alpha } => {
            format!("(({x}) * sl_sigmoid({} * ({x})))", f32_literal(alpha))
        }
        Unary::Mish => format!("(({x}) * sl_tanh(sl_softplus({x})))"),
        Unary::Abs => format!("abs({x})"),
        Unary::Neg => format!("(-({x}))"),
        Unary::Reciprocal => format!("(1.0 / ({x}))"),
        Unary::Sign => format!("sign({x})"),
        Unary::Sin => format!("sin({x})"),
        Unary::Cos => format!("cos({x})"),
        Unary::Floor => format!("floor({x})"),
        Unary::Ceil => format!("ceil({x})"),
        // WGSL's round takes halves to even, as ONNX's Round.
        Unary::Round => format!("round({x})"),
    }
}

/// The WGSL expression of a binary operator combining `a` and `b`.
pub fn binary_wgsl(op: Binary, a: &str, b: &str) -> String {
    match op {
        Binary::Add => format!("({a} + {b})"),
        Binary::Sub => format!("({a} - {b})"),
        Binary::Mul => format!("({a} * {b})"),
        Binary::Div => format!("({a} / {b})"),
        Binary::Pow => format!("sl_pow({a}, {b})"),
        Binary::Max => format!("sl_maximum({a}, {b})"),
        Binary::Min => format!("sl_minimum({a}, {b})"),
        Binary::Mod { fmod: true } => format!("sl_fmod({a}, {b})"),
        Binary::Mod { fmod: false } => format!("sl_mod({a}, {b})"),
        Binary::Prelu => format!("select({a}, ({b}) * ({a}), ({a}) < 0.0)"),
    }
}

/// The WGSL expression of an operator on i32 or bool values (`args`: i32 expressions, or
/// u32 0/1 for bool; `where`'s cond is always u32), or `None` for one defined on f32 only.
fn integer_wgsl(op: &ElementwiseOp, args: &[String]) -> Option<String> {
    let arg = |k: usize| args.get(k);
    Some(match op {
        ElementwiseOp::Unary(Unary::Abs) => format!("abs({})", arg(0)?),
        ElementwiseOp::Unary(Unary::Neg) => format!("(-({}))", arg(0)?),
        ElementwiseOp::Unary(Unary::Sign) => format!("sign({})", arg(0)?),
        ElementwiseOp::Unary(_) => return None,
        ElementwiseOp::Binary(b) => {
            let (a, c) = (arg(0)?, arg(1)?);
            match b {
                Binary::Add => format!("({a} + {c})"),
                Binary::Sub => format!("({a} - {c})"),
                Binary::Mul => format!("({a} * {c})"),
                Binary::Div => format!("sl_idiv({a}, {c})"),
                Binary::Max => format!("max({a}, {c})"),
                Binary::Min => format!("min({a}, {c})"),
                Binary::Mod { fmod } => format!("sl_imod({a}, {c}, {fmod})"),
                Binary::Pow | Binary::Prelu => return None,
            }
        }
        ElementwiseOp::Where => format!("select({}, {}, {} != 0u)", arg(2)?, arg(1)?, arg(0)?),
    })
}

/// The expression of an elementwise operator over inputs `args` (each an f32 expression;
/// for `where`, args[0] is bool).
pub fn wgsl(op: &ElementwiseOp, args: &[String]) -> String {
    match op {
        ElementwiseOp::Unary(u) => unary_wgsl(*u, &args[0]),
        ElementwiseOp::Binary(b) => binary_wgsl(*b, &args[0], &args[1]),
        ElementwiseOp::Where => format!("select({}, {}, {})", args[2], args[1], args[0]),
    }
}

impl Lower for ElementwiseOp {
    /// GPU kernel: the per-element f32 kernel, or for an i32 or bool output the integer
    /// one.
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
        let (inputs, outputs) = (ctx.inputs, ctx.outputs);
        let args: Vec<String> = (0..inputs.len()).map(|i| format!("x{i}")).collect();
        let out = outputs.first().ok_or("internal: no output")?;
        if out.dtype != DType::F32 {
            let expr = integer_wgsl(self, &args)
                .ok_or_else(|| format!("'{}' has no {} kernel", self.name(), out.dtype))?;
            let kernel = integer_kernel(self.name(), &expr, inputs, &out.shape, out.storage)?;
            return Ok(Lowering::Kernels(vec![kernel]));
        }
        let kernel = elementwise_kernel(
            self.name(),
            ("", &wgsl(self, &args)),
            None,
            inputs,
            &outputs[0].shape,
            outputs[0].storage,
            None,
        )?;
        Ok(Lowering::Kernels(vec![kernel]))
    }
}

/// The WGSL helper functions elementwise expressions use (`sl_erf`, `sl_tanh`, ...).
pub fn helpers() -> &'static str {
    variant(SHADER, "helpers")
}

/// The info words of a per-element kernel: `[n]` when every input has the output's shape,
/// else `[n, rank, out shape, then each input's broadcast strides]` (read by `sl_offset`).
fn element_info(inputs: &[Concrete], out: &[usize]) -> Result<(Vec<u32>, bool), String> {
    let n: usize = out.iter().product();
    let contiguous = inputs.iter().all(|t| t.shape == out);
    let mut info = vec![word(n)?];
    if !contiguous {
        info.push(word(out.len())?);
        for &d in out {
            info.push(word(d)?);
        }
        for t in inputs {
            for s in broadcast_strides(&t.shape, out)? {
                info.push(word(s)?);
            }
        }
    }
    Ok((info, contiguous))
}

/// A kernel computing `expr` over inputs `x0..` read as they are stored (i32, or bool as
/// u32 0/1), into an i32 or bool output: integers never pass through f32.
fn integer_kernel(
    label: &str,
    expr: &str,
    inputs: &[Concrete],
    out: &[usize],
    out_storage: Storage,
) -> Result<Kernel, String> {
    let ty = match out_storage {
        Storage::I32 => "i32",
        Storage::Bool => "u32",
        other => return Err(format!("internal: an integer output stored as {other:?}")),
    };
    let (info, contiguous) = element_info(inputs, out)?;
    let mut b = Bindings::new();
    b.add("dst", Slot::Output(0), out_storage, true);
    let mut loads = String::new();
    for (i, t) in inputs.iter().enumerate() {
        if !matches!(t.storage, Storage::I32 | Storage::Bool) {
            return Err(format!(
                "internal: integer kernel input {i} stored as {:?}",
                t.storage
            ));
        }
        let index = if contiguous {
            "i".to_string()
        } else {
            format!("sl_offset(i, {i}u)")
        };
        b.add(&format!("src{i}"), Slot::Input(i), t.storage, false);
        loads.push_str(&format!("    let x{i} = src{i}[{index}];\n"));
    }
    let n: usize = out.iter().product();
    let body = fill(
        variant(SHADER, "words"),
        &[
            ("TYPE", ty.to_string()),
            ("LOADS", loads),
            ("EXPR", expr.to_string()),
            ("WG", WG.to_string()),
        ],
    );
    Ok(Kernel {
        label: format!("{label} {ty}"),
        source: format!("{}\n{}\n{body}", b.wgsl(), helpers()),
        slots: b.slots(),
        info,
        workgroups: dispatch_1d(n, WG)?,
    })
}

/// An elementwise kernel over f32 inputs of the output's shape, four elements a time
/// (`n` a multiple of 4).
fn vec4_kernel(
    label: &str,
    (stmts, expr): (&str, &str),
    lanes4: Option<&Lanes4>,
    inputs: usize,
    n: usize,
    info: Vec<u32>,
) -> Result<Kernel, String> {
    let mut decls = String::from(
        "@group(0) @binding(0) var<storage, read> info: array<u32>;\n\
         @group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;\n",
    );
    let mut slots = vec![Slot::Output(0)];
    let mut loads = String::new();
    for i in 0..inputs {
        decls.push_str(&format!(
            "@group(0) @binding({}) var<storage, read> src{i}: array<vec4<f32>>;\n",
            i + 2
        ));
        slots.push(Slot::Input(i));
        loads.push_str(&format!("    let v{i} = src{i}[t];\n"));
    }
    // The lanes' values: a fused chain's generated `value4`, or the scalar `value` once
    // per lane.
    let (lanes, value) = match lanes4 {
        Some(four) => {
            let args: Vec<String> = (0..inputs).map(|i| format!("v{i}")).collect();
            (
                vec![format!("value4({})", args.join(", "))],
                four.wgsl("value4", inputs),
            )
        }
        None => {
            let lanes = ["x", "y", "z", "w"].iter().map(|c| {
                let args: Vec<String> = (0..inputs).map(|i| format!("v{i}.{c}")).collect();
                format!("value({})", args.join(", "))
            });
            let params: Vec<String> = (0..inputs).map(|i| format!("x{i}: f32")).collect();
            let value = fill(
                variant(SHADER, "value4"),
                &[
                    ("PARAMS", params.join(", ")),
                    ("BODY", stmts.to_string()),
                    ("EXPR", expr.to_string()),
                ],
            );
            (lanes.collect(), value)
        }
    };
    let n4 = n / 4;
    let main = fill(
        variant(SHADER, "vec4_main"),
        &[
            ("WG", WG.to_string()),
            ("N4", n4.to_string()),
            ("LOADS", loads),
            ("LANES", lanes.join(", ")),
        ],
    );
    Ok(Kernel {
        label: format!("{label} vec4"),
        source: format!("{decls}\n{}\n{value}{main}", helpers()),
        slots,
        info,
        workgroups: dispatch_1d(n4, WG)?,
    })
}

/// One elementwise kernel: `stmts` then `expr` over inputs `x0..`, into an output of `out`
/// shape stored as `out_storage`; where it moves four elements at a time, through
/// `lanes4` when given (a fused chain's four lanes interleaved). Inputs of dtype bool are
/// read as `x{i}: bool`. With `in_place = Some(k)`, input k (same shape and storage as the
/// output) is read from the output buffer and gets no binding of its own: the kernel
/// overwrites it.
pub fn elementwise_kernel(
    label: &str,
    (stmts, expr): (&str, &str),
    lanes4: Option<&Lanes4>,
    inputs: &[Concrete],
    out: &[usize],
    out_storage: Storage,
    in_place: Option<usize>,
) -> Result<Kernel, String> {
    let n: usize = out.iter().product();
    if let Some(k) = in_place {
        if inputs
            .get(k)
            .is_none_or(|t| t.shape != out || t.dtype != DType::F32 || t.storage != out_storage)
        {
            return Err(format!(
                "in-place input {k} must be f32 of the output's shape and storage"
            ));
        }
    }
    let (info, contiguous) = element_info(inputs, out)?;
    let all_f32 = |t: &Concrete| t.dtype == DType::F32 && t.storage == Storage::F32;
    if contiguous
        && in_place.is_none()
        && out_storage == Storage::F32
        && inputs.iter().all(all_f32)
        && n.is_multiple_of(4)
    {
        return vec4_kernel(label, (stmts, expr), lanes4, inputs.len(), n, info);
    }
    let mut b = Bindings::new();
    b.add("dst", Slot::Output(0), out_storage, true);
    let mut loads = String::new();
    for (i, t) in inputs.iter().enumerate() {
        if in_place == Some(i) {
            loads.push_str(&format!("    let x{i} = ld_dst(i);\n"));
            continue;
        }
        let index = if contiguous {
            "i".to_string()
        } else {
            format!("sl_offset(i, {i}u)")
        };
        b.add(&format!("src{i}"), Slot::Input(i), t.storage, false);
        let read = match t.dtype {
            DType::Bool => format!("ld_src{i}({index}) != 0.0"),
            _ => format!("ld_src{i}({index})"),
        };
        loads.push_str(&format!("    let x{i} = {read};\n"));
    }
    let value = fill(
        variant(SHADER, "value"),
        &[
            ("LOADS", loads),
            ("BODY", stmts.to_string()),
            ("EXPR", expr.to_string()),
        ],
    );
    let (main, threads) = per_element_main(out_storage, n);
    let source = format!("{}\n{}\n{value}\n{main}", b.wgsl(), helpers());
    Ok(Kernel {
        label: if in_place.is_some() {
            format!("{label} (in place)")
        } else {
            label.to_string()
        },
        source,
        slots: b.slots(),
        info,
        workgroups: dispatch_1d(threads, WG)?,
    })
}
