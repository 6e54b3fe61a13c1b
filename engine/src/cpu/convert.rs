//! CPU reference of the convert family (comparisons, `cast`, `one_hot`, `dropout_train`).

use super::unravel;
use crate::dtype::DType;
use crate::ops::convert::{dropout_keeps, dropout_scale, dropout_threshold, Comparison, ConvertOp};
use crate::shape::{broadcast_strides, numel};
use crate::tensor::{Tensor, TensorData};

/// Evaluates a convert-family operator into an output of shape `out`.
pub fn eval(op: &ConvertOp, inputs: &[&Tensor], out: &[usize]) -> Result<Tensor, String> {
    let x = inputs.first().ok_or("an operand is missing")?;
    let data = match op {
        ConvertOp::Compare(c) => {
            let b = inputs.get(1).ok_or("an operand is missing")?;
            TensorData::Bool(compare(*c, x, b, out)?)
        }
        ConvertOp::Cast { to } => cast(&x.data, *to),
        ConvertOp::OneHot { depth } => {
            let TensorData::I32(idx) = &x.data else {
                return Err("one_hot indices must be i32".into());
            };
            let n = numel(out)?;
            let mut v = vec![0.0f32; n];
            for (j, &k) in idx.iter().enumerate() {
                if let Ok(k) = usize::try_from(k) {
                    if k < *depth {
                        if let Some(e) = j.checked_mul(*depth).and_then(|r| v.get_mut(r + k)) {
                            *e = 1.0;
                        }
                    }
                }
            }
            TensorData::F32(v)
        }
        ConvertOp::DropoutTrain { ratio, seed } => {
            let stream = inputs.get(1).ok_or("an operand is missing")?;
            TensorData::F32(dropout(x, stream, *ratio, *seed)?)
        }
    };
    Ok(Tensor {
        shape: out.to_vec(),
        data,
    })
}

/// `a op b` under broadcasting to `out`, compared in the operands' own dtype.
fn compare(c: Comparison, a: &Tensor, b: &Tensor, out: &[usize]) -> Result<Vec<bool>, String> {
    fn test<T: PartialOrd>(c: Comparison, x: T, y: T) -> bool {
        match c {
            Comparison::Equal => x == y,
            Comparison::Less => x < y,
            Comparison::Greater => x > y,
        }
    }
    let n = numel(out)?;
    let (sa, sb) = (
        broadcast_strides(&a.shape, out)?,
        broadcast_strides(&b.shape, out)?,
    );
    let mut idx = vec![0; out.len()];
    let offset =
        |idx: &[usize], s: &[usize]| -> usize { idx.iter().zip(s).map(|(i, s)| i * s).sum() };
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        unravel(i, out, &mut idx);
        let (oa, ob) = (offset(&idx, &sa), offset(&idx, &sb));
        let r = match (&a.data, &b.data) {
            (TensorData::F32(x), TensorData::F32(y)) => {
                x.get(oa).zip(y.get(ob)).map(|(x, y)| test(c, x, y))
            }
            (TensorData::I32(x), TensorData::I32(y)) => {
                x.get(oa).zip(y.get(ob)).map(|(x, y)| test(c, x, y))
            }
            _ => {
                return Err(format!(
                    "'{}' compares two f32 or two i32 operands",
                    c.name()
                ))
            }
        };
        v.push(r.ok_or_else(|| format!("operands do not broadcast to {out:?}"))?);
    }
    Ok(v)
}

/// Converts elements to `to` (see the family's documentation for the rules).
pub fn cast(data: &TensorData, to: DType) -> TensorData {
    match (data, to) {
        (TensorData::F32(v), DType::I32) => TensorData::I32(v.iter().map(|&x| x as i32).collect()),
        (TensorData::F32(v), DType::Bool) => {
            TensorData::Bool(v.iter().map(|&x| x != 0.0).collect())
        }
        (TensorData::I32(v), DType::F32) => TensorData::F32(v.iter().map(|&x| x as f32).collect()),
        (TensorData::I32(v), DType::Bool) => TensorData::Bool(v.iter().map(|&x| x != 0).collect()),
        (TensorData::Bool(v), DType::F32) => {
            TensorData::F32(v.iter().map(|&x| f32::from(u8::from(x))).collect())
        }
        (TensorData::Bool(v), DType::I32) => {
            TensorData::I32(v.iter().map(|&x| i32::from(x)).collect())
        }
        (same, _) => same.clone(),
    }
}

/// `dropout_train`: x scaled where [`dropout_keeps`] keeps it, else 0.
fn dropout(x: &Tensor, stream: &Tensor, ratio: f32, seed: u32) -> Result<Vec<f32>, String> {
    let (Some(v), TensorData::I32(stream)) = (x.as_f32(), &stream.data) else {
        return Err("dropout_train needs f32 x and an i32 stream".into());
    };
    let stream = *stream.first().ok_or("the stream is empty")?;
    let (threshold, scale) = (dropout_threshold(ratio), dropout_scale(ratio));
    // Element indices are u32, as on the GPU (tensors are bounded far below 2^32).
    Ok(v.iter()
        .enumerate()
        .map(|(i, &e)| {
            if dropout_keeps(seed, stream, i as u32, threshold) {
                e * scale
            } else {
                0.0
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use crate::ops::{parse, Op};
    use crate::tensor::{Tensor, TensorData};
    use serde_json::{json, Value};

    fn run(op: &str, attrs: Value, inputs: &[&Tensor], out: &[usize]) -> Tensor {
        let Ok(Op::Convert(c)) = parse(op, attrs.as_object().unwrap()) else {
            panic!("{op} is in the convert family");
        };
        super::eval(&c, inputs, out).unwrap()
    }

    #[test]
    fn f32_to_i32_truncates_saturates_and_maps_nan_to_zero() {
        let x = Tensor::f32(
            vec![8],
            vec![2.7, -2.7, 0.5, -0.0, 3e9, -3e9, f32::NAN, f32::INFINITY],
        );
        let y = run("cast", json!({ "to": "i32" }), &[&x], &[8]);
        assert_eq!(
            y.data,
            TensorData::I32(vec![2, -2, 0, 0, i32::MAX, i32::MIN, 0, i32::MAX])
        );
        let b = run("cast", json!({ "to": "bool" }), &[&x], &[8]);
        assert_eq!(
            b.data,
            TensorData::Bool(vec![true, true, true, false, true, true, true, true])
        );
        let f = run("cast", json!({ "to": "f32" }), &[&b], &[8]);
        assert_eq!(
            f.as_f32().unwrap(),
            &[1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
        );
        let i = Tensor {
            shape: vec![3],
            data: TensorData::I32(vec![16_777_217, -5, 0]),
        };
        let f = run("cast", json!({ "to": "f32" }), &[&i], &[3]);
        assert_eq!(f.as_f32().unwrap(), &[16_777_216.0, -5.0, 0.0]);
    }

    #[test]
    fn comparisons_broadcast_and_keep_integers_exact() {
        let a = Tensor {
            shape: vec![2, 1],
            data: TensorData::I32(vec![16_777_217, 3]),
        };
        let b = Tensor {
            shape: vec![3],
            data: TensorData::I32(vec![16_777_216, 16_777_217, 3]),
        };
        let eq = run("equal", json!({}), &[&a, &b], &[2, 3]);
        assert_eq!(
            eq.data,
            TensorData::Bool(vec![false, true, false, false, false, true])
        );
        let gt = run("greater", json!({}), &[&a, &b], &[2, 3]);
        assert_eq!(
            gt.data,
            TensorData::Bool(vec![true, false, true, false, false, false])
        );
        let x = Tensor::f32(vec![3], vec![1.0, f32::NAN, -2.0]);
        let y = Tensor::f32(vec![], vec![1.0]);
        for (op, want) in [
            ("equal", [true, false, false]),
            ("less", [false, false, true]),
            ("greater", [false, false, false]),
        ] {
            let r = run(op, json!({}), &[&x, &y], &[3]);
            assert_eq!(r.data, TensorData::Bool(want.to_vec()), "{op}");
        }
    }

    #[test]
    fn one_hot_rows_with_out_of_range_indices_zero() {
        let i = Tensor {
            shape: vec![2, 2],
            data: TensorData::I32(vec![2, -1, 0, 3]),
        };
        let y = run("one_hot", json!({ "depth": 3 }), &[&i], &[2, 2, 3]);
        assert_eq!(
            y.as_f32().unwrap(),
            &[0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        );
    }
}
