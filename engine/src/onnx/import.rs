//! ONNX → Sluice: a model's graph walked in its (topological) order, each node folded on
//! the host (constants and shape arithmetic), passed through (`Identity`, inference
//! `Dropout`), or written as Sluice nodes. Most operators map by rule — the Sluice name
//! is the ONNX name in snake_case, attributes keep their names, constant inputs become
//! the attributes named after them ([`CONST_INPUTS`]) — and the rest have a function here.
//! Initialisers become weights. Everything that cannot be imported is collected, each
//! problem naming its node, and reported once.

use super::fold::{self, SymInt, SymInts};
use super::proto::{self, attribute_type, data_type, AttributeProto, GraphProto, NodeProto};
use super::tensor::{self, Elements, ExternalData, HostTensor};
use super::{ImportError, Imported, Unsupported};
use crate::dtype::DType;
use crate::error::LimitError;
use crate::graph::doc::{GraphDoc, InputDecl, NodeDoc, ParamsDoc};
use crate::graph::{Limit, Limits, FORMAT};
use crate::ops::attrs::AttrKind;
use crate::ops::{self, TensorType};
use crate::shape::Dim;
use crate::weights::Weights;
use serde_json::{json, Map, Value as Json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;

/// Oldest and newest standard opsets the importer reads. Operators follow their newest
/// versions; where an older version means something else, the importer translates it
/// (Softmax before 13, Clip's attributes before 11, Slice's before 10, axes as attributes
/// before 13 and 18), and attributes a version added are checked like any other, so a
/// value Sluice does not implement is refused by name.
pub const OPSETS: std::ops::RangeInclusive<i64> = 7..=28;

/// Constants (`constant` nodes) up to this many elements stay in the graph file; larger
/// float tensors become weights read by `param`.
const INLINE_ELEMENTS: usize = 64;

/// ONNX inputs that Sluice takes as attributes (they must be known at import): operator,
/// input index, attribute name.
pub(super) const CONST_INPUTS: &[(&str, usize, &str)] = &[
    ("Reshape", 1, "shape"),
    ("Expand", 1, "shape"),
    ("Squeeze", 1, "axes"),
    ("Unsqueeze", 1, "axes"),
    ("Slice", 1, "starts"),
    ("Slice", 2, "ends"),
    ("Slice", 3, "axes"),
    ("Slice", 4, "steps"),
    ("Split", 1, "sizes"),
    ("Clip", 1, "min"),
    ("Clip", 2, "max"),
    ("ReduceSum", 1, "axes"),
    ("ReduceMean", 1, "axes"),
    ("ReduceMax", 1, "axes"),
    ("ReduceMin", 1, "axes"),
    ("ReduceProd", 1, "axes"),
    ("ReduceL2", 1, "axes"),
    ("TopK", 1, "k"),
    ("Tile", 1, "repeats"),
    ("Pad", 1, "pads"),
    ("Pad", 2, "constant_value"),
    ("Pad", 3, "axes"),
    ("Resize", 1, "roi"),
    ("Resize", 2, "scales"),
    ("Resize", 3, "sizes"),
    ("CumSum", 1, "axis"),
    ("Trilu", 1, "k"),
    ("OneHot", 1, "depth"),
    ("OneHot", 2, "values"),
    ("ConstantOfShape", 0, "shape"),
    ("Range", 0, "start"),
    ("Range", 1, "limit"),
    ("Range", 2, "delta"),
    ("Dropout", 1, "ratio"),
];

/// ONNX attribute names that Sluice spells differently: operator, ONNX name, Sluice name.
pub(super) const RENAMES: &[(&str, &str, &str)] = &[
    ("Split", "split", "sizes"),
    ("Conv", "group", "groups"),
    ("ConvTranspose", "group", "groups"),
    ("Conv", "kernel_shape", "kernel_size"),
    ("ConvTranspose", "kernel_shape", "kernel_size"),
    ("MaxPool", "kernel_shape", "kernel_size"),
    ("AveragePool", "kernel_shape", "kernel_size"),
];

/// ONNX attributes Sluice has no use for, accepted at these values only (anything else
/// would change the answer): operator ("" for all), attribute, accepted integer value
/// (`None`: any value).
const IGNORED: &[(&str, &str, Option<i64>)] = &[
    ("MaxPool", "storage_order", Some(0)),
    ("BatchNormalization", "momentum", None),
    ("BatchNormalization", "spatial", Some(1)),
    ("BatchNormalization", "training_mode", Some(0)),
    ("LayerNormalization", "stash_type", Some(1)),
    ("Dropout", "seed", None),
    ("Dropout", "training_mode", Some(0)),
    ("Gemm", "broadcast", None),
    ("Split", "num_outputs", None),
    ("Cast", "saturate", None),
    ("", "auto_pad", None),
];

/// ONNX defaults that differ from the Sluice operator's default: operator, attribute
/// (Sluice name), ONNX's default.
const ONNX_DEFAULTS: &[(&str, &str, &str)] = &[
    ("ArgMax", "axis", "0"),
    ("ArgMax", "keepdims", "true"),
    ("ArgMin", "axis", "0"),
    ("ArgMin", "keepdims", "true"),
    ("Concat", "axis", "0"),
];

/// ONNX operators whose Sluice name is not their snake_case name.
pub(super) const NAMES: &[(&str, &str)] = &[
    ("MatMul", "matmul"),
    ("ArgMax", "argmax"),
    ("ArgMin", "argmin"),
    ("Conv", "conv2d"),
    ("MaxPool", "max_pool2d"),
    ("AveragePool", "avg_pool2d"),
    ("GlobalAveragePool", "global_avg_pool"),
    ("ConvTranspose", "conv_transpose2d"),
    ("BatchNormalization", "batch_norm"),
    ("LayerNormalization", "layer_norm"),
    ("InstanceNormalization", "instance_norm"),
    ("GroupNormalization", "group_norm"),
    ("RMSNormalization", "rms_norm"),
    ("GatherND", "gather_nd"),
    ("ScatterND", "scatter_nd"),
    ("TopK", "top_k"),
    ("CumSum", "cumsum"),
    ("PRelu", "prelu"),
    ("LSTM", "lstm"),
    ("GRU", "gru"),
];

/// Operators with weights taken from initialiser inputs: operator, and per ONNX input
/// the Sluice weight name (`None`: a data input).
pub(super) const WEIGHT_INPUTS: &[(&str, &[Option<&str>])] = &[
    ("Conv", &[None, Some("weight"), Some("bias")]),
    ("ConvTranspose", &[None, Some("weight"), Some("bias")]),
    (
        "BatchNormalization",
        &[None, Some("scale"), Some("bias"), Some("mean"), Some("var")],
    ),
    ("LayerNormalization", &[None, Some("scale"), Some("bias")]),
    (
        "InstanceNormalization",
        &[None, Some("scale"), Some("bias")],
    ),
    ("GroupNormalization", &[None, Some("scale"), Some("bias")]),
    ("RMSNormalization", &[None, Some("scale")]),
];

/// An ONNX operator's Sluice name.
pub fn sluice_name(op_type: &str) -> String {
    if let Some((_, n)) = NAMES.iter().find(|(o, _)| *o == op_type) {
        return (*n).to_string();
    }
    let mut out = String::new();
    let chars: Vec<char> = op_type.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() {
            let prev_lower = i > 0 && !chars[i - 1].is_ascii_uppercase();
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            if i > 0 && (prev_lower || next_lower) {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Bytes an entry of a folded integer vector takes in memory.
const SYM_INT_BYTES: u64 = std::mem::size_of::<SymInt>() as u64;

/// Bytes a number of a constant written into the graph document takes in memory.
const JSON_NUMBER_BYTES: u64 = std::mem::size_of::<Json>() as u64;

/// Most inputs of the ONNX operators the importer folds or translates by its own code
/// (the rest are checked against the Sluice operator's arity): an input past these
/// would be ignored, so it is refused.
const MAX_INPUTS: &[(&str, usize)] = &[
    ("Constant", 0),
    ("Shape", 1),
    ("Identity", 1),
    ("Cast", 1),
    ("Gather", 2),
    ("Unsqueeze", 2),
    ("Squeeze", 2),
    ("Slice", 5),
    ("Add", 2),
    ("Sub", 2),
    ("Mul", 2),
    ("Div", 2),
    ("Mod", 2),
    ("Equal", 2),
    ("Where", 3),
    ("Range", 3),
    ("ConstantOfShape", 1),
    ("Reshape", 2),
    ("Dropout", 3),
    ("Gemm", 3),
    ("LRN", 1),
    ("GlobalMaxPool", 1),
    ("Softmax", 1),
    ("LogSoftmax", 1),
    ("Clip", 3),
];

/// What an ONNX value is during the import.
#[derive(Debug, Clone)]
enum Value {
    /// Known now (an initialiser, a `Constant`, a folded computation), shared by the
    /// names that pass it on unchanged (`Identity`, inference `Dropout`).
    Known(Rc<HostTensor>),
    /// An integer vector with symbolic entries (folded shape arithmetic).
    Shape(Rc<SymInts>),
    /// `ConstantOfShape` of a shape holding the symbolic batch size: one value over a
    /// shape known only at run time (written as a broadcast scalar where that is exact).
    Fill(Vec<Dim>, HostTensor),
    /// Computed by the Sluice graph: a reference and its type.
    Graph(String, TensorType),
    /// Produced by a node that could not be imported (already reported).
    Failed,
}

/// The import of one model.
struct Importer<'a> {
    limits: &'a Limits,
    external: &'a dyn ExternalData,
    /// Sizes given for the model's named dimensions (the rest stay symbols).
    dims: &'a BTreeMap<String, usize>,
    opset: i64,
    values: HashMap<String, Value>,
    /// Sluice references of known values already written as graph nodes.
    materialised: HashMap<String, String>,
    nodes: Vec<NodeDoc>,
    inputs: BTreeMap<String, InputDecl>,
    weights: Weights,
    used_ids: HashSet<String>,
    /// The graph inputs: (ONNX name, Sluice name).
    input_names: Vec<(String, String)>,
    /// ONNX values some node or graph output consumes.
    used: HashSet<String>,
    /// Types of the Sluice graph's values by reference.
    types: HashMap<String, TensorType>,
    unsupported: Vec<Unsupported>,
    folded: usize,
    /// Bytes of what the import makes beyond the model's initialisers (decoded
    /// `Constant`s, folded values, the weights and constants written from them), against
    /// `max_import_bytes`.
    held: u64,
    /// Bytes of the decoded initialisers and the weights written from them, against
    /// `max_host_bytes` (a run holds those weights on the host too).
    held_initialisers: u64,
    /// The decoded initialisers (shared, never dropped during the import), by address:
    /// the weights written from them are counted with them.
    initialisers: HashSet<*const HostTensor>,
    /// The first limit the model went over: the import stops there.
    over_limit: Option<LimitError>,
}

/// Imports a decoded model.
pub fn import_model(
    model: &proto::ModelProto,
    external: &dyn ExternalData,
    limits: &Limits,
    dims: &BTreeMap<String, usize>,
) -> Result<Imported, ImportError> {
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .ok_or_else(|| ImportError::Model("the model imports no standard ONNX opset".into()))?;
    if !OPSETS.contains(&opset) {
        return Err(ImportError::Model(format!(
            "opset {opset} is outside the opsets {} to {} Sluice imports",
            OPSETS.start(),
            OPSETS.end()
        )));
    }
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| ImportError::Model("the model has no graph".into()))?;
    if graph.node.len() > limits.max_nodes.saturating_mul(4) {
        return Err(ImportError::Model(format!(
            "{} nodes is far over the limit of {} (--max-nodes)",
            graph.node.len(),
            limits.max_nodes
        )));
    }
    let mut im = Importer {
        limits,
        external,
        dims,
        opset,
        values: HashMap::new(),
        materialised: HashMap::new(),
        nodes: Vec::new(),
        inputs: BTreeMap::new(),
        weights: Weights::new(),
        used_ids: HashSet::new(),
        input_names: Vec::new(),
        used: graph
            .node
            .iter()
            .flat_map(|n| n.input.iter().cloned())
            .chain(graph.output.iter().map(|o| o.name.clone()))
            .collect(),
        types: HashMap::new(),
        unsupported: Vec::new(),
        folded: 0,
        held: 0,
        held_initialisers: 0,
        initialisers: HashSet::new(),
        over_limit: None,
    };
    im.read_initialisers(graph)?;
    im.read_inputs(graph);
    for node in &graph.node {
        im.node(node);
        if let Some(e) = im.over_limit.take() {
            return Err(ImportError::Limit(e));
        }
    }
    let outputs = im.outputs(graph);
    if let Some(e) = im.over_limit.take() {
        return Err(ImportError::Limit(e));
    }
    if !im.unsupported.is_empty() {
        return Err(ImportError::Unsupported(im.unsupported));
    }
    let name = if graph.name.is_empty() {
        "imported".to_string()
    } else {
        graph.name.clone()
    };
    let doc = GraphDoc {
        format: FORMAT.to_string(),
        name,
        inputs: im.inputs,
        nodes: im.nodes,
        outputs,
        params: ParamsDoc::default(),
        layout: BTreeMap::new(),
        stages: BTreeMap::new(),
        training: None,
    };
    Ok(Imported {
        doc,
        weights: im.weights,
        opset,
        onnx_nodes: graph.node.len(),
        folded: im.folded,
        inputs: im.input_names,
    })
}

impl Importer<'_> {
    /// Counts `bytes` more held by the import, refusing (and stopping the import) past
    /// `max_import_bytes`; `at` says where, for the message.
    fn hold(&mut self, at: &str, bytes: Option<u64>) -> Result<(), String> {
        match self.held_with(at, bytes) {
            Ok(total) => {
                self.held = total;
                Ok(())
            }
            Err(e) => Err(self.stop(e)),
        }
    }

    /// What the import would hold with `bytes` more, if that is within
    /// `max_import_bytes`.
    fn held_with(&self, at: &str, bytes: Option<u64>) -> Result<u64, LimitError> {
        let total = bytes.and_then(|b| self.held.checked_add(b));
        self.limits
            .check(
                Limit::MaxImportBytes,
                format!("what the import holds, up to {at},"),
                "bytes",
                total,
            )
            .map(|()| total.unwrap_or(self.held))
    }

    /// What the initialisers and their weights would hold with `bytes` more, if that is
    /// within `max_host_bytes`.
    fn initialisers_with(&self, at: &str, bytes: Option<u64>) -> Result<u64, LimitError> {
        let total = bytes.and_then(|b| self.held_initialisers.checked_add(b));
        self.limits
            .check(
                Limit::MaxHostBytes,
                format!("the model's initialisers and their weights, up to {at},"),
                "bytes",
                total,
            )
            .map(|()| total.unwrap_or(self.held_initialisers))
    }

    /// Holds `bytes` of a weight (or weights) written from `source`: with the
    /// initialisers when it is one, else with what the import makes.
    fn hold_weight(
        &mut self,
        at: &str,
        source: &HostTensor,
        bytes: Option<u64>,
    ) -> Result<(), String> {
        if !self.initialisers.contains(&(source as *const HostTensor)) {
            return self.hold(at, bytes);
        }
        match self.initialisers_with(at, bytes) {
            Ok(total) => {
                self.held_initialisers = total;
                Ok(())
            }
            Err(e) => Err(self.stop(e)),
        }
    }

    /// Checks a constant the import makes of `elements` (each `width` bytes in memory)
    /// against `max_constant_elements`, then holds its bytes; both before it is made.
    fn hold_constant(&mut self, at: &str, elements: Option<u64>, width: u64) -> Result<(), String> {
        if let Err(e) = self.limits.check(
            Limit::MaxConstantElements,
            format!("the value of {at}"),
            "elements",
            elements,
        ) {
            return Err(self.stop(e));
        }
        self.hold(at, elements.and_then(|n| n.checked_mul(width)))
    }

    /// Records the first limit the model went over (the import stops after the node
    /// that met it) and gives its message.
    fn stop(&mut self, e: LimitError) -> String {
        let message = e.to_string();
        self.over_limit.get_or_insert(e);
        message
    }

    fn read_initialisers(&mut self, graph: &GraphProto) -> Result<(), ImportError> {
        for t in &graph.initializer {
            let (_, bytes) = tensor::decoded_size(t, &t.name, self.limits)?;
            self.held_initialisers = self
                .initialisers_with(&format!("initialiser '{}'", t.name), Some(bytes))
                .map_err(ImportError::Limit)?;
            let host = Rc::new(tensor::decode(t, &t.name, self.external, self.limits)?);
            self.initialisers.insert(Rc::as_ptr(&host));
            self.values.insert(t.name.clone(), Value::Known(host));
        }
        Ok(())
    }

    fn read_inputs(&mut self, graph: &GraphProto) {
        for input in &graph.input {
            if self.values.contains_key(&input.name) {
                continue; // an initialiser listed as an input (IR version < 4)
            }
            match self.input_decl(input) {
                Ok(decl) => {
                    let id = self.fresh_id(&input.name);
                    let ty = TensorType {
                        shape: decl.shape.clone(),
                        dtype: decl.dtype,
                    };
                    self.inputs.insert(id.clone(), decl);
                    self.input_names.push((input.name.clone(), id.clone()));
                    self.values.insert(input.name.clone(), Value::Graph(id, ty));
                }
                Err(what) => {
                    self.unsupported.push(Unsupported {
                        node: input.name.clone(),
                        op_type: "graph input".into(),
                        what,
                    });
                    self.values.insert(input.name.clone(), Value::Failed);
                }
            }
        }
    }

    fn input_decl(&self, input: &proto::ValueInfoProto) -> Result<InputDecl, String> {
        let tensor = input
            .r#type
            .as_ref()
            .and_then(|t| t.tensor_type.as_ref())
            .ok_or("not a tensor (sequences, maps and optionals are not supported)")?;
        let dtype = match tensor.elem_type {
            data_type::FLOAT | data_type::FLOAT16 | data_type::DOUBLE | data_type::BFLOAT16 => {
                DType::F32
            }
            data_type::INT64
            | data_type::INT32
            | data_type::INT16
            | data_type::INT8
            | data_type::UINT8
            | data_type::UINT16
            | data_type::UINT32 => DType::I32,
            data_type::BOOL => DType::Bool,
            other => {
                return Err(format!(
                    "element type {} is not supported",
                    data_type::name(other)
                ))
            }
        };
        let dims = &tensor
            .shape
            .as_ref()
            .ok_or("its rank is unknown (Sluice needs every input's rank)")?
            .dim;
        if dims.len() > self.limits.max_rank {
            return Err(format!("rank {} is over --max-rank", dims.len()));
        }
        let shape = dims
            .iter()
            .enumerate()
            .map(|(axis, d)| match (d.dim_value, &d.dim_param) {
                (Some(v), _) if v >= 0 => Ok(Dim::Known(v as usize)),
                (_, Some(p)) if self.dims.contains_key(p) => Ok(Dim::Known(self.dims[p])),
                (_, Some(p)) if !p.is_empty() => Ok(Dim::Sym(symbol(p))),
                _ if axis == 0 => Ok(Dim::Sym("N".into())),
                _ => Err(format!(
                    "axis {axis} has no size and no name; Sluice needs it (only the first axis may be left open, as the batch)"
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(InputDecl { shape, dtype })
    }

    /// A fresh node id from an ONNX name: `:` replaced, cut to the name limit, unique.
    fn fresh_id(&mut self, name: &str) -> String {
        let mut base: String = name
            .chars()
            .map(|c| if c == ':' || c.is_control() { '_' } else { c })
            .collect();
        let max = self.limits.max_name_len.saturating_sub(8).max(8);
        if base.len() > max {
            let mut cut = max;
            while !base.is_char_boundary(cut) {
                cut -= 1;
            }
            base.truncate(cut);
        }
        if base.is_empty() {
            base = "v".into();
        }
        let mut id = base.clone();
        let mut k = 1;
        while !self.used_ids.insert(id.clone()) {
            k += 1;
            id = format!("{base}_{k}");
        }
        id
    }

    fn report(&mut self, node: &NodeProto, what: impl Into<String>) {
        self.unsupported.push(Unsupported {
            node: node_label(node),
            op_type: node.op_type.clone(),
            what: what.into(),
        });
    }

    fn fail_outputs(&mut self, node: &NodeProto) {
        for o in &node.output {
            self.values.insert(o.clone(), Value::Failed);
        }
    }

    fn input(&self, node: &NodeProto, i: usize) -> Option<&Value> {
        node.input
            .get(i)
            .filter(|n| !n.is_empty())
            .and_then(|n| self.values.get(n))
    }

    fn node(&mut self, node: &NodeProto) {
        if !node.domain.is_empty() && node.domain != "ai.onnx" {
            self.report(
                node,
                format!("operator domain '{}' is not supported", node.domain),
            );
            return self.fail_outputs(node);
        }
        if let Some((_, max)) = MAX_INPUTS.iter().find(|(op, _)| *op == node.op_type) {
            if let Some((i, name)) = node
                .input
                .iter()
                .enumerate()
                .skip(*max)
                .find(|(_, n)| !n.is_empty())
            {
                self.report(
                    node,
                    format!(
                        "{} takes at most {max} input(s); input {i} '{name}' is not one of them",
                        node.op_type
                    ),
                );
                return self.fail_outputs(node);
            }
        }
        for (i, name) in node.input.iter().enumerate() {
            if name.is_empty() {
                continue;
            }
            match self.values.get(name) {
                Some(Value::Failed) => return self.fail_outputs(node),
                Some(_) => {}
                None => {
                    self.report(node, format!("input {i} '{name}' is not defined before it"));
                    return self.fail_outputs(node);
                }
            }
        }
        let result = match self.fold(node) {
            Some(r) => r.inspect(|_| self.folded += 1),
            None => self.translate(node),
        };
        match result {
            Ok(values) => {
                for (name, value) in node.output.iter().zip(values) {
                    if !name.is_empty() {
                        self.values.insert(name.clone(), value);
                    }
                }
            }
            Err(problems) => {
                for p in problems {
                    self.report(node, p);
                }
                self.fail_outputs(node);
            }
        }
    }

    /// Host folding: `Some` when every input is known (or a folded shape) and the
    /// operator folds. Every value it makes is checked before it is made: what folding
    /// computes against `max_constant_elements`, everything against `max_import_bytes`.
    fn fold(&mut self, node: &NodeProto) -> Option<Result<Vec<Value>, Vec<String>>> {
        let attrs = Attrs(&node.attribute);
        let at = format!("node '{}' ({})", node_label(node), node.op_type);
        if node.op_type == "Constant" {
            return Some(
                self.constant(&at, &attrs)
                    .map(|v| vec![v])
                    .map_err(|e| vec![e]),
            );
        }
        if node.op_type == "Shape" {
            let start = attrs.int("start").unwrap_or(0);
            let end = attrs.int("end");
            let dims: Vec<Dim> = match self.input(node, 0)? {
                Value::Graph(_, ty) => ty.shape.clone(),
                Value::Known(t) => t.dims.iter().map(|&d| Dim::Known(d)).collect(),
                _ => return None,
            };
            return Some(Ok(vec![sym_value(fold::shape_of(&dims, start, end))]));
        }
        let op = node.op_type.as_str();
        if matches!(op, "Max" | "Min") && node.input.len() != 2 {
            return None; // variadic: a chain of graph nodes
        }
        let inputs: Vec<Option<Value>> = (0..node.input.len())
            .map(|i| self.input(node, i).cloned())
            .collect();
        if inputs
            .iter()
            .flatten()
            .any(|v| matches!(v, Value::Graph(..) | Value::Failed | Value::Fill(..)))
        {
            return None;
        }
        let get = |i: usize| inputs.get(i).and_then(Option::as_ref);
        let first = get(0)?.clone();
        if SYM_FOLDS.contains(&op) {
            // Integer vectors folded entry by entry: none longer than the limit, and
            // the result (at most the longest input, or for Concat their sum) held
            // before it is made.
            if !inputs.iter().flatten().all(sym_foldable) {
                return None;
            }
            let mut sizes = inputs.iter().flatten().map(value_len);
            let bound = if op == "Concat" {
                sizes.try_fold(0u64, u64::checked_add)
            } else {
                sizes.max()
            };
            if let Err(e) = self.hold_constant(&at, bound, SYM_INT_BYTES) {
                return Some(Err(vec![e]));
            }
        }
        let known_or_sym = |v: &Value| -> Option<SymInts> {
            match v {
                Value::Known(t) => SymInts::from_host(t),
                Value::Shape(s) => Some((**s).clone()),
                _ => None,
            }
        };
        let host = |v: &Value| -> Option<Rc<HostTensor>> {
            match v {
                Value::Known(t) => Some(t.clone()),
                Value::Shape(s) => s.to_host().map(Rc::new),
                _ => None,
            }
        };
        let folded: Result<Value, String> = match op {
            "Identity" => Ok(first),
            "Cast" => {
                let to = attrs.int("to").map_or(data_type::FLOAT, |t| t as i32);
                match (&first, to) {
                    (Value::Shape(_), data_type::INT64 | data_type::INT32) => Ok(first.clone()),
                    (Value::Known(t), _) => {
                        let width = match to {
                            data_type::BOOL => 1,
                            data_type::FLOAT
                            | data_type::DOUBLE
                            | data_type::FLOAT16
                            | data_type::BFLOAT16 => tensor::F32_BYTES,
                            _ => tensor::I64_BYTES,
                        };
                        let bytes = (t.len() as u64).checked_mul(width);
                        self.hold(&at, bytes).and_then(|()| cast(t, to)).map(known)
                    }
                    _ => return None,
                }
            }
            "Gather" => {
                let (data, idx) = (known_or_sym(&first)?, host(get(1)?)?);
                if attrs.int("axis").unwrap_or(0) != 0 {
                    return None;
                }
                fold::gather(&data, &idx).map(sym_value)
            }
            "Concat" => {
                let parts: Option<Vec<SymInts>> = inputs
                    .iter()
                    .map(|v| v.as_ref().and_then(known_or_sym))
                    .collect();
                Ok(sym_value(fold::concat(&parts?)))
            }
            "Unsqueeze" | "Squeeze" => {
                let data = known_or_sym(&first)?;
                let to_vector = op == "Unsqueeze";
                // A scalar becomes a vector of one entry, or a vector of one entry a
                // scalar, along axis 0 only; anything else is the graph's to compute.
                let axes = match get(1) {
                    Some(v) => Some(host(v)?.as_i64()),
                    None => attrs.ints("axes"),
                };
                let axis_zero = axes.is_none_or(|a| a == [0] || a == [-1]);
                if data.scalar != to_vector || !axis_zero || (!to_vector && data.items.len() != 1) {
                    return None;
                }
                Ok(sym_value(SymInts {
                    scalar: !to_vector,
                    items: data.items,
                }))
            }
            "Slice" => {
                let data = known_or_sym(&first)?;
                // One axis (the vector's): every given start, end, axis and step has
                // exactly one entry, and the axis is 0.
                let one = |i: usize, default: i64| -> Option<Result<i64, String>> {
                    match get(i) {
                        None => Some(Ok(default)),
                        Some(v) => {
                            let values = host(v)?.as_i64();
                            Some(match values.as_slice() {
                                [x] => Ok(*x),
                                _ => Err(format!(
                                    "Slice of a vector takes one entry per input; input {i} has {}",
                                    values.len()
                                )),
                            })
                        }
                    }
                };
                let sliced = (|| -> Option<Result<SymInts, String>> {
                    let (starts, ends, axis, step) = if self.opset < 10 {
                        // Before opset 10, starts, ends and axes are attributes.
                        let attr = |name: &str, default: Option<i64>| match attrs.ints(name) {
                            Some(v) if v.len() == 1 => Some(Ok(v[0])),
                            Some(v) => Some(Err(format!(
                                "Slice of a vector takes one entry per attribute; '{name}' has {}",
                                v.len()
                            ))),
                            None => default.map(Ok),
                        };
                        (
                            attr("starts", None)?,
                            attr("ends", None)?,
                            attr("axes", Some(0))?,
                            Ok(1),
                        )
                    } else {
                        (one(1, 0)?, one(2, i64::MAX)?, one(3, 0)?, one(4, 1)?)
                    };
                    Some((|| {
                        let axis = axis?;
                        if axis != 0 && axis != -1 {
                            return Err(format!("Slice axis {axis} of a vector"));
                        }
                        fold::slice(&data, starts?, ends?, step?)
                    })())
                })()?;
                sliced.map(sym_value)
            }
            "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" | "Mod"
                if attrs.int("fmod").unwrap_or(0) == 0 =>
            {
                let (a, b) = (known_or_sym(&first)?, known_or_sym(get(1)?)?);
                fold::arithmetic(op, &a, &b).map(sym_value)
            }
            "Equal" => {
                let (a, b) = (known_or_sym(&first)?, known_or_sym(get(1)?)?);
                fold::equal(&a, &b).map(|v| {
                    let dims = if a.scalar && b.scalar {
                        vec![]
                    } else {
                        vec![v.len()]
                    };
                    known(HostTensor {
                        dims,
                        elements: Elements::Bool(v),
                    })
                })
            }
            "Where" => {
                let Value::Known(cond) = &first else {
                    return None;
                };
                let Elements::Bool(c) = &cond.elements else {
                    return None;
                };
                if cond.dims.len() > 1 {
                    return None;
                }
                let (a, b) = (known_or_sym(get(1)?)?, known_or_sym(get(2)?)?);
                fold::select(c, &a, &b).map(sym_value)
            }
            "Range" => {
                let (start, limit, delta) = (host(get(0)?)?, host(get(1)?)?, host(get(2)?)?);
                let width = match start.elements {
                    Elements::F32(_) => tensor::F32_BYTES,
                    _ => tensor::I64_BYTES,
                };
                range_len(&start, &limit, &delta)
                    .and_then(|n| {
                        self.hold_constant(&at, n, width)?;
                        range(&start, &delta, n.unwrap_or(0))
                    })
                    .map(known)
            }
            "ConstantOfShape" => self.fold_constant_of_shape(&at, &attrs, &first, &host)?,
            "Reshape" => {
                let (Value::Known(t), Some(target)) = (&first, get(1)) else {
                    return None;
                };
                let target = host(target)?.as_i64();
                let allow_zero = attrs.int("allowzero").unwrap_or(0) != 0;
                self.hold(&at, Some(t.bytes()))
                    .and_then(|()| reshape_known(t, &target, allow_zero))
                    .map(known)
            }
            _ => return None,
        };
        Some(folded.map(|v| vec![v]).map_err(|e| vec![e]))
    }

    /// `ConstantOfShape` of a known shape (its values made once they are held), or of a
    /// shape holding the symbolic batch (one value, [`Value::Fill`]); `None` when the
    /// shape is not an integer vector.
    fn fold_constant_of_shape(
        &mut self,
        at: &str,
        attrs: &Attrs,
        shape: &Value,
        host: &dyn Fn(&Value) -> Option<Rc<HostTensor>>,
    ) -> Option<Result<Value, String>> {
        let one = match fill_value(attrs) {
            Ok(v) => v,
            Err(e) => return Some(Err(e)),
        };
        if let (None, Value::Shape(s)) = (host(shape), shape) {
            let dims = s
                .items
                .iter()
                .map(|d| match d {
                    SymInt::Known(v) => Dim::Known((*v).max(0) as usize),
                    SymInt::Dim(d) => d.clone(),
                })
                .collect();
            return Some(Ok(Value::Fill(dims, one)));
        }
        let shape = host(shape)?;
        Some((|| {
            if shape.len() > self.limits.max_rank {
                return Err(format!(
                    "a shape of {} axes is over the limit of {} axes (--max-rank)",
                    shape.len(),
                    self.limits.max_rank
                ));
            }
            let dims: Vec<usize> = shape
                .as_i64()
                .iter()
                .map(|&d| usize::try_from(d).map_err(|_| format!("negative dimension {d}")))
                .collect::<Result<_, _>>()?;
            let n = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64));
            let width = (one.bytes() / one.len().max(1) as u64).max(1);
            self.hold_constant(at, n, width)?;
            let n = n.unwrap_or(0) as usize;
            let elements = match &one.elements {
                Elements::F32(v) => Elements::F32(vec![v[0]; n]),
                Elements::I64(v) => Elements::I64(vec![v[0]; n]),
                Elements::Bool(v) => Elements::Bool(vec![v[0]; n]),
            };
            Ok(known(HostTensor { dims, elements }))
        })())
    }

    /// A `Constant` node's value, checked against `max_constant_elements` and held
    /// before it is decoded or copied.
    fn constant(&mut self, at: &str, attrs: &Attrs) -> Result<Value, String> {
        let a = attrs
            .0
            .first()
            .ok_or("a Constant without a value attribute")?;
        let (elements, width) = match a.name.as_str() {
            "value" => {
                let t = a.t.as_ref().ok_or("value is not a tensor")?;
                let (n, bytes) = tensor::decoded_size(t, "Constant value", self.limits)
                    .map_err(|e| e.to_string())?;
                (n, bytes / n.max(1))
            }
            "value_float" | "value_int" => (1, tensor::I64_BYTES),
            "value_floats" => (a.floats.len() as u64, tensor::F32_BYTES),
            "value_ints" => (a.ints.len() as u64, tensor::I64_BYTES),
            other => return Err(format!("Constant attribute '{other}' is not supported")),
        };
        self.hold_constant(at, Some(elements), width)?;
        let t = match a.name.as_str() {
            "value" => tensor::decode(
                a.t.as_ref().ok_or("value is not a tensor")?,
                "Constant value",
                self.external,
                self.limits,
            )
            .map_err(|e| e.to_string())?,
            "value_float" => HostTensor {
                dims: vec![],
                elements: Elements::F32(vec![a.f]),
            },
            "value_floats" => HostTensor {
                dims: vec![a.floats.len()],
                elements: Elements::F32(a.floats.clone()),
            },
            "value_int" => HostTensor::ints(vec![], vec![a.i]),
            _ => HostTensor::ints(vec![a.ints.len()], a.ints.clone()),
        };
        Ok(known(t))
    }

    /// A value as a reference in the Sluice graph: a computed value as is, a known one
    /// written once as a `constant` (with a `cast` for integers and booleans) or, when
    /// large, a weight read by `param`.
    fn reference(&mut self, name: &str) -> Result<(String, TensorType), String> {
        match self.values.get(name).cloned() {
            Some(Value::Graph(r, ty)) => Ok((r, ty)),
            Some(Value::Known(t)) => {
                if let Some(r) = self.materialised.get(name).cloned() {
                    let ty = self.type_of(&r)?;
                    return Ok((r, ty));
                }
                let r = self.materialise(name, &t)?;
                self.materialised.insert(name.to_string(), r.0.clone());
                Ok(r)
            }
            Some(Value::Shape(_) | Value::Fill(..)) => Err(format!(
                "'{name}' is computed from the symbolic batch size and used as data; Sluice folds such shape arithmetic only into shape attributes"
            )),
            _ => Err(format!("'{name}' is not available")),
        }
    }

    fn materialise(&mut self, name: &str, t: &HostTensor) -> Result<(String, TensorType), String> {
        let shape_json = json!(t.dims);
        let id = self.fresh_id(name);
        let count = t.len() as u64;
        if let Elements::F32(values) = &t.elements {
            if t.len() > INLINE_ELEMENTS || values.iter().any(|v| !v.is_finite()) {
                let key = format!("{id}.value");
                self.hold_weight(&format!("weight '{key}'"), t, Some(t.bytes()))?;
                self.weights.insert(key.clone(), t.to_tensor()?);
                return self
                    .emit(
                        &id,
                        "param",
                        vec![],
                        json!({ "key": key, "shape": shape_json }),
                    )
                    .map(|(r, mut tys)| (r, tys.remove(0)));
            }
            self.hold(
                &format!("constant '{id}'"),
                count.checked_mul(JSON_NUMBER_BYTES),
            )?;
            let attrs = json!({ "value": values, "shape": shape_json });
            return self
                .emit(&id, "constant", vec![], attrs)
                .map(|(r, mut tys)| (r, tys.remove(0)));
        }
        let exact = (1i64 << 24) as f32;
        let too_large = || {
            format!(
                "the integer constant '{name}' is too large to write into the graph (values beyond ±2^24 or too many elements)"
            )
        };
        if count > self.limits.max_constant_elements {
            return Err(too_large());
        }
        self.hold(
            &format!("constant '{id}'"),
            count.checked_mul(JSON_NUMBER_BYTES + tensor::F32_BYTES),
        )?;
        let values = t.as_f32();
        if values.iter().any(|v| v.abs() > exact) {
            return Err(too_large());
        }
        let raw = format!("{id}_f32");
        let raw = self.fresh_id(&raw);
        self.emit(
            &raw,
            "constant",
            vec![],
            json!({ "value": values, "shape": shape_json }),
        )?;
        self.emit(&id, "cast", vec![raw], json!({ "to": t.sluice_dtype() }))
            .map(|(r, mut tys)| (r, tys.remove(0)))
    }

    /// Writes a Sluice node and infers its outputs' types.
    fn emit(
        &mut self,
        id: &str,
        op: &str,
        inputs: Vec<String>,
        attrs: Json,
    ) -> Result<(String, Vec<TensorType>), String> {
        let attrs = match attrs {
            Json::Object(m) => m,
            _ => Map::new(),
        };
        let parsed = ops::parse(op, &attrs).map_err(|problems| {
            problems
                .into_iter()
                .map(|(a, m)| {
                    if a == "op" {
                        m
                    } else {
                        format!("attribute '{a}': {m}")
                    }
                })
                .collect::<Vec<_>>()
                .join("; ")
        })?;
        parsed.check_arity(inputs.len())?;
        let types: Vec<TensorType> = inputs
            .iter()
            .map(|r| self.type_of(r))
            .collect::<Result<_, _>>()?;
        let outputs = parsed.infer(&types)?;
        let specs = parsed.params(&types)?;
        for spec in &specs {
            let key = match parsed.param_key() {
                Some(k) => k.to_string(),
                None => format!("{id}.{}", spec.name),
            };
            if let Some(w) = self.weights.get(&key) {
                if w.shape != spec.shape {
                    return Err(format!(
                        "weight '{}' has shape {:?}, but Sluice's {op} expects {:?}",
                        spec.name, w.shape, spec.shape
                    ));
                }
            }
        }
        if self.nodes.len() >= self.limits.max_nodes {
            return Err(format!(
                "the imported graph needs more than {} nodes (--max-nodes)",
                self.limits.max_nodes
            ));
        }
        self.nodes.push(NodeDoc {
            id: id.to_string(),
            op: op.to_string(),
            inputs,
            attrs,
        });
        for (k, ty) in outputs.iter().enumerate() {
            let r = if k == 0 {
                id.to_string()
            } else {
                format!("{id}:{k}")
            };
            self.types_insert(r, ty.clone());
        }
        Ok((id.to_string(), outputs))
    }

    fn types_insert(&mut self, reference: String, ty: TensorType) {
        self.types.insert(reference, ty);
    }

    fn type_of(&self, reference: &str) -> Result<TensorType, String> {
        if let Some(decl) = self.inputs.get(reference) {
            return Ok(TensorType {
                shape: decl.shape.clone(),
                dtype: decl.dtype,
            });
        }
        self.types
            .get(reference)
            .cloned()
            .ok_or_else(|| format!("internal: no type for '{reference}'"))
    }

    /// Translates a node into Sluice nodes.
    fn translate(&mut self, node: &NodeProto) -> Result<Vec<Value>, Vec<String>> {
        let attrs = Attrs(&node.attribute);
        let one = |s: &str| vec![s.to_string()];
        if node.input.first().is_none_or(String::is_empty) || node.output.is_empty() {
            return Err(one("a node needs its first input and an output"));
        }
        match node.op_type.as_str() {
            "Identity" => Ok(vec![self.values[&node.input[0]].clone()]),
            "Dropout" => {
                if node.output.get(1).is_some_and(|m| self.used.contains(m)) {
                    return Err(one("the mask output is produced only in training"));
                }
                // Inference (the output is the input) only where training_mode is known
                // to be false: a flag known only at run time could ask for either.
                let training = |t: &HostTensor| t.as_i64().iter().any(|&v| v != 0);
                match (
                    node.input.get(2).filter(|n| !n.is_empty()),
                    self.input(node, 2),
                ) {
                    (None, _) => {}
                    (Some(_), Some(Value::Known(t))) if !training(t) => {}
                    (Some(_), Some(Value::Fill(_, t))) if !training(t) => {}
                    (Some(_), Some(Value::Known(_) | Value::Fill(..))) => {
                        return Err(one("training_mode=1 (random dropping) is not imported"));
                    }
                    (Some(name), _) => {
                        return Err(vec![format!(
                            "input 2 '{name}' (training_mode) is known only at run time: Sluice cannot choose at run time between inference (the output is the input) and training (random dropping); give it as an initialiser or a constant"
                        )]);
                    }
                }
                Ok(vec![self.values[&node.input[0]].clone()])
            }
            "Gemm" if node.input.get(1).is_none_or(String::is_empty) => {
                Err(one("Gemm needs inputs A and B"))
            }
            "Gemm" => self.gemm(node, &attrs),
            "Sum" | "Mean" => self.variadic(node),
            "Max" | "Min" if node.input.len() != 2 => self.variadic(node),
            "LRN" => self.lrn(node, &attrs),
            "Clip"
                if [1, 2]
                    .iter()
                    .any(|&i| matches!(self.input(node, i), Some(Value::Graph(..)))) =>
            {
                self.computed_clip(node)
            }
            "Softmax" | "LogSoftmax" if self.opset < 13 => self.coerced_softmax(node, &attrs),
            "GlobalMaxPool" => {
                let (x, ty) = self.reference(&node.input[0]).map_err(|e| vec![e])?;
                let axes: Vec<usize> = (2..ty.shape.len()).collect();
                self.write(
                    node,
                    "reduce_max",
                    vec![x],
                    json!({ "axes": axes, "keepdims": true }),
                )
            }
            _ => self.by_rule(node, &attrs),
        }
    }

    /// The outputs of a written node as values.
    fn write(
        &mut self,
        node: &NodeProto,
        op: &str,
        inputs: Vec<String>,
        attrs: Json,
    ) -> Result<Vec<Value>, Vec<String>> {
        let base = node
            .output
            .first()
            .filter(|o| !o.is_empty())
            .cloned()
            .unwrap_or_else(|| node_label(node));
        let id = self.fresh_id(&base);
        let (r, types) = self.emit(&id, op, inputs, attrs).map_err(|e| vec![e])?;
        Ok(types
            .into_iter()
            .enumerate()
            .map(|(k, ty)| {
                let reference = if k == 0 {
                    r.clone()
                } else {
                    format!("{r}:{k}")
                };
                Value::Graph(reference, ty)
            })
            .collect())
    }

    /// The generic mapping.
    fn by_rule(&mut self, node: &NodeProto, attrs: &Attrs) -> Result<Vec<Value>, Vec<String>> {
        let op = sluice_name(&node.op_type);
        let Some(schema) = ops::schema(&op) else {
            return Err(vec![format!("operator {} is not supported", node.op_type)]);
        };
        if schema.family == "grad" || schema.family == "loss" || op == "param" {
            return Err(vec![format!("operator {} is not supported", node.op_type)]);
        }
        let mut problems = Vec::new();
        let mut out = Map::new();
        for a in attrs.0 {
            if a.name == "activations" && matches!(node.op_type.as_str(), "LSTM" | "GRU") {
                if !default_activations(node, a) {
                    problems.push(format!(
                        "attribute 'activations' {:?}: only the default activations are supported",
                        a.strings
                            .iter()
                            .map(|s| String::from_utf8_lossy(s))
                            .collect::<Vec<_>>()
                    ));
                }
                continue;
            }
            let name = RENAMES
                .iter()
                .find(|(o, from, _)| *o == node.op_type && *from == a.name)
                .map_or(a.name.clone(), |(_, _, to)| (*to).to_string());
            match schema.attrs.iter().find(|s| s.name == name) {
                Some(spec) => match attr_json(a, spec.kind) {
                    Ok(v) => {
                        out.insert(name, v);
                    }
                    Err(e) => problems.push(format!("attribute '{}': {e}", a.name)),
                },
                None => {
                    let ignored = IGNORED
                        .iter()
                        .find(|(o, n, _)| (o.is_empty() || *o == node.op_type) && *n == a.name);
                    match ignored {
                        Some((_, _, None)) => {}
                        Some((_, _, Some(v))) if a.i == *v => {}
                        _ => problems.push(format!(
                            "attribute '{}' ({}) is not supported",
                            a.name,
                            show_attr(a)
                        )),
                    }
                }
            }
        }
        for (_, attr, default) in ONNX_DEFAULTS.iter().filter(|(o, _, _)| *o == node.op_type) {
            if !out.contains_key(*attr) {
                if let Ok(v) = serde_json::from_str(default) {
                    out.insert((*attr).to_string(), v);
                }
            }
        }
        let weights = WEIGHT_INPUTS
            .iter()
            .find(|(o, _)| *o == node.op_type)
            .map(|(_, w)| *w);
        let mut inputs = Vec::new();
        let mut pending_weights = Vec::new();
        let mut fills: Vec<Vec<Dim>> = Vec::new();
        let last_given = node.input.iter().rposition(|n| !n.is_empty());
        for (i, name) in node.input.iter().enumerate() {
            let zero_state = matches!(
                (node.op_type.as_str(), i),
                ("LSTM" | "GRU", 5) | ("LSTM", 6)
            ) && matches!(self.values.get(name), Some(Value::Fill(_, v)) if v.as_f32().iter().all(|&x| x == 0.0));
            if name.is_empty() || zero_state {
                // An omitted optional input before a given one is a zero-element tensor
                // (a zero initial state is the default, so it is omitted too).
                if last_given.is_some_and(|l| l > i)
                    && !CONST_INPUTS
                        .iter()
                        .any(|(o, k, _)| *o == node.op_type && *k == i)
                {
                    let empty = HostTensor {
                        dims: vec![0],
                        elements: Elements::F32(vec![]),
                    };
                    match self.materialise(&format!("{}_none{i}", node_label(node)), &empty) {
                        Ok((r, _)) => inputs.push(r),
                        Err(e) => problems.push(e),
                    }
                }
                continue;
            }
            if let Some((_, _, attr)) = CONST_INPUTS
                .iter()
                .find(|(o, k, _)| *o == node.op_type && *k == i)
            {
                match self.const_input(node, i, attr, schema) {
                    Ok(Some(v)) => {
                        out.insert((*attr).to_string(), v);
                    }
                    Ok(None) => {}
                    Err(e) => problems.push(e),
                }
                continue;
            }
            if let Some(Some(w)) = weights.and_then(|w| w.get(i)) {
                match self.values.get(name).cloned() {
                    Some(Value::Known(t)) => {
                        let converted = self
                            .hold_weight(&format!("weight '{name}'"), &t, Some(weight_bytes(&t)))
                            .and_then(|()| t.to_tensor());
                        match converted {
                            Ok(t) => pending_weights.push(((*w).to_string(), t)),
                            Err(e) => problems.push(format!("weight '{name}': {e}")),
                        }
                    }
                    _ => problems.push(format!(
                        "input {i} '{name}' ({w}) must be an initialiser: Sluice keeps it as a weight"
                    )),
                }
                continue;
            }
            if let Some(Value::Fill(shape, value)) = self.values.get(name).cloned() {
                if matches!(schema.family, "elementwise" | "convert") {
                    // A broadcast scalar gives the same result when the fill's shape
                    // broadcasts into the output's (checked once the output is known).
                    let one = HostTensor {
                        dims: vec![1; shape.len()],
                        elements: value.elements.clone(),
                    };
                    match self.materialise(&format!("{name}_fill"), &one) {
                        Ok((r, _)) => {
                            fills.push(shape);
                            inputs.push(r);
                        }
                        Err(e) => problems.push(e),
                    }
                    continue;
                }
            }
            match self.reference(name) {
                Ok((r, _)) => inputs.push(r),
                Err(e) => problems.push(e),
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        if op == "layer_norm" && !pending_weights.iter().any(|(n, _)| n == "bias") {
            // ONNX's bias is optional; Sluice's layer_norm always adds one: zeros.
            if let Some((_, scale)) = pending_weights.iter().find(|(n, _)| n == "scale") {
                let shape = scale.shape.clone();
                let bytes = (scale.len() as u64).checked_mul(tensor::F32_BYTES);
                self.hold("a layer_norm's zero bias", bytes)
                    .map_err(|e| vec![e])?;
                let zeros = crate::tensor::Tensor::full(shape, 0.0);
                pending_weights.push(("bias".to_string(), zeros));
            }
        }
        self.op_specific(node, &op, &inputs, &pending_weights, &mut out)?;
        let base = node
            .output
            .first()
            .filter(|o| !o.is_empty())
            .cloned()
            .unwrap_or_else(|| node_label(node));
        let id = self.fresh_id(&base);
        for (w, t) in pending_weights {
            self.weights.insert(format!("{id}.{w}"), t);
        }
        let (r, types) = self
            .emit(&id, &op, inputs, Json::Object(out))
            .map_err(|e| vec![e])?;
        for shape in fills {
            let out = &types[0].shape;
            if crate::shape::broadcast(out, &shape).as_ref() != Ok(out) {
                return Err(vec![format!(
                    "a ConstantOfShape of the run-time shape {} does not broadcast into the output {}",
                    crate::shape::show(&shape),
                    crate::shape::show(out)
                )]);
            }
        }
        let n = node.output.len();
        if types.len() < n {
            let used: Vec<&String> = node.output[types.len()..]
                .iter()
                .filter(|o| self.used.contains(*o))
                .collect();
            if !used.is_empty() {
                return Err(vec![format!(
                    "Sluice's {op} gives {} output(s); output(s) {used:?} are not produced",
                    types.len()
                )]);
            }
        }
        Ok(types
            .into_iter()
            .enumerate()
            .map(|(k, ty)| {
                let reference = if k == 0 {
                    r.clone()
                } else {
                    format!("{r}:{k}")
                };
                Value::Graph(reference, ty)
            })
            .collect())
    }

    /// A constant input as an attribute value (`None` when omitted).
    fn const_input(
        &self,
        node: &NodeProto,
        i: usize,
        attr: &str,
        schema: &ops::OpSchema,
    ) -> Result<Option<Json>, String> {
        let name = &node.input[i];
        let kind = schema.attrs.iter().find(|s| s.name == attr).map(|s| s.kind);
        let value = self.values.get(name);
        if node.op_type == "Reshape" || node.op_type == "Expand" {
            if let Some(Value::Shape(s)) = value {
                if s.to_host().is_none() {
                    let Some(Value::Graph(_, ty)) = self.input(node, 0) else {
                        return Err("the data input is not a computed value".into());
                    };
                    if node.op_type == "Expand" {
                        return Err(format!(
                            "input {i} '{name}' (shape) depends on the symbolic batch size"
                        ));
                    }
                    return fold::reshape_target(&ty.shape, s).map(|v| Some(json!(v)));
                }
            }
        }
        let t = match value {
            Some(Value::Known(t)) => t.clone(),
            Some(Value::Shape(s)) => s.to_host().map(Rc::new).ok_or_else(|| {
                format!("input {i} '{name}' ({attr}) depends on the symbolic batch size")
            })?,
            _ => {
                return Err(format!(
                    "input {i} '{name}' ({attr}) must be known when the model is loaded (an initialiser or a constant), not computed"
                ))
            }
        };
        if t.is_empty() {
            return Ok(None); // an empty tensor stands for an absent input (Resize's roi, scales)
        }
        let kind = kind.ok_or_else(|| format!("input {i} '{name}' ({attr}) is not supported"))?;
        if !matches!(kind, AttrKind::Int | AttrKind::Float | AttrKind::Bool) {
            self.limits
                .check(
                    Limit::MaxListLen,
                    format!("input {i} '{name}' ({attr})"),
                    "values",
                    Some(t.len() as u64),
                )
                .map_err(|e| e.to_string())?;
        }
        Ok(Some(match kind {
            AttrKind::Int => json!(t.as_i64().first().copied().unwrap_or(0)),
            AttrKind::Float => json!(t.as_f32().first().copied().unwrap_or(0.0)),
            AttrKind::Bool => json!(t.as_i64().first().copied().unwrap_or(0) != 0),
            AttrKind::Floats => json!(t.as_f32()),
            _ => json!(t.as_i64()),
        }))
    }

    /// Adjustments of a few operators after the generic mapping.
    fn op_specific(
        &self,
        node: &NodeProto,
        op: &str,
        inputs: &[String],
        weights: &[(String, crate::tensor::Tensor)],
        attrs: &mut Map<String, Json>,
    ) -> Result<(), Vec<String>> {
        let x_shape = inputs
            .first()
            .and_then(|r| self.type_of(r).ok())
            .map(|t| t.shape);
        match op {
            "conv2d" | "max_pool2d" | "avg_pool2d" | "conv_transpose2d" => {
                let weight = weights.iter().find(|(n, _)| n == "weight").map(|(_, t)| t);
                if let Some(w) = weight {
                    attrs
                        .entry("kernel_size")
                        .or_insert_with(|| json!(w.shape[2..].to_vec()));
                    let out = if op == "conv_transpose2d" {
                        let g = attrs.get("groups").and_then(Json::as_u64).unwrap_or(1) as usize;
                        w.shape.get(1).copied().unwrap_or(0) * g
                    } else {
                        w.shape[0]
                    };
                    attrs.insert("out_channels".into(), json!(out));
                    attrs.insert(
                        "bias".into(),
                        json!(weights.iter().any(|(n, _)| n == "bias")),
                    );
                }
                if let Some(shape) = &x_shape {
                    explicit_pads(node, shape, attrs).map_err(|e| vec![e])?;
                }
            }
            "cast" => {
                let to = attrs.get("to").and_then(Json::as_i64).unwrap_or(1) as i32;
                let name = match to {
                    data_type::FLOAT | data_type::DOUBLE => "f32",
                    // Rounded to the 16-bit float, the value kept as f32.
                    data_type::FLOAT16 => "f16",
                    data_type::BFLOAT16 => "bf16",
                    data_type::BOOL => "bool",
                    data_type::INT64
                    | data_type::INT32
                    | data_type::INT16
                    | data_type::INT8
                    | data_type::UINT8
                    | data_type::UINT16
                    | data_type::UINT32 => "i32",
                    other => {
                        return Err(vec![format!(
                            "cast to {} is not supported",
                            data_type::name(other)
                        )])
                    }
                };
                attrs.insert("to".into(), json!(name));
            }
            "constant_of_shape" => {
                let int = node
                    .attribute
                    .iter()
                    .find(|a| a.name == "value")
                    .and_then(|a| a.t.as_ref())
                    .is_some_and(|t| {
                        !matches!(
                            t.data_type,
                            data_type::FLOAT
                                | data_type::DOUBLE
                                | data_type::FLOAT16
                                | data_type::BFLOAT16
                        )
                    });
                attrs.insert("dtype".into(), json!(if int { "i32" } else { "f32" }));
            }
            "range" => {
                let int = matches!(
                    self.input(node, 0),
                    Some(Value::Known(t)) if matches!(t.elements, Elements::I64(_))
                );
                attrs.insert("dtype".into(), json!(if int { "i32" } else { "f32" }));
            }
            "reduce_sum" | "reduce_mean" | "reduce_max" | "reduce_min" | "reduce_prod"
            | "reduce_l2" => {
                let empty = attrs
                    .get("axes")
                    .and_then(Json::as_array)
                    .is_some_and(Vec::is_empty);
                let noop = attrs
                    .remove("noop_with_empty_axes")
                    .and_then(|v| v.as_i64().or(v.as_bool().map(i64::from)))
                    == Some(1);
                if empty && !noop {
                    attrs.remove("axes");
                }
                if noop && !attrs.contains_key("axes") {
                    attrs.insert("axes".into(), json!([]));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// `Gemm(A, B, C)`: `linear` when it is one (A not transposed, B known, α = β = 1),
    /// else a composition.
    fn gemm(&mut self, node: &NodeProto, attrs: &Attrs) -> Result<Vec<Value>, Vec<String>> {
        let alpha = attrs.float("alpha").unwrap_or(1.0);
        let beta = attrs.float("beta").unwrap_or(1.0);
        let trans_a = attrs.int("transA").unwrap_or(0) != 0;
        let trans_b = attrs.int("transB").unwrap_or(0) != 0;
        let b = match self.input(node, 1) {
            Some(Value::Known(t)) if t.dims.len() == 2 => Some(t.clone()),
            _ => None,
        };
        let c = self.input(node, 2).cloned();
        let (a_ref, _) = self.reference(&node.input[0]).map_err(|e| vec![e])?;
        let a_ref = if trans_a {
            let id = self.fresh_id(&format!("{}_at", node.input[0]));
            self.emit(&id, "transpose", vec![a_ref], json!({ "perm": [1, 0] }))
                .map_err(|e| vec![e])?
                .0
        } else {
            a_ref
        };
        if let (Some(b), true, true) = (&b, alpha == 1.0, beta == 1.0 || c.is_none()) {
            let (k, n) = if trans_b {
                (b.dims[1], b.dims[0])
            } else {
                (b.dims[0], b.dims[1])
            };
            let bias = match &c {
                None => None,
                Some(Value::Known(t)) if t.len() == n || t.len() == 1 => {
                    let v = t.as_f32();
                    Some(if v.len() == n { v } else { vec![v[0]; n] })
                }
                _ => None,
            };
            if c.is_none() || bias.is_some() {
                let bytes = (b.len() as u64)
                    .checked_add(n as u64)
                    .and_then(|e| e.checked_mul(tensor::F32_BYTES));
                self.hold_weight(&format!("the weights of '{}'", node_label(node)), b, bytes)
                    .map_err(|e| vec![e])?;
                let wv = b.as_f32();
                let weight: Vec<f32> = if trans_b {
                    (0..k)
                        .flat_map(|i| (0..n).map(move |j| (i, j)))
                        .map(|(i, j)| wv[j * k + i])
                        .collect()
                } else {
                    wv
                };
                let base = node.output[0].clone();
                let id = self.fresh_id(&base);
                self.weights.insert(
                    format!("{id}.weight"),
                    crate::tensor::Tensor::f32(vec![k, n], weight),
                );
                if let Some(bias) = bias {
                    self.weights.insert(
                        format!("{id}.bias"),
                        crate::tensor::Tensor::f32(vec![n], bias),
                    );
                }
                let (r, types) = self
                    .emit(
                        &id,
                        "linear",
                        vec![a_ref],
                        json!({ "out_features": n, "bias": c.is_some() }),
                    )
                    .map_err(|e| vec![e])?;
                return Ok(vec![Value::Graph(r, types[0].clone())]);
            }
        }
        let (b_ref, _) = self.reference(&node.input[1]).map_err(|e| vec![e])?;
        let b_ref = if trans_b {
            let id = self.fresh_id(&format!("{}_bt", node.input[1]));
            self.emit(&id, "transpose", vec![b_ref], json!({ "perm": [1, 0] }))
                .map_err(|e| vec![e])?
                .0
        } else {
            b_ref
        };
        let id = self.fresh_id(&format!("{}_ab", node.output[0]));
        let mut y = self
            .emit(&id, "matmul", vec![a_ref, b_ref], json!({}))
            .map_err(|e| vec![e])?
            .0;
        let scale = |im: &mut Self, y: String, s: f32, tag: &str| -> Result<String, String> {
            let cid = im.fresh_id(&format!("{}_{tag}", node.output[0]));
            im.emit(
                &cid,
                "constant",
                vec![],
                json!({ "value": [s], "shape": [] }),
            )?;
            let mid = im.fresh_id(&format!("{}_{tag}x", node.output[0]));
            Ok(im.emit(&mid, "mul", vec![y, cid], json!({}))?.0)
        };
        if alpha != 1.0 {
            y = scale(self, y, alpha, "alpha").map_err(|e| vec![e])?;
        }
        if c.is_some() {
            let (mut c_ref, _) = self.reference(&node.input[2]).map_err(|e| vec![e])?;
            if beta != 1.0 {
                c_ref = scale(self, c_ref, beta, "beta").map_err(|e| vec![e])?;
            }
            let id = self.fresh_id(&node.output[0]);
            let (r, types) = self
                .emit(&id, "add", vec![y, c_ref], json!({}))
                .map_err(|e| vec![e])?;
            return Ok(vec![Value::Graph(r, types[0].clone())]);
        }
        let ty = self.type_of(&y).map_err(|e| vec![e])?;
        Ok(vec![Value::Graph(y, ty)])
    }

    /// `Sum` and `Mean` (any number of inputs), `Max` and `Min` over other than two:
    /// a chain of binary nodes.
    fn variadic(&mut self, node: &NodeProto) -> Result<Vec<Value>, Vec<String>> {
        let op = match node.op_type.as_str() {
            "Sum" | "Mean" => "add",
            "Max" => "max",
            _ => "min",
        };
        let refs: Vec<String> = node
            .input
            .iter()
            .map(|n| self.reference(n).map(|r| r.0))
            .collect::<Result<_, _>>()
            .map_err(|e| vec![e])?;
        let mut acc = refs[0].clone();
        for (k, r) in refs.iter().enumerate().skip(1) {
            let id = self.fresh_id(&format!("{}_{k}", node.output[0]));
            acc = self
                .emit(&id, op, vec![acc, r.clone()], json!({}))
                .map_err(|e| vec![e])?
                .0;
        }
        if node.op_type == "Mean" && refs.len() > 1 {
            let cid = self.fresh_id(&format!("{}_count", node.output[0]));
            self.emit(
                &cid,
                "constant",
                vec![],
                json!({ "value": [refs.len() as f32], "shape": [] }),
            )
            .map_err(|e| vec![e])?;
            let id = self.fresh_id(&node.output[0]);
            acc = self
                .emit(&id, "div", vec![acc, cid], json!({}))
                .map_err(|e| vec![e])?
                .0;
        }
        let ty = self.type_of(&acc).map_err(|e| vec![e])?;
        Ok(vec![Value::Graph(acc, ty)])
    }

    /// `LRN` (local response normalisation across channels) as a composition:
    /// `x / (bias + alpha · mean of x² over the channel window)^beta`, the window mean
    /// an average pool of size × 1 over [N, 1, C, H·W] counting the zero padding (so it
    /// is ONNX's sum over the window divided by `size`).
    fn lrn(&mut self, node: &NodeProto, attrs: &Attrs) -> Result<Vec<Value>, Vec<String>> {
        let size = attrs
            .int("size")
            .ok_or_else(|| vec!["LRN without a size".to_string()])?;
        if size < 1 {
            return Err(vec![format!("LRN size {size} must be at least 1")]);
        }
        let alpha = attrs.float("alpha").unwrap_or(1e-4);
        let beta = attrs.float("beta").unwrap_or(0.75);
        let bias = attrs.float("bias").unwrap_or(1.0);
        let (x, ty) = self.reference(&node.input[0]).map_err(|e| vec![e])?;
        let Some(channels) = ty.shape.get(1).and_then(Dim::known) else {
            return Err(vec![
                "LRN needs an input of rank 3 or more with known channels".into(),
            ]);
        };
        if ty.shape.len() < 3 {
            return Err(vec!["LRN needs an input of rank 3 or more".into()]);
        }
        let back: Vec<i64> = ty
            .shape
            .iter()
            .map(|d| d.known().map_or(0, |v| v as i64))
            .collect();
        let base = node.output[0].clone();
        let e = |r: Result<(String, Vec<TensorType>), String>| r.map(|x| x.0).map_err(|e| vec![e]);
        let id = self.fresh_id(&format!("{base}_sq"));
        let sq = e(self.emit(&id, "mul", vec![x.clone(), x.clone()], json!({})))?;
        let id = self.fresh_id(&format!("{base}_rows"));
        let rows = e(self.emit(
            &id,
            "reshape",
            vec![sq],
            json!({ "shape": [0, 1, channels, -1] }),
        ))?;
        let (lo, hi) = ((size - 1) / 2, size - 1 - (size - 1) / 2);
        let id = self.fresh_id(&format!("{base}_window"));
        let mean = e(self.emit(
            &id,
            "avg_pool2d",
            vec![rows],
            json!({ "kernel_size": [size, 1], "pads": [lo, 0, hi, 0], "count_include_pad": true }),
        ))?;
        let scalar = |im: &mut Self, tag: &str, v: f32| -> Result<String, Vec<String>> {
            let id = im.fresh_id(&format!("{base}_{tag}"));
            e(im.emit(
                &id,
                "constant",
                vec![],
                json!({ "value": [v], "shape": [] }),
            ))
        };
        let a = scalar(self, "alpha", alpha)?;
        let b = scalar(self, "bias", bias)?;
        let p = scalar(self, "beta", beta)?;
        let id = self.fresh_id(&format!("{base}_scaled"));
        let scaled = e(self.emit(&id, "mul", vec![mean, a], json!({})))?;
        let id = self.fresh_id(&format!("{base}_shifted"));
        let shifted = e(self.emit(&id, "add", vec![scaled, b], json!({})))?;
        let id = self.fresh_id(&format!("{base}_pow"));
        let denom = e(self.emit(&id, "pow", vec![shifted, p], json!({})))?;
        let id = self.fresh_id(&format!("{base}_back"));
        let denom = e(self.emit(&id, "reshape", vec![denom], json!({ "shape": back })))?;
        self.write(node, "div", vec![x, denom], json!({}))
    }

    /// `Clip` with a bound computed by the graph: `min(max(x, lo), hi)`, which is ONNX's
    /// Clip (a `lo` above `hi` gives `hi`).
    fn computed_clip(&mut self, node: &NodeProto) -> Result<Vec<Value>, Vec<String>> {
        let (mut y, _) = self.reference(&node.input[0]).map_err(|e| vec![e])?;
        let given: Vec<(usize, &str)> = [(1, "max"), (2, "min")]
            .into_iter()
            .filter(|(i, _)| node.input.get(*i).is_some_and(|n| !n.is_empty()))
            .collect();
        for (k, (i, op)) in given.iter().enumerate() {
            let (bound, _) = self.reference(&node.input[*i]).map_err(|e| vec![e])?;
            if k + 1 == given.len() {
                return self.write(node, op, vec![y, bound], json!({}));
            }
            let id = self.fresh_id(&format!("{}_{op}", node.output[0]));
            y = self
                .emit(&id, op, vec![y, bound], json!({}))
                .map_err(|e| vec![e])?
                .0;
        }
        Ok(vec![self.values[&node.input[0]].clone()])
    }

    /// Softmax before opset 13: the input coerced to 2-D at `axis` (default 1).
    fn coerced_softmax(
        &mut self,
        node: &NodeProto,
        attrs: &Attrs,
    ) -> Result<Vec<Value>, Vec<String>> {
        let op = sluice_name(&node.op_type);
        let (x, ty) = self.reference(&node.input[0]).map_err(|e| vec![e])?;
        let rank = ty.shape.len() as i64;
        let axis = attrs.int("axis").unwrap_or(1);
        let axis = if axis < 0 { axis + rank } else { axis };
        if axis == rank - 1 {
            return self.write(node, &op, vec![x], json!({ "axis": -1 }));
        }
        let fid = self.fresh_id(&format!("{}_flat", node.output[0]));
        let flat = self
            .emit(&fid, "flatten", vec![x], json!({ "axis": axis }))
            .map_err(|e| vec![e])?
            .0;
        let sid = self.fresh_id(&format!("{}_2d", node.output[0]));
        let soft = self
            .emit(&sid, &op, vec![flat], json!({ "axis": 1 }))
            .map_err(|e| vec![e])?
            .0;
        let target: Vec<i64> = ty
            .shape
            .iter()
            .map(|d| match d {
                Dim::Known(v) => *v as i64,
                Dim::Sym(_) => 0,
            })
            .collect();
        self.write(node, "reshape", vec![soft], json!({ "shape": target }))
    }

    /// The Sluice references of the graph's outputs (known outputs written as nodes).
    fn outputs(&mut self, graph: &GraphProto) -> Vec<String> {
        let mut refs = Vec::new();
        for o in &graph.output {
            match self.values.get(&o.name) {
                Some(Value::Failed) => {}
                None => self.unsupported.push(Unsupported {
                    node: o.name.clone(),
                    op_type: "graph output".into(),
                    what: "no node computes it".into(),
                }),
                Some(_) => match self.reference(&o.name) {
                    Ok((r, _)) => refs.push(r),
                    Err(what) => self.unsupported.push(Unsupported {
                        node: o.name.clone(),
                        op_type: "graph output".into(),
                        what,
                    }),
                },
            }
        }
        refs
    }
}

/// Whether an LSTM's or GRU's `activations` are ONNX's defaults for every direction.
fn default_activations(node: &NodeProto, a: &AttributeProto) -> bool {
    let per_direction: &[&str] = if node.op_type == "LSTM" {
        &["Sigmoid", "Tanh", "Tanh"]
    } else {
        &["Sigmoid", "Tanh"]
    };
    !a.strings.is_empty()
        && a.strings.len().is_multiple_of(per_direction.len())
        && a.strings
            .iter()
            .zip(per_direction.iter().cycle())
            .all(|(s, d)| s.as_slice() == d.as_bytes())
}

/// A node's name for messages: its name, else its first output.
fn node_label(node: &NodeProto) -> String {
    if !node.name.is_empty() {
        node.name.clone()
    } else {
        node.output.first().cloned().unwrap_or_default()
    }
}

/// A symbol name for a dimension parameter (Sluice symbols: letters, digits, `_`).
fn symbol(p: &str) -> String {
    let s: String = p
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(32)
        .collect();
    if s.starts_with(|c: char| c.is_ascii_alphabetic()) {
        s
    } else {
        format!("d{s}")
    }
}

fn sym_value(s: SymInts) -> Value {
    match s.to_host() {
        Some(t) => known(t),
        None => Value::Shape(Rc::new(s)),
    }
}

/// Bytes a known tensor takes as a weight (f32 and i32 at 4 bytes, bool at 1).
fn weight_bytes(t: &HostTensor) -> u64 {
    let width = match t.elements {
        Elements::Bool(_) => 1,
        _ => tensor::F32_BYTES,
    };
    (t.len() as u64).saturating_mul(width)
}

/// A known value.
fn known(t: HostTensor) -> Value {
    Value::Known(Rc::new(t))
}

/// Operators folded entry by entry over integer vectors ([`SymInts`]).
const SYM_FOLDS: &[&str] = &[
    "Gather",
    "Concat",
    "Unsqueeze",
    "Squeeze",
    "Slice",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Max",
    "Min",
    "Mod",
    "Equal",
    "Where",
];

/// Whether a value can take part in folding entry by entry: a folded shape, or a known
/// integer or boolean tensor of rank 0 or 1.
fn sym_foldable(v: &Value) -> bool {
    match v {
        Value::Shape(_) => true,
        Value::Known(t) => t.dims.len() <= 1 && !matches!(t.elements, Elements::F32(_)),
        _ => false,
    }
}

/// Entries of a known value or a folded shape.
fn value_len(v: &Value) -> u64 {
    match v {
        Value::Known(t) => t.len() as u64,
        Value::Shape(s) => s.items.len() as u64,
        _ => 0,
    }
}

/// The one value a `ConstantOfShape` fills with (0.0 when it gives none), checked to be
/// one element before it is decoded.
fn fill_value(attrs: &Attrs) -> Result<HostTensor, String> {
    let Some(t) = attrs.get("value").and_then(|a| a.t.as_ref()) else {
        return Ok(HostTensor {
            dims: vec![1],
            elements: Elements::F32(vec![0.0]),
        });
    };
    if tensor::elements(t) != Some(1) {
        return Err(format!(
            "the value attribute must be a one-element tensor; it has shape {:?}",
            t.dims
        ));
    }
    tensor::decode(
        t,
        "ConstantOfShape value",
        &tensor::NoExternalData,
        &Limits::default(),
    )
    .map_err(|e| e.to_string())
}

/// A node's attributes.
struct Attrs<'a>(&'a [AttributeProto]);

impl Attrs<'_> {
    fn get(&self, name: &str) -> Option<&AttributeProto> {
        self.0.iter().find(|a| a.name == name)
    }
    fn int(&self, name: &str) -> Option<i64> {
        self.get(name).map(|a| a.i)
    }
    fn float(&self, name: &str) -> Option<f32> {
        self.get(name).map(|a| a.f)
    }
    fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.get(name).map(|a| a.ints.clone())
    }
}

/// An attribute as the JSON value of a Sluice attribute of `kind`.
fn attr_json(a: &AttributeProto, kind: AttrKind) -> Result<Json, String> {
    if !a.ref_attr_name.is_empty() {
        return Err("references to function attributes are not supported".into());
    }
    let value = match a.r#type {
        attribute_type::INT => match kind {
            AttrKind::Bool => json!(a.i != 0),
            AttrKind::Float => json!(a.i as f64),
            _ => json!(a.i),
        },
        attribute_type::FLOAT => json!(a.f),
        attribute_type::STRING => {
            let s = String::from_utf8_lossy(&a.s).to_string();
            match kind {
                AttrKind::Choice(options) => {
                    let lower = s.to_ascii_lowercase();
                    let pick = options
                        .iter()
                        .find(|o| **o == s || **o == lower)
                        .ok_or_else(|| format!("'{s}' is not one of {options:?}"))?;
                    json!(pick)
                }
                _ => json!(s),
            }
        }
        attribute_type::INTS => json!(a.ints),
        attribute_type::FLOATS => json!(a.floats),
        attribute_type::TENSOR => {
            let t =
                a.t.as_ref()
                    .ok_or("a tensor attribute without its tensor")?;
            if tensor::elements(t) != Some(1) {
                return Err("tensor-valued attributes are supported only as one number".into());
            }
            let v = tensor::decode(t, &a.name, &tensor::NoExternalData, &Limits::default())
                .map_err(|e| e.to_string())?;
            match (v.len(), kind) {
                (1, AttrKind::Int) => json!(v.as_i64()[0]),
                (1, AttrKind::Float) => json!(v.as_f32()[0]),
                _ => return Err("tensor-valued attributes are supported only as one number".into()),
            }
        }
        attribute_type::GRAPH => return Err("subgraphs (control flow) are not supported".into()),
        other => return Err(format!("attribute type {other} is not supported")),
    };
    Ok(value)
}

fn show_attr(a: &AttributeProto) -> String {
    match a.r#type {
        attribute_type::INT => a.i.to_string(),
        attribute_type::FLOAT => a.f.to_string(),
        attribute_type::STRING => format!("\"{}\"", String::from_utf8_lossy(&a.s)),
        attribute_type::INTS => format!("{:?}", a.ints),
        attribute_type::FLOATS => format!("{:?}", a.floats),
        _ => "a value".into(),
    }
}

/// Explicit `[begins..., ends...]` pads for ONNX's `auto_pad` (SAME_UPPER, SAME_LOWER,
/// VALID), which need the input's spatial sizes.
fn explicit_pads(node: &NodeProto, x: &[Dim], attrs: &mut Map<String, Json>) -> Result<(), String> {
    let Some(auto) = node.attribute.iter().find(|a| a.name == "auto_pad") else {
        return Ok(());
    };
    let auto = String::from_utf8_lossy(&auto.s).to_string();
    let spatial = x.len().saturating_sub(2);
    let list = |k: &str, default: i64| -> Vec<i64> {
        attrs
            .get(k)
            .and_then(Json::as_array)
            .map(|a| a.iter().filter_map(Json::as_i64).collect())
            .unwrap_or(vec![default; spatial])
    };
    match auto.as_str() {
        "NOTSET" | "" => Ok(()),
        "VALID" => {
            attrs.insert("pads".into(), json!(vec![0; 2 * spatial]));
            Ok(())
        }
        "SAME_UPPER" | "SAME_LOWER" => {
            let kernel = list("kernel_size", 1);
            let transposed = node.op_type == "ConvTranspose";
            let output_padding = list("output_padding", 0);
            let strides = list("strides", 1);
            let dilations = list("dilations", 1);
            let (mut begin, mut end) = (Vec::new(), Vec::new());
            for a in 0..spatial {
                let size = x[2 + a]
                    .known()
                    .ok_or("auto_pad SAME needs the spatial sizes known")?
                    as i64;
                let (k, s, d) = (
                    kernel.get(a).copied().unwrap_or(1),
                    strides.get(a).copied().unwrap_or(1).max(1),
                    dilations.get(a).copied().unwrap_or(1),
                );
                if [k, s, d].iter().any(|v| !(1..=1 << 20).contains(v)) {
                    return Err(format!(
                        "auto_pad with kernel {k}, stride {s}, dilation {d} out of range"
                    ));
                }
                let total = if transposed {
                    // ConvTranspose: the output is input × stride; the pads make it so.
                    let extra = output_padding
                        .get(a)
                        .copied()
                        .unwrap_or(0)
                        .clamp(0, 1 << 20);
                    (s * (size - 1) + extra + (k - 1) * d + 1 - size * s).max(0)
                } else {
                    let out = (size + s - 1) / s;
                    ((out - 1) * s + (k - 1) * d + 1 - size).max(0)
                };
                let (b, e) = if auto == "SAME_UPPER" {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                };
                begin.push(b);
                end.push(e);
            }
            begin.extend(end);
            attrs.insert("pads".into(), json!(begin));
            Ok(())
        }
        other => Err(format!("auto_pad '{other}' is not an ONNX value")),
    }
}

/// `Cast` of a known tensor (to FLOAT16 or BFLOAT16: rounded as the `cast` operator
/// rounds, the value kept as f32).
fn cast(t: &HostTensor, to: i32) -> Result<HostTensor, String> {
    use crate::ops::convert::HalfFormat;
    let rounded = |half: HalfFormat| -> Vec<f32> {
        t.as_f32()
            .into_iter()
            .map(|x| half.round(f64::from(x)) as f32)
            .collect()
    };
    let elements = match to {
        data_type::FLOAT | data_type::DOUBLE => Elements::F32(t.as_f32()),
        data_type::FLOAT16 => Elements::F32(rounded(HalfFormat::F16)),
        data_type::BFLOAT16 => Elements::F32(rounded(HalfFormat::Bf16)),
        data_type::BOOL => Elements::Bool(t.as_f32().iter().map(|&x| x != 0.0).collect()),
        data_type::INT64
        | data_type::INT32
        | data_type::INT16
        | data_type::INT8
        | data_type::UINT8
        | data_type::UINT16
        | data_type::UINT32
        | data_type::UINT64 => Elements::I64(t.as_i64()),
        other => {
            return Err(format!(
                "cast to {} is not supported",
                data_type::name(other)
            ))
        }
    };
    Ok(HostTensor {
        dims: t.dims.clone(),
        elements,
    })
}

/// The length of `Range(start, limit, delta)` of known scalars (`None`: too long to
/// count), worked out before any element is made.
fn range_len(
    start: &HostTensor,
    limit: &HostTensor,
    delta: &HostTensor,
) -> Result<Option<u64>, String> {
    let first = |t: &HostTensor, what: &str| -> Result<f64, String> {
        if t.len() != 1 {
            return Err(format!(
                "Range's {what} must be a scalar; it has {} elements",
                t.len()
            ));
        }
        Ok(f64::from(t.as_f32()[0]))
    };
    let (s, l, d) = (
        first(start, "start")?,
        first(limit, "limit")?,
        first(delta, "delta")?,
    );
    if d == 0.0 {
        return Err("Range with delta 0".into());
    }
    let n = ((l - s) / d).ceil().max(0.0);
    // Below 2^63 the length converts exactly enough; beyond it, it is uncountable.
    Ok((n.is_finite() && n < 9.2e18).then_some(n as u64))
}

/// `Range` of known scalars, `n` elements long (its length, already held).
fn range(start: &HostTensor, delta: &HostTensor, n: u64) -> Result<HostTensor, String> {
    let n = usize::try_from(n).map_err(|_| "Range is too long for this machine".to_string())?;
    Ok(match start.elements {
        Elements::F32(_) => {
            let (s, d) = (f64::from(start.as_f32()[0]), f64::from(delta.as_f32()[0]));
            HostTensor {
                dims: vec![n],
                elements: Elements::F32((0..n).map(|i| (s + i as f64 * d) as f32).collect()),
            }
        }
        _ => {
            let (s, d) = (start.as_i64()[0], delta.as_i64()[0]);
            let values = (0..n as i64)
                .map(|i| i.checked_mul(d).and_then(|x| x.checked_add(s)))
                .collect::<Option<Vec<_>>>()
                .ok_or("Range overflows 64-bit integers")?;
            HostTensor::ints(vec![n], values)
        }
    })
}

/// `Reshape` of a known tensor; with `allow_zero` (ONNX's `allowzero`), a 0 in the
/// target is a size of 0, else it copies the input's size.
fn reshape_known(t: &HostTensor, target: &[i64], allow_zero: bool) -> Result<HostTensor, String> {
    let n = t.len();
    let mut dims = Vec::with_capacity(target.len());
    let mut infer = None;
    for (i, &d) in target.iter().enumerate() {
        match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                dims.push(1);
            }
            0 if allow_zero => dims.push(0),
            0 => dims.push(*t.dims.get(i).ok_or("reshape copies a missing dimension")?),
            d if d > 0 => dims.push(d as usize),
            _ => return Err(format!("reshape target {target:?} is not valid")),
        }
    }
    let known = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("reshape target {target:?} is too large"))?;
    if let Some(i) = infer {
        if known == 0 || !n.is_multiple_of(known) {
            return Err(format!("cannot reshape {n} elements to {target:?}"));
        }
        dims[i] = n / known;
    } else if known != n {
        return Err(format!("cannot reshape {n} elements to {target:?}"));
    }
    Ok(HostTensor {
        dims,
        elements: t.elements.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::tensor::NoExternalData;
    use super::*;
    use proto::*;

    fn ints(dims: &[i64], values: &[i64]) -> TensorProto {
        TensorProto {
            dims: dims.to_vec(),
            data_type: data_type::INT64,
            int64_data: values.to_vec(),
            ..Default::default()
        }
    }

    fn named(name: &str, mut t: TensorProto) -> TensorProto {
        t.name = name.into();
        t
    }

    fn node(op: &str, inputs: &[&str], output: &str) -> NodeProto {
        NodeProto {
            op_type: op.into(),
            name: output.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.into()],
            ..Default::default()
        }
    }

    fn with_value(mut n: NodeProto, t: TensorProto) -> NodeProto {
        n.attribute.push(AttributeProto {
            name: "value".into(),
            r#type: attribute_type::TENSOR,
            t: Some(t),
            ..Default::default()
        });
        n
    }

    fn input(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                tensor_type: Some(TypeTensor {
                    elem_type: elem,
                    shape: Some(TensorShapeProto {
                        dim: dims
                            .iter()
                            .map(|&d| Dimension {
                                dim_value: Some(d),
                                dim_param: None,
                            })
                            .collect(),
                    }),
                }),
            }),
            ..Default::default()
        }
    }

    fn import(
        nodes: Vec<NodeProto>,
        inputs: Vec<ValueInfoProto>,
        initializer: Vec<TensorProto>,
        output: &str,
        limits: &Limits,
    ) -> Result<Imported, ImportError> {
        let model = ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: 17,
            }],
            graph: Some(GraphProto {
                node: nodes,
                initializer,
                input: inputs,
                output: vec![ValueInfoProto {
                    name: output.into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        import_model(&model, &NoExternalData, limits, &BTreeMap::new())
    }

    /// The first output of an imported model with no inputs, on the CPU reference.
    fn output(m: &Imported) -> Vec<f32> {
        let g = crate::Graph::build(m.doc.clone()).unwrap();
        let out = crate::cpu::run(&g, &m.weights, &HashMap::new()).unwrap();
        out[0].1.to_f32_vec()
    }

    #[test]
    fn folded_constants_are_bounded_before_they_are_made() {
        let fill = |elements: i64| {
            vec![
                with_value(node("Constant", &[], "shape"), ints(&[1], &[elements])),
                with_value(
                    node("ConstantOfShape", &["shape"], "bomb"),
                    ints(&[1], &[1]),
                ),
            ]
        };
        let e = import(fill(1 << 28), vec![], vec![], "bomb", &Limits::default()).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, ImportError::Limit(_)), "{text}");
        for part in [
            "'bomb' (ConstantOfShape)",
            "268435456",
            "--max-constant-elements",
        ] {
            assert!(text.contains(part), "{text}");
        }
        // Under the element limit, int64 values count 8 bytes each against the budget.
        let tight = Limits {
            max_import_bytes: 8 * 1000,
            ..Limits::default()
        };
        let e = import(fill(1001), vec![], vec![], "bomb", &tight).unwrap_err();
        assert!(e.to_string().contains("--max-import-bytes"), "{e}");
        // 100 int64 values (800 bytes), then written into the graph as a constant.
        assert!(import(fill(100), vec![], vec![], "bomb", &tight).is_ok());
        let range = vec![
            with_value(node("Constant", &[], "a"), ints(&[], &[0])),
            with_value(node("Constant", &[], "b"), ints(&[], &[i64::MAX])),
            with_value(node("Constant", &[], "d"), ints(&[], &[1])),
            node("Range", &["a", "b", "d"], "r"),
        ];
        let e = import(range, vec![], vec![], "r", &Limits::default()).unwrap_err();
        assert!(e.to_string().contains("'r' (Range)"), "{e}");
        assert!(e.to_string().contains("max_constant_elements"), "{e}");
        // A Constant node is a constant like a graph file's.
        let small = Limits {
            max_constant_elements: 4,
            ..Limits::default()
        };
        let big = vec![with_value(node("Constant", &[], "c"), ints(&[5], &[1; 5]))];
        let e = import(big, vec![], vec![], "c", &small).unwrap_err();
        assert!(e.to_string().contains("'c' (Constant)"), "{e}");
    }

    #[test]
    fn initialisers_and_their_weights_are_held_against_the_host_limit() {
        // Initialisers, and the weights written from them, count against the host limit.
        let tight = Limits {
            max_host_bytes: 1000,
            ..Limits::default()
        };
        let w = named("w", ints(&[126], &[3; 126])); // 1008 bytes as int64
        let e = import(vec![], vec![], vec![w], "w", &tight).unwrap_err();
        assert!(e.to_string().contains("initialiser 'w'"), "{e}");
        // 100 floats are 400 bytes, and 400 more as the weight written for them.
        let f = |n: usize| TensorProto {
            name: "f".into(),
            dims: vec![n as i64],
            data_type: data_type::FLOAT,
            float_data: vec![1.0; n],
            ..Default::default()
        };
        assert!(import(vec![], vec![], vec![f(100)], "f", &tight).is_ok());
        let e = import(vec![], vec![], vec![f(200)], "f", &tight).unwrap_err();
        assert!(e.to_string().contains("weight"), "{e}");
    }

    #[test]
    fn a_run_time_training_mode_is_refused_by_name() {
        let x = input("x", data_type::FLOAT, &[2, 3]);
        let ratio = TensorProto {
            name: "ratio".into(),
            data_type: data_type::FLOAT,
            float_data: vec![0.5],
            ..Default::default()
        };
        let drop = node("Dropout", &["x", "ratio", "t"], "drop");
        let t = input("t", data_type::BOOL, &[]);
        let e = import(
            vec![drop.clone()],
            vec![x.clone(), t],
            vec![ratio.clone()],
            "drop",
            &Limits::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("node 'drop' (Dropout)"), "{e}");
        assert!(
            e.contains("'t' (training_mode) is known only at run time"),
            "{e}"
        );
        let flag = |v: i32| TensorProto {
            name: "t".into(),
            data_type: data_type::BOOL,
            int32_data: vec![v],
            ..Default::default()
        };
        let ok = import(
            vec![drop.clone()],
            vec![x.clone()],
            vec![ratio.clone(), flag(0)],
            "drop",
            &Limits::default(),
        );
        assert!(ok.is_ok());
        let e = import(
            vec![drop],
            vec![x],
            vec![ratio, flag(1)],
            "drop",
            &Limits::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("training_mode=1"), "{e}");
    }

    #[test]
    fn inputs_the_importer_would_ignore_are_refused() {
        let x = input("x", data_type::FLOAT, &[2]);
        let e = import(
            vec![node("Identity", &["x", "x"], "y")],
            vec![x],
            vec![],
            "y",
            &Limits::default(),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("input 1 'x' is not one of them"),
            "{e}"
        );
    }

    #[test]
    fn folding_keeps_every_input_and_attribute() {
        let consts = |names: &[(&str, i64)]| -> Vec<NodeProto> {
            names
                .iter()
                .map(|(n, v)| with_value(node("Constant", &[], n), ints(&[1], &[*v])))
                .collect()
        };
        // Max of three: the third input counts.
        let mut nodes = consts(&[("a", 1), ("b", 2), ("c", 5)]);
        nodes.push(node("Max", &["a", "b", "c"], "m"));
        let m = import(nodes, vec![], vec![], "m", &Limits::default()).unwrap();
        assert_eq!(output(&m), vec![5.0]);
        // Reshape with allowzero: a 0 in the target is a size of 0.
        let mut nodes = vec![
            with_value(node("Constant", &[], "e"), ints(&[0, 3], &[])),
            with_value(node("Constant", &[], "t"), ints(&[2], &[3, 0])),
        ];
        let mut r = node("Reshape", &["e", "t"], "r");
        r.attribute.push(AttributeProto {
            name: "allowzero".into(),
            r#type: attribute_type::INT,
            i: 1,
            ..Default::default()
        });
        nodes.push(r);
        let m = import(nodes, vec![], vec![], "r", &Limits::default()).unwrap();
        let g = crate::Graph::build(m.doc).unwrap();
        let out = crate::cpu::run(&g, &m.weights, &HashMap::new()).unwrap();
        assert_eq!(out[0].1.shape, vec![3, 0]);
        // Slicing a vector along another axis is not a vector slice.
        let mut nodes = vec![with_value(
            node("Constant", &[], "v"),
            ints(&[3], &[1, 2, 3]),
        )];
        nodes.extend(consts(&[("s", 0), ("e", 2), ("ax", 1)]));
        nodes.push(node("Slice", &["v", "s", "e", "ax"], "y"));
        let e = import(nodes, vec![], vec![], "y", &Limits::default()).unwrap_err();
        assert!(e.to_string().contains("Slice axis 1"), "{e}");
    }

    #[test]
    fn names_map_to_snake_case() {
        assert_eq!(sluice_name("LeakyRelu"), "leaky_relu");
        assert_eq!(sluice_name("HardSigmoid"), "hard_sigmoid");
        assert_eq!(sluice_name("ReduceL2"), "reduce_l2");
        assert_eq!(sluice_name("GatherElements"), "gather_elements");
        assert_eq!(sluice_name("LessOrEqual"), "less_or_equal");
        assert_eq!(sluice_name("Conv"), "conv2d");
        assert_eq!(sluice_name("TopK"), "top_k");
        assert_eq!(sluice_name("MatMul"), "matmul");
        assert_eq!(sluice_name("ArgMax"), "argmax");
    }
}
