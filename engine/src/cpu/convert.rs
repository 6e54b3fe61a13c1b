//! CPU reference of the convert family (comparisons, logic, `cast`, `one_hot`,
//! `dropout_train`).

use super::{unravel, Float, Host};
use crate::dtype::DType;
use crate::ops::convert::{
    dropout_keeps, dropout_scale, dropout_threshold, Comparison, ConvertOp, HalfFormat, Logic,
};
use crate::shape::{broadcast_strides, numel};

/// Evaluates a convert-family operator into an output of shape `out`.
pub fn eval<T: Host>(op: &ConvertOp, inputs: &[&T], out: &[usize]) -> Result<T, String> {
    let x = inputs.first().ok_or("an operand is missing")?;
    Ok(match op {
        ConvertOp::Compare(c) => {
            let b = inputs.get(1).ok_or("an operand is missing")?;
            T::from_bools(out.to_vec(), compare(*c, *x, *b, out)?)
        }
        ConvertOp::Logic(l) => T::from_bools(out.to_vec(), logic(*l, inputs, out)?),
        ConvertOp::Cast { to, round_to } => {
            let y = cast(*x, *to, out.to_vec());
            match round_to {
                Some(half) => round(&y, *half)?,
                None => y,
            }
        }
        ConvertOp::OneHot { depth } => {
            let Some(idx) = x.ints() else {
                return Err("one_hot indices must be i32".into());
            };
            let n = numel(out)?;
            let mut v = vec![T::F::ZERO; n];
            for (j, &k) in idx.iter().enumerate() {
                if let Ok(k) = usize::try_from(k) {
                    if k < *depth {
                        if let Some(e) = j.checked_mul(*depth).and_then(|r| v.get_mut(r + k)) {
                            *e = T::F::ONE;
                        }
                    }
                }
            }
            T::from_floats(out.to_vec(), v)
        }
        ConvertOp::DropoutTrain { ratio, seed } => {
            let stream = inputs.get(1).ok_or("an operand is missing")?;
            T::from_floats(out.to_vec(), dropout(*x, *stream, *ratio, *seed)?)
        }
    })
}

/// `a op b` under broadcasting to `out`, compared in the operands' own dtype.
fn compare<T: Host>(c: Comparison, a: &T, b: &T, out: &[usize]) -> Result<Vec<bool>, String> {
    fn test<T: PartialOrd>(c: Comparison, x: T, y: T) -> bool {
        match c {
            Comparison::Equal => x == y,
            Comparison::Less => x < y,
            Comparison::Greater => x > y,
            Comparison::LessOrEqual => x <= y,
            Comparison::GreaterOrEqual => x >= y,
        }
    }
    let n = numel(out)?;
    let (sa, sb) = (
        broadcast_strides(a.shape(), out)?,
        broadcast_strides(b.shape(), out)?,
    );
    let mut idx = vec![0; out.len()];
    let offset =
        |idx: &[usize], s: &[usize]| -> usize { idx.iter().zip(s).map(|(i, s)| i * s).sum() };
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        unravel(i, out, &mut idx);
        let (oa, ob) = (offset(&idx, &sa), offset(&idx, &sb));
        let r = match (a.floats(), b.floats(), a.ints(), b.ints()) {
            (Some(x), Some(y), _, _) => x.get(oa).zip(y.get(ob)).map(|(x, y)| test(c, x, y)),
            (_, _, Some(x), Some(y)) => x.get(oa).zip(y.get(ob)).map(|(x, y)| test(c, x, y)),
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

/// A logical operator over bool operands broadcast to `out`.
fn logic<T: Host>(l: Logic, inputs: &[&T], out: &[usize]) -> Result<Vec<bool>, String> {
    let vals: Vec<&[bool]> = inputs
        .iter()
        .map(|t| {
            t.bools()
                .ok_or_else(|| format!("'{}' needs bool operands", l.name()))
        })
        .collect::<Result<_, _>>()?;
    let strides: Vec<Vec<usize>> = inputs
        .iter()
        .map(|t| broadcast_strides(t.shape(), out))
        .collect::<Result<_, _>>()?;
    let n = numel(out)?;
    let mut idx = vec![0; out.len()];
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        unravel(i, out, &mut idx);
        let mut args = [false; 2];
        for (k, (vals, s)) in vals.iter().zip(&strides).enumerate().take(2) {
            let off: usize = idx.iter().zip(s).map(|(i, s)| i * s).sum();
            args[k] = *vals
                .get(off)
                .ok_or_else(|| format!("operands do not broadcast to {out:?}"))?;
        }
        v.push(l.apply(args[0], args[1]));
    }
    Ok(v)
}

/// Converts elements to `to`, giving a tensor of `shape` (see the family's documentation
/// for the rules).
pub fn cast<T: Host>(x: &T, to: DType, shape: Vec<usize>) -> T {
    match (x.dtype(), to) {
        (DType::F32, DType::I32) => T::from_ints(
            shape,
            x.to_floats().into_iter().map(Float::to_i32).collect(),
        ),
        (DType::F32, DType::Bool) => T::from_bools(
            shape,
            x.to_floats().into_iter().map(|v| v != T::F::ZERO).collect(),
        ),
        (DType::I32 | DType::Bool, DType::F32) => T::from_floats(shape, x.to_floats()),
        (DType::I32, DType::Bool) => T::from_bools(
            shape,
            x.ints()
                .unwrap_or_default()
                .iter()
                .map(|&v| v != 0)
                .collect(),
        ),
        (DType::Bool, DType::I32) => T::from_ints(
            shape,
            x.bools()
                .unwrap_or_default()
                .iter()
                .map(|&v| i32::from(v))
                .collect(),
        ),
        _ => x.reshaped(shape),
    }
}

/// Float elements rounded to a 16-bit format (and kept as floats).
fn round<T: Host>(x: &T, half: HalfFormat) -> Result<T, String> {
    let v = x.floats().ok_or("a rounding cast needs float values")?;
    let rounded = v
        .iter()
        .map(|&f| T::F::from_f64(half.round(f.to_f64())))
        .collect();
    Ok(T::from_floats(x.shape().to_vec(), rounded))
}

/// `dropout_train`: x scaled where [`dropout_keeps`] keeps it, else 0.
fn dropout<T: Host>(x: &T, stream: &T, ratio: f32, seed: u32) -> Result<Vec<T::F>, String> {
    let (Some(v), Some(stream)) = (x.floats(), stream.ints()) else {
        return Err("dropout_train needs f32 x and an i32 stream".into());
    };
    let stream = *stream.first().ok_or("the stream is empty")?;
    let threshold = dropout_threshold(ratio);
    let scale = T::F::from_f32(dropout_scale(ratio));
    // Element indices are u32, as on the GPU (tensors are bounded far below 2^32).
    Ok(v.iter()
        .enumerate()
        .map(|(i, &e)| {
            if dropout_keeps(seed, stream, i as u32, threshold) {
                e * scale
            } else {
                T::F::ZERO
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
    fn logic_and_the_new_comparisons_by_hand() {
        let bools = |shape: Vec<usize>, v: &[bool]| Tensor {
            shape,
            data: TensorData::Bool(v.to_vec()),
        };
        let a = bools(vec![2, 1], &[true, false]);
        let b = bools(vec![2], &[true, false]);
        for (op, want) in [
            ("and", [true, false, false, false]),
            ("or", [true, true, true, false]),
            ("xor", [false, true, true, false]),
        ] {
            let r = run(op, json!({}), &[&a, &b], &[2, 2]);
            assert_eq!(r.data, TensorData::Bool(want.to_vec()), "{op}");
        }
        let r = run("not", json!({}), &[&b], &[2]);
        assert_eq!(r.data, TensorData::Bool(vec![false, true]));
        let x = Tensor::f32(vec![3], vec![1.0, f32::NAN, -2.0]);
        let y = Tensor::f32(vec![], vec![1.0]);
        for (op, want) in [
            ("less_or_equal", [true, false, true]),
            ("greater_or_equal", [true, false, false]),
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
