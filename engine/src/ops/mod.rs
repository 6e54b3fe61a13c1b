//! The operator set. One operator is one definition: schema (attributes with defaults and
//! docs), shape and dtype inference, weights it declares, cost, what the planner may do
//! with it (its [`Capabilities`]) and how it treats the batch axis, all in its family file
//! here; its CPU reference is in the mirrored file of `crate::cpu` and its WGSL kernels in
//! the mirrored file of `crate::gpu::lower`.
//!
//! Operators are grouped in families that share one kernel generator and one WGSL file in
//! `shaders/`: matmul, elementwise, reduce, normalisation, movement, indexing (element
//! gathers and scatters, tiles, triangles, ranges, shapes), conv/pool, constant (and
//! `param`), convert (comparisons, casts, one-hot), loss, gradient, attention, recurrent
//! (`lstm`, `gru`), einsum. Each family also
//! declares its gradient rule (`fn grad`, over [`backward::GradContext`]), which
//! `crate::autodiff` drives.

pub mod attention;
pub mod attrs;
pub mod backward;
pub mod constant;
pub mod conv;
pub mod convert;
pub mod einsum;
pub mod elementwise;
pub mod grad;
pub mod indexing;
pub mod loss;
pub mod matmul;
pub mod movement;
pub mod norm;
pub mod recurrent;
mod recurrent_unrolled;
pub mod reduce;

use crate::dtype::DType;
use crate::shape::{show, Shape};
use attrs::{AttrReader, AttrSpec};
use serde::Serialize;
use serde_json::{Map, Value};
use std::fmt;

/// The shape and dtype of a value flowing along an edge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
pub struct TensorType {
    /// Shape (possibly symbolic).
    pub shape: Shape,
    /// Element type.
    pub dtype: DType,
}

impl TensorType {
    /// A float tensor type.
    pub fn f32(shape: Shape) -> TensorType {
        TensorType {
            shape,
            dtype: DType::F32,
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.dtype, show(&self.shape))
    }
}

/// How a weight is initialised when no weights file provides it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Init {
    /// Uniform in [-bound, bound] (Kaiming-uniform style, bound = 1/sqrt(fan_in)).
    Uniform(f32),
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
}

/// A weight an operator declares (for `linear`: `weight` [in, out] and `bias` [out]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParamSpec {
    /// Local name; the file key is `node.name`.
    pub name: &'static str,
    /// Concrete shape.
    pub shape: Vec<usize>,
    /// Seeded initialisation.
    pub init: Init,
}

/// Predicted cost of one operator application.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Cost {
    /// Floating-point operations.
    pub flops: u64,
    /// Bytes read from device memory.
    pub bytes_read: u64,
    /// Bytes written to device memory.
    pub bytes_written: u64,
}

/// How many inputs an operator takes.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Arity {
    /// Exactly these named inputs.
    Fixed(&'static [&'static str]),
    /// At least this many inputs.
    Variadic(usize),
}

/// The schema of an operator, as served to the editor's palette.
#[derive(Debug, Clone, Serialize)]
pub struct OpSchema {
    /// Name used in graph files.
    pub name: &'static str,
    /// Kernel family.
    pub family: &'static str,
    /// One line of documentation.
    pub doc: &'static str,
    /// Inputs.
    pub inputs: Arity,
    /// Names of outputs (`split` has as many as its attributes say).
    pub outputs: &'static [&'static str],
    /// Attributes.
    pub attrs: &'static [AttrSpec],
    /// Names of the weights it declares.
    pub params: &'static [&'static str],
}

/// A parsed operator with its attributes (plain data: plans carry it to any device).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `matmul`, `linear`.
    MatMul(matmul::MatMulOp),
    /// Unary, binary (broadcasting) and `where`.
    Elementwise(elementwise::ElementwiseOp),
    /// `reduce_sum`, `reduce_mean`, `reduce_max`, `reduce_min`, `reduce_prod`,
    /// `reduce_l2`, `argmax`, `argmin`, `cumsum`, `top_k`.
    Reduce(reduce::ReduceOp),
    /// `softmax`, `log_softmax`, `layer_norm`, `rms_norm`, `instance_norm`, `group_norm`,
    /// `batch_norm`.
    Norm(norm::NormOp),
    /// Reshapes, views, copies and gathers.
    Movement(movement::MovementOp),
    /// Element gathers and scatters, `tile`, `trilu`, `range`, `shape`,
    /// `constant_of_shape`.
    Indexing(indexing::IndexingOp),
    /// Convolution and pooling.
    Conv(conv::ConvOp),
    /// A constant tensor.
    Constant(constant::ConstantOp),
    /// Comparisons, `cast`, `one_hot`: operators that change dtype.
    Convert(convert::ConvertOp),
    /// Losses.
    Loss(loss::LossOp),
    /// A weight read by key.
    Param(constant::ParamOp),
    /// Backward operators.
    Grad(grad::GradOp),
    /// `attention`, `attention_probs`.
    Attention(attention::AttentionOp),
    /// `lstm`, `gru`.
    Recurrent(recurrent::RecurrentOp),
    /// `einsum`.
    Einsum(einsum::EinsumOp),
}

/// Every operator schema, grouped by family (the palette's data).
pub fn schemas() -> Vec<&'static OpSchema> {
    let families: [&'static [OpSchema]; 15] = [
        matmul::SCHEMAS,
        elementwise::SCHEMAS,
        reduce::SCHEMAS,
        norm::SCHEMAS,
        movement::SCHEMAS,
        indexing::SCHEMAS,
        conv::SCHEMAS,
        constant::SCHEMAS,
        convert::SCHEMAS,
        loss::SCHEMAS,
        constant::PARAM_SCHEMAS,
        grad::SCHEMAS,
        attention::SCHEMAS,
        recurrent::SCHEMAS,
        einsum::SCHEMAS,
    ];
    families.iter().flat_map(|f| f.iter()).collect()
}

/// The schema of an operator by name.
pub fn schema(name: &str) -> Option<&'static OpSchema> {
    schemas().into_iter().find(|s| s.name == name)
}

/// The first problem of each attribute: the others follow from it (a missing attribute
/// then fails its range check too), and saying them again only repeats the cause.
fn first_per_attribute(problems: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut seen = std::collections::BTreeSet::new();
    problems
        .into_iter()
        .filter(|(attr, _)| seen.insert(attr.clone()))
        .collect()
}

/// Parses an operator and its attributes. Errors are (attribute, message) pairs, one per
/// attribute.
pub fn parse(name: &str, attrs: &Map<String, Value>) -> Result<Op, Vec<(String, String)>> {
    let Some(schema) = schema(name) else {
        let known: Vec<&str> = schemas().iter().map(|s| s.name).collect();
        return Err(vec![(
            "op".into(),
            format!("unknown operator '{name}' (known: {})", known.join(", ")),
        )]);
    };
    let mut r = AttrReader::new(attrs, schema.attrs);
    let op = match schema.family {
        matmul::FAMILY => matmul::parse(name, &mut r).map(Op::MatMul),
        elementwise::FAMILY => elementwise::parse(name, &mut r).map(Op::Elementwise),
        reduce::FAMILY => reduce::parse(name, &mut r).map(Op::Reduce),
        norm::FAMILY => norm::parse(name, &mut r).map(Op::Norm),
        movement::FAMILY => movement::parse(name, &mut r).map(Op::Movement),
        indexing::FAMILY => indexing::parse(name, &mut r).map(Op::Indexing),
        conv::FAMILY => conv::parse(name, &mut r).map(Op::Conv),
        constant::FAMILY if name == "param" => Some(Op::Param(constant::parse_param(&mut r))),
        constant::FAMILY => Some(Op::Constant(constant::parse(&mut r))),
        convert::FAMILY => convert::parse(name, &mut r).map(Op::Convert),
        loss::FAMILY => loss::parse(name, &mut r).map(Op::Loss),
        grad::FAMILY => grad::parse(name, &mut r).map(Op::Grad),
        attention::FAMILY => attention::parse(name, &mut r).map(Op::Attention),
        recurrent::FAMILY => recurrent::parse(name, &mut r).map(Op::Recurrent),
        einsum::FAMILY => einsum::parse(name, &mut r).map(Op::Einsum),
        _ => None,
    };
    let Some(op) = op else {
        return Err(vec![(
            "op".into(),
            format!("internal: operator '{name}' has a schema but no parser"),
        )]);
    };
    if r.problems.is_empty() {
        Ok(op)
    } else {
        Err(first_per_attribute(r.problems))
    }
}

impl Op {
    /// The operator's name as written in graph files.
    pub fn name(&self) -> &'static str {
        match self {
            Op::MatMul(o) => o.name(),
            Op::Elementwise(o) => o.name(),
            Op::Reduce(o) => o.name(),
            Op::Norm(o) => o.name(),
            Op::Movement(o) => o.name(),
            Op::Indexing(o) => o.name(),
            Op::Conv(o) => o.name(),
            Op::Constant(_) => "constant",
            Op::Convert(o) => o.name(),
            Op::Loss(o) => o.name(),
            Op::Param(_) => "param",
            Op::Grad(o) => o.name(),
            Op::Attention(o) => o.name(),
            Op::Recurrent(o) => o.name(),
            Op::Einsum(o) => o.name(),
        }
    }

    /// The operator's schema.
    pub fn schema(&self) -> &'static OpSchema {
        schema(self.name()).expect("every parsed operator has a schema")
    }

    /// Number of outputs (`split` has several).
    pub fn num_outputs(&self) -> usize {
        match self {
            Op::Movement(m) => m.num_outputs(),
            Op::Recurrent(r) => r.num_outputs(),
            Op::Reduce(r) => r.num_outputs(),
            _ => 1,
        }
    }

    /// Checks what parsing guarantees, for operators that arrive already parsed (plans
    /// deserialized from a server or a cache): sizes and counts in range, lists at most
    /// `max_list` long, a clip's bounds in order, a constant's values filling its shape.
    pub fn validate(&self, max_list: usize) -> Result<(), String> {
        let name = self.name();
        let list = |what: &str, len: usize| {
            if len > max_list {
                Err(format!("{name}: {what} has {len} entries, over {max_list}"))
            } else {
                Ok(())
            }
        };
        match self {
            Op::MatMul(matmul::MatMulOp::Linear { out_features, .. }) => {
                let max = usize::try_from(attrs::MAX_SIZE).unwrap_or(usize::MAX);
                if *out_features == 0 || *out_features > max {
                    return Err(format!(
                        "linear: out_features {out_features} is out of range"
                    ));
                }
                Ok(())
            }
            Op::MatMul(matmul::MatMulOp::MatMul) | Op::Norm(_) => Ok(()),
            Op::Param(p) => list("shape", p.shape.len()),
            Op::Grad(g) => g.validate(),
            Op::Elementwise(o) => o.validate(),
            Op::Reduce(r) => {
                list("axes", r.axes.as_ref().map_or(0, Vec::len))?;
                match (r.single_axis(), r.axes.as_deref(), r.kind) {
                    (true, Some(&[_]), reduce::ReduceKind::TopK { k, .. })
                        if i64::try_from(k).map_or(true, |k| k > attrs::MAX_SIZE) =>
                    {
                        Err(format!("top_k: k {k} is out of range"))
                    }
                    (true, Some(&[_]), _) | (false, _, _) => Ok(()),
                    (true, _, _) => Err(format!("{name}: one axis, got {:?}", r.axes)),
                }
            }
            Op::Movement(m) => {
                for (what, len) in m.lists() {
                    list(what, len)?;
                }
                m.validate()
            }
            Op::Indexing(o) => {
                for (what, len) in o.lists() {
                    list(what, len)?;
                }
                o.validate()
            }
            Op::Conv(c) => c.validate(),
            Op::Attention(a) => a.validate(),
            Op::Recurrent(r) => r.validate(),
            Op::Einsum(e) => e.validate(),
            Op::Convert(c) => c.validate(),
            Op::Loss(l) => l.validate(),
            Op::Constant(c) => {
                c.value.check()?;
                if c.value.dtype() != DType::F32 || c.value.len() > constant::MAX_ELEMENTS {
                    return Err(format!(
                        "constant: {} {} elements (f32, at most {})",
                        c.value.len(),
                        c.value.dtype(),
                        constant::MAX_ELEMENTS
                    ));
                }
                Ok(())
            }
        }
    }

    /// Checks the number of inputs.
    pub fn check_arity(&self, n: usize) -> Result<(), String> {
        match self.schema().inputs {
            Arity::Fixed(names) if names.len() != n => Err(format!(
                "'{}' takes {} input{} ({}), got {n}",
                self.name(),
                names.len(),
                if names.len() == 1 { "" } else { "s" },
                names.join(", ")
            )),
            Arity::Variadic(min) if n < min => Err(format!(
                "'{}' takes at least {min} inputs, got {n}",
                self.name()
            )),
            _ => Ok(()),
        }
    }

    /// Infers output types from input types (a wrong number of inputs is an error too).
    /// Errors name the offending shapes.
    pub fn infer(&self, inputs: &[TensorType]) -> Result<Vec<TensorType>, String> {
        self.check_arity(inputs.len())?;
        match self {
            Op::MatMul(o) => o.infer(inputs),
            Op::Elementwise(o) => o.infer(inputs),
            Op::Reduce(o) => o.infer(inputs),
            Op::Norm(o) => o.infer(inputs),
            Op::Movement(o) => o.infer(inputs),
            Op::Indexing(o) => o.infer(inputs),
            Op::Conv(o) => o.infer(inputs),
            Op::Constant(o) => o.infer(inputs),
            Op::Convert(o) => o.infer(inputs),
            Op::Loss(o) => o.infer(inputs),
            Op::Param(o) => o.infer(inputs),
            Op::Grad(o) => o.infer(inputs),
            Op::Attention(o) => o.infer(inputs),
            Op::Recurrent(o) => o.infer(inputs),
            Op::Einsum(o) => o.infer(inputs),
        }
    }

    /// How the operator treats the batch axis: given each input's batch axis (None: the
    /// input does not depend on the batch; at least one is Some), each output's batch axis,
    /// or Err(reason) when the operator combines samples (reduces, normalises, contracts,
    /// concatenates, splits, slices or indexes along the batch axis, or reshapes so that a
    /// sample's elements are no longer a contiguous block along one axis).
    ///
    /// The reason names the operator and the axis ("softmax along axis 0, the batch
    /// axis"). Inputs and outputs are the types inference gave; a wrong number of inputs
    /// or batch axes, or an axis outside its input's rank, is an `Err` too (never a panic).
    pub fn batch(
        &self,
        inputs: &[TensorType],
        batch: &[Option<usize>],
        outputs: &[TensorType],
    ) -> Result<Vec<Option<usize>>, String> {
        let name = self.name();
        self.check_arity(inputs.len())?;
        if batch.len() != inputs.len() {
            return Err(format!(
                "'{name}' got {} batch axes for {} inputs",
                batch.len(),
                inputs.len()
            ));
        }
        for (k, (t, b)) in inputs.iter().zip(batch).enumerate() {
            if let Some(a) = *b {
                if a >= t.shape.len() {
                    return Err(format!(
                        "'{name}': batch axis {a} of input {k} is outside {t}"
                    ));
                }
            }
        }
        if outputs.is_empty() || batch.iter().all(Option::is_none) {
            return Ok(vec![None; outputs.len()]);
        }
        let axes = match self {
            Op::MatMul(o) => o.batch(inputs, batch, outputs),
            Op::Elementwise(o) => o.batch(inputs, batch, outputs),
            Op::Reduce(o) => o.batch(inputs, batch, outputs),
            Op::Norm(o) => o.batch(inputs, batch, outputs),
            Op::Movement(o) => o.batch(inputs, batch, outputs),
            Op::Indexing(o) => o.batch(inputs, batch, outputs),
            Op::Conv(o) => o.batch(inputs, batch, outputs),
            Op::Constant(o) => o.batch(inputs, batch, outputs),
            Op::Convert(o) => o.batch(inputs, batch, outputs),
            Op::Loss(o) => o.batch(inputs, batch, outputs),
            // A param has no inputs: it never depends on the batch (returned above).
            Op::Param(_) => Ok(vec![None]),
            Op::Grad(o) => o.batch(inputs, batch, outputs),
            Op::Attention(o) => o.batch(inputs, batch, outputs),
            Op::Recurrent(o) => o.batch(inputs, batch, outputs),
            Op::Einsum(o) => o.batch(inputs, batch, outputs),
        }?;
        for (k, (t, b)) in outputs.iter().zip(&axes).enumerate() {
            if let Some(a) = *b {
                if a >= t.shape.len() {
                    return Err(format!(
                        "'{name}' puts the batch of output {k} on axis {a}, outside {t}"
                    ));
                }
            }
        }
        Ok(axes)
    }

    /// The weights this operator declares, given its (inferred) input types.
    pub fn params(&self, inputs: &[TensorType]) -> Result<Vec<ParamSpec>, String> {
        self.check_arity(inputs.len())?;
        match self {
            Op::MatMul(o) => o.params(inputs),
            Op::Norm(o) => o.params(inputs),
            Op::Conv(o) => o.params(inputs),
            Op::Param(o) => Ok(o.params()),
            _ => Ok(Vec::new()),
        }
    }

    /// Predicted cost on concrete operands (bytes counted with each operand's real
    /// element size). Costs saturate: they weigh work, they never size an allocation.
    pub fn cost(&self, inputs: &[CostOperand], outputs: &[CostOperand]) -> Cost {
        let shapes = |ops: &[CostOperand]| -> Vec<Vec<usize>> {
            ops.iter().map(|o| o.shape.to_vec()).collect()
        };
        let elements = |ops: &[CostOperand]| -> u64 {
            ops.iter()
                .fold(0u64, |a, o| a.saturating_add(product(o.shape)))
        };
        let bytes = |ops: &[CostOperand]| -> u64 {
            ops.iter().fold(0u64, |a, o| {
                a.saturating_add(o.element_bytes.saturating_mul(product(o.shape)))
            })
        };
        let (read, written) = (elements(inputs), elements(outputs));
        let flops = match self {
            Op::MatMul(o) => o.flops(&shapes(inputs), &shapes(outputs)),
            Op::Conv(o) => o.flops(&shapes(inputs), &shapes(outputs)),
            Op::Grad(o) => o
                .flops(&shapes(inputs), &shapes(outputs))
                .unwrap_or(read.max(written)),
            Op::Attention(o) => o.flops(&shapes(inputs)),
            Op::Recurrent(o) => o.flops(&shapes(inputs)),
            Op::Einsum(o) => o.flops(&shapes(inputs)),
            Op::Norm(_) | Op::Loss(_) => read.saturating_mul(8),
            Op::Movement(_) | Op::Constant(_) | Op::Param(_) => 0,
            _ => read.max(written),
        };
        Cost {
            flops,
            bytes_read: bytes(inputs),
            bytes_written: bytes(outputs),
        }
    }

    /// What the planner may do with this operator.
    pub fn capabilities(&self) -> Capabilities {
        match self {
            Op::Elementwise(o) => o.capabilities(),
            Op::MatMul(_) => Capabilities {
                anchor: Some(Anchor { row_operands: true }),
                ..Capabilities::default()
            },
            Op::Conv(o) => o.capabilities(),
            Op::Movement(o) => o.capabilities(),
            Op::Convert(o) => o.capabilities(),
            Op::Grad(o) => o.capabilities(),
            Op::Reduce(o) => o.capabilities(),
            Op::Norm(_)
            | Op::Indexing(_)
            | Op::Constant(_)
            | Op::Param(_)
            | Op::Loss(_)
            | Op::Attention(_)
            | Op::Recurrent(_)
            | Op::Einsum(_) => Capabilities::default(),
        }
    }

    /// The input holding indices into another input, when the operator has one (checked
    /// on the host before upload).
    pub fn index_input(&self) -> Option<IndexInput> {
        match self {
            Op::Movement(o) => o.index_input(),
            Op::Indexing(o) => o.index_input(),
            Op::Loss(o) => o.index_input(),
            Op::Grad(o) => o.index_input(),
            _ => None,
        }
    }

    /// The key of the weight a `param` operator reads (its declared weight's key is this,
    /// not `node.value`).
    pub fn param_key(&self) -> Option<&str> {
        match self {
            Op::Param(p) => Some(&p.key),
            _ => None,
        }
    }

    /// The gradient rule: emits, through `g`, the gradients of the inputs that want one and
    /// of the weights, from the gradients reaching the outputs. Err (a reason) when the
    /// operator has no gradient with respect to what wants one.
    pub(crate) fn grad(&self, g: &mut dyn backward::GradContext) -> Result<(), String> {
        match self {
            Op::MatMul(o) => o.grad(g),
            Op::Elementwise(o) => o.grad(g),
            Op::Reduce(o) => o.grad(g),
            Op::Norm(o) => o.grad(g),
            Op::Movement(o) => o.grad(g),
            Op::Indexing(o) => o.grad(g),
            Op::Conv(o) => o.grad(g),
            Op::Constant(_) => Ok(()),
            Op::Param(_) => {
                let dy = g.dy()?;
                g.param_grad("value", dy)
            }
            Op::Grad(o) => o.grad(g),
            Op::Convert(o) => o.grad(g),
            Op::Loss(o) => o.grad(g),
            Op::Attention(o) => o.grad(g),
            Op::Einsum(o) => o.grad(g),
            Op::Recurrent(o) => recurrent_unrolled::grad(o, g),
        }
    }

    /// The value of a constant operator.
    pub fn constant_value(&self) -> Option<&crate::tensor::Tensor> {
        match self {
            Op::Constant(c) => Some(&c.value),
            _ => None,
        }
    }
}

/// A concrete operand as costing sees it.
#[derive(Debug, Clone, Copy)]
pub struct CostOperand<'a> {
    /// Concrete shape.
    pub shape: &'a [usize],
    /// Bytes per element in its storage.
    pub element_bytes: u64,
}

/// What the planner may do with an operator, declared by the operator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    /// Output element i depends only on element i of each (broadcast) input and nothing
    /// else: the operator can be fused with other pointwise operators into one pass, and
    /// its output may overwrite an input of the same shape that dies there.
    pub pointwise: bool,
    /// Pointwise with one tensor operand besides scalars or row vectors: it can be applied
    /// to an anchor's result inside the anchor's kernel.
    pub epilogue_member: bool,
    /// Pointwise work on its result can be fused into its kernel's store.
    pub anchor: Option<Anchor>,
    /// The output is the input reinterpreted: no work and no buffer of its own.
    pub view: bool,
    /// One input folded element by element (a reduction): pointwise work producing that
    /// input can be computed inside its kernel as each element is read, and never stored.
    pub prologue: bool,
}

/// How an epilogue anchor reads the extra operands of its fused chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Anchor {
    /// Besides scalars, 1-D operands the length of the result's last axis (a bias row).
    pub row_operands: bool,
}

/// An input holding indices into another input along an axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IndexInput {
    /// The input holding the indices.
    pub indices: usize,
    /// The input they index.
    pub data: usize,
    /// The indexed axis of `data` (negative counts from the end).
    pub axis: i64,
    /// Indices must be in [0, length) (class labels); otherwise negative ones count from
    /// the end (`gather`).
    pub non_negative: bool,
}

/// A size as a `u64` (lossless: `usize` is at most 64 bits on every target).
pub(crate) fn widen(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The saturating product of a concrete shape, for costs.
pub(crate) fn product(dims: &[usize]) -> u64 {
    dims.iter().fold(1u64, |a, &d| a.saturating_mul(widen(d)))
}

/// Checks that an input is a float tensor.
pub(crate) fn need_f32(op: &str, which: &str, t: &TensorType) -> Result<(), String> {
    if t.dtype == DType::F32 {
        Ok(())
    } else {
        Err(format!("'{op}' needs an f32 {which}, got {t}"))
    }
}

/// The one output axis that the batched inputs of a broadcasting operator land on (input
/// axis `a` of rank `r` is output axis `a + rank - r`, numpy-style), or Err when two land
/// on different axes: every sample of one then meets every sample of the other.
pub(crate) fn broadcast_batch(
    op: &str,
    inputs: &[TensorType],
    batch: &[Option<usize>],
    rank: usize,
) -> Result<Option<usize>, String> {
    let mut found: Option<(usize, usize)> = None;
    for (k, (t, b)) in inputs.iter().zip(batch).enumerate() {
        let Some(a) = *b else { continue };
        let Some(out) = (a + rank).checked_sub(t.shape.len()) else {
            return Err(format!(
                "{op} has an input of rank {} above its output's {rank}",
                t.shape.len()
            ));
        };
        match found {
            None => found = Some((k, out)),
            Some((j, o)) if o != out => {
                return Err(format!(
                    "{op} broadcasts the batch of input {j} along axis {o} against the batch of input {k} along axis {out}: every sample meets every other"
                ))
            }
            Some(_) => {}
        }
    }
    Ok(found.map(|(_, o)| o))
}

#[cfg(test)]
pub(crate) mod testing {
    //! Running one operator's batch rule on symbolic shapes written as text.

    use super::{parse, TensorType};
    use crate::dtype::DType;
    use crate::shape::{Dim, Shape};
    use serde_json::Value;

    /// `"N,4"` → `[N, 4]`; a leading `i32:` or `bool:` sets the dtype.
    pub fn tensor(text: &str) -> TensorType {
        let (dtype, dims) = match text.split_once(':') {
            Some(("i32", d)) => (DType::I32, d),
            Some(("bool", d)) => (DType::Bool, d),
            _ => (DType::F32, text),
        };
        let shape: Shape = dims
            .split(',')
            .filter(|d| !d.trim().is_empty())
            .map(|d| match d.trim().parse::<usize>() {
                Ok(n) => Dim::Known(n),
                Err(_) => Dim::Sym(d.trim().to_string()),
            })
            .collect();
        TensorType { shape, dtype }
    }

    /// The rule of operator `op` (attributes `attrs`) for inputs given as (shape text,
    /// batch axis); inference must accept the inputs.
    pub fn rule(
        op: &str,
        attrs: Value,
        inputs: &[(&str, Option<usize>)],
    ) -> Result<Vec<Option<usize>>, String> {
        let attrs = attrs.as_object().cloned().unwrap_or_default();
        let op = parse(op, &attrs).expect("attributes parse");
        let types: Vec<TensorType> = inputs.iter().map(|(t, _)| tensor(t)).collect();
        let axes: Vec<Option<usize>> = inputs.iter().map(|(_, a)| *a).collect();
        let outputs = op.infer(&types).expect("inference accepts the inputs");
        op.batch(&types, &axes, &outputs)
    }

    /// Asserts that the rule couples and that its reason mentions every one of `words`.
    pub fn couples(result: Result<Vec<Option<usize>>, String>, words: &[&str]) {
        match result {
            Err(reason) => {
                for w in words {
                    assert!(reason.contains(w), "'{reason}' does not mention '{w}'");
                }
            }
            Ok(axes) => panic!("expected a coupling, got axes {axes:?}"),
        }
    }
}
