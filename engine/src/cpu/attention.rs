//! CPU reference of the attention family.

use super::{floats, Float, Host};
use crate::ops::attention::{mask_layout, AttentionOp, Geometry};

/// The mask as the reference reads it: additive floats or booleans (true: attend).
enum Mask<'a, F> {
    None,
    Add(&'a [F]),
    Keep(&'a [bool]),
}

/// Evaluates `attention` (Y) or `attention_probs` (P).
pub fn eval<T: Host>(op: &AttentionOp, inputs: &[&T], out: &[usize]) -> Result<T, String> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    let g = op.geometry(&shapes)?;
    let q = floats(inputs[0])?;
    let k = floats(inputs[1])?;
    let (given_mask, given_lens) = op.mask_and_lengths(inputs, |t| t.shape());
    let lens: Option<&[i32]> = match given_lens {
        Some(t) => Some(t.ints().ok_or("nonpad_kv_seqlen must be i32")?),
        None => None,
    };
    let (mask, layout) = match given_mask {
        None => (Mask::None, ([0; 4], g.skv)),
        Some(m) => {
            let layout = mask_layout(m.shape(), &g)?;
            match (m.floats(), m.bools()) {
                (Some(v), _) => (Mask::Add(v), layout),
                (_, Some(v)) => (Mask::Keep(v), layout),
                _ => return Err(format!("attn_mask must be f32 or bool, got {}", m.dtype())),
            }
        }
    };
    let probs = weights(op, &g, q, k, &mask, layout, lens);
    if op.probs {
        return Ok(T::from_floats(out.to_vec(), probs));
    }
    let v = floats(inputs[2])?;
    let vs = g.strides(g.kv_heads, g.skv, g.dv);
    let ys = g.strides(g.q_heads, g.sq, g.dv);
    let mut y = vec![T::F::ZERO; g.batch * g.q_heads * g.sq * g.dv];
    for b in 0..g.batch {
        for h in 0..g.q_heads {
            let hk = h / g.group();
            for i in 0..g.sq {
                let row = ((b * g.q_heads + h) * g.sq + i) * g.skv;
                for d in 0..g.dv {
                    let mut acc = T::F::ZERO;
                    for j in 0..g.skv {
                        acc += probs[row + j] * v[b * vs[0] + hk * vs[1] + j * vs[2] + d];
                    }
                    y[b * ys[0] + h * ys[1] + i * ys[2] + d] = acc;
                }
            }
        }
    }
    Ok(T::from_floats(out.to_vec(), y))
}

/// The weights [B, q heads, S_q, S_kv]: masked keys 0, a row with every key masked all 0.
#[allow(clippy::too_many_arguments)]
fn weights<F: Float>(
    op: &AttentionOp,
    g: &Geometry,
    q: &[F],
    k: &[F],
    mask: &Mask<F>,
    (ms, mask_len): ([usize; 4], usize),
    lens: Option<&[i32]>,
) -> Vec<F> {
    let qs = g.strides(g.q_heads, g.sq, g.d);
    let ks = g.strides(g.kv_heads, g.skv, g.d);
    let scale = F::from_f32(g.scale);
    let cap = F::from_f32(op.softcap);
    let mut p = vec![F::ZERO; g.batch * g.q_heads * g.sq * g.skv];
    let mut scores: Vec<Option<F>> = vec![None; g.skv];
    let wide = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    for b in 0..g.batch {
        // Keys from the sample's length on are padding; its queries end at its length.
        let (kv_len, offset) = match lens {
            Some(l) => {
                let n = i64::from(l[b]);
                (n.clamp(0, wide(g.skv)), n - wide(g.sq))
            }
            None => (wide(g.skv), 0),
        };
        for h in 0..g.q_heads {
            let hk = h / g.group();
            for i in 0..g.sq {
                let qo = b * qs[0] + h * qs[1] + i * qs[2];
                let pos = wide(i) + offset;
                for (j, s) in scores.iter_mut().enumerate() {
                    *s = None;
                    if !op.allowed(pos, j) || j >= mask_len || wide(j) >= kv_len {
                        continue;
                    }
                    let ko = b * ks[0] + hk * ks[1] + j * ks[2];
                    let mut dot = F::ZERO;
                    for d in 0..g.d {
                        dot += q[qo + d] * k[ko + d];
                    }
                    let mut v = dot * scale;
                    if op.softcap > 0.0 {
                        v = cap * (v / cap).tanh();
                    }
                    let at = b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3];
                    match mask {
                        Mask::None => {}
                        Mask::Keep(m) if !m[at] => continue,
                        Mask::Keep(_) => {}
                        Mask::Add(m) if m[at] == F::NEG_INFINITY => continue,
                        Mask::Add(m) => v += m[at],
                    }
                    *s = Some(v);
                }
                let m = scores
                    .iter()
                    .flatten()
                    .fold(F::NEG_INFINITY, |a, &x| a.max(x));
                let row = ((b * g.q_heads + h) * g.sq + i) * g.skv;
                let mut sum = F::ZERO;
                for (j, s) in scores.iter().enumerate() {
                    if let Some(s) = s {
                        let e = (*s - m).exp();
                        p[row + j] = e;
                        sum += e;
                    }
                }
                if sum > F::ZERO {
                    for x in &mut p[row..row + g.skv] {
                        *x = *x / sum;
                    }
                }
            }
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use crate::ops::{parse, Op};
    use crate::tensor::{Tensor, TensorData};
    use serde_json::json;

    fn attention(attrs: serde_json::Value, inputs: &[&Tensor], out: Vec<usize>) -> Vec<f32> {
        let op = parse("attention", attrs.as_object().unwrap()).unwrap();
        let Op::Attention(a) = &op else { panic!() };
        super::eval(a, inputs, &out)
            .unwrap()
            .as_f32()
            .unwrap()
            .to_vec()
    }

    #[test]
    fn one_head_by_hand() {
        // q = [1, 0], keys [1, 0] and [0, 1], scale 1: weights e/(e+1), 1/(e+1).
        let q = Tensor::f32(vec![1, 1, 1, 2], vec![1.0, 0.0]);
        let k = Tensor::f32(vec![1, 1, 2, 2], vec![1.0, 0.0, 0.0, 1.0]);
        let v = Tensor::f32(vec![1, 1, 2, 1], vec![10.0, 20.0]);
        let y = attention(json!({ "scale": 1.0 }), &[&q, &k, &v], vec![1, 1, 1, 1]);
        let e = std::f32::consts::E;
        let want = (10.0 * e + 20.0) / (e + 1.0);
        assert!((y[0] - want).abs() < 1e-5, "{y:?} vs {want}");
        // Causal: query 0 sees key 0 only.
        let y = attention(json!({ "is_causal": 1 }), &[&q, &k, &v], vec![1, 1, 1, 1]);
        assert_eq!(y, vec![10.0]);
        // A bool mask masking every key: output 0, not NaN.
        let none = Tensor {
            shape: vec![2],
            data: TensorData::Bool(vec![false, false]),
        };
        let y = attention(json!({}), &[&q, &k, &v, &none], vec![1, 1, 1, 1]);
        assert_eq!(y, vec![0.0]);
        // An additive −∞ masks key 1 out.
        let add = Tensor::f32(vec![1, 2], vec![0.0, f32::NEG_INFINITY]);
        let y = attention(json!({}), &[&q, &k, &v, &add], vec![1, 1, 1, 1]);
        assert_eq!(y, vec![10.0]);
        // A mask shorter than the keys masks the keys past its end.
        let short = Tensor::f32(vec![1], vec![0.0]);
        let y = attention(json!({}), &[&q, &k, &v, &short], vec![1, 1, 1, 1]);
        assert_eq!(y, vec![10.0]);
    }

    #[test]
    fn nonpad_lengths_mask_padding_and_place_the_queries_at_the_end() {
        // Keys [1], [2], [3] (scale 1, q = 0: equal scores), V = the key. Sample length 2:
        // key 2 is padding; causal with one query at position 2 − 1 = 1 sees keys 0, 1.
        let q = Tensor::f32(vec![1, 1, 1, 1], vec![0.0]);
        let k = Tensor::f32(vec![1, 1, 3, 1], vec![1.0, 2.0, 3.0]);
        let absent = Tensor::f32(vec![0], vec![]);
        let lens = |n: i32| Tensor {
            shape: vec![1],
            data: TensorData::I32(vec![n]),
        };
        let inputs = |l: &Tensor| -> Vec<Tensor> {
            vec![
                q.clone(),
                k.clone(),
                k.clone(),
                absent.clone(),
                absent.clone(),
                absent.clone(),
                l.clone(),
            ]
        };
        let run = |attrs: serde_json::Value, l: &Tensor| {
            let t = inputs(l);
            let refs: Vec<&Tensor> = t.iter().collect();
            attention(attrs, &refs, vec![1, 1, 1, 1])
        };
        assert_eq!(run(json!({}), &lens(2)), [1.5]);
        assert_eq!(run(json!({ "is_causal": 1 }), &lens(2)), [1.5]);
        // Length 1: the query sits at position 0 and sees key 0 only.
        assert_eq!(run(json!({ "is_causal": 1 }), &lens(1)), [1.0]);
        // Length 0: nothing to attend.
        assert_eq!(run(json!({ "is_causal": 1 }), &lens(0)), [0.0]);
    }

    #[test]
    fn grouped_query_heads_share_their_kv_head() {
        // Two query heads over one kv head, 3-D layout [B, S, heads·size].
        let q = Tensor::f32(vec![1, 1, 2], vec![1.0, -1.0]);
        let k = Tensor::f32(vec![1, 2, 1], vec![1.0, 0.0]);
        let v = Tensor::f32(vec![1, 2, 1], vec![1.0, 0.0]);
        let y = attention(
            json!({ "q_num_heads": 2, "kv_num_heads": 1, "scale": 1.0 }),
            &[&q, &k, &v],
            vec![1, 1, 2],
        );
        let e = std::f32::consts::E;
        let want = [e / (e + 1.0), 1.0 / (1.0 + e)];
        for (a, b) in y.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{y:?} vs {want:?}");
        }
    }
}
