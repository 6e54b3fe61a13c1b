//! Elementwise family: unary operators, binary operators with numpy broadcasting, and
//! `where`. One generated kernel per expression (`shaders/elementwise.wgsl`); the same
//! expressions are what fusion composes.
//!
//! Arithmetic is f32 with IEEE results on every device (`pow` is C's; the operators built
//! on a maximum or minimum give NaN for NaN, as PyTorch's do), except that add, sub, mul,
//! div, max, min, mod, abs, neg and sign also take i32 operands (both of one dtype) and
//! give i32, computed as integers (wrapping on overflow; division truncates toward zero; a
//! division or remainder by 0 gives 0, as ONNX leaves it undefined), and `where` picks
//! between values of any one dtype. Fusion composes f32 expressions only, so integer and
//! bool results run as kernels of their own.

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

const fn alpha(default: &'static str, doc: &'static str) -> AttrSpec {
    optional("alpha", AttrKind::Float, default, doc)
}

const LEAKY_RELU_ATTRS: &[AttrSpec] = &[alpha("0.01", "Slope for x < 0.")];
const ELU_ATTRS: &[AttrSpec] = &[alpha("1.0", "Scale of exp(x) − 1 for x < 0.")];
const SELU_ATTRS: &[AttrSpec] = &[
    alpha(
        SELU_ALPHA_TEXT,
        "Scale of exp(x) − 1 for x ≤ 0 (before gamma).",
    ),
    optional(
        "gamma",
        AttrKind::Float,
        SELU_GAMMA_TEXT,
        "Scale of the whole.",
    ),
];
const HARD_SIGMOID_ATTRS: &[AttrSpec] = &[
    alpha("0.2", "Slope."),
    optional("beta", AttrKind::Float, "0.5", "Offset."),
];
const SWISH_ATTRS: &[AttrSpec] = &[alpha("1.0", "Scale of x inside the sigmoid.")];
const MOD_ATTRS: &[AttrSpec] = &[optional(
    "fmod",
    AttrKind::Int,
    "0",
    "0: the remainder takes the divisor's sign (numpy's mod, Python's %); 1: the dividend's (C's fmod).",
)];

/// hard_swish's slope: 1/6 in f32 (ONNX's HardSwish is HardSigmoid with alpha 1/6, beta 1/2).
pub const HARD_SWISH_ALPHA: f32 = 1.0 / 6.0;

/// selu's default alpha (ONNX's).
pub const SELU_ALPHA: f32 = 1.673_263_2;
/// selu's default gamma (ONNX's).
pub const SELU_GAMMA: f32 = 1.050_701;
const SELU_ALPHA_TEXT: &str = "1.67326319217681884765625";
const SELU_GAMMA_TEXT: &str = "1.05070102214813232421875";

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
    binary("add", "a + b, broadcasting; f32 or i32 (wrapping)."),
    binary("sub", "a - b, broadcasting; f32 or i32 (wrapping)."),
    binary("mul", "a × b, broadcasting; f32 or i32 (wrapping)."),
    binary(
        "div",
        "a / b, broadcasting; f32, or i32 truncating toward zero (a divisor of 0 gives 0).",
    ),
    binary(
        "pow",
        "a raised to b, broadcasting (f32); C's pow special cases (pow(0, y < 0) = inf, pow(x, 0) = 1, a negative base needs an integer exponent).",
    ),
    binary(
        "max",
        "Elementwise maximum, broadcasting; f32 or i32; NaN if either operand is.",
    ),
    binary(
        "min",
        "Elementwise minimum, broadcasting; f32 or i32; NaN if either operand is.",
    ),
    OpSchema {
        attrs: MOD_ATTRS,
        ..binary(
            "mod",
            "Remainder of a / b, broadcasting: f32 or i32 (an i32 divisor of 0 gives 0).",
        )
    },
    OpSchema {
        inputs: Arity::Fixed(&["x", "slope"]),
        ..binary(
            "prelu",
            "x for x ≥ 0, slope × x below; slope broadcasts to x's shape (one way, as ONNX).",
        )
    },
    unary("relu", "max(x, 0); NaN stays NaN."),
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
        ..unary("clip", "Clamps x to [min, max]; NaN stays NaN.")
    },
    OpSchema {
        attrs: LEAKY_RELU_ATTRS,
        ..unary("leaky_relu", "x for x ≥ 0, alpha × x below.")
    },
    OpSchema {
        attrs: ELU_ATTRS,
        ..unary("elu", "x for x ≥ 0, alpha × (exp(x) − 1) below.")
    },
    OpSchema {
        attrs: SELU_ATTRS,
        ..unary(
            "selu",
            "gamma × x for x > 0, gamma × alpha × (exp(x) − 1) otherwise.",
        )
    },
    unary("softplus", "ln(1 + exp(x)), computed as max(x, 0) + ln(1 + exp(−|x|))."),
    unary("softsign", "x / (1 + |x|)."),
    OpSchema {
        attrs: HARD_SIGMOID_ATTRS,
        ..unary("hard_sigmoid", "max(0, min(1, alpha × x + beta)); NaN stays NaN.")
    },
    unary("hard_swish", "x × max(0, min(1, x / 6 + 1/2))."),
    unary("silu", "x × sigmoid(x) (swish with alpha 1)."),
    OpSchema {
        attrs: SWISH_ATTRS,
        ..unary("swish", "x × sigmoid(alpha × x).")
    },
    unary("mish", "x × tanh(softplus(x))."),
    unary("abs", "|x| (f32 or i32; i32's minimum stays itself)."),
    unary("neg", "−x (f32 or i32; i32's minimum stays itself)."),
    unary("reciprocal", "1 / x."),
    unary("sign", "−1, 0 or 1 by the sign of x (f32 or i32)."),
    unary("sin", "Sine."),
    unary("cos", "Cosine."),
    unary("floor", "Largest integer not above x."),
    unary("ceil", "Smallest integer not below x."),
    unary("round", "Nearest integer, halves to even (as ONNX)."),
    OpSchema {
        name: "where",
        family: FAMILY,
        doc: "Picks a where cond is true, else b; broadcasting all three; a and b of one dtype (f32, i32 or bool).",
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
    /// x for x ≥ 0, alpha·x below.
    LeakyRelu {
        /// Slope below 0.
        alpha: f32,
    },
    /// x for x ≥ 0, alpha·(eˣ − 1) below.
    Elu {
        /// Scale below 0.
        alpha: f32,
    },
    /// gamma·x for x > 0, gamma·alpha·(eˣ − 1) otherwise.
    Selu {
        /// Scale at or below 0.
        alpha: f32,
        /// Scale of the whole.
        gamma: f32,
    },
    /// ln(1 + eˣ)
    Softplus,
    /// x / (1 + |x|)
    Softsign,
    /// max(0, min(1, alpha·x + beta))
    HardSigmoid {
        /// Slope.
        alpha: f32,
        /// Offset.
        beta: f32,
    },
    /// x · max(0, min(1, x/6 + 1/2))
    HardSwish,
    /// x · sigmoid(x)
    Silu,
    /// x · sigmoid(alpha·x)
    Swish {
        /// Scale inside the sigmoid.
        alpha: f32,
    },
    /// x · tanh(softplus(x))
    Mish,
    /// |x|
    Abs,
    /// −x
    Neg,
    /// 1 / x
    Reciprocal,
    /// −1, 0 or 1
    Sign,
    /// sin x
    Sin,
    /// cos x
    Cos,
    /// ⌊x⌋
    Floor,
    /// ⌈x⌉
    Ceil,
    /// Nearest integer, halves to even.
    Round,
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
    /// Remainder: with the divisor's sign, or (`fmod`) the dividend's.
    Mod {
        /// C's fmod (the dividend's sign) rather than numpy's mod.
        fmod: bool,
    },
    /// x for x ≥ 0, slope·x below (the second operand broadcasts to the first).
    Prelu,
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
        "mod" => {
            let fmod = r.int("fmod");
            if !matches!(fmod, 0 | 1) {
                r.reject("fmod", format!("fmod must be 0 or 1, got {fmod}"));
            }
            B(Binary::Mod { fmod: fmod == 1 })
        }
        "prelu" => B(Binary::Prelu),
        "where" => ElementwiseOp::Where,
        _ => return read_unary(name, r).map(U),
    })
}

/// A unary operator by name with its attributes (`approximate`, `min`, `max`, `alpha`,
/// `beta`, `gamma`; an absent one takes the forward operator's default): shared by the
/// forward operators and `unary_grad`. `None` for a name that is no unary operator.
pub(crate) fn read_unary(name: &str, r: &mut AttrReader) -> Option<Unary> {
    fn float(r: &mut AttrReader, attr: &str, default: f32) -> f32 {
        r.opt_float(attr).unwrap_or(default)
    }
    Some(match name {
        "relu" => Unary::Relu,
        "sigmoid" => Unary::Sigmoid,
        "tanh" => Unary::Tanh,
        "gelu" => Unary::Gelu {
            tanh: r.choice("approximate") == "tanh",
        },
        "exp" => Unary::Exp,
        "log" => Unary::Log,
        "sqrt" => Unary::Sqrt,
        "erf" => Unary::Erf,
        "clip" => Unary::Clip {
            min: r.opt_float("min"),
            max: r.opt_float("max"),
        },
        "leaky_relu" => Unary::LeakyRelu {
            alpha: float(r, "alpha", 0.01),
        },
        "elu" => Unary::Elu {
            alpha: float(r, "alpha", 1.0),
        },
        "selu" => Unary::Selu {
            alpha: float(r, "alpha", SELU_ALPHA),
            gamma: float(r, "gamma", SELU_GAMMA),
        },
        "softplus" => Unary::Softplus,
        "softsign" => Unary::Softsign,
        "hard_sigmoid" => Unary::HardSigmoid {
            alpha: float(r, "alpha", 0.2),
            beta: float(r, "beta", 0.5),
        },
        "hard_swish" => Unary::HardSwish,
        "silu" => Unary::Silu,
        "swish" => Unary::Swish {
            alpha: float(r, "alpha", 1.0),
        },
        "mish" => Unary::Mish,
        "abs" => Unary::Abs,
        "neg" => Unary::Neg,
        "reciprocal" => Unary::Reciprocal,
        "sign" => Unary::Sign,
        "sin" => Unary::Sin,
        "cos" => Unary::Cos,
        "floor" => Unary::Floor,
        "ceil" => Unary::Ceil,
        "round" => Unary::Round,
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
            Unary::LeakyRelu { .. } => "leaky_relu",
            Unary::Elu { .. } => "elu",
            Unary::Selu { .. } => "selu",
            Unary::Softplus => "softplus",
            Unary::Softsign => "softsign",
            Unary::HardSigmoid { .. } => "hard_sigmoid",
            Unary::HardSwish => "hard_swish",
            Unary::Silu => "silu",
            Unary::Swish { .. } => "swish",
            Unary::Mish => "mish",
            Unary::Abs => "abs",
            Unary::Neg => "neg",
            Unary::Reciprocal => "reciprocal",
            Unary::Sign => "sign",
            Unary::Sin => "sin",
            Unary::Cos => "cos",
            Unary::Floor => "floor",
            Unary::Ceil => "ceil",
            Unary::Round => "round",
        }
    }

    /// The attributes of the `unary_grad` node differentiating this operator.
    pub fn grad_attrs(self) -> serde_json::Value {
        match self {
            Unary::Gelu { tanh } => {
                json!({ "op": "gelu", "approximate": if tanh { "tanh" } else { "none" } })
            }
            Unary::Clip { min, max } => json!({ "op": "clip", "min": min, "max": max }),
            Unary::LeakyRelu { alpha } | Unary::Elu { alpha } | Unary::Swish { alpha } => {
                json!({ "op": self.name(), "alpha": alpha })
            }
            Unary::Selu { alpha, gamma } => json!({ "op": "selu", "alpha": alpha, "gamma": gamma }),
            Unary::HardSigmoid { alpha, beta } => {
                json!({ "op": "hard_sigmoid", "alpha": alpha, "beta": beta })
            }
            other => json!({ "op": other.name() }),
        }
    }

    /// Piecewise constant (floor, ceil, round, sign): the gradient is zero.
    pub fn is_step(self) -> bool {
        matches!(
            self,
            Unary::Floor | Unary::Ceil | Unary::Round | Unary::Sign
        )
    }

    /// Also defined on i32 (abs, neg, sign: the result stays i32).
    pub fn takes_i32(self) -> bool {
        matches!(self, Unary::Abs | Unary::Neg | Unary::Sign)
    }

    /// Checks what parsing guarantees, for operators that arrive already parsed: clip's
    /// bounds are numbers and every other attribute is finite.
    pub fn validate(self) -> Result<(), String> {
        let finite: &[(&str, f32)] = match &self {
            Unary::Clip { min, max } => {
                if min.is_some_and(f32::is_nan) || max.is_some_and(f32::is_nan) {
                    return Err(format!(
                        "clip: bounds must be numbers, got min {min:?}, max {max:?}"
                    ));
                }
                &[]
            }
            Unary::LeakyRelu { alpha } | Unary::Elu { alpha } | Unary::Swish { alpha } => {
                &[("alpha", *alpha)]
            }
            Unary::Selu { alpha, gamma } => &[("alpha", *alpha), ("gamma", *gamma)],
            Unary::HardSigmoid { alpha, beta } => &[("alpha", *alpha), ("beta", *beta)],
            _ => &[],
        };
        match finite.iter().find(|(_, v)| !v.is_finite()) {
            Some((attr, v)) => Err(format!("{}: {attr} must be finite, got {v}", self.name())),
            None => Ok(()),
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
            Binary::Mod { .. } => "mod",
            Binary::Prelu => "prelu",
        }
    }

    /// Also defined on two i32 operands (the result is i32).
    pub fn takes_i32(self) -> bool {
        !matches!(self, Binary::Pow | Binary::Prelu)
    }
}

impl ElementwiseOp {
    /// Every elementwise operator is pointwise; unary and binary ones can also run in a
    /// matmul or convolution epilogue. (Fusion composes f32 expressions: it also asks
    /// that the output be f32, so integer and bool work stays a kernel of its own.)
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

    /// Checks what parsing guarantees (see [`Unary::validate`]).
    pub fn validate(&self) -> Result<(), String> {
        match self {
            ElementwiseOp::Unary(u) => u.validate(),
            _ => Ok(()),
        }
    }

    /// Output types: the broadcast of the inputs, of their dtype. f32 throughout, except:
    /// abs, neg, sign and the binary operators but pow and prelu also take i32 (both
    /// operands of one dtype), and `where` picks between values of any one dtype; prelu's
    /// slope must broadcast to x's shape.
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let name = self.name();
        let dtype = match self {
            ElementwiseOp::Where => {
                if inputs[0].dtype != DType::Bool {
                    return Err(format!("'where' needs a bool cond, got {}", inputs[0]));
                }
                let (a, b) = (&inputs[1], &inputs[2]);
                if a.dtype != b.dtype {
                    return Err(format!(
                        "'where' picks between values of one dtype, got {a} and {b}"
                    ));
                }
                a.dtype
            }
            ElementwiseOp::Unary(u) => {
                let x = &inputs[0];
                if !(x.dtype == DType::F32 || u.takes_i32() && x.dtype == DType::I32) {
                    let want = if u.takes_i32() { "f32 or i32" } else { "f32" };
                    return Err(format!("'{name}' needs an {want} input, got {x}"));
                }
                x.dtype
            }
            ElementwiseOp::Binary(op) => {
                let (a, b) = (&inputs[0], &inputs[1]);
                if !op.takes_i32() {
                    need_f32(name, "input 0", a)?;
                    need_f32(name, "input 1", b)?;
                } else if a.dtype != b.dtype || a.dtype == DType::Bool {
                    return Err(format!(
                        "'{name}' needs two f32 or two i32 operands, got {a} and {b}"
                    ));
                }
                a.dtype
            }
        };
        let mut shape = inputs[0].shape.clone();
        for t in &inputs[1..] {
            shape = broadcast(&shape, &t.shape).map_err(|_| {
                let shapes: Vec<String> = inputs.iter().map(|t| show(&t.shape)).collect();
                format!("input shapes {} do not broadcast", shapes.join(" and "))
            })?;
        }
        if matches!(self, ElementwiseOp::Binary(Binary::Prelu)) && shape != inputs[0].shape {
            return Err(format!(
                "'prelu': slope {} does not broadcast to x's shape {}",
                show(&inputs[1].shape),
                show(&inputs[0].shape)
            ));
        }
        Ok(vec![TensorType { shape, dtype }])
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

    /// Gradient rule. Unary: `unary_grad`, or zeros for the step functions (floor, ceil,
    /// round, sign). add/sub/mul/div/pow/mod by their partial derivatives (mod's is 1 for
    /// a and −k for b, where y = a − k·b, k = (a − y)/b); prelu passes dy where x ≥ 0 and
    /// slope·dy below, and gives the slope Σ dy·min(x, 0); max/min pass dy to the larger
    /// (smaller) operand, to b on ties; where passes dy to the picked side. Broadcasting
    /// is undone (summed) per input.
    pub(crate) fn grad(&self, g: &mut dyn GradContext) -> Result<(), String> {
        let dy = g.dy()?;
        match self {
            ElementwiseOp::Unary(u) if u.is_step() => {
                if g.needs(0) {
                    let x = g.input(0)?;
                    let xs = g.shape(&x)?;
                    let dx = g.zeros(&xs)?;
                    g.input_grad(0, dx)?;
                }
                Ok(())
            }
            ElementwiseOp::Binary(Binary::Prelu) => {
                let (x, slope) = (g.input(0)?, g.input(1)?);
                let zero = g.scalar(0.0)?;
                if g.needs(0) {
                    let below = g.emit("less", json!({}), &[&x, &zero])?;
                    let scaled = g.binary("mul", &dy, &slope)?;
                    let dx = g.emit("where", json!({}), &[&below, &scaled, &dy])?;
                    g.input_grad_unbroadcast(0, &dx)?;
                }
                if g.needs(1) {
                    let neg = g.binary("min", &x, &zero)?;
                    let ds = g.binary("mul", &dy, &neg)?;
                    g.input_grad_unbroadcast(1, &ds)?;
                }
                Ok(())
            }
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
                    Binary::Mod { .. } => {
                        let db = if g.needs(1) {
                            let y = g.output(0)?;
                            let k = g.binary("sub", &y, &a)?;
                            let k = g.binary("div", &k, &b)?;
                            Some(g.binary("mul", &dy, &k)?)
                        } else {
                            None
                        };
                        (Some(dy.clone()), db)
                    }
                    Binary::Prelu => (None, None),
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
    use crate::ops::testing::{couples, rule, tensor};
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

    fn infer(op: &str, attrs: serde_json::Value, inputs: &[&str]) -> Result<String, String> {
        let op = crate::ops::parse(op, attrs.as_object().unwrap()).map_err(|e| format!("{e:?}"))?;
        let types: Vec<_> = inputs.iter().map(|t| tensor(t)).collect();
        op.infer(&types).map(|t| t[0].to_string())
    }

    #[test]
    fn integer_operands_keep_their_dtype_and_mixed_ones_are_refused() {
        assert_eq!(
            infer("add", json!({}), &["i32:N,3", "i32:3"]).unwrap(),
            "i32 [N, 3]"
        );
        assert_eq!(
            infer("mod", json!({}), &["i32:2", "i32:"]).unwrap(),
            "i32 [2]"
        );
        assert_eq!(infer("abs", json!({}), &["i32:4"]).unwrap(), "i32 [4]");
        let e = infer("div", json!({}), &["2", "i32:2"]).unwrap_err();
        assert!(
            e.contains("needs two f32 or two i32 operands, got f32 [2] and i32 [2]"),
            "{e}"
        );
        assert!(infer("add", json!({}), &["bool:2", "bool:2"]).is_err());
        let e = infer("pow", json!({}), &["i32:2", "i32:2"]).unwrap_err();
        assert!(e.contains("'pow' needs an f32 input 0"), "{e}");
        let e = infer("sin", json!({}), &["i32:2"]).unwrap_err();
        assert!(e.contains("'sin' needs an f32 input, got i32 [2]"), "{e}");
        let e = infer("abs", json!({}), &["bool:2"]).unwrap_err();
        assert!(e.contains("f32 or i32"), "{e}");
    }

    #[test]
    fn where_takes_values_of_one_dtype() {
        let w = |a: &str, b: &str| infer("where", json!({}), &["bool:N,1", a, b]);
        assert_eq!(w("i32:3", "i32:").unwrap(), "i32 [N, 3]");
        assert_eq!(w("bool:3", "bool:3").unwrap(), "bool [N, 3]");
        assert_eq!(w("3", "3").unwrap(), "f32 [N, 3]");
        let e = w("i32:3", "3").unwrap_err();
        assert!(e.contains("values of one dtype"), "{e}");
    }

    #[test]
    fn prelu_slope_broadcasts_one_way_and_attributes_are_checked() {
        assert_eq!(
            infer("prelu", json!({}), &["N,4,5", "5"]).unwrap(),
            "f32 [N, 4, 5]"
        );
        assert_eq!(
            infer("prelu", json!({}), &["N,4,5", "4,1"]).unwrap(),
            "f32 [N, 4, 5]"
        );
        let e = infer("prelu", json!({}), &["4,1", "4,5"]).unwrap_err();
        assert!(
            e.contains("slope [4, 5] does not broadcast to x's shape [4, 1]"),
            "{e}"
        );
        for (op, attrs) in [
            ("mod", json!({ "fmod": 2 })),
            ("leaky_relu", json!({ "alpha": "x" })),
            ("selu", json!({ "gamma": 1e39 })),
            ("hard_sigmoid", json!({ "beta": [1] })),
        ] {
            let e = crate::ops::parse(op, attrs.as_object().unwrap()).unwrap_err();
            let attr = attrs.as_object().unwrap().keys().next().unwrap().clone();
            assert!(format!("{e:?}").contains(&attr), "{op}: {e:?}");
        }
        // Parsed elsewhere (a plan): non-finite attributes are refused by name.
        let op = crate::ops::Op::Elementwise(super::ElementwiseOp::Unary(super::Unary::Elu {
            alpha: f32::INFINITY,
        }));
        let e = op.validate(16).unwrap_err();
        assert!(e.contains("elu: alpha must be finite"), "{e}");
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
