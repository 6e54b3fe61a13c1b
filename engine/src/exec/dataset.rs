//! Datasets: binding the batch, seeded inputs, checking inputs, and cutting a dataset
//! into micro-batches along each input's batch axis (the last one padded by repeating its
//! last sample) and joining the outputs back along each output's batch axis (the padding
//! trimmed). Cutting is only ever applied where the graph's batch semantics say samples
//! stay independent (see [`super::config::check_batching`]).

use super::device::Values;
use crate::dtype::DType;
use crate::error::RunError;
use crate::graph::{Batch, BatchSemantics, Graph};
use crate::plan::Plan;
use crate::rng::Rng;
use crate::shape;
use crate::tensor::{Tensor, TensorData};
use std::collections::HashMap;

/// The graph with every symbolic dimension bound to `n` samples.
pub fn bind(graph: &Graph, n: usize) -> Result<Graph, RunError> {
    let bindings: HashMap<String, usize> = graph.symbols().into_iter().map(|s| (s, n)).collect();
    graph.bind(&bindings).map_err(|p| RunError::Input {
        name: "batch".into(),
        message: format!("with {n} samples: {p}"),
    })
}

/// Seeded random inputs for a bound graph: floats uniform in [-1, 1), integers in [0, 4),
/// booleans fair. The same graph, batch and seed give the same values everywhere
/// (browsers included).
pub fn random_inputs(graph: &Graph, seed: u64) -> Result<Values, RunError> {
    random_inputs_except(graph, seed, &Values::new())
}

/// [`random_inputs`] for the inputs `given` lacks.
fn random_inputs_except(graph: &Graph, seed: u64, given: &Values) -> Result<Values, RunError> {
    let mut out = HashMap::new();
    for (name, ix) in graph.inputs.iter().filter(|(n, _)| !given.contains_key(n)) {
        let ty = &graph.dag[*ix].outputs[0];
        let dims = shape::concrete(&ty.shape).ok_or_else(|| RunError::Unbound(name.clone()))?;
        let n = shape::numel(&dims);
        let mut rng = Rng::for_name(seed, name);
        let data = match ty.dtype {
            DType::F32 => TensorData::F32((0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()),
            DType::I32 => TensorData::I32((0..n).map(|_| rng.below(4) as i32).collect()),
            DType::Bool => TensorData::Bool((0..n).map(|_| rng.below(2) == 1).collect()),
        };
        out.insert(name.clone(), Tensor { shape: dims, data });
    }
    Ok(out)
}

/// The dataset of a run without uploaded inputs: `batch` samples of seeded random inputs.
pub fn seeded(graph: &Graph, batch: usize, seed: u64) -> Result<Values, RunError> {
    random_inputs(&bind(graph, batch)?, seed)
}

/// A run's dataset: the `given` inputs, and seeded random values for every other input,
/// with as many samples as the given batched inputs hold (`default_samples` when none
/// is given), all checked against the graph bound to that many samples.
pub fn complete(
    graph: &Graph,
    given: Values,
    seed: u64,
    default_samples: usize,
) -> Result<Values, RunError> {
    let semantics = graph.batch_semantics();
    let n = samples(&semantics, &given)?.unwrap_or(default_samples);
    if n == 0 {
        return Err(RunError::Input {
            name: "dataset".into(),
            message: "the inputs hold no samples".into(),
        });
    }
    let bound = bind(graph, n)?;
    let mut all = random_inputs_except(&bound, seed, &given)?;
    all.extend(given);
    check_inputs(&bound, &all)?;
    Ok(all)
}

/// Checks that `inputs` provides every graph input of a bound graph with its declared
/// dtype and shape, and nothing else.
pub fn check_inputs(graph: &Graph, inputs: &Values) -> Result<(), RunError> {
    for name in inputs.keys() {
        if graph.input_type(name).is_none() {
            let known: Vec<&str> = graph.inputs.iter().map(|(n, _)| n.as_str()).collect();
            return Err(RunError::Input {
                name: name.clone(),
                message: format!("the graph has no such input (inputs: {})", known.join(", ")),
            });
        }
    }
    for (name, ix) in &graph.inputs {
        let ty = &graph.dag[*ix].outputs[0];
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
    }
    Ok(())
}

/// Checks that `inputs` holds every input of a plan with its dtype and shape, and that
/// index inputs are in range (what every executable checks before it starts a
/// micro-batch).
pub fn check_plan_inputs(plan: &Plan, inputs: &Values) -> Result<(), RunError> {
    for (name, v) in &plan.inputs {
        let t = inputs.get(name).ok_or_else(|| RunError::Input {
            name: name.clone(),
            message: "missing".into(),
        })?;
        let value = &plan.values[*v];
        if t.shape != value.shape || t.dtype() != value.dtype {
            return Err(RunError::Input {
                name: name.clone(),
                message: format!(
                    "has {} {:?} but the plan expects {} {:?}",
                    t.dtype(),
                    t.shape,
                    value.dtype,
                    value.shape
                ),
            });
        }
    }
    for check in &plan.index_checks {
        let Some(TensorData::I32(idx)) = inputs.get(&check.input).map(|t| &t.data) else {
            continue;
        };
        let len = check.axis_len as i64;
        if let Some(bad) = idx
            .iter()
            .find(|&&k| i64::from(k) < -len || i64::from(k) >= len)
        {
            return Err(RunError::Input {
                name: check.input.clone(),
                message: format!(
                    "index {bad} is out of range for axis length {len} of '{}'",
                    check.node
                ),
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

/// Elements [from, to) of `t` along `axis`, as a tensor.
pub fn slice_axis(t: &Tensor, axis: usize, from: usize, to: usize) -> Tensor {
    let outer: usize = t.shape[..axis].iter().product();
    let len = t.shape[axis];
    let inner: usize = t.shape[axis + 1..].iter().product();
    let (from, to) = (from.min(len), to.min(len).max(from.min(len)));
    let mut shape = t.shape.clone();
    shape[axis] = to - from;
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
    Tensor { shape, data }
}

/// Tensors of one dtype joined along `axis` (their other dimensions equal).
pub fn concat_axis(parts: &[&Tensor], axis: usize) -> Tensor {
    let Some(first) = parts.first() else {
        return Tensor::f32(vec![0], Vec::new());
    };
    let outer: usize = first.shape[..axis].iter().product();
    let inner: usize = first.shape[axis + 1..].iter().product();
    let mut shape = first.shape.clone();
    shape[axis] = parts.iter().map(|t| t.shape[axis]).sum();
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
    Tensor { shape, data }
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

    /// Samples of micro-batch `m` that are real (the rest of it is padding).
    pub fn real(&self, m: usize) -> usize {
        self.samples.saturating_sub(m * self.micro).min(self.micro)
    }

    /// Micro-batch `m`: batched inputs cut along their batch axis, a partial last one
    /// padded to `micro` samples by repeating its last sample; the other inputs whole.
    pub fn cut(&self, data: &Values, m: usize) -> Values {
        let from = m * self.micro;
        let real = self.real(m);
        data.iter()
            .map(|(name, t)| {
                let v = match self.inputs.get(name) {
                    Some(&axis) if real == self.micro || real == 0 => {
                        slice_axis(t, axis, from, from + self.micro)
                    }
                    Some(&axis) => {
                        let part = slice_axis(t, axis, from, from + real);
                        let last = slice_axis(t, axis, from + real - 1, from + real);
                        let mut parts = vec![&part];
                        parts.extend(std::iter::repeat_n(&last, self.micro - real));
                        concat_axis(&parts, axis)
                    }
                    None => t.clone(),
                };
                (name.clone(), v)
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
                            let per = t.shape[*axis] / self.micro;
                            slice_axis(t, *axis, 0, per * self.real(m))
                        })
                        .collect();
                    let refs: Vec<&Tensor> = trimmed.iter().collect();
                    concat_axis(&refs, *axis)
                }
                _ => (*first).clone(),
            };
            out.push((name.clone(), joined));
        }
        Ok(out)
    }
}
