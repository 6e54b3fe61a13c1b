//! Convert family: operators whose output dtype differs from their inputs' or is bool.
//! Comparisons (`equal`, `less`, `greater`, `less_or_equal`, `greater_or_equal`: f32 or
//! i32 operands of one dtype, numpy broadcasting, bool output), logic on bools (`not`, and
//! `and`, `or`, `xor` with numpy broadcasting), `cast` between f32, i32 and bool (and to
//! the 16-bit floats `f16` and `bf16`, whose values stay f32), and `one_hot` (i32 indices
//! → f32 rows).
//! Kernels: `shaders/convert.wgsl`.
//!
//! They are not fused with pointwise neighbours: fused units compose f32 expressions, and
//! these operators exist to leave f32. Integers are compared and copied as integers (never
//! through f32, which would round those beyond 2^24).
//!
//! Conversions: f32 → i32 truncates toward zero and saturates at i32's range, NaN giving 0
//! (Rust's `as`); i32 → f32 rounds to nearest; bool → number is 1 or 0; number → bool is
//! `x != 0` (so NaN is true, as in PyTorch); f32, i32 or bool → `f16` or `bf16` rounds
//! the value to that format, to nearest with ties to even, overflowing to ±∞, NaN staying
//! NaN (ONNX's and PyTorch's rounding), and keeps it as an f32 (every later operator
//! computes in f32). Comparisons follow IEEE: NaN is neither equal to, less than nor
//! greater than anything.
//!
//! `dropout_train` is dropout in training (the graph file's `dropout` is the identity;
//! the trainer puts this in its place in the joint graph): it keeps an element with
//! probability 1 − ratio, scaled by 1/(1 − ratio), else zeroes it. Whether element i is
//! kept is a hash of (seed, stream, i) — [`dropout_keeps`], mirrored bit for bit by the
//! WGSL kernel — so every device draws the same mask, and the backward pass redraws it.

use super::attrs::{optional, required, AttrKind, AttrReader, AttrSpec};
use super::backward::GradContext;
use super::{broadcast_batch, Arity, Capabilities, OpSchema, TensorType};
use crate::dtype::DType;
use crate::shape::{broadcast, show, Dim};

/// Family tag.
pub const FAMILY: &str = "convert";

const CAST_ATTRS: &[AttrSpec] = &[required(
    "to",
    AttrKind::Choice(&["f32", "i32", "bool", "f16", "bf16"]),
    "Target dtype: f32 → i32 truncates toward zero, saturating, NaN → 0; bool → number is 1/0; number → bool is x != 0; f16 and bf16 round to that 16-bit float (nearest, ties to even, overflow to ±inf) and keep the value as f32.",
)];

const ONE_HOT_ATTRS: &[AttrSpec] = &[required(
    "depth",
    AttrKind::Int,
    "Number of classes (at least 1): the length of the added last axis.",
)];

const DROPOUT_ATTRS: &[AttrSpec] = &[
    required("ratio", AttrKind::Float, "Drop probability, in [0, 1)."),
    optional(
        "seed",
        AttrKind::Int,
        "0",
        "Seed of the mask (with the stream input and the element's index).",
    ),
];

const fn comparison(name: &'static str, doc: &'static str) -> OpSchema {
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
    comparison(
        "equal",
        "a == b as bool, broadcasting; a and b both f32 or both i32 (NaN equals nothing).",
    ),
    comparison(
        "less",
        "a < b as bool, broadcasting; a and b both f32 or both i32.",
    ),
    comparison(
        "greater",
        "a > b as bool, broadcasting; a and b both f32 or both i32.",
    ),
    comparison(
        "less_or_equal",
        "a <= b as bool, broadcasting; a and b both f32 or both i32.",
    ),
    comparison(
        "greater_or_equal",
        "a >= b as bool, broadcasting; a and b both f32 or both i32.",
    ),
    OpSchema {
        inputs: Arity::Fixed(&["x"]),
        ..comparison("not", "Logical not of a bool tensor.")
    },
    comparison("and", "Logical and of two bool tensors, broadcasting."),
    comparison("or", "Logical or of two bool tensors, broadcasting."),
    comparison("xor", "Logical exclusive or of two bool tensors, broadcasting."),
    OpSchema {
        name: "cast",
        family: FAMILY,
        doc: "Converts x to another dtype (f32, i32 or bool).",
        inputs: Arity::Fixed(&["x"]),
        outputs: &["y"],
        attrs: CAST_ATTRS,
        params: &[],
    },
    OpSchema {
        name: "one_hot",
        family: FAMILY,
        doc: "f32 one-hot rows of i32 indices: shape indices.shape + [depth]; an index outside [0, depth) gives a row of zeros.",
        inputs: Arity::Fixed(&["indices"]),
        outputs: &["y"],
        attrs: ONE_HOT_ATTRS,
        params: &[],
    },
    OpSchema {
        name: "dropout_train",
        family: FAMILY,
        doc: "Dropout in training: x·1/(1−ratio) where a hash of (seed, stream, element index) keeps it (probability 1−ratio), else 0; stream is an i32 scalar (the trainer's micro-batch counter).",
        inputs: Arity::Fixed(&["x", "stream"]),
        outputs: &["y"],
        attrs: DROPOUT_ATTRS,
        params: &[],
    },
];

/// PCG's output permutation of a 32-bit state (Jarzynski and Olano, "Hash Functions for
/// GPU Rendering", 2020): the hash of dropout masks, the same in `shaders/convert.wgsl`.
pub fn pcg_hash(x: u32) -> u32 {
    let state = x.wrapping_mul(747_796_405).wrapping_add(2_891_336_453);
    let word = ((state >> ((state >> 28) + 4)) ^ state).wrapping_mul(277_803_737);
    (word >> 22) ^ word
}

/// Whether dropout keeps element `i` of stream `stream`: the hash's top 24 bits at or
/// above [`dropout_threshold`].
pub fn dropout_keeps(seed: u32, stream: i32, i: u32, threshold: u32) -> bool {
    let h = pcg_hash(pcg_hash(pcg_hash(seed) ^ stream as u32) ^ i);
    (h >> 8) >= threshold
}

/// The 24-bit threshold below which an element is dropped: ratio · 2^24, rounded up.
pub fn dropout_threshold(ratio: f32) -> u32 {
    (f64::from(ratio) * f64::from(1u32 << 24)).ceil() as u32
}

/// What a kept element is multiplied by: 1/(1 − ratio) in f32.
pub fn dropout_scale(ratio: f32) -> f32 {
    1.0 / (1.0 - ratio)
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Comparison {
    /// a == b
    Equal,
    /// a < b
    Less,
    /// a > b
    Greater,
    /// a <= b
    LessOrEqual,
    /// a >= b
    GreaterOrEqual,
}

/// A logical operator on bools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Logic {
    /// ¬x
    Not,
    /// a ∧ b
    And,
    /// a ∨ b
    Or,
    /// a ⊕ b
    Xor,
}

impl Logic {
    /// The operator's name.
    pub fn name(self) -> &'static str {
        match self {
            Logic::Not => "not",
            Logic::And => "and",
            Logic::Or => "or",
            Logic::Xor => "xor",
        }
    }

    /// The operator on one element (`b` is ignored by `not`).
    pub fn apply(self, a: bool, b: bool) -> bool {
        match self {
            Logic::Not => !a,
            Logic::And => a && b,
            Logic::Or => a || b,
            Logic::Xor => a != b,
        }
    }
}

/// A parsed convert-family operator.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvertOp {
    /// `equal`, `less`, `greater`, `less_or_equal`, `greater_or_equal`.
    Compare(Comparison),
    /// `not`, `and`, `or`, `xor`.
    Logic(Logic),
    /// `cast` to a dtype.
    Cast {
        /// Target dtype.
        to: DType,
        /// With `to` f32: the 16-bit float each value is first rounded to (`f16`, `bf16`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        round_to: Option<HalfFormat>,
    },
    /// `one_hot` with `depth` classes.
    OneHot {
        /// Length of the added axis (at least 1).
        depth: usize,
    },
    /// `dropout_train`.
    DropoutTrain {
        /// Drop probability in [0, 1).
        ratio: f32,
        /// Seed of the mask.
        seed: u32,
    },
}

/// A 16-bit float format `cast` rounds to; the rounded value stays an f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HalfFormat {
    /// IEEE binary16: 5 exponent bits, 10 fraction bits, largest finite 65504.
    F16,
    /// bfloat16: f32's 8 exponent bits, 7 fraction bits.
    Bf16,
}

impl HalfFormat {
    /// The `cast` target naming it (`f16`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            HalfFormat::F16 => "f16",
            HalfFormat::Bf16 => "bf16",
        }
    }

    /// The format a `cast` target names, if it names one.
    pub fn parse(name: &str) -> Option<HalfFormat> {
        [HalfFormat::F16, HalfFormat::Bf16]
            .into_iter()
            .find(|h| h.name() == name)
    }

    /// `x` rounded to this format (to nearest, ties to even; beyond the largest finite
    /// value to ±∞; NaN stays NaN) and widened back, exactly.
    pub fn round(self, x: f64) -> f64 {
        match self {
            HalfFormat::F16 => half::f16::from_f64(x).to_f64(),
            HalfFormat::Bf16 => half::bf16::from_f64(x).to_f64(),
        }
    }
}

/// Parses attributes; `None` for a name outside the family.
pub fn parse(name: &str, r: &mut AttrReader) -> Option<ConvertOp> {
    Some(match name {
        "equal" => ConvertOp::Compare(Comparison::Equal),
        "less" => ConvertOp::Compare(Comparison::Less),
        "greater" => ConvertOp::Compare(Comparison::Greater),
        "less_or_equal" => ConvertOp::Compare(Comparison::LessOrEqual),
        "greater_or_equal" => ConvertOp::Compare(Comparison::GreaterOrEqual),
        "not" => ConvertOp::Logic(Logic::Not),
        "and" => ConvertOp::Logic(Logic::And),
        "or" => ConvertOp::Logic(Logic::Or),
        "xor" => ConvertOp::Logic(Logic::Xor),
        "cast" => {
            let to = r.choice("to");
            match HalfFormat::parse(&to) {
                Some(half) => ConvertOp::Cast {
                    to: DType::F32,
                    round_to: Some(half),
                },
                None => ConvertOp::Cast {
                    to: DType::parse(&to).unwrap_or(DType::F32),
                    round_to: None,
                },
            }
        }
        "one_hot" => ConvertOp::OneHot {
            depth: r.size("depth", 1),
        },
        "dropout_train" => {
            let ratio = r.float("ratio");
            if !(0.0..1.0).contains(&ratio) {
                r.reject("ratio", format!("ratio must be in [0, 1), got {ratio}"));
            }
            let seed = r.int("seed");
            let seed = u32::try_from(seed).unwrap_or_else(|_| {
                r.reject("seed", format!("seed must be in [0, 2^32), got {seed}"));
                0
            });
            ConvertOp::DropoutTrain { ratio, seed }
        }
        _ => return None,
    })
}

impl Comparison {
    /// The operator's name.
    pub fn name(self) -> &'static str {
        match self {
            Comparison::Equal => "equal",
            Comparison::Less => "less",
            Comparison::Greater => "greater",
            Comparison::LessOrEqual => "less_or_equal",
            Comparison::GreaterOrEqual => "greater_or_equal",
        }
    }
}

impl ConvertOp {
    /// Gradient rule: a cast from f32 to f32 passes the gradient through; every other
    /// operator of the family has an integer or boolean side (comparisons and `one_hot`
    /// produce piecewise-constant values, casts change the dtype), so no gradient flows.
    pub(crate) fn grad(&self, g: &mut dyn GradContext) -> Result<(), String> {
        if let ConvertOp::DropoutTrain { ratio, seed } = self {
            // The same mask and scale applied to the gradient.
            if !g.needs(0) {
                return Ok(());
            }
            let dy = g.dy()?;
            let stream = g.input(1)?;
            let attrs = serde_json::json!({ "ratio": ratio, "seed": seed });
            let dx = g.emit("dropout_train", attrs, &[&dy, &stream])?;
            return g.input_grad(0, dx);
        }
        if matches!(self, ConvertOp::Cast { to: DType::F32, .. }) && g.needs(0) {
            let dy = g.dy()?;
            let x = g.input(0)?;
            let xs = g.shape(&x)?;
            let dx = g.reshape(&dy, &xs)?;
            return g.input_grad(0, dx);
        }
        Ok(())
    }

    /// Name in graph files.
    pub fn name(&self) -> &'static str {
        match self {
            ConvertOp::Compare(c) => c.name(),
            ConvertOp::Logic(l) => l.name(),
            ConvertOp::Cast { .. } => "cast",
            ConvertOp::OneHot { .. } => "one_hot",
            ConvertOp::DropoutTrain { .. } => "dropout_train",
        }
    }

    /// Nothing beyond the defaults: not pointwise for fusion (see the module docs).
    pub fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Checks what parsing guarantees (`one_hot`'s depth in range, a rounding cast giving f32).
    pub fn validate(&self) -> Result<(), String> {
        match self {
            ConvertOp::OneHot { depth } => {
                let max = usize::try_from(super::attrs::MAX_SIZE).unwrap_or(usize::MAX);
                if *depth == 0 || *depth > max {
                    return Err(format!("one_hot: depth {depth} is out of range"));
                }
                Ok(())
            }
            ConvertOp::DropoutTrain { ratio, .. } if !(0.0..1.0).contains(ratio) => {
                Err(format!("dropout_train: ratio {ratio} is not in [0, 1)"))
            }
            ConvertOp::Cast {
                to,
                round_to: Some(half),
            } if *to != DType::F32 => Err(format!(
                "cast: a rounding to {} gives f32 values, not {to}",
                half.name()
            )),
            _ => Ok(()),
        }
    }

    /// Output types.
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        let name = self.name();
        match self {
            ConvertOp::Compare(_) => {
                let (a, b) = (&inputs[0], &inputs[1]);
                if a.dtype != b.dtype || a.dtype == DType::Bool {
                    return Err(format!(
                        "'{name}' compares two f32 or two i32 operands, got {a} and {b}"
                    ));
                }
                let shape = broadcast(&a.shape, &b.shape).map_err(|_| {
                    format!(
                        "input shapes {} and {} do not broadcast",
                        show(&a.shape),
                        show(&b.shape)
                    )
                })?;
                Ok(vec![TensorType {
                    shape,
                    dtype: DType::Bool,
                }])
            }
            ConvertOp::Logic(_) => {
                if let Some(t) = inputs.iter().find(|t| t.dtype != DType::Bool) {
                    return Err(format!("'{name}' needs bool operands, got {t}"));
                }
                let mut shape = inputs[0].shape.clone();
                for t in &inputs[1..] {
                    shape = broadcast(&shape, &t.shape).map_err(|_| {
                        let shapes: Vec<String> = inputs.iter().map(|t| show(&t.shape)).collect();
                        format!("input shapes {} do not broadcast", shapes.join(" and "))
                    })?;
                }
                Ok(vec![TensorType {
                    shape,
                    dtype: DType::Bool,
                }])
            }
            ConvertOp::Cast { to, .. } => Ok(vec![TensorType {
                shape: inputs[0].shape.clone(),
                dtype: *to,
            }]),
            ConvertOp::OneHot { depth } => {
                let i = &inputs[0];
                if i.dtype != DType::I32 {
                    return Err(format!("'one_hot' needs i32 indices, got {i}"));
                }
                let mut shape = i.shape.clone();
                shape.push(Dim::Known(*depth));
                Ok(vec![TensorType::f32(shape)])
            }
            ConvertOp::DropoutTrain { .. } => {
                let (x, stream) = (&inputs[0], &inputs[1]);
                if x.dtype != DType::F32 {
                    return Err(format!("'dropout_train' needs f32 x, got {x}"));
                }
                if stream.dtype != DType::I32 || !stream.shape.is_empty() {
                    return Err(format!(
                        "'dropout_train' needs an i32 scalar stream, got {stream}"
                    ));
                }
                Ok(vec![x.clone()])
            }
        }
    }

    /// Batch rule: comparisons and logic broadcast like the elementwise operators; `cast`
    /// keeps the axis, and so does `one_hot` (its new axis is last).
    pub fn batch(
        &self,
        inputs: &[TensorType],
        batch: &[Option<usize>],
        outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        match self {
            ConvertOp::Compare(_) | ConvertOp::Logic(_) => {
                let rank = outputs[0].shape.len();
                Ok(vec![broadcast_batch(self.name(), inputs, batch, rank)?])
            }
            ConvertOp::Cast { .. } | ConvertOp::OneHot { .. } => Ok(vec![batch[0]]),
            // A mask per element index within what one run sees.
            ConvertOp::DropoutTrain { .. } => Ok(vec![batch[0]]),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testing::{couples, rule, tensor};
    use crate::ops::{parse, TensorType};
    use serde_json::{json, Value};

    fn infer(op: &str, attrs: Value, inputs: &[&str]) -> Result<Vec<TensorType>, String> {
        let op = parse(op, attrs.as_object().unwrap()).map_err(|e| format!("{e:?}"))?;
        let types: Vec<TensorType> = inputs.iter().map(|t| tensor(t)).collect();
        op.infer(&types)
    }

    #[test]
    fn comparisons_broadcast_same_dtype_operands_into_bool() {
        let y = infer("less", json!({}), &["N,1,3", "4,1"]).unwrap();
        assert_eq!(y[0], tensor("bool:N,4,3"));
        let y = infer("equal", json!({}), &["i32:2,3", "i32:"]).unwrap();
        assert_eq!(y[0], tensor("bool:2,3"));
        let e = infer("greater", json!({}), &["2,3", "i32:2,3"]).unwrap_err();
        assert!(e.contains("two f32 or two i32"), "{e}");
        assert!(e.contains("f32 [2, 3] and i32 [2, 3]"), "{e}");
        assert!(infer("equal", json!({}), &["bool:2", "bool:2"]).is_err());
        let e = infer("equal", json!({}), &["2,3", "4"]).unwrap_err();
        assert!(e.contains("[2, 3] and [4] do not broadcast"), "{e}");
    }

    #[test]
    fn logic_broadcasts_bools_into_bool() {
        let y = infer("and", json!({}), &["bool:N,1,3", "bool:4,1"]).unwrap();
        assert_eq!(y[0], tensor("bool:N,4,3"));
        let y = infer("not", json!({}), &["bool:N,2"]).unwrap();
        assert_eq!(y[0], tensor("bool:N,2"));
        let e = infer("xor", json!({}), &["bool:2", "i32:2"]).unwrap_err();
        assert!(e.contains("'xor' needs bool operands, got i32 [2]"), "{e}");
        let y = infer("less_or_equal", json!({}), &["i32:2", "i32:"]).unwrap();
        assert_eq!(y[0], tensor("bool:2"));
        assert_eq!(
            rule("or", json!({}), &[("bool:N,4", Some(0)), ("bool:4", None)]),
            Ok(vec![Some(0)])
        );
    }

    #[test]
    fn cast_and_one_hot_types() {
        let y = infer("cast", json!({ "to": "i32" }), &["N,3"]).unwrap();
        assert_eq!(y[0], tensor("i32:N,3"));
        let y = infer("cast", json!({ "to": "bool" }), &["i32:"]).unwrap();
        assert_eq!(y[0], tensor("bool:"));
        // f16 and bf16 round and stay f32.
        for half in ["f16", "bf16"] {
            let y = infer("cast", json!({ "to": half }), &["i32:N,3"]).unwrap();
            assert_eq!(y[0], tensor("N,3"));
        }
        assert!(infer("cast", json!({ "to": "f64" }), &["3"]).is_err());
        assert!(infer("cast", json!({}), &["3"]).is_err());
        let y = infer("one_hot", json!({ "depth": 5 }), &["i32:N,2"]).unwrap();
        assert_eq!(y[0], tensor("N,2,5"));
        let y = infer("one_hot", json!({ "depth": 1 }), &["i32:"]).unwrap();
        assert_eq!(y[0], tensor("1"));
        let e = infer("one_hot", json!({ "depth": 3 }), &["N,2"]).unwrap_err();
        assert!(e.contains("needs i32 indices, got f32 [N, 2]"), "{e}");
        assert!(infer("one_hot", json!({ "depth": 0 }), &["i32:3"]).is_err());
        assert!(infer("one_hot", json!({}), &["i32:3"]).is_err());
    }

    #[test]
    fn dropout_train_types_and_masks() {
        let y = infer("dropout_train", json!({ "ratio": 0.25 }), &["N,3", "i32:"]).unwrap();
        assert_eq!(y[0], tensor("N,3"));
        let e = infer("dropout_train", json!({ "ratio": 0.25 }), &["N,3", "i32:1"]).unwrap_err();
        assert!(e.contains("i32 scalar stream"), "{e}");
        assert!(infer("dropout_train", json!({ "ratio": 1.0 }), &["3", "i32:"]).is_err());
        assert!(infer(
            "dropout_train",
            json!({ "ratio": 0.5, "seed": -1 }),
            &["3", "i32:"]
        )
        .is_err());
        // About 1 − ratio of the elements are kept, and masks differ between streams.
        let t = super::dropout_threshold(0.3);
        let kept = |stream| {
            (0..100_000u32)
                .filter(|&i| super::dropout_keeps(7, stream, i, t))
                .count()
        };
        let (a, b) = (kept(0), kept(1));
        assert!((69_000..71_000).contains(&a), "{a}");
        assert!((69_000..71_000).contains(&b), "{b}");
        let same = (0..1000u32)
            .filter(|&i| super::dropout_keeps(7, 0, i, t) == super::dropout_keeps(7, 1, i, t))
            .count();
        assert!(
            same < 700,
            "streams draw independent masks ({same} of 1000 agree)"
        );
        assert_eq!(super::dropout_threshold(0.0), 0);
    }

    #[test]
    fn batch_rules() {
        assert_eq!(
            rule("equal", json!({}), &[("N,4", Some(0)), ("4", None)]),
            Ok(vec![Some(0)])
        );
        couples(
            rule("less", json!({}), &[("N,1", Some(0)), ("1,N", Some(1))]),
            &["less", "axis 0", "axis 1"],
        );
        assert_eq!(
            rule("cast", json!({ "to": "f32" }), &[("i32:3,N", Some(1))]),
            Ok(vec![Some(1)])
        );
        assert_eq!(
            rule("one_hot", json!({ "depth": 7 }), &[("i32:N", Some(0))]),
            Ok(vec![Some(0)])
        );
    }
}
