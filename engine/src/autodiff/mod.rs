//! Reverse-mode autodiff as a graph transform: from a bound graph and its loss, the joint
//! forward + backward graph, an ordinary `sluice/graph@1` document (so it goes through
//! every check, plans with fusion and memory planning, and runs on every device).
//!
//! Each operator declares its gradient rule next to its forward definition (`fn grad` in
//! its `ops/` family file, over [`GradContext`]); this module drives them: it finds the
//! values on a path from something differentiated (a weight, or a graph input asked for)
//! to the loss, walks those nodes in reverse topological order giving each rule the
//! gradients reaching its outputs (summed with `add` when several consumers contribute),
//! and collects the gradients of weights (by key) and inputs as extra outputs. Only f32
//! values carry gradients: integer and bool values end a path. A node on a path whose
//! operator has no rule for what it is asked is refused, naming the node and the operator.
//! Backward nodes read forward weights through `param` nodes, keyed as the forward node's.

use crate::dtype::DType;
use crate::graph::doc::{GraphDoc, NodeDoc};
use crate::graph::{Graph, NodeKind, Problems};
use crate::ops::backward::{Composite, GradContext, Ref};
use crate::ops::{self, TensorType};
use crate::shape;
use petgraph::stable_graph::NodeIndex;
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};

/// Why a joint graph could not be built.
#[derive(Debug, thiserror::Error)]
pub enum AutodiffError {
    /// The loss names no graph output.
    #[error("the loss '{0}' is not an output of the graph (outputs: {1})")]
    NoLoss(String, String),
    /// The loss is not one f32 element.
    #[error("the loss '{0}' must be an f32 scalar (one element), got {1}")]
    NotScalar(String, String),
    /// An input asked for is not an f32 graph input.
    #[error("cannot differentiate with respect to '{0}': it is not an f32 graph input")]
    BadInput(String),
    /// A graph input has symbolic dimensions.
    #[error("backward needs concrete shapes, but input '{0}' is {1}: bind the graph first")]
    Unbound(String, String),
    /// A node on a path to the loss has no gradient.
    #[error("node '{node}' ({op}) is on a path from a parameter to the loss but has no gradient: {reason}")]
    NoGradient {
        /// The node.
        node: String,
        /// Its operator.
        op: String,
        /// Why (the rule's message).
        reason: String,
    },
    /// The joint document did not build (a limit, or a rule's mistake).
    #[error("the joint graph is invalid: {0}")]
    Joint(Problems),
}

/// One gradient output of a joint graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gradient {
    /// The weight's key (`fc1.weight`) or the graph input's name.
    pub of: String,
    /// The output holding its gradient (`fc1.weight.grad`).
    pub output: String,
}

/// What a backward node was emitted for: where it belongs when the joint graph is cut
/// into pipeline stages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The gradient rule of this forward node (or the sum of the gradients reaching its
    /// outputs).
    Node(String),
    /// This weight: reading it in the backward pass, or summing its gradient.
    Weight(String),
    /// This graph input's gradient.
    Input(String),
    /// The seed: the gradient of the loss with respect to itself.
    Loss,
}

impl Origin {
    /// The base of the ids of the nodes emitted for it.
    fn base(&self) -> &str {
        match self {
            Origin::Node(s) | Origin::Weight(s) | Origin::Input(s) => s,
            Origin::Loss => "loss",
        }
    }
}

/// A joint forward + backward graph.
#[derive(Debug, Clone)]
pub struct Joint {
    /// The document: the forward graph's outputs, then one output per gradient.
    pub doc: GraphDoc,
    /// The document, built.
    pub graph: Graph,
    /// Gradients of the weights, in the order the forward graph declares them.
    pub params: Vec<Gradient>,
    /// Gradients of the graph inputs asked for, in the order asked.
    pub inputs: Vec<Gradient>,
    /// What each backward node (by id) was emitted for; forward nodes are not in it.
    pub origins: HashMap<String, Origin>,
}

/// The joint graph of `graph` (bound: every shape concrete) differentiating output `loss`
/// with respect to every weight on a path to it.
pub fn backward(graph: &Graph, loss: &str) -> Result<Joint, AutodiffError> {
    backward_wrt(graph, loss, &[])
}

/// [`backward`], differentiating with respect to the graph inputs `wrt` too.
pub fn backward_wrt(graph: &Graph, loss: &str, wrt: &[&str]) -> Result<Joint, AutodiffError> {
    for (name, ix) in &graph.inputs {
        let t = &graph.dag[*ix].outputs[0];
        if shape::concrete(&t.shape).is_none() {
            return Err(AutodiffError::Unbound(name.clone(), t.to_string()));
        }
    }
    let out = graph
        .outputs
        .iter()
        .find(|o| o.name == loss)
        .ok_or_else(|| {
            let names: Vec<&str> = graph.outputs.iter().map(|o| o.name.as_str()).collect();
            AutodiffError::NoLoss(loss.to_string(), names.join(", "))
        })?;
    let loss_value = (out.node, out.port);
    let loss_type = graph.dag[out.node]
        .outputs
        .get(out.port)
        .ok_or_else(|| AutodiffError::NoLoss(loss.to_string(), "(untyped)".into()))?;
    let loss_shape = shape::concrete(&loss_type.shape)
        .filter(|s| loss_type.dtype == DType::F32 && s.iter().product::<usize>() == 1)
        .ok_or_else(|| AutodiffError::NotScalar(loss.to_string(), loss_type.to_string()))?;
    let mut wrt_nodes = Vec::new();
    for &name in wrt {
        match graph.inputs.iter().find(|(n, _)| n == name) {
            Some((_, ix)) if graph.dag[*ix].outputs[0].dtype == DType::F32 => {
                wrt_nodes.push((name.to_string(), *ix))
            }
            _ => return Err(AutodiffError::BadInput(name.to_string())),
        }
    }
    let flows = flowing(graph, loss_value, &wrt_nodes);

    let mut state = State::new(graph);
    let seed = state.emit(
        &Origin::Loss,
        "constant",
        json!({ "value": [1.0], "shape": loss_shape }),
        &[],
    );
    let seed = seed.map_err(|reason| AutodiffError::NoGradient {
        node: loss.to_string(),
        op: "constant".into(),
        reason,
    })?;
    state.grads.entry(loss_value).or_default().push(seed);
    for &ix in graph.order.iter().rev() {
        let node = &graph.dag[ix];
        let NodeKind::Op(op) = &node.kind else {
            continue;
        };
        if !(0..node.outputs.len()).any(|p| flows.contains(&(ix, p))) {
            continue;
        }
        let refuse = |reason: String| AutodiffError::NoGradient {
            node: node.id.clone(),
            op: op.name().to_string(),
            reason,
        };
        let mut out_grads = Vec::new();
        for p in 0..node.outputs.len() {
            out_grads.push(
                state
                    .total(&Origin::Node(node.id.clone()), (ix, p))
                    .map_err(refuse)?,
            );
        }
        let mut ctx = NodeContext {
            state: &mut state,
            flows: &flows,
            ix,
            out_grads,
        };
        op.grad(&mut ctx).map_err(refuse)?;
    }

    let mut doc = graph.doc.clone();
    let mut params = Vec::new();
    let mut seen = HashSet::new();
    for (key, _) in crate::weights::param_specs(graph) {
        if !seen.insert(key.clone()) {
            continue;
        }
        if let Some(output) =
            state
                .finish_param(&key)
                .map_err(|reason| AutodiffError::NoGradient {
                    node: key.clone(),
                    op: "param".into(),
                    reason,
                })?
        {
            params.push(Gradient { of: key, output });
        }
    }
    let mut inputs = Vec::new();
    for (name, ix) in &wrt_nodes {
        let origin = Origin::Input(name.clone());
        let total = state.total(&origin, (*ix, 0));
        let total = total.and_then(|t| match t {
            Some(t) => state.rename(&origin, &t).map(Some),
            None => Ok(None),
        });
        let total = total.map_err(|reason| AutodiffError::NoGradient {
            node: name.clone(),
            op: "input".into(),
            reason,
        })?;
        if let Some(output) = total {
            inputs.push(Gradient {
                of: name.clone(),
                output,
            });
        }
    }
    doc.nodes.extend(state.nodes);
    doc.outputs
        .extend(params.iter().chain(&inputs).map(|g| g.output.clone()));
    let joint = Graph::build_with(doc.clone(), &graph.limits).map_err(AutodiffError::Joint)?;
    Ok(Joint {
        doc,
        graph: joint,
        params,
        inputs,
        origins: state.origins,
    })
}

/// The f32 values a gradient flows through: those depending on a weight or on an input in
/// `wrt` and from which the loss depends.
fn flowing(
    graph: &Graph,
    loss: (NodeIndex, usize),
    wrt: &[(String, NodeIndex)],
) -> HashSet<(NodeIndex, usize)> {
    let mut depends: HashSet<(NodeIndex, usize)> = HashSet::new();
    for &ix in &graph.order {
        let node = &graph.dag[ix];
        let source = match &node.kind {
            NodeKind::Input => wrt.iter().any(|(_, w)| *w == ix),
            NodeKind::Op(_) => {
                !node.params.is_empty() || graph.node_inputs(ix).iter().any(|v| depends.contains(v))
            }
        };
        for (p, t) in node.outputs.iter().enumerate() {
            if source && t.dtype == DType::F32 {
                depends.insert((ix, p));
            }
        }
    }
    let mut flows = HashSet::new();
    for &ix in graph.order.iter().rev() {
        for p in 0..graph.dag[ix].outputs.len() {
            if !depends.contains(&(ix, p)) {
                continue;
            }
            let reaches = (ix, p) == loss
                || graph
                    .dag
                    .edges_directed(ix, Direction::Outgoing)
                    .filter(|e| e.weight().from_port == p)
                    .any(|e| {
                        let c = e.target();
                        (0..graph.dag[c].outputs.len()).any(|q| flows.contains(&(c, q)))
                    });
            if reaches {
                flows.insert((ix, p));
            }
        }
    }
    flows
}

/// The reference of a value in the forward document.
fn reference(graph: &Graph, (ix, port): (NodeIndex, usize)) -> Ref {
    let id = &graph.dag[ix].id;
    if port == 0 {
        id.clone()
    } else {
        format!("{id}:{port}")
    }
}

/// The backward nodes emitted so far and what is known of every value.
struct State<'g> {
    graph: &'g Graph,
    nodes: Vec<NodeDoc>,
    used: HashSet<String>,
    types: HashMap<Ref, TensorType>,
    counter: usize,
    /// Gradient contributions per forward value.
    grads: HashMap<(NodeIndex, usize), Vec<Ref>>,
    /// Gradient contributions per weight key, with the weight's shape.
    param_grads: HashMap<String, Vec<Ref>>,
    /// `param` nodes reading a weight, by key.
    param_reads: HashMap<String, Ref>,
    /// What each emitted node was emitted for.
    origins: HashMap<String, Origin>,
}

impl<'g> State<'g> {
    fn new(graph: &'g Graph) -> Self {
        let mut used: HashSet<String> = graph.doc.inputs.keys().cloned().collect();
        used.extend(graph.doc.nodes.iter().map(|n| n.id.clone()));
        let mut types = HashMap::new();
        for &ix in &graph.order {
            for (p, t) in graph.dag[ix].outputs.iter().enumerate() {
                types.insert(reference(graph, (ix, p)), t.clone());
            }
        }
        State {
            graph,
            nodes: Vec::new(),
            used,
            types,
            counter: 0,
            grads: HashMap::new(),
            param_grads: HashMap::new(),
            param_reads: HashMap::new(),
            origins: HashMap::new(),
        }
    }

    /// An id not yet used, `base` when free.
    fn fresh(&mut self, base: &str) -> String {
        let mut id = base.to_string();
        while self.used.contains(&id) {
            self.counter += 1;
            id = format!("{base}.{}", self.counter);
        }
        self.used.insert(id.clone());
        id
    }

    /// Adds a node (its operator parsed and its type inferred at once, so that a rule's
    /// mistake is found here, naming it) and returns its output.
    fn emit(
        &mut self,
        owner: &Origin,
        op: &str,
        attrs: Value,
        inputs: &[&str],
    ) -> Result<Ref, String> {
        let attrs = match attrs {
            Value::Object(m) => m,
            _ => return Err(format!("internal: attributes of '{op}' are not an object")),
        };
        let parsed = ops::parse(op, &attrs).map_err(|problems| {
            let shown: Vec<String> = problems.iter().map(|(a, m)| format!("{a}: {m}")).collect();
            format!("internal: backward '{op}': {}", shown.join("; "))
        })?;
        let types: Vec<TensorType> = inputs
            .iter()
            .map(|r| {
                self.types
                    .get(*r)
                    .cloned()
                    .ok_or_else(|| format!("internal: unknown value '{r}'"))
            })
            .collect::<Result<_, _>>()?;
        let outs = parsed
            .infer(&types)
            .map_err(|e| format!("internal: backward '{op}': {e}"))?;
        let base = match owner.base() {
            "" => "grad".to_string(),
            name => format!("{name}.d"),
        };
        self.counter += 1;
        let id = self.fresh(&format!("{base}{}", self.counter));
        for (p, t) in outs.into_iter().enumerate() {
            let r = if p == 0 {
                id.clone()
            } else {
                format!("{id}:{p}")
            };
            self.types.insert(r, t);
        }
        self.origins.insert(id.clone(), owner.clone());
        self.nodes.push(NodeDoc {
            id: id.clone(),
            op: op.to_string(),
            inputs: inputs.iter().map(|r| r.to_string()).collect(),
            attrs,
        });
        Ok(id)
    }

    /// The summed contributions to a value's gradient (none when nothing reached it).
    fn total(&mut self, owner: &Origin, value: (NodeIndex, usize)) -> Result<Option<Ref>, String> {
        let parts = self.grads.remove(&value).unwrap_or_default();
        self.sum(owner, parts)
    }

    fn sum(&mut self, owner: &Origin, parts: Vec<Ref>) -> Result<Option<Ref>, String> {
        let mut total: Option<Ref> = None;
        for part in parts {
            total = Some(match total {
                None => part,
                Some(t) => self.emit(owner, "add", json!({}), &[&t, &part])?,
            });
        }
        Ok(total)
    }

    /// `v` under the name `{name}.grad` (an identity: no work, no buffer).
    fn rename(&mut self, owner: &Origin, v: &str) -> Result<Ref, String> {
        let id = self.fresh(&format!("{}.grad", owner.base()));
        let t = self
            .types
            .get(v)
            .cloned()
            .ok_or_else(|| format!("internal: unknown value '{v}'"))?;
        self.types.insert(id.clone(), t);
        self.origins.insert(id.clone(), owner.clone());
        self.nodes.push(NodeDoc {
            id: id.clone(),
            op: "identity".into(),
            inputs: vec![v.to_string()],
            attrs: Default::default(),
        });
        Ok(id)
    }

    /// The output holding a weight's summed gradient, when any reached it.
    fn finish_param(&mut self, key: &str) -> Result<Option<Ref>, String> {
        let parts = self.param_grads.remove(key).unwrap_or_default();
        let origin = Origin::Weight(key.to_string());
        match self.sum(&origin, parts)? {
            Some(t) => self.rename(&origin, &t).map(Some),
            None => Ok(None),
        }
    }
}

/// The [`GradContext`] of one forward node.
struct NodeContext<'a, 'g> {
    state: &'a mut State<'g>,
    flows: &'a HashSet<(NodeIndex, usize)>,
    ix: NodeIndex,
    out_grads: Vec<Option<Ref>>,
}

impl NodeContext<'_, '_> {
    fn source(&self, k: usize) -> Result<(NodeIndex, usize), String> {
        let graph = self.state.graph;
        graph
            .node_inputs(self.ix)
            .get(k)
            .copied()
            .ok_or_else(|| format!("internal: no input {k}"))
    }

    fn id(&self) -> &str {
        &self.state.graph.dag[self.ix].id
    }

    /// The key and shape of this node's weight `name`.
    fn weight(&self, name: &str) -> Result<(String, Vec<usize>), String> {
        let node = &self.state.graph.dag[self.ix];
        let spec = node
            .params
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| format!("internal: no weight '{name}'"))?;
        Ok((node.param_key(spec), spec.shape.clone()))
    }
}

impl GradContext for NodeContext<'_, '_> {
    fn input(&self, k: usize) -> Result<Ref, String> {
        Ok(reference(self.state.graph, self.source(k)?))
    }

    fn output(&self, k: usize) -> Result<Ref, String> {
        let node = &self.state.graph.dag[self.ix];
        if k >= node.outputs.len() {
            return Err(format!("internal: no output {k}"));
        }
        Ok(reference(self.state.graph, (self.ix, k)))
    }

    fn output_grad(&self, k: usize) -> Option<Ref> {
        self.out_grads.get(k).cloned().flatten()
    }

    fn needs(&self, k: usize) -> bool {
        self.source(k).is_ok_and(|v| self.flows.contains(&v))
    }

    fn shape(&self, v: &str) -> Result<Vec<usize>, String> {
        let t = self
            .state
            .types
            .get(v)
            .ok_or_else(|| format!("internal: unknown value '{v}'"))?;
        shape::concrete(&t.shape).ok_or_else(|| format!("'{v}' has a symbolic shape {t}"))
    }

    fn emit(&mut self, op: &str, attrs: Value, inputs: &[&str]) -> Result<Ref, String> {
        let owner = Origin::Node(self.id().to_string());
        self.state.emit(&owner, op, attrs, inputs)
    }

    fn input_grad(&mut self, k: usize, v: Ref) -> Result<(), String> {
        let source = self.source(k)?;
        if !self.flows.contains(&source) {
            return Ok(());
        }
        let want = self.shape(&self.input(k)?)?;
        let got = self.shape(&v)?;
        if want != got {
            return Err(format!(
                "internal: the gradient of input {k} is {got:?}, not the input's {want:?}"
            ));
        }
        self.state.grads.entry(source).or_default().push(v);
        Ok(())
    }

    fn param(&mut self, name: &str) -> Result<Ref, String> {
        let (key, shape) = self.weight(name)?;
        if let Some(r) = self.state.param_reads.get(&key) {
            return Ok(r.clone());
        }
        let r = self.state.emit(
            &Origin::Weight(key.clone()),
            "param",
            json!({ "key": key, "shape": shape }),
            &[],
        )?;
        self.state.param_reads.insert(key, r.clone());
        Ok(r)
    }

    fn param_grad(&mut self, name: &str, v: Ref) -> Result<(), String> {
        let (key, shape) = self.weight(name)?;
        let got = self.shape(&v)?;
        if got != shape {
            return Err(format!(
                "internal: the gradient of weight '{key}' is {got:?}, not {shape:?}"
            ));
        }
        self.state.param_grads.entry(key).or_default().push(v);
        Ok(())
    }

    fn composite_grad(&mut self, composite: &Composite) -> Result<(), String> {
        // The vector-Jacobian product of the composition is the gradient of
        // Σ output·(its gradient) with respect to the inputs: build that as a graph of its
        // own, differentiate it with this same transform, and splice the result in.
        let mut doc = GraphDoc {
            format: crate::graph::doc::FORMAT.into(),
            name: format!("{}.unrolled", self.id()),
            inputs: Default::default(),
            nodes: Vec::new(),
            outputs: Vec::new(),
            params: Default::default(),
            layout: Default::default(),
            stages: Default::default(),
            training: None,
        };
        let mut outer: HashMap<String, Ref> = HashMap::new();
        let mut wrt = Vec::new();
        let declare = |doc: &mut GraphDoc, name: &str, r: &str, ctx: &Self| -> Result<(), String> {
            let t = ctx
                .state
                .types
                .get(r)
                .ok_or_else(|| format!("internal: unknown value '{r}'"))?;
            doc.inputs.insert(
                name.to_string(),
                crate::graph::doc::InputDecl {
                    shape: t.shape.clone(),
                    dtype: t.dtype,
                },
            );
            Ok(())
        };
        for (k, name) in composite.inputs.iter().enumerate() {
            if name.is_empty() {
                continue;
            }
            let r = self.input(k)?;
            declare(&mut doc, name, &r, self)?;
            outer.insert(name.clone(), r);
            if self.needs(k) {
                wrt.push((k, name.clone()));
            }
        }
        doc.nodes = composite
            .nodes
            .iter()
            .map(|(id, op, attrs, inputs)| NodeDoc {
                id: id.clone(),
                op: op.clone(),
                inputs: inputs.clone(),
                attrs: attrs.as_object().cloned().unwrap_or_default(),
            })
            .collect();
        let mut terms = Vec::new();
        for (k, out) in composite.outputs.iter().enumerate() {
            let Some(dy) = self.output_grad(k) else {
                continue;
            };
            let name = format!("vjp.dy{k}");
            declare(&mut doc, &name, &dy, self)?;
            outer.insert(name.clone(), dy);
            let product = format!("vjp.product{k}");
            doc.nodes.push(NodeDoc {
                id: product.clone(),
                op: "mul".into(),
                inputs: vec![out.clone(), name],
                attrs: Default::default(),
            });
            let term = format!("vjp.term{k}");
            doc.nodes.push(NodeDoc {
                id: term.clone(),
                op: "reduce_sum".into(),
                inputs: vec![product],
                attrs: Default::default(),
            });
            terms.push(term);
        }
        let Some(mut loss) = terms.first().cloned() else {
            return Ok(());
        };
        for (i, term) in terms.iter().enumerate().skip(1) {
            let id = format!("vjp.sum{i}");
            doc.nodes.push(NodeDoc {
                id: id.clone(),
                op: "add".into(),
                inputs: vec![loss, term.clone()],
                attrs: Default::default(),
            });
            loss = id;
        }
        doc.outputs = vec![loss.clone()];
        let inner = Graph::build_with(doc, &self.state.graph.limits)
            .map_err(|p| format!("internal: the unrolled composition is invalid: {p}"))?;
        let names: Vec<&str> = wrt.iter().map(|(_, n)| n.as_str()).collect();
        let joint = backward_wrt(&inner, &loss, &names).map_err(|e| e.to_string())?;
        // Splice in only what the input gradients need, in the joint graph's order.
        let by_id: HashMap<&str, &NodeDoc> =
            joint.doc.nodes.iter().map(|n| (n.id.as_str(), n)).collect();
        let mut needed: HashSet<&str> = HashSet::new();
        let mut stack: Vec<&str> = joint.inputs.iter().map(|g| g.output.as_str()).collect();
        while let Some(id) = stack.pop() {
            let Some(node) = by_id.get(id) else {
                continue;
            };
            if needed.insert(id) {
                stack.extend(node.inputs.iter().map(|r| r.split(':').next().unwrap_or(r)));
            }
        }
        let map = |r: &str, outer: &HashMap<String, Ref>| -> Result<Ref, String> {
            let (base, port) = match r.split_once(':') {
                Some((b, p)) => (b, Some(p)),
                None => (r, None),
            };
            let mapped = outer.get(base).ok_or_else(|| {
                format!("internal: '{r}' of the unrolled composition is not spliced")
            })?;
            Ok(match port {
                Some(p) => format!("{mapped}:{p}"),
                None => mapped.clone(),
            })
        };
        for &ix in &joint.graph.order {
            let id = joint.graph.dag[ix].id.as_str();
            let Some(node) = by_id.get(id).filter(|_| needed.contains(id)) else {
                continue;
            };
            let inputs: Vec<Ref> = node
                .inputs
                .iter()
                .map(|r| map(r, &outer))
                .collect::<Result<_, _>>()?;
            let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
            let emitted = self.emit(&node.op, Value::Object(node.attrs.clone()), &refs)?;
            outer.insert(id.to_string(), emitted);
        }
        for (k, name) in wrt {
            if let Some(g) = joint.inputs.iter().find(|g| g.of == name) {
                let v = map(&g.output, &outer)?;
                self.input_grad(k, v)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::backward_wrt;
    use crate::exec::dataset;
    use crate::graph::testing::{random_document, Mode};
    use crate::graph::{load_graph, Graph};
    use crate::weights::init_weights;
    use proptest::prelude::*;
    use serde_json::json;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// For random accepted graphs (about one in six binds and is differentiated), differentiating the sum of their first output with
        /// respect to every weight and f32 input never panics: it is refused or gives a
        /// joint graph the CPU reference runs (or refuses) without panicking.
        #[test]
        fn random_graphs_are_differentiated_or_refused_never_panic(seed in any::<u64>()) {
            let mut doc = random_document(seed, Mode::Tame);
            let Some(out) = doc["outputs"][0].as_str().map(String::from) else { return Ok(()) };
            if let Some(nodes) = doc["nodes"].as_array_mut() {
                nodes.push(json!({ "id": "__loss", "op": "reduce_sum", "inputs": [out],
                                   "attrs": { "keepdims": false } }));
            }
            doc["outputs"] = json!(["__loss"]);
            let Ok(g) = load_graph(&doc.to_string()) else { return Ok(()) };
            let Ok(bound) = dataset::bind(&g, 2) else { return Ok(()) };
            let wrt: Vec<String> = bound
                .inputs
                .iter()
                .filter(|(_, ix)| bound.dag[*ix].outputs[0].dtype == crate::DType::F32)
                .map(|(n, _)| n.clone())
                .collect();
            let wrt: Vec<&str> = wrt.iter().map(String::as_str).collect();
            if let Ok(joint) = backward_wrt(&bound, "__loss", &wrt) {
                let weights = init_weights(&joint.graph, 1);
                let inputs = dataset::random_inputs(&joint.graph, 2)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let _ = crate::cpu::run(&joint.graph, &weights, &inputs);
                // Every backward node is an operator of the catalogue.
                let ops = joint.graph.op_nodes().count();
                prop_assert!(ops >= bound.op_nodes().count());
            }
        }
    }

    #[test]
    fn only_nodes_on_a_path_get_backward_nodes() {
        // 'side' depends on a weight but not the loss; 'c' feeds the loss but depends on
        // nothing differentiated: neither gets backward nodes.
        let g = load_graph(
            r#"{ "format": "sluice/graph@1", "inputs": { "x": { "shape": [2, 3] } },
                 "nodes": [
                   { "id": "fc", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 3 } },
                   { "id": "side", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 2 } },
                   { "id": "c", "op": "exp", "inputs": ["x"] },
                   { "id": "m", "op": "mul", "inputs": ["fc", "c"] },
                   { "id": "loss", "op": "reduce_sum", "inputs": ["m"], "attrs": { "keepdims": false } }
                 ],
                 "outputs": ["loss", "side"] }"#,
        )
        .unwrap();
        let j = super::backward(&g, "loss").unwrap();
        let added: Vec<&str> = j.doc.nodes[g.doc.nodes.len()..]
            .iter()
            .map(|n| n.id.as_str())
            .collect();
        assert!(
            added
                .iter()
                .all(|id| !id.starts_with("side") && !id.starts_with("c.")),
            "{added:?}"
        );
        let of: Vec<&str> = j.params.iter().map(|p| p.of.as_str()).collect();
        assert_eq!(of, ["fc.weight", "fc.bias"]);
        // The joint graph is an ordinary graph: it builds again from its document.
        let again = Graph::build(j.doc.clone()).unwrap();
        let outputs: Vec<&str> = again.outputs.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(outputs, ["loss", "side", "fc.weight.grad", "fc.bias.grad"]);
    }
}
