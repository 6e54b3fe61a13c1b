//! Elementwise family: unary operators, binary operators with numpy broadcasting, and
//! `where`. One generated kernel per expression (`shaders/elementwise.wgsl`); the same
//! expressions are what fusion composes.

use super::attrs::{optional, AttrKind, AttrReader, AttrSpec};
use super::backward::GradContext;
use super::{broadcast_batch, need_f32, Arity, Capabilities, OpSchema, TensorType};
use crate::dtype::DType;
use crate::shape::{broadcast, show};
use serde_json::json;

/// Family tag.
pub const FAMILY: &str = "elementwise";

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
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum ElementwiseOp {
    /// One input.
    Unary(Unary),
    /// Two broadcast inputs.
    Binary(Binary),
    /// `where(cond, a, b)`.
    Where,
}

/// Unary operators.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
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
    /// clamp: `min(max(x, min), max)`, as ONNX's Clip (with `min` above `max`, every
    /// element is `max`); never Rust's `clamp`, which panics there.
    Clip {
        /// Lower bound.
        min: Option<f32>,
        /// Upper bound.
        max: Option<f32>,
    },
}

/// Binary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

/// Parses attributes; `None` for a name outside the family.
pub fn parse(name: &str, r: &mut AttrReader) -> Option<ElementwiseOp> {
    use ElementwiseOp::{Binary as B, Unary as U};
    Some(match name {
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
        "where" => ElementwiseOp::Where,
        _ => return None,
    })
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

    /// The attributes of the `unary_grad` node differentiating this operator.
    pub fn grad_attrs(self) -> serde_json::Value {
        match self {
            Unary::Gelu { tanh } => {
                json!({ "op": "gelu", "approximate": if tanh { "tanh" } else { "none" } })
            }
            Unary::Clip { min, max } => json!({ "op": "clip", "min": min, "max": max }),
            other => json!({ "op": other.name() }),
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
}

impl ElementwiseOp {
    /// Every elementwise operator is pointwise; unary and binary ones can also run in a
    /// matmul or convolution epilogue.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            pointwise: true,
            epilogue_member: !matches!(self, ElementwiseOp::Where),
            ..Capabilities::default()
        }
    }

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

    /// Gradient rule. Unary: `unary_grad`. add/sub/mul/div/pow by their partial
    /// derivatives; max/min pass dy to the larger (smaller) operand, to b on ties; where
    /// passes dy to the picked side. Broadcasting is undone (summed) per input.
    pub(crate) fn grad(&self, g: &mut dyn GradContext) -> Result<(), String> {
        let dy = g.dy()?;
        match self {
            ElementwiseOp::Unary(u) => {
                if g.needs(0) {
                    let x = g.input(0)?;
                    let dx = g.emit("unary_grad", u.grad_attrs(), &[&x, &dy])?;
                    g.input_grad_unbroadcast(0, &dx)?;
                }
                Ok(())
            }
            ElementwiseOp::Binary(op) => {
                let (a, b) = (g.input(0)?, g.input(1)?);
                let (da, db) = match op {
                    Binary::Add => (Some(dy.clone()), Some(dy.clone())),
                    Binary::Sub => {
                        let db = if g.needs(1) {
                            Some(g.scale(&dy, -1.0)?)
                        } else {
                            None
                        };
                        (Some(dy.clone()), db)
                    }
                    Binary::Mul => {
                        let da = if g.needs(0) {
                            Some(g.binary("mul", &dy, &b)?)
                        } else {
                            None
                        };
                        let db = if g.needs(1) {
                            Some(g.binary("mul", &dy, &a)?)
                        } else {
                            None
                        };
                        (da, db)
                    }
                    Binary::Div => {
                        let da = if g.needs(0) {
                            Some(g.binary("div", &dy, &b)?)
                        } else {
                            None
                        };
                        let db = if g.needs(1) {
                            // d(a/b)/db = -(a/b)/b
                            let y = g.output(0)?;
                            let t = g.binary("mul", &dy, &y)?;
                            let t = g.binary("div", &t, &b)?;
                            Some(g.scale(&t, -1.0)?)
                        } else {
                            None
                        };
                        (da, db)
                    }
                    Binary::Pow => {
                        let da = if g.needs(0) {
                            // b · a^(b-1)
                            let one = g.scalar(1.0)?;
                            let e = g.binary("sub", &b, &one)?;
                            let p = g.binary("pow", &a, &e)?;
                            let p = g.binary("mul", &p, &b)?;
                            Some(g.binary("mul", &dy, &p)?)
                        } else {
                            None
                        };
                        let db = if g.needs(1) {
                            // a^b · ln a
                            let y = g.output(0)?;
                            let l = g.emit("log", json!({}), &[&a])?;
                            let t = g.binary("mul", &y, &l)?;
                            Some(g.binary("mul", &dy, &t)?)
                        } else {
                            None
                        };
                        (da, db)
                    }
                    Binary::Max | Binary::Min => {
                        // dy where a wins (a - b > 0 for max, b - a > 0 for min), else 0.
                        let d = if *op == Binary::Max {
                            g.binary("sub", &a, &b)?
                        } else {
                            g.binary("sub", &b, &a)?
                        };
                        let attrs = Unary::Relu.grad_attrs();
                        let da = g.emit("unary_grad", attrs, &[&d, &dy])?;
                        let db = if g.needs(1) {
                            Some(g.binary("sub", &dy, &da)?)
                        } else {
                            None
                        };
                        (Some(da), db)
                    }
                };
                for (k, d) in [(0, da), (1, db)] {
                    if let Some(d) = d {
                        g.input_grad_unbroadcast(k, &d)?;
                    }
                }
                Ok(())
            }
            ElementwiseOp::Where => {
                let cond = g.input(0)?;
                let zero = g.scalar(0.0)?;
                if g.needs(1) {
                    let da = g.emit("where", json!({}), &[&cond, &dy, &zero])?;
                    g.input_grad_unbroadcast(1, &da)?;
                }
                if g.needs(2) {
                    let db = g.emit("where", json!({}), &[&cond, &zero, &dy])?;
                    g.input_grad_unbroadcast(2, &db)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testing::{couples, rule};
    use serde_json::json;

    #[test]
    fn clip_takes_min_above_max_as_onnx_does_and_refuses_nan_bounds() {
        // ONNX's test_clip_min_greater_than_max: every element becomes max (the CPU
        // reference and the WGSL both take max, then min; the conformance test checks).
        let attrs = json!({ "min": 2.0, "max": 1.0 });
        let op = crate::ops::parse("clip", attrs.as_object().unwrap()).expect("parses");
        assert!(op.validate(16).is_ok());
        // A clip that arrives parsed (in a plan) is validated too.
        let op = crate::ops::Op::Elementwise(super::ElementwiseOp::Unary(super::Unary::Clip {
            min: Some(f32::NAN),
            max: Some(0.0),
        }));
        assert!(op.validate(16).is_err());
    }

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
