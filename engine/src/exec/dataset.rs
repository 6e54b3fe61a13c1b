//! Datasets: binding the batch, seeded inputs, checking inputs, and cutting a dataset
//! into micro-batches along each input's batch axis (the last one padded by repeating its
//! last sample) and joining the outputs back along each output's batch axis (the padding
//! trimmed). Cutting is only ever applied where the graph's batch semantics say samples
//! stay independent (see [`super::config::check_batching`]).

use super::device::Values;
use super::input::{Input, Inputs, Rows};
use crate::dtype::DType;
use crate::error::RunError;
use crate::graph::{Batch, BatchSemantics, Graph, NodeKind};
use crate::limits;
use crate::ops::TensorType;
use crate::plan::Plan;
use crate::rng::Rng;
use crate::shape;
use crate::tensor::{Tensor, TensorData};
use petgraph::stable_graph::NodeIndex;
use std::collections::{BTreeSet, HashMap};

/// The graph with every symbolic dimension bound to `n` samples.
pub fn bind(graph: &Graph, n: usize) -> Result<Graph, RunError> {
    let bindings: HashMap<String, usize> = graph.symbols().into_iter().map(|s| (s, n)).collect();
    graph.bind(&bindings).map_err(|p| RunError::Input {
        name: "batch".into(),
        message: format!("with {n} samples: {p}"),
    })
}

/// The graph's input types with every symbol bound to `n` samples: what a dataset of
/// `n` samples holds, without binding (and checking) the whole graph at that size.
fn input_types(graph: &Graph, n: usize) -> Result<Vec<(String, TensorType)>, RunError> {
    let bindings: HashMap<String, usize> = graph.symbols().into_iter().map(|s| (s, n)).collect();
    graph
        .doc
        .inputs
        .iter()
        .map(|(name, decl)| {
            let shape = shape::bind(&decl.shape, &bindings).map_err(|message| RunError::Input {
                name: name.clone(),
                message,
            })?;
            Ok((
                name.clone(),
                TensorType {
                    shape,
                    dtype: decl.dtype,
                },
            ))
        })
        .collect()
}

/// Seeded random inputs for a bound graph: floats uniform in [-1, 1), booleans fair,
/// integers in [0, 4) — except index inputs (class labels a loss reads, indices a gather
/// or scatter reads), which are uniform over the valid range of the axis they index. The
/// same graph, batch and seed give the same values everywhere (browsers included).
/// Refused, before anything is allocated, when the inputs are over the graph's limits.
pub fn random_inputs(graph: &Graph, seed: u64) -> Result<Values, RunError> {
    limits::check_dataset(graph, 1, &graph.limits)?;
    let types: Vec<(String, TensorType)> = graph
        .inputs
        .iter()
        .map(|(name, ix)| {
            let t = graph.dag[*ix].outputs.first().cloned();
            t.map(|t| (name.clone(), t))
                .ok_or_else(|| RunError::Unbound(name.clone()))
        })
        .collect::<Result<_, _>>()?;
    let ranges = index_ranges(graph, &HashMap::new())?;
    generate(&types, &ranges, seed, &Values::new())
}

/// The graph input a node output is, seen through views (reshapes, transposes, ...), as
/// the planner's index checks see it.
fn root_input(graph: &Graph, (mut ix, mut port): (NodeIndex, usize)) -> Option<&str> {
    loop {
        match &graph.dag[ix].kind {
            NodeKind::Input => {
                return graph
                    .inputs
                    .iter()
                    .find(|(_, i)| *i == ix && port == 0)
                    .map(|(n, _)| n.as_str())
            }
            NodeKind::Op(op) if op.capabilities().view => {
                (ix, port) = *graph.node_inputs(ix).first()?;
            }
            NodeKind::Op(_) => return None,
        }
    }
}

/// For every graph input that holds indices (an operator's [`IndexInput`](crate::ops::IndexInput)), the length
/// of the axis they index with the graph's symbols bound by `bindings` (the shortest,
/// where it indexes several): seeded indices stay below it.
fn index_ranges(
    graph: &Graph,
    bindings: &HashMap<String, usize>,
) -> Result<HashMap<String, usize>, RunError> {
    let mut ranges: HashMap<String, usize> = HashMap::new();
    for (ix, node, op) in graph.op_nodes() {
        let Some(index) = op.index_input() else {
            continue;
        };
        let sources = graph.node_inputs(ix);
        let (Some(&indices), Some(&(data, port))) =
            (sources.get(index.indices), sources.get(index.data))
        else {
            continue;
        };
        let Some(input) = root_input(graph, indices) else {
            continue;
        };
        let bad = |message: String| RunError::Op {
            node: node.id.clone(),
            message,
        };
        let dims = shape::bind(&graph.dag[data].outputs[port].shape, bindings).map_err(bad)?;
        let axis = shape::existing_axis(index.axis, dims.len()).map_err(bad)?;
        let len = dims[axis]
            .known()
            .ok_or_else(|| RunError::Unbound(node.id.clone()))?;
        ranges
            .entry(input.to_string())
            .and_modify(|l| *l = (*l).min(len))
            .or_insert(len);
    }
    Ok(ranges)
}

/// Seeded random values for the inputs of `types` that `given` lacks (their sizes are
/// checked by the caller), index inputs below their axis length in `ranges`.
fn generate(
    types: &[(String, TensorType)],
    ranges: &HashMap<String, usize>,
    seed: u64,
    given: &Values,
) -> Result<Values, RunError> {
    let mut out = HashMap::new();
    for (name, ty) in types.iter().filter(|(n, _)| !given.contains_key(n)) {
        let dims = shape::concrete(&ty.shape).ok_or_else(|| RunError::Unbound(name.clone()))?;
        let n = shape::numel(&dims).map_err(|message| RunError::Input {
            name: name.clone(),
            message,
        })?;
        let mut rng = Rng::for_name(seed, name);
        let below = ranges.get(name).map_or(4, |&len| crate::ops::widen(len));
        let data = match ty.dtype {
            DType::F32 => TensorData::F32((0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()),
            DType::I32 => TensorData::I32(
                (0..n)
                    .map(|_| i32::try_from(rng.below(below)).unwrap_or(i32::MAX))
                    .collect(),
            ),
            DType::Bool => TensorData::Bool((0..n).map(|_| rng.below(2) == 1).collect()),
        };
        out.insert(name.clone(), Tensor { shape: dims, data });
    }
    Ok(out)
}

/// The dataset of a run without uploaded inputs: `batch` samples of seeded random inputs
/// (refused before allocating when over the graph's limits).
pub fn seeded(graph: &Graph, batch: usize, seed: u64) -> Result<Values, RunError> {
    complete(graph, Values::new(), seed, batch)
}

/// The graph's inputs that `given` lacks, in the graph's order: what [`complete`] seeds.
pub fn missing_inputs(graph: &Graph, given: &Values) -> Vec<String> {
    graph
        .inputs
        .iter()
        .filter(|(name, _)| !given.contains_key(name))
        .map(|(name, _)| name.clone())
        .collect()
}

/// A run's dataset: the `given` inputs, and seeded random values for every other input,
/// with as many samples as the given batched inputs hold (`default_samples` when none
/// is given), all checked against the graph's inputs at that many samples. The inputs'
/// sizes at that many samples are checked against the graph's limits
/// ([`limits::check_dataset`]) before anything is generated.
pub fn complete(
    graph: &Graph,
    given: Values,
    seed: u64,
    default_samples: usize,
) -> Result<Values, RunError> {
    for (name, t) in &given {
        t.check().map_err(|message| RunError::Input {
            name: name.clone(),
            message,
        })?;
    }
    let semantics = graph.batch_semantics();
    let n = samples(&semantics, &given)?.unwrap_or(default_samples);
    if n == 0 {
        return Err(RunError::Input {
            name: "dataset".into(),
            message: "the inputs hold no samples".into(),
        });
    }
    limits::check_dataset(graph, n, &graph.limits)?;
    let types = input_types(graph, n)?;
    let bindings: HashMap<String, usize> = graph.symbols().into_iter().map(|s| (s, n)).collect();
    let ranges = index_ranges(graph, &bindings)?;
    let mut all = generate(&types, &ranges, seed, &given)?;
    all.extend(given);
    check_typed(&types, &all)?;
    Ok(all)
}

/// Checks that `inputs` provides every graph input of a bound graph with its declared
/// dtype and shape (and the elements the shape says), and nothing else.
pub fn check_inputs(graph: &Graph, inputs: &Values) -> Result<(), RunError> {
    let types: Vec<(String, TensorType)> = graph
        .inputs
        .iter()
        .filter_map(|(name, ix)| {
            let t = graph.dag[*ix].outputs.first()?;
            Some((name.clone(), t.clone()))
        })
        .collect();
    check_typed(&types, inputs)
}

/// [`check_inputs`] against a list of input types.
fn check_typed(types: &[(String, TensorType)], inputs: &Values) -> Result<(), RunError> {
    for name in inputs.keys() {
        if !types.iter().any(|(n, _)| n == name) {
            let known: Vec<&str> = types.iter().map(|(n, _)| n.as_str()).collect();
            return Err(RunError::Input {
                name: name.clone(),
                message: format!("the graph has no such input (inputs: {})", known.join(", ")),
            });
        }
    }
    for (name, ty) in types {
        let t = inputs.get(name).ok_or_else(|| RunError::Input {
            name: name.clone(),
            message: format!("missing (expected {ty})"),
        })?;
        if t.dtype() != ty.dtype {
            return Err(RunError::Input {
                name: name.clone(),
                message: format!("has dtype {} but the graph declares {ty}", t.dtype()),
            });
        }
        if shape::known(&t.shape) != ty.shape {
            return Err(RunError::Input {
                name: name.clone(),
                message: format!("has shape {:?} but the graph declares {ty}", t.shape),
            });
        }
        t.check().map_err(|message| RunError::Input {
            name: name.clone(),
            message,
        })?;
    }
    Ok(())
}

/// Checks that `inputs` holds every input of a plan that is not `kept` on the device, each
/// given one with its dtype and shape, and that index inputs are in range (what every
/// executable checks before it starts a micro-batch).
pub fn check_plan_inputs<T: Checked>(
    plan: &Plan,
    inputs: &HashMap<String, T>,
    kept: &BTreeSet<String>,
) -> Result<(), RunError> {
    if let Some((name, _)) = plan
        .inputs
        .iter()
        .find(|(name, _)| !inputs.contains_key(name) && !kept.contains(name))
    {
        return Err(RunError::Input {
            name: name.clone(),
            message: "missing".into(),
        });
    }
    check_given_inputs(plan, inputs)
}

/// Checks inputs a caller keeps on the device for later micro-batches
/// ([`Executable::keep_inputs`](super::device::Executable::keep_inputs)): each names an
/// input of `plan` and has its dtype and shape, indices in range.
pub fn check_kept_inputs(plan: &Plan, inputs: &Values) -> Result<(), RunError> {
    if let Some(name) = inputs
        .keys()
        .find(|name| !plan.inputs.iter().any(|(n, _)| n == *name))
    {
        return Err(RunError::Input {
            name: name.clone(),
            message: "is not an input of this plan, so it cannot be kept on its device".into(),
        });
    }
    check_given_inputs(plan, inputs)
}

/// What the input checks read of an input.
pub trait Checked {
    /// Its shape.
    fn shape(&self) -> Vec<usize>;
    /// Its element type.
    fn dtype(&self) -> DType;
    /// The tensor, where the input is one of its own (samples borrowed from a dataset
    /// are floats from a tensor checked whole, so they have no values to check).
    fn tensor(&self) -> Option<&Tensor>;
}

impl Checked for Tensor {
    fn shape(&self) -> Vec<usize> {
        self.shape.clone()
    }
    fn dtype(&self) -> DType {
        Tensor::dtype(self)
    }
    fn tensor(&self) -> Option<&Tensor> {
        Some(self)
    }
}

impl Checked for Input<'_> {
    fn shape(&self) -> Vec<usize> {
        Input::shape(self)
    }
    fn dtype(&self) -> DType {
        Input::dtype(self)
    }
    fn tensor(&self) -> Option<&Tensor> {
        self.owned()
    }
}

/// Checks the inputs of `plan` that `inputs` holds: dtype, shape, values, index ranges.
fn check_given_inputs<T: Checked>(
    plan: &Plan,
    inputs: &HashMap<String, T>,
) -> Result<(), RunError> {
    for (name, v) in &plan.inputs {
        let Some(t) = inputs.get(name) else {
            continue;
        };
        let value = plan
            .values
            .get(*v)
            .ok_or_else(|| RunError::Internal(format!("plan input '{name}' has no value")))?;
        let shape = t.shape();
        if shape != value.shape || t.dtype() != value.dtype {
            return Err(RunError::Input {
                name: name.clone(),
                message: format!(
                    "has {} {:?} but the plan expects {} {:?}",
                    t.dtype(),
                    shape,
                    value.dtype,
                    value.shape
                ),
            });
        }
        if let Some(t) = t.tensor() {
            t.check().map_err(|message| RunError::Input {
                name: name.clone(),
                message,
            })?;
        }
    }
    for check in &plan.index_checks {
        let Some(TensorData::I32(idx)) = inputs
            .get(&check.input)
            .and_then(Checked::tensor)
            .map(|t| &t.data)
        else {
            continue;
        };
        let len = i64::try_from(check.axis_len).unwrap_or(i64::MAX);
        let low = if check.non_negative { 0 } else { -len };
        if let Some(bad) = idx
            .iter()
            .find(|&&k| i64::from(k) < low || i64::from(k) >= len)
        {
            let message = if check.non_negative {
                format!(
                    "label {bad} is outside [0, {len}), the classes of '{}'",
                    check.node
                )
            } else {
                format!(
                    "index {bad} is out of range for axis length {len} of '{}'",
                    check.node
                )
            };
            return Err(RunError::Input {
                name: check.input.clone(),
                message,
            });
        }
    }
    Ok(())
}

/// The number of samples in a dataset: the common batch-axis length of its batched
/// inputs (`None` when no input carries the batch).
pub fn samples(semantics: &BatchSemantics, data: &Values) -> Result<Option<usize>, RunError> {
    let mut n: Option<(usize, &str)> = None;
    for (name, axis) in &semantics.inputs {
        let (Some(axis), Some(t)) = (axis, data.get(name)) else {
            continue;
        };
        let rows = *t.shape.get(*axis).ok_or_else(|| RunError::Input {
            name: name.clone(),
            message: format!(
                "has shape {:?}, without the batch axis {axis} the graph declares",
                t.shape
            ),
        })?;
        if let Some((m, other)) = n.filter(|&(m, _)| m != rows) {
            return Err(RunError::Input {
                name: name.clone(),
                message: format!("has {rows} samples but input '{other}' has {m}"),
            });
        }
        n = Some((rows, name));
    }
    Ok(n.map(|(rows, _)| rows))
}

/// The (outer, length, inner) blocks of a tensor around `axis`, checked.
fn blocks(t: &Tensor, axis: usize) -> Result<(usize, usize, usize), RunError> {
    let bad = |message: String| RunError::Input {
        name: "dataset".into(),
        message,
    };
    t.check().map_err(bad)?;
    let len = *t
        .shape
        .get(axis)
        .ok_or_else(|| bad(format!("shape {:?} has no axis {axis}", t.shape)))?;
    let outer = shape::numel(&t.shape[..axis]).map_err(bad)?;
    let inner = shape::numel(&t.shape[axis + 1..]).map_err(bad)?;
    Ok((outer, len, inner))
}

/// Elements [from, to) of `t` along `axis` (clamped to the axis), as a tensor.
pub fn slice_axis(t: &Tensor, axis: usize, from: usize, to: usize) -> Result<Tensor, RunError> {
    let (outer, len, inner) = blocks(t, axis)?;
    let (from, to) = (from.min(len), to.min(len).max(from.min(len)));
    let mut shape = t.shape.clone();
    shape[axis] = to - from;
    // Every index below is inside the tensor: outer·len·inner is its checked length.
    fn pick<T: Copy>(
        v: &[T],
        outer: usize,
        len: usize,
        inner: usize,
        from: usize,
        to: usize,
    ) -> Vec<T> {
        let mut out = Vec::with_capacity(outer * (to - from) * inner);
        for o in 0..outer {
            let base = o * len * inner;
            out.extend_from_slice(&v[base + from * inner..base + to * inner]);
        }
        out
    }
    let data = match &t.data {
        TensorData::F32(v) => TensorData::F32(pick(v, outer, len, inner, from, to)),
        TensorData::I32(v) => TensorData::I32(pick(v, outer, len, inner, from, to)),
        TensorData::Bool(v) => TensorData::Bool(pick(v, outer, len, inner, from, to)),
    };
    Ok(Tensor { shape, data })
}

/// Tensors of one dtype joined along `axis` (their other dimensions equal).
pub fn concat_axis(parts: &[&Tensor], axis: usize) -> Result<Tensor, RunError> {
    let Some(first) = parts.first() else {
        return Ok(Tensor::f32(vec![0], Vec::new()));
    };
    let (outer, _, inner) = blocks(first, axis)?;
    let mut shape = first.shape.clone();
    let mut total = 0usize;
    for t in parts {
        let (o, len, i) = blocks(t, axis)?;
        let mut same = t.shape.clone();
        same[axis] = shape[axis];
        if (o, i) != (outer, inner) || same != shape || t.dtype() != first.dtype() {
            return Err(RunError::Internal(format!(
                "cannot join {} {:?} to {} {:?} along axis {axis}",
                t.dtype(),
                t.shape,
                first.dtype(),
                first.shape
            )));
        }
        total = total
            .checked_add(len)
            .ok_or_else(|| RunError::Internal(format!("joining along axis {axis} overflows")))?;
    }
    shape[axis] = total;
    // Every part was checked: its blocks lie inside it.
    fn join<'a, T: Copy + 'a>(
        parts: &[&'a Tensor],
        axis: usize,
        outer: usize,
        inner: usize,
        pick: impl Fn(&'a TensorData) -> Option<&'a [T]>,
    ) -> Vec<T> {
        let mut out = Vec::new();
        for o in 0..outer {
            for t in parts {
                let len = t.shape[axis];
                if let Some(v) = pick(&t.data) {
                    out.extend_from_slice(&v[o * len * inner..(o + 1) * len * inner]);
                }
            }
        }
        out
    }
    let data = match &first.data {
        TensorData::F32(_) => TensorData::F32(join(parts, axis, outer, inner, |d| match d {
            TensorData::F32(v) => Some(v),
            _ => None,
        })),
        TensorData::I32(_) => TensorData::I32(join(parts, axis, outer, inner, |d| match d {
            TensorData::I32(v) => Some(v),
            _ => None,
        })),
        TensorData::Bool(_) => TensorData::Bool(join(parts, axis, outer, inner, |d| match d {
            TensorData::Bool(v) => Some(v),
            _ => None,
        })),
    };
    Ok(Tensor { shape, data })
}

/// A whole tensor as an input: borrowed where it holds floats, else copied.
fn borrow(t: &Tensor) -> Input<'_> {
    Rows::all(t).map_or_else(|| Input::Owned(t.clone()), Input::Rows)
}

/// A dataset that is one micro-batch, as inputs (float tensors borrowed).
pub fn borrow_whole(data: &Values) -> Inputs<'_> {
    data.iter()
        .map(|(name, t)| (name.clone(), borrow(t)))
        .collect()
}

/// How a dataset of `samples` samples is cut into micro-batches of `micro` samples and
/// how their outputs are joined back.
#[derive(Debug, Clone)]
pub struct Cutter {
    inputs: HashMap<String, usize>,
    outputs: Vec<(String, Option<usize>)>,
    micro: usize,
    samples: usize,
}

impl Cutter {
    /// The cutter of a graph's batch semantics. Only for graphs whose outputs keep
    /// samples independent (coupled outputs are refused before this).
    pub fn new(semantics: &BatchSemantics, micro: usize, samples: usize) -> Cutter {
        Cutter {
            inputs: semantics
                .inputs
                .iter()
                .filter_map(|(n, a)| a.map(|a| (n.clone(), a)))
                .collect(),
            outputs: semantics
                .outputs
                .iter()
                .map(|(n, b)| {
                    let axis = match b {
                        Batch::Axis { axis } => Some(*axis),
                        Batch::None | Batch::Coupled { .. } => None,
                    };
                    (n.clone(), axis)
                })
                .collect(),
            micro: micro.max(1),
            samples,
        }
    }

    /// How many micro-batches the dataset makes (the last may be partial).
    pub fn count(&self) -> usize {
        self.samples.div_ceil(self.micro).max(1)
    }

    /// The first sample of micro-batch `m` (saturating past the end).
    fn start(&self, m: usize) -> usize {
        m.saturating_mul(self.micro)
    }

    /// Samples of micro-batch `m` that are real (the rest of it is padding).
    pub fn real(&self, m: usize) -> usize {
        self.samples.saturating_sub(self.start(m)).min(self.micro)
    }

    /// Micro-batch `m`: batched inputs cut along their batch axis, a partial last one
    /// padded to `micro` samples by repeating its last sample; the other inputs whole.
    /// Float samples are borrowed from `data` where no padding is needed; everything else
    /// is copied into tensors of its own.
    pub fn cut<'d>(&self, data: &'d Values, m: usize) -> Result<Inputs<'d>, RunError> {
        let from = self.start(m);
        let real = self.real(m);
        data.iter()
            .map(|(name, t)| {
                let v = match self.inputs.get(name) {
                    Some(&axis) if real == self.micro || real == 0 => {
                        let to = from.saturating_add(self.micro);
                        match Rows::new(t, axis, from, to) {
                            Some(rows) => Input::Rows(rows),
                            None => Input::Owned(slice_axis(t, axis, from, to)?),
                        }
                    }
                    Some(&axis) => {
                        let end = from + real;
                        let part = slice_axis(t, axis, from, end)?;
                        let last = slice_axis(t, axis, end - 1, end)?;
                        let mut parts = vec![&part];
                        parts.extend(std::iter::repeat_n(&last, self.micro - real));
                        Input::Owned(concat_axis(&parts, axis)?)
                    }
                    None => borrow(t),
                };
                Ok((name.clone(), v))
            })
            .collect()
    }

    /// The graph outputs joined over micro-batches (in order), in output order: batched
    /// outputs concatenated along their batch axis with the padding trimmed, the others
    /// taken from the first micro-batch.
    pub fn join(&self, per_mb: &[Values]) -> Result<Vec<(String, Tensor)>, RunError> {
        let mut out = Vec::new();
        for (name, axis) in &self.outputs {
            let parts: Vec<&Tensor> = per_mb
                .iter()
                .map(|values| {
                    values.get(name).ok_or_else(|| {
                        RunError::Internal(format!("output '{name}' missing from a micro-batch"))
                    })
                })
                .collect::<Result<_, _>>()?;
            let Some(first) = parts.first() else {
                continue;
            };
            let joined = match axis {
                Some(axis) if *axis < first.shape.len() => {
                    let trimmed: Vec<Tensor> = parts
                        .iter()
                        .enumerate()
                        .map(|(m, t)| {
                            // A piece holds `per` rows per sample along the axis.
                            let per = t.shape.get(*axis).copied().unwrap_or(0) / self.micro;
                            slice_axis(t, *axis, 0, per.saturating_mul(self.real(m)))
                        })
                        .collect::<Result<_, _>>()?;
                    let refs: Vec<&Tensor> = trimmed.iter().collect();
                    concat_axis(&refs, *axis)?
                }
                _ => (*first).clone(),
            };
            out.push((name.clone(), joined));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_indices_and_labels_stay_inside_the_axis_they_index() {
        // Class labels of a 3-class loss, and gather indices (through a view) into a
        // table of 5 rows: seeded [0, 4) would put labels at 3, past the classes.
        let graph = crate::graph::load_graph(
            &serde_json::json!({
                "format": "sluice/graph@1",
                "name": "indices",
                "inputs": {
                    "table": { "shape": [5, 4], "dtype": "f32" },
                    "ids": { "shape": ["N", 3], "dtype": "i32" },
                    "logits": { "shape": ["N", 3], "dtype": "f32" },
                    "labels": { "shape": ["N"], "dtype": "i32" },
                    "other": { "shape": ["N"], "dtype": "i32" }
                },
                "nodes": [
                    { "id": "view", "op": "identity", "inputs": ["ids"] },
                    { "id": "rows", "op": "gather", "inputs": ["table", "view"] },
                    { "id": "loss", "op": "softmax_cross_entropy", "inputs": ["logits", "labels"] }
                ],
                "outputs": ["rows", "loss", "other"]
            })
            .to_string(),
        )
        .expect("graph");
        let ints = |v: &Values, name: &str| match &v[name].data {
            TensorData::I32(x) => x.clone(),
            other => panic!("{name}: {other:?}"),
        };
        let unbound = complete(&graph, Values::new(), 3, 256).expect("seeded");
        let bound = random_inputs(&bind(&graph, 256).expect("bound"), 3).expect("seeded");
        for data in [unbound, bound] {
            let (ids, labels) = (ints(&data, "ids"), ints(&data, "labels"));
            assert!(ids.iter().all(|&k| (0..5).contains(&k)), "{ids:?}");
            assert!(ids.contains(&4), "the whole range is used");
            assert!(labels.iter().all(|&k| (0..3).contains(&k)), "{labels:?}");
            assert!(labels.contains(&2));
            // Integers that index nothing keep their [0, 4).
            assert!(ints(&data, "other").iter().all(|&k| (0..4).contains(&k)));
        }
        assert_eq!(
            missing_inputs(&graph, &Values::new()).len(),
            5,
            "every input is missing"
        );
    }
}
