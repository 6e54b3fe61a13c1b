//! What a run may ask for: the limits themselves (defined with the graph checks in
//! `crate::graph::limits` and re-exported here), a run's [`Footprint`] — the bytes its
//! weights, dataset and activations need, computed with checked arithmetic from the
//! inferred shapes — and the check of a dataset's inputs before they are generated or
//! read, and of a run's weights against the largest buffer its devices bind before they
//! are generated or read. The one place the CLI, the server, workers and the editor take
//! them from; `exec::check_run` compares a run configuration's footprint with them.

use crate::error::{LimitError, RunError};
use crate::graph::{Graph, NodeKind};
use crate::ops::TensorType;
use crate::shape::Dim;
use petgraph::stable_graph::NodeIndex;
use std::collections::HashMap;

pub use crate::graph::check::check_document;
pub use crate::graph::limits::{
    Limit, Limits, MAX_BATCH, MAX_MICROBATCHES, MAX_PREFETCH, MAX_STAGES,
};

/// Bytes per element on the host and, at most, on a device (every dtype is stored in
/// 32 bits; 16-bit storages only ever need less).
const ELEMENT_BYTES: u64 = 4;

/// What a run needs, in bytes (and the largest tensor, in elements), before anything is
/// allocated. Device figures assume 32-bit storage and no buffer sharing beyond what
/// liveness allows, so the plan's real figures are at most these.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Footprint {
    /// Weights and constants.
    pub weight_bytes: u64,
    /// The dataset's inputs, every sample.
    pub input_bytes: u64,
    /// The dataset's outputs, every sample.
    pub output_bytes: u64,
    /// One micro-batch's inputs.
    pub micro_input_bytes: u64,
    /// One micro-batch's outputs.
    pub micro_output_bytes: u64,
    /// The most bytes of values computed by operators that are alive at once during one
    /// micro-batch (views share their source's bytes).
    pub activation_bytes: u64,
    /// Every device of the run together: weights, the inputs of the micro-batches in
    /// flight, and the activations.
    pub device_bytes: u64,
    /// The host: weights, the dataset's inputs, its outputs twice (per micro-batch and
    /// joined), and the inputs and outputs of the micro-batches in flight.
    pub host_bytes: u64,
    /// The largest tensor: its name and elements (inputs and outputs with every sample,
    /// other values with one micro-batch's).
    pub largest: (String, u64),
}

/// Notes a tensor's elements (`None`: uncountable) under its name, returning them.
type Consider<'a> = dyn FnMut(&str, Option<u64>) -> Result<u64, LimitError> + 'a;

/// Elements of a type with every symbol bound to `n` (`None` on overflow).
fn elements(t: &TensorType, n: u64) -> Option<u64> {
    t.shape.iter().try_fold(1u64, |acc, d| match d {
        Dim::Known(k) => acc.checked_mul(u64::try_from(*k).ok()?),
        Dim::Sym(s) => s.split('*').try_fold(acc, |a, f| match f.parse::<u64>() {
            Ok(k) => a.checked_mul(k),
            Err(_) => a.checked_mul(n),
        }),
    })
}

/// Bytes of `count` elements, checked.
fn bytes(count: u64) -> Option<u64> {
    count.checked_mul(ELEMENT_BYTES)
}

/// A sum that may already have overflowed.
fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    a?.checked_add(b?)
}

/// `a × b` where `a` may already have overflowed.
fn times(a: Option<u64>, b: usize) -> Option<u64> {
    a?.checked_mul(u64::try_from(b).ok()?)
}

/// The footprint of running `graph` (bound or not: every symbol is bound to the
/// sizes given) on a dataset of `samples` samples in micro-batches of `micro`, with up
/// to `in_flight` micro-batches started and not yet finished. Linear in the graph.
/// Errors name the limit a figure overflows (it is then over it by far).
pub fn footprint(
    graph: &Graph,
    samples: usize,
    micro: usize,
    in_flight: usize,
) -> Result<Footprint, LimitError> {
    let limits = &graph.limits;
    let wide = |v: usize| u64::try_from(v).ok();
    let (n, m) = (wide(samples), wide(micro));
    let overflow = |limit: Limit, what: String, unit| limits.error(limit, what, unit, None);
    let mut largest = (String::new(), 0u64);
    let mut consider = |name: &str, count: Option<u64>| -> Result<u64, LimitError> {
        let c = count
            .ok_or_else(|| overflow(Limit::MaxTensorElements, format!("'{name}'"), "elements"))?;
        if c > largest.1 {
            largest = (name.to_string(), c);
        }
        Ok(c)
    };
    let (mut input, mut micro_input) = (Some(0u64), Some(0u64));
    for (name, ix) in &graph.inputs {
        let Some(t) = graph.dag[*ix].outputs.first() else {
            continue;
        };
        let all = consider(name, n.and_then(|n| elements(t, n)))?;
        input = add(input, bytes(all));
        micro_input = add(micro_input, m.and_then(|m| elements(t, m)).and_then(bytes));
    }
    let (mut output, mut micro_output) = (Some(0u64), Some(0u64));
    for o in &graph.outputs {
        let Some(t) = graph.dag[o.node].outputs.get(o.port) else {
            continue;
        };
        let all = consider(&o.name, n.and_then(|n| elements(t, n)))?;
        output = add(output, bytes(all));
        micro_output = add(micro_output, m.and_then(|m| elements(t, m)).and_then(bytes));
    }
    // Weights and constants.
    let mut weights = Some(0u64);
    let mut keys = std::collections::HashSet::new();
    for (_, node, op) in graph.op_nodes() {
        for p in &node.params {
            let key = node.param_key(p);
            if !keys.insert(key.clone()) {
                continue;
            }
            let count = p
                .shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(wide(d)?));
            weights = add(weights, bytes(consider(&key, count)?));
        }
        if let Some(c) = op.constant_value() {
            weights = add(weights, bytes(consider(&node.id, wide(c.len()))?));
        }
    }
    let activations = peak_activations(graph, m, &mut consider)?;
    let over = |what: &str, v: Option<u64>, limit| {
        v.ok_or_else(|| overflow(limit, what.to_string(), "bytes"))
    };
    let host = Limit::MaxHostBytes;
    let device = Limit::MaxDeviceBytes;
    let weight_bytes = over("the graph's weights", weights, host)?;
    let input_bytes = over("the dataset's inputs", input, host)?;
    let output_bytes = over("the dataset's outputs", output, host)?;
    let micro_input_bytes = over("a micro-batch's inputs", micro_input, device)?;
    let micro_output_bytes = over("a micro-batch's outputs", micro_output, host)?;
    let device_bytes = add(
        add(
            Some(weight_bytes),
            times(Some(micro_input_bytes), in_flight),
        ),
        Some(activations),
    );
    let in_flight_bytes = times(
        Some(micro_input_bytes).and_then(|i| i.checked_add(micro_output_bytes)),
        in_flight,
    );
    let host_bytes = add(
        add(Some(weight_bytes), Some(input_bytes)),
        add(times(Some(output_bytes), 2), in_flight_bytes),
    );
    Ok(Footprint {
        weight_bytes,
        input_bytes,
        output_bytes,
        micro_input_bytes,
        micro_output_bytes,
        activation_bytes: activations,
        device_bytes: over("the run's device memory", device_bytes, device)?,
        host_bytes: over("the run's host memory", host_bytes, host)?,
        largest,
    })
}

/// The most bytes of operator-computed values alive at once in one micro-batch of `m`
/// samples: values are born at their node (in topological order) and die after their
/// last reader (graph outputs live to the end); views and constants take no bytes of
/// their own.
fn peak_activations(
    graph: &Graph,
    m: Option<u64>,
    consider: &mut Consider<'_>,
) -> Result<u64, LimitError> {
    let end = graph.order.len();
    let mut last: HashMap<(NodeIndex, usize), usize> = HashMap::new();
    for (i, &ix) in graph.order.iter().enumerate() {
        for src in graph.node_inputs(ix) {
            let e = last.entry(src).or_insert(i);
            *e = (*e).max(i);
        }
    }
    for o in &graph.outputs {
        last.insert((o.node, o.port), end);
    }
    // A view keeps its source alive as long as itself (views of views too: later views
    // come first in reverse order).
    let view = |ix: NodeIndex| match &graph.dag[ix].kind {
        NodeKind::Op(op) => op.capabilities().view,
        NodeKind::Input => false,
    };
    for &ix in graph.order.iter().rev() {
        if !view(ix) {
            continue;
        }
        let until = last.get(&(ix, 0)).copied();
        if let (Some(until), Some(&src)) = (until, graph.node_inputs(ix).first()) {
            let e = last.entry(src).or_insert(until);
            *e = (*e).max(until);
        }
    }
    // Bytes freed after each position.
    let mut freed: Vec<u64> = vec![0; end + 1];
    let (mut live, mut peak) = (0u64, 0u64);
    let overflow = || {
        graph.limits.error(
            Limit::MaxDeviceBytes,
            "the activations of a micro-batch",
            "bytes",
            None,
        )
    };
    for (i, &ix) in graph.order.iter().enumerate() {
        let node = &graph.dag[ix];
        let owns = match &node.kind {
            NodeKind::Op(op) => !view(ix) && op.constant_value().is_none(),
            NodeKind::Input => false,
        };
        if owns {
            for (port, t) in node.outputs.iter().enumerate() {
                let name = if port == 0 {
                    node.id.clone()
                } else {
                    format!("{}:{port}", node.id)
                };
                let b =
                    bytes(consider(&name, m.and_then(|m| elements(t, m)))?).ok_or_else(overflow)?;
                live = live.checked_add(b).ok_or_else(overflow)?;
                let dies = last.get(&(ix, port)).copied().unwrap_or(i).min(end);
                freed[dies] = freed[dies].saturating_add(b);
            }
        }
        peak = peak.max(live);
        live = live.saturating_sub(freed[i]);
    }
    Ok(peak)
}

/// Checks a dataset of `samples` samples of `graph`'s inputs (symbols bound to
/// `samples`; a bound graph's inputs as they are) against `limits` before it is
/// generated or read: every input's elements, and their bytes together on the host.
pub fn check_dataset(graph: &Graph, samples: usize, limits: &Limits) -> Result<(), RunError> {
    let n = u64::try_from(samples).ok();
    let mut total = Some(0u64);
    for (name, decl) in &graph.doc.inputs {
        let t = TensorType {
            shape: decl.shape.clone(),
            dtype: decl.dtype,
        };
        let count = n.and_then(|n| elements(&t, n));
        limits.check(
            Limit::MaxTensorElements,
            format!("input '{name}' with {samples} samples"),
            "elements",
            count,
        )?;
        total = add(total, count.and_then(bytes));
    }
    limits.check(
        Limit::MaxHostBytes,
        format!("the inputs of {samples} samples"),
        "bytes",
        total,
    )?;
    Ok(())
}

/// The largest buffer a device can bind, as the device reports it (a GPU: the smaller of
/// its maximum buffer size and maximum storage binding size), and which limit that is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferLimit {
    /// Bytes.
    pub bytes: u64,
    /// Which of the device's limits it is (`maximum storage binding size`).
    pub what: &'static str,
}

/// Checks every weight of `graph` against the largest buffer the run's devices bind,
/// before any weight is generated or read: a weight is one buffer on the device of its
/// stage, of at least `element_bytes` bytes an element (4 in f32 storage, 2 in 16-bit
/// storage). `devices` holds one entry per device, `None` for a device without a buffer
/// limit of its own (the CPU), where the run's limits alone bound a weight ([`footprint`]).
/// A weight is refused when no device could hold it (the stage it lands on is chosen
/// later, and each stage's plan is checked again when compiled). The error names the
/// weight, its bytes and the device's limit.
pub fn check_weights_fit(
    graph: &Graph,
    element_bytes: u64,
    devices: &[Option<BufferLimit>],
) -> Result<(), RunError> {
    let mut largest: Option<BufferLimit> = None;
    for device in devices {
        match device {
            None => return Ok(()),
            Some(d) if largest.is_none_or(|l| d.bytes > l.bytes) => largest = Some(*d),
            Some(_) => {}
        }
    }
    let Some(limit) = largest else {
        return Ok(());
    };
    let mut keys = std::collections::HashSet::new();
    for (_, node, _) in graph.op_nodes() {
        for p in &node.params {
            let key = node.param_key(p);
            if !keys.insert(key.clone()) {
                continue;
            }
            let needed = p
                .shape
                .iter()
                .try_fold(element_bytes, |a, &d| a.checked_mul(u64::try_from(d).ok()?));
            if needed.is_none_or(|b| b > limit.bytes) {
                return Err(RunError::TooLarge {
                    value: key,
                    bytes: needed.unwrap_or(u64::MAX),
                    limit: limit.bytes,
                    what: limit.what,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::load_graph;

    fn mlp() -> Graph {
        load_graph(
            r#"{ "format": "sluice/graph@1",
                 "inputs": { "x": { "shape": ["N", 8] } },
                 "nodes": [
                   { "id": "fc", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 4 } },
                   { "id": "r", "op": "reshape", "inputs": ["fc"], "attrs": { "shape": [-1, 2] } },
                   { "id": "act", "op": "relu", "inputs": ["r"] }
                 ],
                 "outputs": ["act"] }"#,
        )
        .unwrap()
    }

    #[test]
    fn footprints_count_weights_data_and_live_activations() {
        let f = footprint(&mlp(), 10, 2, 3).unwrap();
        assert_eq!(f.weight_bytes, 4 * (8 * 4 + 4));
        assert_eq!(f.input_bytes, 4 * 10 * 8);
        assert_eq!(f.output_bytes, 4 * 10 * 4);
        assert_eq!(f.micro_input_bytes, 4 * 2 * 8);
        // fc (2×4 floats) and act (4×2 floats) are alive together; the reshape is a view.
        assert_eq!(f.activation_bytes, 4 * 16);
        assert_eq!(
            f.device_bytes,
            f.weight_bytes + 3 * f.micro_input_bytes + 4 * 16
        );
        assert_eq!(f.largest, ("x".to_string(), 80));
    }

    #[test]
    fn datasets_are_refused_before_they_exist() {
        let g = mlp();
        assert!(check_dataset(&g, 1000, &Limits::default()).is_ok());
        let e = check_dataset(&g, 1 << 26, &Limits::default()).unwrap_err();
        assert!(e.to_string().contains("max_tensor_elements"), "{e}");
        let e = check_dataset(&g, usize::MAX, &Limits::default()).unwrap_err();
        assert!(e.to_string().contains("than can be counted"), "{e}");
        assert!(footprint(&g, usize::MAX, 1, 1).is_err());
    }

    #[test]
    fn weights_are_sized_against_the_largest_device_buffer() {
        let g = mlp();
        // fc.weight is [8, 4]: 128 bytes in f32, 64 in 16-bit storage.
        let buffer = |bytes| {
            Some(BufferLimit {
                bytes,
                what: "maximum storage binding size",
            })
        };
        assert!(check_weights_fit(&g, 4, &[buffer(128)]).is_ok());
        let e = check_weights_fit(&g, 4, &[buffer(127)]).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("tensor 'fc.weight'"), "{text}");
        assert!(text.contains("128 bytes"), "{text}");
        assert!(
            text.contains("maximum storage binding size of 127"),
            "{text}"
        );
        assert!(check_weights_fit(&g, 2, &[buffer(64)]).is_ok());
        // Any device that could hold it, or one without a buffer limit (the CPU).
        assert!(check_weights_fit(&g, 4, &[buffer(64), buffer(128)]).is_ok());
        assert!(check_weights_fit(&g, 4, &[buffer(64), None]).is_ok());
        assert!(check_weights_fit(&g, 4, &[]).is_ok());
    }
}
