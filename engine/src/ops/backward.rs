//! The interface of gradient rules: what a rule (each family's `fn grad`, declared next
//! to its forward definition) sees of one forward node and how it emits that node's
//! backward nodes, with the helpers rules share (scalars, sums, undoing broadcasting).
//! The reverse-mode transform that implements it and drives the rules is
//! `crate::autodiff`.

use serde_json::{json, Value};

/// A value of the joint graph, as a reference written in its document (`"fc1"`,
/// `"split1:1"`, or the id of a backward node).
pub type Ref = String;

/// A node's outputs recomputed by existing operators, for a rule that would rather have
/// the autodiff differentiate a composition than write the backward pass by hand (a
/// recurrence unrolled over time). Ids and references are local to the composition.
#[derive(Debug, Clone, Default)]
pub struct Composite {
    /// The name input `k` of the node has in the composition ("" for one it leaves out).
    pub inputs: Vec<String>,
    /// The composition's nodes in order: (id, operator, attributes, inputs).
    pub nodes: Vec<(String, String, Value, Vec<String>)>,
    /// The reference of each output of the node in the composition.
    pub outputs: Vec<String>,
}

/// What a gradient rule sees of one forward node and how it emits its backward nodes.
/// Shapes are concrete (the transform runs on bound graphs). Every method that can fail
/// returns a message; the transform names the node and operator around it.
pub trait GradContext {
    /// The reference of input `k`.
    fn input(&self, k: usize) -> Result<Ref, String>;
    /// The reference of output `k`.
    fn output(&self, k: usize) -> Result<Ref, String>;
    /// The gradient reaching output `k` (summed over its consumers); `None` when none does.
    fn output_grad(&self, k: usize) -> Option<Ref>;
    /// Whether input `k` wants a gradient (it is f32 and depends on something
    /// differentiated).
    fn needs(&self, k: usize) -> bool;
    /// The concrete shape of a value.
    fn shape(&self, v: &str) -> Result<Vec<usize>, String>;
    /// Adds a backward node (operator, attributes, inputs) and returns its output.
    fn emit(&mut self, op: &str, attrs: Value, inputs: &[&str]) -> Result<Ref, String>;
    /// Gives input `k` gradient `v` (of the input's shape).
    fn input_grad(&mut self, k: usize, v: Ref) -> Result<(), String>;
    /// The value of this node's weight `name` (read by a `param` node).
    fn param(&mut self, name: &str) -> Result<Ref, String>;
    /// Gives this node's weight `name` gradient `v` (of the weight's shape).
    fn param_grad(&mut self, name: &str, v: Ref) -> Result<(), String>;
    /// Gives every input that wants one its gradient by differentiating `composite`, which
    /// must compute this node's outputs from its inputs: the composition is emitted again
    /// (recomputing what the backward pass reads) with its reverse-mode backward pass.
    fn composite_grad(&mut self, composite: &Composite) -> Result<(), String>;

    /// The one gradient of a single-output node.
    fn dy(&self) -> Result<Ref, String> {
        self.output_grad(0)
            .ok_or_else(|| "internal: no gradient reaches the output".to_string())
    }

    /// A scalar constant.
    fn scalar(&mut self, v: f32) -> Result<Ref, String> {
        self.emit("constant", json!({ "value": [v], "shape": [] }), &[])
    }

    /// `a op b` for a binary elementwise operator.
    fn binary(&mut self, op: &str, a: &str, b: &str) -> Result<Ref, String> {
        self.emit(op, json!({}), &[a, b])
    }

    /// `v × s` for a scalar `s`.
    fn scale(&mut self, v: &str, s: f32) -> Result<Ref, String> {
        let c = self.scalar(s)?;
        self.binary("mul", v, &c)
    }

    /// Sum over `axes`, keeping them or not.
    fn sum(&mut self, v: &str, axes: &[usize], keepdims: bool) -> Result<Ref, String> {
        if axes.is_empty() {
            return Ok(v.to_string());
        }
        self.emit(
            "reduce_sum",
            json!({ "axes": axes, "keepdims": keepdims }),
            &[v],
        )
    }

    /// `v` reshaped to `shape` (nothing when it has that shape already).
    fn reshape(&mut self, v: &str, shape: &[usize]) -> Result<Ref, String> {
        if self.shape(v)? == shape {
            return Ok(v.to_string());
        }
        self.emit(
            "reshape",
            json!({ "shape": shape, "allowzero": true }),
            &[v],
        )
    }

    /// `v` broadcast to `shape` (nothing when it has that shape already).
    fn expand(&mut self, v: &str, shape: &[usize]) -> Result<Ref, String> {
        if self.shape(v)? == shape {
            return Ok(v.to_string());
        }
        self.emit("expand", json!({ "shape": shape }), &[v])
    }

    /// Zeros of a shape.
    fn zeros(&mut self, shape: &[usize]) -> Result<Ref, String> {
        let z = self.scalar(0.0)?;
        self.emit("expand", json!({ "shape": shape }), &[&z])
    }

    /// The gradient `v` of a broadcast result, summed back to `shape` (numpy broadcasting
    /// undone: leading axes and axes broadcast from size 1 are summed).
    fn unbroadcast(&mut self, v: &str, shape: &[usize]) -> Result<Ref, String> {
        let from = self.shape(v)?;
        let lead = from
            .len()
            .checked_sub(shape.len())
            .ok_or_else(|| format!("internal: cannot sum {from:?} back to the larger {shape:?}"))?;
        let mut axes: Vec<usize> = (0..lead).collect();
        for (i, (&f, &t)) in from[lead..].iter().zip(shape).enumerate() {
            if f != t {
                if t != 1 {
                    return Err(format!("internal: {from:?} is no broadcast of {shape:?}"));
                }
                axes.push(lead + i);
            }
        }
        let summed = self.sum(v, &axes, true)?;
        self.reshape(&summed, shape)
    }

    /// Gives input `k` gradient `v` summed back to the input's shape, when it wants one.
    fn input_grad_unbroadcast(&mut self, k: usize, v: &str) -> Result<(), String> {
        if !self.needs(k) {
            return Ok(());
        }
        let x = self.input(k)?;
        let shape = self.shape(&x)?;
        let g = self.unbroadcast(v, &shape)?;
        self.input_grad(k, g)
    }
}
