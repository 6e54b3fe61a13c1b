//! Elementwise family: unary operators, binary operators with numpy broadcasting, and
//! `where`. One generated kernel per expression (`shaders/elementwise.wgsl`); the same
//! expressions are what fusion composes.

use super::attrs::{optional, AttrKind, AttrReader, AttrSpec};
use super::kernel::{
    dispatch_1d, f32_literal, fill, per_element_main, variant, word, Bindings, Concrete, Kernel,
    LowerCtx, Lowering, Slot, Storage, WG,
};
use super::{broadcast_batch, need_f32, Arity, OpSchema, TensorType};
use crate::dtype::DType;
use crate::shape::{broadcast, broadcast_strides, show};

/// Family tag.
pub const FAMILY: &str = "elementwise";
const SHADER: &str = include_str!("../../../shaders/elementwise.wgsl");

const GELU_ATTRS: &[AttrSpec] = &[optional(
    "approximate",
    AttrKind::Choice(&["none", "tanh"]),
    "\"none\"",
    "\"none\": exact (erf) form; \"tanh\": the tanh approximation.",
)];
const CLIP_ATTRS: &[AttrSpec] = &[
    optional(
        "min",
        AttrKind::Float,
        "null",
        "Lower bound (none when absent).",
    ),
    optional(
        "max",
        AttrKind::Float,
        "null",
        "Upper bound (none when absent).",
    ),
];

const fn unary(name: &'static str, doc: &'static str) -> OpSchema {
    OpSchema {
        name,
        family: FAMILY,
        doc,
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: &[],
        params: &[],
    }
}

const fn binary(name: &'static str, doc: &'static str) -> OpSchema {
    OpSchema {
        name,
        family: FAMILY,
        doc,
        inputs: Arity::Fixed(&["a", "b"]),
        outputs: &["y"],
        attrs: &[],
        params: &[],
    }
}

/// Schemas of the family.
pub const SCHEMAS: &[OpSchema] = &[
    binary("add", "a + b, broadcasting."),
    binary("sub", "a - b, broadcasting."),
    binary("mul", "a × b, broadcasting."),
    binary("div", "a / b, broadcasting."),
    binary("pow", "a raised to b, broadcasting."),
    binary("max", "Elementwise maximum, broadcasting."),
    binary("min", "Elementwise minimum, broadcasting."),
    unary("relu", "max(x, 0)."),
    unary("sigmoid", "1 / (1 + exp(-x))."),
    unary("tanh", "Hyperbolic tangent."),
    OpSchema {
        attrs: GELU_ATTRS,
        ..unary("gelu", "Gaussian error linear unit.")
    },
    unary("exp", "e^x."),
    unary("log", "Natural logarithm."),
    unary("sqrt", "Square root."),
    unary("erf", "Gauss error function."),
    OpSchema {
        attrs: CLIP_ATTRS,
        ..unary("clip", "Clamps x to [min, max].")
    },
    OpSchema {
        name: "where",
        family: FAMILY,
        doc: "Picks a where cond is true, else b; broadcasting all three.",
        inputs: Arity::Fixed(&["cond", "a", "b"]),
        outputs: &["y"],
        attrs: &[],
        params: &[],
    },
];

/// A parsed elementwise operator.
#[derive(Debug, Clone, PartialEq)]
pub enum ElementwiseOp {
    /// One input.
    Unary(Unary),
    /// Two broadcast inputs.
    Binary(Binary),
    /// `where(cond, a, b)`.
    Where,
}

/// Unary operators.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unary {
    /// max(x, 0)
    Relu,
    /// logistic
    Sigmoid,
    /// tanh
    Tanh,
    /// GELU, exact or tanh approximation.
    Gelu {
        /// Use the tanh approximation.
        tanh: bool,
    },
    /// e^x
    Exp,
    /// ln x
    Log,
    /// √x
    Sqrt,
    /// erf x
    Erf,
    /// clamp
    Clip {
        /// Lower bound.
        min: Option<f32>,
        /// Upper bound.
        max: Option<f32>,
    },
}

/// Binary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a × b
    Mul,
    /// a / b
    Div,
    /// a ^ b
    Pow,
    /// max
    Max,
    /// min
    Min,
}

/// Parses attributes.
pub fn parse(name: &str, r: &mut AttrReader) -> ElementwiseOp {
    use ElementwiseOp::{Binary as B, Unary as U};
    match name {
        "add" => B(Binary::Add),
        "sub" => B(Binary::Sub),
        "mul" => B(Binary::Mul),
        "div" => B(Binary::Div),
        "pow" => B(Binary::Pow),
        "max" => B(Binary::Max),
        "min" => B(Binary::Min),
        "relu" => U(Unary::Relu),
        "sigmoid" => U(Unary::Sigmoid),
        "tanh" => U(Unary::Tanh),
        "gelu" => U(Unary::Gelu {
            tanh: r.choice("approximate") == "tanh",
        }),
        "exp" => U(Unary::Exp),
        "log" => U(Unary::Log),
        "sqrt" => U(Unary::Sqrt),
        "erf" => U(Unary::Erf),
        "clip" => U(Unary::Clip {
            min: r.opt_float("min"),
            max: r.opt_float("max"),
        }),
        _ => ElementwiseOp::Where,
    }
}

impl Unary {
    /// The operator's name.
    pub fn name(self) -> &'static str {
        match self {
            Unary::Relu => "relu",
            Unary::Sigmoid => "sigmoid",
            Unary::Tanh => "tanh",
            Unary::Gelu { .. } => "gelu",
            Unary::Exp => "exp",
            Unary::Log => "log",
            Unary::Sqrt => "sqrt",
            Unary::Erf => "erf",
            Unary::Clip { .. } => "clip",
        }
    }

    /// The WGSL expression applied to `x` (an f32 expression).
    pub fn wgsl(self, x: &str) -> String {
        match self {
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
}

impl Binary {
    /// The operator's name.
    pub fn name(self) -> &'static str {
        match self {
            Binary::Add => "add",
            Binary::Sub => "sub",
            Binary::Mul => "mul",
            Binary::Div => "div",
            Binary::Pow => "pow",
            Binary::Max => "max",
            Binary::Min => "min",
        }
    }

    /// The WGSL expression combining `a` and `b`.
    pub fn wgsl(self, a: &str, b: &str) -> String {
        match self {
            Binary::Add => format!("({a} + {b})"),
            Binary::Sub => format!("({a} - {b})"),
            Binary::Mul => format!("({a} * {b})"),
            Binary::Div => format!("({a} / {b})"),
            Binary::Pow => format!("sl_pow({a}, {b})"),
            Binary::Max => format!("max({a}, {b})"),
            Binary::Min => format!("min({a}, {b})"),
        }
    }
}

impl ElementwiseOp {
    /// Name in graph files.
    pub fn name(&self) -> &'static str {
        match self {
            ElementwiseOp::Unary(u) => u.name(),
            ElementwiseOp::Binary(b) => b.name(),
            ElementwiseOp::Where => "where",
        }
    }

    /// Output types: the broadcast of the inputs.
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let name = self.name();
        let values = match self {
            ElementwiseOp::Where => {
                if inputs[0].dtype != DType::Bool {
                    return Err(format!("'where' needs a bool cond, got {}", inputs[0]));
                }
                &inputs[1..]
            }
            _ => inputs,
        };
        for (i, t) in values.iter().enumerate() {
            need_f32(name, &format!("input {i}"), t)?;
        }
        let mut shape = inputs[0].shape.clone();
        for t in &inputs[1..] {
            shape = broadcast(&shape, &t.shape).map_err(|_| {
                let shapes: Vec<String> = inputs.iter().map(|t| show(&t.shape)).collect();
                format!("input shapes {} do not broadcast", shapes.join(" and "))
            })?;
        }
        Ok(vec![TensorType::f32(shape)])
    }

    /// Batch rule: every batched input's axis lands on one output axis under numpy
    /// broadcasting (input axis a of rank r is output axis a + R − r); batches landing on
    /// different axes couple ([N, 1] + [1, N] pairs every sample with every other).
    pub fn batch(
        &self,
        inputs: &[TensorType],
        batch: &[Option<usize>],
        outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        let rank = outputs[0].shape.len();
        Ok(vec![broadcast_batch(self.name(), inputs, batch, rank)?])
    }

    /// The expression over inputs `args` (each an f32 expression; for `where`, args[0] is bool).
    pub fn wgsl(&self, args: &[String]) -> String {
        match self {
            ElementwiseOp::Unary(u) => u.wgsl(&args[0]),
            ElementwiseOp::Binary(b) => b.wgsl(&args[0], &args[1]),
            ElementwiseOp::Where => format!("select({}, {}, {})", args[2], args[1], args[0]),
        }
    }

    /// GPU kernel.
    pub fn lower(&self, ctx: &LowerCtx) -> Result<Lowering, String> {
        let (inputs, outputs) = (ctx.inputs, ctx.outputs);
        let args: Vec<String> = (0..inputs.len()).map(|i| format!("x{i}")).collect();
        let kernel = elementwise_kernel(
            self.name(),
            "",
            &self.wgsl(&args),
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
            for s in broadcast_strides(&t.shape, out) {
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

#[cfg(test)]
mod tests {
    use crate::ops::testing::{couples, rule};
    use serde_json::json;

    #[test]
    fn broadcasting_aligns_batch_axes_from_the_right() {
        let add = |a, b| rule("add", json!({}), &[a, b]);
        assert_eq!(add(("N,4", Some(0)), ("4", None)), Ok(vec![Some(0)]));
        assert_eq!(add(("4", None), ("N,4", Some(0))), Ok(vec![Some(0)]));
        assert_eq!(add(("N,4", Some(0)), ("N,4", Some(0))), Ok(vec![Some(0)]));
        assert_eq!(add(("N,4", Some(0)), ("3,1,4", None)), Ok(vec![Some(1)]));
        assert_eq!(add(("N,1", Some(0)), ("3,N,4", Some(1))), Ok(vec![Some(1)]));
        assert_eq!(
            rule("relu", json!({}), &[("4,N", Some(1))]),
            Ok(vec![Some(1)])
        );
        let w = rule(
            "where",
            json!({}),
            &[("bool:N,1", Some(0)), ("N,4", Some(0)), ("4", None)],
        );
        assert_eq!(w, Ok(vec![Some(0)]));
    }

    #[test]
    fn batches_broadcast_onto_different_axes_couple() {
        couples(
            rule("add", json!({}), &[("N,1", Some(0)), ("1,N", Some(1))]),
            &["add", "axis 0", "axis 1"],
        );
        couples(
            rule("mul", json!({}), &[("N,1", Some(0)), ("N", Some(0))]),
            &["mul"],
        );
    }
}
