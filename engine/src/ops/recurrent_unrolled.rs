//! The gradient of `lstm` and `gru` (backpropagation through time): the cell unrolled
//! over the sequence into existing operators (slices, products, sigmoid, tanh, masks),
//! computing exactly what the fused operator computes, and handed to the autodiff as a
//! [`Composite`] to differentiate. Sequence lengths become per-step masks: past its
//! length a sequence's state holds and its output is 0, which is also how a reverse
//! direction starts at each sequence's own last element (the steps after it change
//! nothing).

use super::backward::{Composite, GradContext};
use super::recurrent::{Cell, RecurrentOp, B, INITIAL_C, INITIAL_H, P, SEQ_LENS};
use serde_json::{json, Value};

/// The names the node's inputs have in the composition, by position.
const NAMES: [&str; 8] = ["x", "w", "r", "b", "lens", "h0", "c0", "p"];

/// Builds a composition node by node.
#[derive(Default)]
struct Unroll {
    nodes: Vec<(String, String, Value, Vec<String>)>,
}

impl Unroll {
    fn add(&mut self, op: &str, attrs: Value, inputs: &[&str]) -> String {
        let id = format!("u{}", self.nodes.len());
        self.nodes.push((
            id.clone(),
            op.to_string(),
            attrs,
            inputs.iter().map(|s| s.to_string()).collect(),
        ));
        id
    }

    fn binary(&mut self, op: &str, a: &str, b: &str) -> String {
        self.add(op, json!({}), &[a, b])
    }

    fn unary(&mut self, op: &str, a: &str) -> String {
        self.add(op, json!({}), &[a])
    }

    /// `v[start..end]` along `axis`.
    fn slice(&mut self, v: &str, axis: usize, start: usize, end: usize) -> String {
        self.add(
            "slice",
            json!({ "starts": [start], "ends": [end], "axes": [axis] }),
            &[v],
        )
    }

    fn reshape(&mut self, v: &str, shape: &[usize]) -> String {
        self.add("reshape", json!({ "shape": shape }), &[v])
    }

    fn transpose(&mut self, v: &str, perm: &[usize]) -> String {
        self.add("transpose", json!({ "perm": perm }), &[v])
    }

    fn scalar(&mut self, v: f32) -> String {
        self.add("constant", json!({ "value": [v], "shape": [] }), &[])
    }

    /// Direction `d`'s slice of a weight stacked on axis 0, as `shape`.
    fn direction(&mut self, v: &str, d: usize, shape: &[usize]) -> String {
        let s = self.slice(v, 0, d, d + 1);
        self.reshape(&s, shape)
    }

    /// `a + b`, or `a` when there is no `b`.
    fn plus(&mut self, a: &str, b: Option<&str>) -> String {
        match b {
            Some(b) => self.binary("add", a, b),
            None => a.to_string(),
        }
    }
}

/// The gradient rule of `lstm` and `gru`.
pub(crate) fn grad(op: &RecurrentOp, g: &mut dyn GradContext) -> Result<(), String> {
    let mut shapes = Vec::new();
    for k in 0..NAMES.len() {
        shapes.push(match g.input(k) {
            Ok(r) => Some(g.shape(&r)?).filter(|s| s.as_slice() != [0]),
            Err(_) => None,
        });
    }
    let composite = unrolled(op, &shapes)?;
    g.composite_grad(&composite)
}

/// The composition computing `op`'s outputs from inputs of `shapes` (None: left out).
pub(crate) fn unrolled(
    op: &RecurrentOp,
    shapes: &[Option<Vec<usize>>],
) -> Result<Composite, String> {
    let given = |k: usize| shapes.get(k).is_some_and(Option::is_some);
    let xs = shapes
        .first()
        .cloned()
        .flatten()
        .filter(|s| s.len() == 3)
        .ok_or("internal: x is not 3-D")?;
    let (seq, batch, input) = if op.batch_first {
        (xs[1], xs[0], xs[2])
    } else {
        (xs[0], xs[1], xs[2])
    };
    let (h, dirs) = (op.hidden_size, op.dirs());
    let gh = op.gates() * h;
    let mut u = Unroll::default();
    let x = if op.batch_first {
        u.transpose("x", &[1, 0, 2])
    } else {
        "x".to_string()
    };
    let x = u.reshape(&x, &[seq * batch, input]);
    let lens = given(SEQ_LENS).then(|| u.add("cast", json!({ "to": "f32" }), &["lens"]));
    let zeros = {
        let z = u.scalar(0.0);
        u.add("expand", json!({ "shape": [batch, h] }), &[&z])
    };
    let (mut ys, mut hs, mut cs) = (Vec::new(), Vec::new(), Vec::new());
    for d in 0..dirs {
        // Every step's input products at once: [seq, batch, gates·H].
        let w = u.direction("w", d, &[gh, input]);
        let wt = u.transpose(&w, &[1, 0]);
        let xw = u.binary("matmul", &x, &wt);
        let xw = u.reshape(&xw, &[seq, batch, gh]);
        let r = u.direction("r", d, &[gh, h]);
        let (wb, rb) = if given(B) {
            let b = u.direction("b", d, &[2 * gh]);
            (
                Some(u.slice(&b, 0, 0, gh)),
                Some(u.slice(&b, 0, gh, 2 * gh)),
            )
        } else {
            (None, None)
        };
        // Initial states are [dirs, batch, H] ([batch, dirs, H] batch first).
        let mut initial = |name: &str, k: usize| {
            if !given(k) {
                return zeros.clone();
            }
            let s = u.slice(name, usize::from(op.batch_first), d, d + 1);
            u.reshape(&s, &[batch, h])
        };
        let mut state = initial("h0", INITIAL_H);
        let mut cell = initial("c0", INITIAL_C);
        let mut y_steps = vec![String::new(); seq];
        match op.cell {
            Cell::Lstm => {
                let rt = u.transpose(&r, &[1, 0]);
                let bias = match (&wb, &rb) {
                    (Some(a), Some(b)) => Some(u.binary("add", a, b)),
                    _ => None,
                };
                let peep = given(P).then(|| {
                    let p = u.direction("p", d, &[3 * h]);
                    [0, 1, 2].map(|k| u.slice(&p, 0, k * h, (k + 1) * h))
                });
                for s in 0..seq {
                    let t = if op.reversed(d) { seq - 1 - s } else { s };
                    let xt = u.slice(&xw, 0, t, t + 1);
                    let xt = u.reshape(&xt, &[batch, gh]);
                    let rec = u.binary("matmul", &state, &rt);
                    let pre = u.binary("add", &xt, &rec);
                    let pre = u.plus(&pre, bias.as_deref());
                    // ONNX's gate order: input, output, forget, cell.
                    let [gi, go, gf, gc] =
                        [0, 1, 2, 3].map(|k| u.slice(&pre, 1, k * h, (k + 1) * h));
                    let peeped = |u: &mut Unroll, pre: String, k: usize, c: &str| match &peep {
                        Some(p) => {
                            let pc = u.binary("mul", &p[k], c);
                            u.binary("add", &pre, &pc)
                        }
                        None => pre,
                    };
                    let gi = peeped(&mut u, gi, 0, &cell);
                    let gf = peeped(&mut u, gf, 2, &cell);
                    let i = u.unary("sigmoid", &gi);
                    let f = u.unary("sigmoid", &gf);
                    let cand = u.unary("tanh", &gc);
                    let kept = u.binary("mul", &f, &cell);
                    let added = u.binary("mul", &i, &cand);
                    let c_next = u.binary("add", &kept, &added);
                    let go = peeped(&mut u, go, 1, &c_next);
                    let o = u.unary("sigmoid", &go);
                    let squashed = u.unary("tanh", &c_next);
                    let h_next = u.binary("mul", &o, &squashed);
                    let (next_state, next_cell, y) = masked(
                        &mut u,
                        (lens.as_deref(), batch),
                        t,
                        &state,
                        &h_next,
                        Some((&cell, &c_next)),
                    );
                    state = next_state;
                    cell = next_cell.unwrap_or(cell);
                    y_steps[t] = u.reshape(&y, &[1, 1, batch, h]);
                }
            }
            Cell::Gru {
                linear_before_reset,
            } => {
                let r_zr = u.slice(&r, 0, 0, 2 * h);
                let r_zr = u.transpose(&r_zr, &[1, 0]);
                let r_h = u.slice(&r, 0, 2 * h, 3 * h);
                let r_h = u.transpose(&r_h, &[1, 0]);
                let part = |u: &mut Unroll, v: &Option<String>, from: usize, to: usize| {
                    v.as_ref().map(|v| u.slice(v, 0, from, to))
                };
                let (wb_zr, rb_zr) = (part(&mut u, &wb, 0, 2 * h), part(&mut u, &rb, 0, 2 * h));
                let b_zr = match (&wb_zr, &rb_zr) {
                    (Some(a), Some(b)) => Some(u.binary("add", a, b)),
                    _ => None,
                };
                let (wb_h, rb_h) = (
                    part(&mut u, &wb, 2 * h, 3 * h),
                    part(&mut u, &rb, 2 * h, 3 * h),
                );
                for s in 0..seq {
                    let t = if op.reversed(d) { seq - 1 - s } else { s };
                    let xt = u.slice(&xw, 0, t, t + 1);
                    let xt = u.reshape(&xt, &[batch, gh]);
                    // ONNX's gate order: update z, reset r, hidden.
                    let x_zr = u.slice(&xt, 1, 0, 2 * h);
                    let x_h = u.slice(&xt, 1, 2 * h, 3 * h);
                    let rec = u.binary("matmul", &state, &r_zr);
                    let zr = u.binary("add", &x_zr, &rec);
                    let zr = u.plus(&zr, b_zr.as_deref());
                    let zr = u.unary("sigmoid", &zr);
                    let z = u.slice(&zr, 1, 0, h);
                    let reset = u.slice(&zr, 1, h, 2 * h);
                    let rec_h = if linear_before_reset {
                        let p = u.binary("matmul", &state, &r_h);
                        let p = u.plus(&p, rb_h.as_deref());
                        u.binary("mul", &reset, &p)
                    } else {
                        let gated = u.binary("mul", &reset, &state);
                        let p = u.binary("matmul", &gated, &r_h);
                        u.plus(&p, rb_h.as_deref())
                    };
                    let pre = u.plus(&x_h, wb_h.as_deref());
                    let pre = u.binary("add", &pre, &rec_h);
                    let cand = u.unary("tanh", &pre);
                    // (1 − z)·h̃ + z·h = h̃ + z·(h − h̃)
                    let diff = u.binary("sub", &state, &cand);
                    let moved = u.binary("mul", &z, &diff);
                    let h_next = u.binary("add", &cand, &moved);
                    let (next_state, _, y) =
                        masked(&mut u, (lens.as_deref(), batch), t, &state, &h_next, None);
                    state = next_state;
                    y_steps[t] = u.reshape(&y, &[1, 1, batch, h]);
                }
            }
        }
        let steps: Vec<&str> = y_steps.iter().map(String::as_str).collect();
        ys.push(u.add("concat", json!({ "axis": 0 }), &steps));
        hs.push(u.reshape(&state, &[1, batch, h]));
        if op.cell == Cell::Lstm {
            cs.push(u.reshape(&cell, &[1, batch, h]));
        }
    }
    let join = |u: &mut Unroll, parts: &[String], axis: usize| {
        if parts.len() == 1 {
            parts[0].clone()
        } else {
            let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
            u.add("concat", json!({ "axis": axis }), &refs)
        }
    };
    let mut outputs = vec![join(&mut u, &ys, 1), join(&mut u, &hs, 0)];
    if !cs.is_empty() {
        outputs.push(join(&mut u, &cs, 0));
    }
    if op.batch_first {
        // y [seq, dirs, batch, H] → [batch, seq, dirs, H]; states → [batch, dirs, H].
        for (k, out) in outputs.iter_mut().enumerate() {
            let perm: &[usize] = if k == 0 { &[2, 0, 1, 3] } else { &[1, 0, 2] };
            *out = u.transpose(out, perm);
        }
    }
    Ok(Composite {
        inputs: NAMES
            .iter()
            .enumerate()
            .map(|(k, n)| {
                if given(k) {
                    n.to_string()
                } else {
                    String::new()
                }
            })
            .collect(),
        nodes: u.nodes,
        outputs,
    })
}

/// One step's new state under the sequence-length mask of step `t` (`lens`, as f32 of
/// `batch` sequences; none: every sequence runs the full length): (state, cell state, output). Past a sequence's length its state
/// (and cell) hold and its output is 0.
fn masked(
    u: &mut Unroll,
    (lens, batch): (Option<&str>, usize),
    t: usize,
    state: &str,
    next: &str,
    cell: Option<(&str, &str)>,
) -> (String, Option<String>, String) {
    let Some(lens) = lens else {
        return (
            next.to_string(),
            cell.map(|(_, c)| c.to_string()),
            next.to_string(),
        );
    };
    let step = u.scalar(t as f32);
    let live = u.binary("less", &step, lens);
    let live = u.add("cast", json!({ "to": "f32" }), &[&live]);
    let live = u.reshape(&live, &[batch, 1]);
    let blend = |u: &mut Unroll, old: &str, new: &str| {
        let diff = u.binary("sub", new, old);
        let moved = u.binary("mul", &live, &diff);
        u.binary("add", old, &moved)
    };
    let h = blend(u, state, next);
    let c = cell.map(|(old, new)| blend(u, old, new));
    let y = u.binary("mul", &live, next);
    (h, c, y)
}
