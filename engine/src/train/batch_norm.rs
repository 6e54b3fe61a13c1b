//! Batch norm in training mode, as PyTorch's `BatchNorm1d`/`BatchNorm2d` in `train()`:
//! a training step normalises with the batch's statistics, and the running ones are
//! updated on the host afterwards.
//!
//! [`training_batch_norm`] rewrites the step's (bound) graph: every `batch_norm` node
//! becomes a composition of ordinary operators — the per-channel mean and biased variance
//! over every axis but the channel axis 1 (`reduce_mean`), then
//! `(x − mean) · scale / √(var + ε) + bias` with the scale and bias read through `param`
//! nodes under the node's own keys — whose last node keeps the batch norm's id, so its consumers are unchanged. The batch
//! mean and variance become extra graph outputs. Autodiff then differentiates the
//! composition, gradients flowing through the batch statistics; the running mean and
//! variance are not read by the step, so they get no gradient and the optimiser leaves
//! them alone. After a step, [`BatchStats::update`] folds the batch statistics into the
//! running ones: `(1 − momentum)·running + momentum·batch`, the variance unbiased
//! (`n / (n − 1)`, n the values per channel). Evaluation keeps `batch_norm` itself, with
//! the running statistics.

use crate::exec::device::Values;
use crate::graph::doc::NodeDoc;
use crate::graph::Graph;
use crate::ops::norm::NormOp;
use crate::ops::Op;
use crate::shape;
use crate::tensor::{Tensor, TensorData};
use crate::weights::Weights;
use serde_json::{json, Value};
use std::collections::HashSet;

/// One batch norm of a training step: where its batch statistics come out and which
/// running statistics they update.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BatchStats {
    /// The batch norm node's id.
    pub node: String,
    /// The graph output holding the batch mean, `[C]`.
    pub mean_output: String,
    /// The graph output holding the batch's biased variance, `[C]`.
    pub var_output: String,
    /// The running mean's weight key.
    pub mean_key: String,
    /// The running variance's weight key.
    pub var_key: String,
    /// The node's momentum.
    pub momentum: f32,
    /// Values per channel in one step's batch (N times the spatial sizes).
    pub count: usize,
}

/// The bound graph `graph` with every `batch_norm` normalising with its batch's
/// statistics, and the statistics each exposes (none: the graph unchanged); or why not.
pub(crate) fn training_batch_norm(graph: &Graph) -> Result<(Graph, Vec<BatchStats>), String> {
    let mut doc = graph.doc.clone();
    let mut used: HashSet<String> = doc.inputs.keys().cloned().collect();
    used.extend(doc.nodes.iter().map(|n| n.id.clone()));
    used.extend(doc.outputs.iter().cloned());
    let mut stats = Vec::new();
    for (ix, node, op) in graph.op_nodes() {
        let Op::Norm(NormOp::BatchNorm { epsilon, momentum }) = op else {
            continue;
        };
        let refuse = |why: String| {
            format!(
                "batch norm '{}' cannot use its batch's statistics: {why}",
                node.id
            )
        };
        let x = graph
            .input_types(ix)
            .into_iter()
            .next()
            .ok_or_else(|| refuse("it has no input".into()))?;
        let dims = shape::concrete(&x.shape)
            .ok_or_else(|| refuse(format!("its input {x} is not bound to sizes")))?;
        let (c, rank) = match dims.get(1) {
            Some(&c) => (c, dims.len()),
            None => return Err(refuse(format!("its input {x} has no channel axis 1"))),
        };
        let count = dims.iter().product::<usize>() / c.max(1);
        if count < 2 {
            // PyTorch refuses too: the variance of one value is no statistic.
            return Err(refuse(format!(
                "its input {x} holds {count} value(s) per channel in a step; it needs more than one"
            )));
        }
        let Some(position) = doc.nodes.iter().position(|n| n.id == node.id) else {
            return Err(refuse("it is not in the graph's document".into()));
        };
        let input = doc.nodes[position]
            .inputs
            .first()
            .cloned()
            .ok_or_else(|| refuse("it has no input".into()))?;
        let mut b = Builder {
            base: node.id.clone(),
            used: &mut used,
            nodes: Vec::new(),
        };
        let others: Vec<usize> = (0..rank).filter(|&a| a != 1).collect();
        let mut channels = vec![c];
        channels.resize(rank - 1, 1);
        let per_channel = |b: &mut Builder, v: &str| -> String {
            if rank == 2 {
                v.to_string()
            } else {
                b.emit("channels", "reshape", json!({ "shape": channels }), &[v])
            }
        };
        let reduce = json!({ "axes": others, "keepdims": false });
        let mean = b.emit("mean", "reduce_mean", reduce.clone(), &[&input]);
        let mean_c = per_channel(&mut b, &mean);
        let centred = b.emit("centred", "sub", json!({}), &[&input, &mean_c]);
        let square = b.emit("square", "mul", json!({}), &[&centred, &centred]);
        let var = b.emit("var", "reduce_mean", reduce, &[&square]);
        let eps = b.emit(
            "epsilon",
            "constant",
            json!({ "value": [epsilon], "shape": [] }),
            &[],
        );
        let shifted = b.emit("var_epsilon", "add", json!({}), &[&var, &eps]);
        let std = b.emit("std", "sqrt", json!({}), &[&shifted]);
        let param = |b: &mut Builder, name: &str| -> String {
            let read = b.emit(
                name,
                "param",
                json!({ "key": format!("{}.{name}", node.id), "shape": [c] }),
                &[],
            );
            per_channel(b, &read)
        };
        let scale = param(&mut b, "scale");
        let bias = param(&mut b, "bias");
        let std_c = per_channel(&mut b, &std);
        let factor = b.emit("factor", "div", json!({}), &[&scale, &std_c]);
        let scaled = b.emit("scaled", "mul", json!({}), &[&centred, &factor]);
        let mut nodes = b.nodes;
        nodes.push(NodeDoc {
            id: node.id.clone(),
            op: "add".into(),
            inputs: vec![scaled, bias],
            attrs: Default::default(),
        });
        doc.nodes.splice(position..=position, nodes);
        doc.outputs.push(mean.clone());
        doc.outputs.push(var.clone());
        stats.push(BatchStats {
            node: node.id.clone(),
            mean_output: mean,
            var_output: var,
            mean_key: format!("{}.mean", node.id),
            var_key: format!("{}.var", node.id),
            momentum: *momentum,
            count,
        });
    }
    if stats.is_empty() {
        return Ok((graph.clone(), stats));
    }
    let g = Graph::build_with(doc, &graph.limits)
        .map_err(|p| format!("the step graph with batch statistics is invalid: {p}"))?;
    Ok((g, stats))
}

impl BatchStats {
    /// Folds the batch statistics of a step's `outputs` into the running mean and
    /// variance of `params`, as PyTorch does.
    pub(crate) fn update(&self, params: &mut Weights, outputs: &Values) -> Result<(), String> {
        let m = f64::from(self.momentum);
        // PyTorch's running variance is unbiased (the count is at least 2).
        let n = self.count as f64;
        let unbias = n / (n - 1.0).max(1.0);
        for (key, output, k) in [
            (&self.mean_key, &self.mean_output, 1.0),
            (&self.var_key, &self.var_output, unbias),
        ] {
            let batch = outputs
                .get(output)
                .map(Tensor::to_f32_vec)
                .ok_or_else(|| format!("the step gave no batch statistics '{output}'"))?;
            let running = match params.get_mut(key).map(|t| &mut t.data) {
                Some(TensorData::F32(v)) if v.len() == batch.len() => v,
                _ => {
                    return Err(format!(
                    "batch norm '{}': the running statistics '{key}' are not f32 of {} channels",
                    self.node,
                    batch.len()
                ))
                }
            };
            for (r, &b) in running.iter_mut().zip(&batch) {
                *r = ((1.0 - m) * f64::from(*r) + m * k * f64::from(b)) as f32;
            }
        }
        Ok(())
    }
}

/// Emits the nodes of one batch norm's composition under fresh ids.
struct Builder<'a> {
    base: String,
    used: &'a mut HashSet<String>,
    nodes: Vec<NodeDoc>,
}

impl Builder<'_> {
    /// Adds a node `op(inputs)` and returns its id (`BASE.batch_NAME`, numbered if
    /// taken).
    fn emit(&mut self, name: &str, op: &str, attrs: Value, inputs: &[&str]) -> String {
        let stem = format!("{}.batch_{name}", self.base);
        let mut id = stem.clone();
        let mut k = 1;
        while self.used.contains(&id) {
            k += 1;
            id = format!("{stem}.{k}");
        }
        self.used.insert(id.clone());
        self.nodes.push(NodeDoc {
            id: id.clone(),
            op: op.into(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            attrs: match attrs {
                Value::Object(m) => m,
                _ => Default::default(),
            },
        });
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::dataset::bind;

    fn graph(momentum: &str) -> Graph {
        crate::graph::load_graph(&format!(
            r#"{{"format": "sluice/graph@1", "inputs": {{"x": {{"shape": ["N", 3]}}}},
                "nodes": [{{"id": "bn", "op": "batch_norm", "inputs": ["x"], "attrs": {{{momentum}}}}}],
                "outputs": ["bn"]}}"#
        ))
        .unwrap()
    }

    #[test]
    fn batch_norm_becomes_a_composition_exposing_its_statistics() {
        let (g, stats) =
            training_batch_norm(&bind(&graph(r#""momentum": 0.25"#), 4).unwrap()).unwrap();
        assert_eq!(stats.len(), 1);
        let s = &stats[0];
        assert_eq!((s.count, s.momentum), (4, 0.25));
        assert_eq!(
            (s.mean_key.as_str(), s.var_key.as_str()),
            ("bn.mean", "bn.var")
        );
        let outputs: Vec<&str> = g.outputs.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(outputs, ["bn", "bn.batch_mean", "bn.batch_var"]);
        assert!(g.op_nodes().all(|(_, _, op)| op.name() != "batch_norm"));
        // One value per channel has no variance: refused, as PyTorch does.
        let e = training_batch_norm(&bind(&graph(""), 1).unwrap()).unwrap_err();
        assert!(e.to_string().contains("batch norm 'bn'"), "{e}");
    }

    #[test]
    fn running_statistics_move_by_the_momentum_with_the_unbiased_variance() {
        let stats = BatchStats {
            node: "bn".into(),
            mean_output: "m".into(),
            var_output: "v".into(),
            mean_key: "bn.mean".into(),
            var_key: "bn.var".into(),
            momentum: 0.5,
            count: 4,
        };
        let mut params = Weights::from([
            ("bn.mean".to_string(), Tensor::f32(vec![1], vec![1.0])),
            ("bn.var".to_string(), Tensor::f32(vec![1], vec![1.0])),
        ]);
        let outputs = Values::from([
            ("m".to_string(), Tensor::f32(vec![1], vec![3.0])),
            ("v".to_string(), Tensor::f32(vec![1], vec![3.0])),
        ]);
        stats.update(&mut params, &outputs).unwrap();
        assert_eq!(params["bn.mean"].to_f32_vec(), [2.0]);
        assert_eq!(params["bn.var"].to_f32_vec(), [0.5 + 0.5 * 4.0]);
        assert!(stats.update(&mut params, &Values::new()).is_err());
    }
}
