//! GPU lowering of the elementwise family: the WGSL expression of every operator (what
//! fusion composes) and the generated per-element kernel.

use super::Lower;
use crate::dtype::DType;
use crate::gpu::kernel::*;
use crate::ops::elementwise::*;
use crate::shape::broadcast_strides;

const SHADER: &str = include_str!("../../../../shaders/elementwise.wgsl");

/// The WGSL expression of a unary operator applied to `x` (an f32 expression).
pub fn unary_wgsl(u: Unary, x: &str) -> String {
    match u {
        Unary::Relu => format!("max({x}, 0.0)"),
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
                e = format!("max({e}, {})", f32_literal(lo));
            }
            if let Some(hi) = max {
                e = format!("min({e}, {})", f32_literal(hi));
            }
            e
        }
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
        Binary::Max => format!("max({a}, {b})"),
        Binary::Min => format!("min({a}, {b})"),
    }
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
    /// GPU kernel.
    fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
        let (inputs, outputs) = (ctx.inputs, ctx.outputs);
        let args: Vec<String> = (0..inputs.len()).map(|i| format!("x{i}")).collect();
        let kernel = elementwise_kernel(
            self.name(),
            "",
            &wgsl(self, &args),
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

/// One elementwise kernel: `stmts` then `expr` over inputs `x0..`, into an output of `out`
/// shape stored as `out_storage`. Inputs of dtype bool are read as `x{i}: bool`. With
/// `in_place = Some(k)`, input k (same shape and storage as the output) is read from the
/// output buffer and gets no binding of its own: the kernel overwrites it.
pub fn elementwise_kernel(
    label: &str,
    stmts: &str,
    expr: &str,
    inputs: &[Concrete],
    out: &[usize],
    out_storage: Storage,
    in_place: Option<usize>,
) -> Result<Kernel, String> {
    let n: usize = out.iter().product();
    let contiguous = inputs.iter().all(|t| t.shape == out);
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
