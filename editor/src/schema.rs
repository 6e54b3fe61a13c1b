//! Operator schemas as `/api/ops` serves them (the engine's own, serialised): the palette's
//! entries, each operator's ports, and attribute values read from what is typed in the
//! property panel.

use serde::Deserialize;
use serde_json::Value;

/// The palette's pseudo-operator that adds a graph input.
pub const INPUT: &str = "input";

/// How many inputs an operator takes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arity {
    /// Exactly these named inputs.
    Fixed(Vec<String>),
    /// At least this many inputs.
    Variadic(usize),
}

/// The type of an attribute.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttrKind {
    /// An integer.
    Int,
    /// A number.
    Float,
    /// `true` or `false`.
    Bool,
    /// A list of integers.
    Ints,
    /// A list of this many integers, one per axis; a single integer stands for all.
    PerAxis(usize),
    /// A list of numbers.
    Floats,
    /// One of these strings.
    Choice(Vec<String>),
    /// Any string (a weight's key).
    Text,
}

/// One attribute.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AttrInfo {
    /// Its name.
    pub name: String,
    /// Its type.
    pub kind: AttrKind,
    /// The default as JSON text; `None` when required.
    pub default: Option<String>,
    /// One line of documentation.
    pub doc: String,
}

/// One operator of the palette.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct OpInfo {
    /// Name used in graph files.
    pub name: String,
    /// Kernel family (the palette's group).
    pub family: String,
    /// One line of documentation.
    pub doc: String,
    /// Inputs.
    pub inputs: Arity,
    /// Output names.
    pub outputs: Vec<String>,
    /// Attributes.
    pub attrs: Vec<AttrInfo>,
    /// Weights it declares.
    pub params: Vec<String>,
}

/// Reads the body of `/api/ops`.
pub fn parse_ops(body: &Value) -> Result<Vec<OpInfo>, String> {
    let ops = body
        .get("ops")
        .cloned()
        .ok_or("the operator list has no 'ops' field")?;
    serde_json::from_value(ops).map_err(|e| format!("the operator list is malformed: {e}"))
}

/// The engine's own schemas (used when the server cannot be reached).
pub fn builtin_ops() -> Vec<OpInfo> {
    let value = serde_json::json!({ "ops": sluice_engine::ops::schemas() });
    parse_ops(&value).unwrap_or_default()
}

impl OpInfo {
    /// Names of the input ports to show, given how many are connected or held open.
    pub fn input_ports(&self, present: usize) -> Vec<String> {
        match &self.inputs {
            Arity::Fixed(names) => names.clone(),
            Arity::Variadic(min) => (0..(*min).max(present + 1))
                .map(|i| format!("in{i}"))
                .collect(),
        }
    }

    /// How many input ports a new node gets.
    pub fn initial_inputs(&self) -> usize {
        match &self.inputs {
            Arity::Fixed(names) => names.len(),
            Arity::Variadic(min) => *min,
        }
    }

    /// The attribute with this name.
    pub fn attr(&self, name: &str) -> Option<&AttrInfo> {
        self.attrs.iter().find(|a| a.name == name)
    }

    /// Whether the operator matches a palette search (name, family or doc).
    pub fn matches(&self, query: &str) -> bool {
        let q = query.trim().to_lowercase();
        q.is_empty()
            || self.name.to_lowercase().contains(&q)
            || self.family.to_lowercase().contains(&q)
            || self.doc.to_lowercase().contains(&q)
    }
}

/// The port names of node or graph input `id` as drawn: (inputs, outputs). A node has its
/// operator's input ports and as many outputs as the analysis inferred (`inferred`), else
/// as its operator names; a graph input has one output, named after it.
pub fn port_names(
    ops: &[OpInfo],
    doc: &sluice_engine::graph::GraphDoc,
    id: &str,
    inferred: Option<usize>,
) -> (Vec<String>, Vec<String>) {
    let Some(n) = doc.nodes.iter().find(|n| n.id == id) else {
        return (Vec::new(), vec![id.to_string()]);
    };
    let info = ops.iter().find(|o| o.name == n.op);
    let inputs = match info {
        Some(o) => o.input_ports(n.inputs.len()),
        None => (0..n.inputs.len()).map(|k| format!("in{k}")).collect(),
    };
    let names = info.map(|o| o.outputs.clone()).unwrap_or_default();
    let count = inferred.unwrap_or(names.len()).max(1);
    let outputs = (0..count)
        .map(|k| {
            if count == names.len() {
                names[k].clone()
            } else {
                format!("{}{k}", names.first().map_or("out", String::as_str))
            }
        })
        .collect();
    (inputs, outputs)
}

/// The port counts of `id` (see [`port_names`]).
pub fn port_counts(
    ops: &[OpInfo],
    doc: &sluice_engine::graph::GraphDoc,
    id: &str,
    inferred: Option<usize>,
) -> (usize, usize) {
    let (i, o) = port_names(ops, doc, id, inferred);
    (i.len(), o.len())
}

/// Families in palette order, each with its operators.
pub fn by_family(ops: &[OpInfo]) -> Vec<(String, Vec<&OpInfo>)> {
    let mut out: Vec<(String, Vec<&OpInfo>)> = Vec::new();
    for op in ops {
        match out.iter_mut().find(|(f, _)| *f == op.family) {
            Some((_, list)) => list.push(op),
            None => out.push((op.family.clone(), vec![op])),
        }
    }
    out
}

/// Shows an attribute value for editing: `[1, 2]` as `1, 2`, strings bare.
pub fn show_value(v: &Value) -> String {
    match v {
        Value::Array(items) => items.iter().map(show_value).collect::<Vec<_>>().join(", "),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Reads an attribute value as typed: empty means "use the default" (`None`).
pub fn parse_value(kind: &AttrKind, text: &str) -> Result<Option<Value>, String> {
    let t = text.trim();
    if t.is_empty() {
        return Ok(None);
    }
    let int = |s: &str| {
        s.trim()
            .parse::<i64>()
            .map(Value::from)
            .map_err(|_| format!("'{}' is not an integer", s.trim()))
    };
    let float = |s: &str| {
        s.trim()
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .map(Value::from)
            .ok_or_else(|| format!("'{}' is not a number", s.trim()))
    };
    let list = |f: &dyn Fn(&str) -> Result<Value, String>| -> Result<Value, String> {
        let inner = t.trim_start_matches('[').trim_end_matches(']');
        if inner.trim().is_empty() {
            return Ok(Value::Array(Vec::new()));
        }
        inner
            .split(',')
            .map(f)
            .collect::<Result<_, _>>()
            .map(Value::Array)
    };
    let v = match kind {
        AttrKind::Int => int(t)?,
        AttrKind::Float => float(t)?,
        AttrKind::Bool => match t {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => return Err(format!("'{t}' is neither true nor false")),
        },
        AttrKind::Ints => list(&int)?,
        // A bare integer is kept as typed: the engine reads it as that value on every axis.
        AttrKind::PerAxis(_) if !t.contains([',', '[']) => int(t)?,
        AttrKind::PerAxis(_) => list(&int)?,
        AttrKind::Floats => list(&float)?,
        AttrKind::Text => Value::String(t.to_string()),
        AttrKind::Choice(options) => {
            if !options.iter().any(|o| o == t) {
                return Err(format!("'{t}' is not one of {}", options.join(", ")));
            }
            Value::String(t.to_string())
        }
    };
    Ok(Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_schemas_parse_with_ports_and_families() {
        let ops = builtin_ops();
        assert_eq!(ops.len(), sluice_engine::ops::schemas().len());
        let linear = ops.iter().find(|o| o.name == "linear").unwrap();
        assert_eq!(linear.input_ports(0), vec!["x"]);
        assert!(linear.attr("out_features").unwrap().default.is_none());
        let concat = ops.iter().find(|o| o.name == "concat").unwrap();
        assert!(matches!(concat.inputs, Arity::Variadic(_)));
        assert_eq!(concat.input_ports(3).len(), 4.max(concat.initial_inputs()));
        let families = by_family(&ops);
        assert!(families
            .iter()
            .any(|(f, list)| f == "matmul" && list.len() == 2));
        assert!(linear.matches("fully"));
        let conv = ops.iter().find(|o| o.name == "conv2d").unwrap();
        assert_eq!(conv.attr("kernel_size").unwrap().kind, AttrKind::PerAxis(2));
        assert_eq!(conv.attr("pads").unwrap().kind, AttrKind::PerAxis(4));
    }

    #[test]
    fn typed_values_parse_by_kind() {
        assert_eq!(
            parse_value(&AttrKind::Int, " 10 ").unwrap(),
            Some(Value::from(10))
        );
        assert_eq!(parse_value(&AttrKind::Int, "").unwrap(), None);
        assert!(parse_value(&AttrKind::Int, "ten").is_err());
        assert_eq!(
            parse_value(&AttrKind::Ints, "1, 2").unwrap(),
            Some(serde_json::json!([1, 2]))
        );
        assert!(parse_value(&AttrKind::Float, "inf").is_err());
        assert_eq!(
            parse_value(&AttrKind::PerAxis(2), " 3 ").unwrap(),
            Some(Value::from(3))
        );
        assert_eq!(
            parse_value(&AttrKind::PerAxis(2), "[3, 2]").unwrap(),
            Some(serde_json::json!([3, 2]))
        );
        assert!(parse_value(&AttrKind::PerAxis(2), "3x").is_err());
        let choice = AttrKind::Choice(vec!["a".into(), "b".into()]);
        assert!(parse_value(&choice, "c").is_err());
        assert_eq!(show_value(&serde_json::json!([1, 2])), "1, 2");
    }
}
