//! CPU reference of the recurrent family.

use super::{floats, Float, Host};
use crate::ops::recurrent::{Cell, RecurrentOp, B, INITIAL_C, INITIAL_H, P, SEQ_LENS};

fn sigmoid<F: Float>(x: F) -> F {
    F::ONE / (F::ONE + (-x).exp())
}

/// Evaluates `lstm` or `gru`: (y, y_h) and y_c for lstm.
pub fn eval<T: Host>(
    op: &RecurrentOp,
    inputs: &[&T],
    out_shapes: &[Vec<usize>],
) -> Result<Vec<T>, String> {
    let xs = inputs[0].shape();
    let (seq, batch, input) = if op.batch_first {
        (xs[1], xs[0], xs[2])
    } else {
        (xs[0], xs[1], xs[2])
    };
    let (h, dirs, gates) = (op.hidden_size, op.dirs(), op.gates());
    let gh = gates * h;
    let given = |k: usize| inputs.get(k).copied().filter(|t| t.shape() != [0]);
    let x = floats(inputs[0])?;
    let w = floats(inputs[1])?;
    let r = floats(inputs[2])?;
    let bias = given(B).map(floats).transpose()?;
    let lens: Vec<usize> = match given(SEQ_LENS) {
        Some(t) => t
            .ints()
            .ok_or("sequence_lens must be i32")?
            .iter()
            .map(|&l| usize::try_from(l).unwrap_or(0).min(seq))
            .collect(),
        None => vec![seq; batch],
    };
    let h0 = given(INITIAL_H).map(floats).transpose()?;
    let c0 = given(INITIAL_C).map(floats).transpose()?;
    let peep = given(P).map(floats).transpose()?;
    let xi = |t: usize, b: usize| {
        if op.batch_first {
            (b * seq + t) * input
        } else {
            (t * batch + b) * input
        }
    };
    let si = |d: usize, b: usize| {
        if op.batch_first {
            (b * dirs + d) * h
        } else {
            (d * batch + b) * h
        }
    };
    let yi = |t: usize, d: usize, b: usize| {
        if op.batch_first {
            ((b * seq + t) * dirs + d) * h
        } else {
            ((t * dirs + d) * batch + b) * h
        }
    };
    let zero = T::F::ZERO;
    let mut y = vec![zero; seq * dirs * batch * h];
    let mut yh = vec![zero; dirs * batch * h];
    let mut yc = vec![zero; dirs * batch * h];
    let mut pre = vec![zero; gh];
    for d in 0..dirs {
        // Input and recurrent products of one gate row for unit rows `row`.
        let wrow = |row: usize, xo: usize| -> T::F {
            let mut acc = zero;
            let wo = (d * gh + row) * input;
            for i in 0..input {
                acc += x[xo + i] * w[wo + i];
            }
            acc
        };
        let rrow = |row: usize, state: &[T::F]| -> T::F {
            let mut acc = zero;
            let ro = (d * gh + row) * h;
            for (m, &s) in state.iter().enumerate() {
                acc += s * r[ro + m];
            }
            acc
        };
        let wb = |row: usize| bias.map_or(zero, |b| b[d * 2 * gh + row]);
        let rb = |row: usize| bias.map_or(zero, |b| b[d * 2 * gh + gh + row]);
        for (b, &len) in lens.iter().enumerate() {
            let so = si(d, b);
            let mut hs: Vec<T::F> = h0.map_or(vec![zero; h], |v| v[so..so + h].to_vec());
            let mut cs: Vec<T::F> = c0.map_or(vec![zero; h], |v| v[so..so + h].to_vec());
            for s in 0..len {
                let t = if op.reversed(d) { len - 1 - s } else { s };
                let xo = xi(t, b);
                match op.cell {
                    Cell::Lstm => {
                        for (row, p) in pre.iter_mut().enumerate() {
                            *p = wrow(row, xo) + rrow(row, &hs) + wb(row) + rb(row);
                        }
                        let pv =
                            |k: usize, j: usize| peep.map_or(zero, |p| p[d * 3 * h + k * h + j]);
                        let mut next = vec![zero; h];
                        for j in 0..h {
                            let c = cs[j];
                            let ig = sigmoid(pre[j] + pv(0, j) * c);
                            let fg = sigmoid(pre[2 * h + j] + pv(2, j) * c);
                            let cand = pre[3 * h + j].tanh();
                            let cn = fg * c + ig * cand;
                            let og = sigmoid(pre[h + j] + pv(1, j) * cn);
                            cs[j] = cn;
                            next[j] = og * cn.tanh();
                        }
                        hs = next;
                    }
                    Cell::Gru {
                        linear_before_reset,
                    } => {
                        let z: Vec<T::F> = (0..h)
                            .map(|j| sigmoid(wrow(j, xo) + rrow(j, &hs) + wb(j) + rb(j)))
                            .collect();
                        let rg: Vec<T::F> = (0..h)
                            .map(|j| {
                                let row = h + j;
                                sigmoid(wrow(row, xo) + rrow(row, &hs) + wb(row) + rb(row))
                            })
                            .collect();
                        let reset: Vec<T::F> = hs.iter().zip(&rg).map(|(&a, &b)| a * b).collect();
                        let next: Vec<T::F> = (0..h)
                            .map(|j| {
                                let row = 2 * h + j;
                                let rec = if linear_before_reset {
                                    rg[j] * (rrow(row, &hs) + rb(row))
                                } else {
                                    rrow(row, &reset) + rb(row)
                                };
                                let cand = (wrow(row, xo) + wb(row) + rec).tanh();
                                (T::F::ONE - z[j]) * cand + z[j] * hs[j]
                            })
                            .collect();
                        hs = next;
                    }
                }
                let yo = yi(t, d, b);
                y[yo..yo + h].copy_from_slice(&hs);
            }
            yh[so..so + h].copy_from_slice(&hs);
            yc[so..so + h].copy_from_slice(&cs);
        }
    }
    let mut outs = vec![
        T::from_floats(out_shapes[0].clone(), y),
        T::from_floats(out_shapes[1].clone(), yh),
    ];
    if op.cell == Cell::Lstm {
        outs.push(T::from_floats(out_shapes[2].clone(), yc));
    }
    Ok(outs)
}

#[cfg(test)]
mod tests {
    use crate::ops::{parse, Op};
    use crate::tensor::{Tensor, TensorData};
    use serde_json::json;

    fn run(op: &str, attrs: serde_json::Value, inputs: &[&Tensor]) -> Vec<Tensor> {
        let op = parse(op, attrs.as_object().unwrap()).unwrap();
        let types: Vec<_> = inputs
            .iter()
            .map(|t| crate::ops::TensorType {
                shape: crate::shape::known(&t.shape),
                dtype: t.dtype(),
            })
            .collect();
        let shapes: Vec<Vec<usize>> = op
            .infer(&types)
            .unwrap()
            .iter()
            .map(|t| crate::shape::concrete(&t.shape).unwrap())
            .collect();
        let Op::Recurrent(r) = &op else { panic!() };
        super::eval(r, inputs, &shapes).unwrap()
    }

    #[test]
    fn one_unit_by_hand() {
        // H = 1, input 1, weights 1 everywhere, no bias: x = [1, 0] over two steps.
        let x = Tensor::f32(vec![2, 1, 1], vec![1.0, 0.0]);
        let s = |v: f32| 1.0 / (1.0 + (-v).exp());
        // GRU: z = r = σ(x + h), h̃ = tanh(x + r·h), h' = (1 − z)·h̃ + z·h.
        let w = Tensor::f32(vec![1, 3, 1], vec![1.0; 3]);
        let out = run("gru", json!({ "hidden_size": 1 }), &[&x, &w, &w]);
        let h1 = (1.0 - s(1.0)) * 1f32.tanh();
        let (z2, r2) = (s(h1), s(h1));
        let h2 = (1.0 - z2) * (r2 * h1).tanh() + z2 * h1;
        let y = out[0].as_f32().unwrap();
        assert!(
            (y[0] - h1).abs() < 1e-6 && (y[1] - h2).abs() < 1e-6,
            "{y:?}"
        );
        assert_eq!(out[1].as_f32().unwrap(), &[y[1]]);
        // LSTM step 1: i = f = o = σ(1), c = σ(1)·tanh(1), h = σ(1)·tanh(c).
        let w = Tensor::f32(vec![1, 4, 1], vec![1.0; 4]);
        let out = run("lstm", json!({ "hidden_size": 1 }), &[&x, &w, &w]);
        let c1 = s(1.0) * 1f32.tanh();
        let h1 = s(1.0) * c1.tanh();
        assert!((out[0].as_f32().unwrap()[0] - h1).abs() < 1e-6);
        // Reverse with sequence_lens 1: only x[0] is read, and it is the last step.
        let lens = Tensor {
            shape: vec![1],
            data: TensorData::I32(vec![1]),
        };
        let absent = Tensor::f32(vec![0], vec![]);
        let out = run(
            "lstm",
            json!({ "hidden_size": 1, "direction": "reverse" }),
            &[&x, &w, &w, &absent, &lens],
        );
        let y = out[0].as_f32().unwrap();
        assert!((y[0] - h1).abs() < 1e-6 && y[1] == 0.0, "{y:?}");
        assert!((out[2].as_f32().unwrap()[0] - c1).abs() < 1e-6);
    }
}
