//! CPU reference of the elementwise family, with numpy broadcasting. i32 operands are
//! computed as integers (wrapping on overflow; a division or remainder by 0 gives 0, as
//! the WGSL kernel does), and `where` picks values of any dtype as they are. Floats follow
//! IEEE: `pow` is C99's, and every operator built on a maximum or minimum (relu, clip,
//! hard_sigmoid, hard_swish, max, min) gives NaN for a NaN operand, as PyTorch and
//! onnxruntime do.

use super::{floats, unravel, Float, Host};
use crate::ops::elementwise::{Binary, ElementwiseOp, Unary, HARD_SWISH_ALPHA};
use crate::shape::{broadcast_strides, numel};

/// erf with the same 1.5e-7 approximation family as the kernel, in f64.
pub fn erf<F: Float>(x: F) -> F {
    let x = x.to_f64();
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let y = 1.0
        - (((((1.061_405_429 * t - 1.453_152_027) * t) + 1.421_413_741) * t - 0.284_496_736) * t
            + 0.254_829_592)
            * t
            * (-x * x).exp();
    F::from_f64(if x >= 0.0 { y } else { -y })
}

/// One unary operator.
pub fn unary<F: Float>(u: Unary, x: F) -> F {
    let (half, one) = (F::from_f32(0.5), F::ONE);
    match u {
        Unary::Relu => x.maximum(F::ZERO),
        Unary::Sigmoid => sigmoid(x),
        Unary::Tanh => x.tanh(),
        Unary::Gelu { tanh: false } => half * x * (one + erf(x / F::SQRT_2)),
        Unary::Gelu { tanh: true } => {
            let c = F::from_f32(0.044715);
            half * x * (one + (F::from_f32(0.797_884_6) * (x + c * x * x * x)).tanh())
        }
        Unary::Exp => x.exp(),
        Unary::Log => x.ln(),
        Unary::Sqrt => x.sqrt(),
        Unary::Erf => erf(x),
        Unary::Clip { min, max } => {
            let mut v = x;
            if let Some(lo) = min {
                v = v.maximum(F::from_f32(lo));
            }
            if let Some(hi) = max {
                v = v.minimum(F::from_f32(hi));
            }
            v
        }
        Unary::LeakyRelu { alpha } => {
            if x < F::ZERO {
                F::from_f32(alpha) * x
            } else {
                x
            }
        }
        Unary::Elu { alpha } => {
            if x < F::ZERO {
                F::from_f32(alpha) * (x.exp() - one)
            } else {
                x
            }
        }
        Unary::Selu { alpha, gamma } => {
            let g = F::from_f32(gamma);
            if x > F::ZERO {
                g * x
            } else {
                let a = F::from_f32(alpha);
                g * (a * x.exp() - a)
            }
        }
        Unary::Softplus => softplus(x),
        Unary::Softsign => x / (one + x.abs()),
        Unary::HardSigmoid { alpha, beta } => {
            hard_sigmoid(x, F::from_f32(alpha), F::from_f32(beta))
        }
        Unary::HardSwish => x * hard_sigmoid(x, F::from_f32(HARD_SWISH_ALPHA), half),
        Unary::Silu => x * sigmoid(x),
        Unary::Swish { alpha } => x * sigmoid(F::from_f32(alpha) * x),
        Unary::Mish => x * softplus(x).tanh(),
        Unary::Abs => x.abs(),
        Unary::Neg => -x,
        Unary::Reciprocal => one / x,
        Unary::Sign => {
            if x > F::ZERO {
                one
            } else if x < F::ZERO {
                -one
            } else {
                x
            }
        }
        Unary::Sin => x.sin(),
        Unary::Cos => x.cos(),
        Unary::Floor => x.floor(),
        Unary::Ceil => x.ceil(),
        Unary::Round => x.round_even(),
    }
}

/// The logistic function.
pub fn sigmoid<F: Float>(x: F) -> F {
    F::ONE / (F::ONE + (-x).exp())
}

/// ln(1 + eˣ) as max(x, 0) + ln(1 + e^−|x|), which never overflows.
pub fn softplus<F: Float>(x: F) -> F {
    x.maximum(F::ZERO) + (-x.abs()).exp().ln_1p()
}

/// max(0, min(1, alpha·x + beta)), NaN for NaN.
pub fn hard_sigmoid<F: Float>(x: F, alpha: F, beta: F) -> F {
    (alpha * x + beta).minimum(F::ONE).maximum(F::ZERO)
}

/// numpy's mod (`fmod` false: the divisor's sign) or C's fmod (the dividend's sign).
pub fn modulo<F: Float>(x: F, y: F, fmod: bool) -> F {
    let r = x.fmod(y);
    if !fmod && r != F::ZERO && (r < F::ZERO) != (y < F::ZERO) {
        r + y
    } else {
        r
    }
}

/// A unary operator on i32 (`None` for one defined on floats only).
pub fn unary_i32(u: Unary, x: i32) -> Option<i32> {
    match u {
        Unary::Abs => Some(x.wrapping_abs()),
        Unary::Neg => Some(x.wrapping_neg()),
        Unary::Sign => Some(x.signum()),
        _ => None,
    }
}

/// A binary operator on i32: wrapping arithmetic, division truncating toward zero, and a
/// division or remainder by 0 giving 0 (`None` for one defined on floats only).
pub fn binary_i32(b: Binary, x: i32, y: i32) -> Option<i32> {
    Some(match b {
        Binary::Add => x.wrapping_add(y),
        Binary::Sub => x.wrapping_sub(y),
        Binary::Mul => x.wrapping_mul(y),
        Binary::Div if y == 0 => 0,
        Binary::Div => x.wrapping_div(y),
        Binary::Max => x.max(y),
        Binary::Min => x.min(y),
        Binary::Mod { .. } if y == 0 => 0,
        Binary::Mod { fmod } => {
            let r = x.wrapping_rem(y);
            if !fmod && r != 0 && (r < 0) != (y < 0) {
                r + y
            } else {
                r
            }
        }
        Binary::Pow | Binary::Prelu => return None,
    })
}

/// One binary operator.
pub fn binary<F: Float>(b: Binary, x: F, y: F) -> F {
    match b {
        Binary::Add => x + y,
        Binary::Sub => x - y,
        Binary::Mul => x * y,
        Binary::Div => x / y,
        Binary::Pow => x.powf(y),
        Binary::Max => x.maximum(y),
        Binary::Min => x.minimum(y),
        Binary::Mod { fmod } => modulo(x, y, fmod),
        Binary::Prelu => {
            if x < F::ZERO {
                y * x
            } else {
                x
            }
        }
    }
}

/// Calls `f` with each output element's offsets into inputs of `shapes` broadcast to
/// `out` (`f` gives `None` for an offset outside its input).
fn broadcast_map<R>(
    shapes: &[&[usize]],
    out: &[usize],
    mut f: impl FnMut(&[usize]) -> Option<R>,
) -> Result<Vec<R>, String> {
    let n = numel(out)?;
    let strides: Vec<Vec<usize>> = shapes
        .iter()
        .map(|s| broadcast_strides(s, out))
        .collect::<Result<_, _>>()?;
    let mut idx = vec![0; out.len()];
    let mut offsets = vec![0; shapes.len()];
    let mut data = Vec::with_capacity(n);
    for i in 0..n {
        unravel(i, out, &mut idx);
        for (o, s) in offsets.iter_mut().zip(&strides) {
            *o = idx
                .iter()
                .zip(s)
                .try_fold(0usize, |acc, (a, b)| a.checked_mul(*b)?.checked_add(acc))
                .ok_or("an offset overflows")?;
        }
        data.push(f(&offsets).ok_or_else(|| format!("an operand does not broadcast to {out:?}"))?);
    }
    Ok(data)
}

/// Evaluates an elementwise operator into an output of shape `out`; every input must
/// broadcast to it.
pub fn eval<T: Host>(op: &ElementwiseOp, inputs: &[&T], out: &[usize]) -> Result<T, String> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    let shape = out.to_vec();
    if let ElementwiseOp::Where = op {
        let [cond, a, b] = inputs else {
            return Err("where takes cond, a and b".into());
        };
        let cond = cond.bools().ok_or("where needs a bool cond")?;
        let pick = |o: &[usize]| {
            Some(if *cond.get(o[0])? {
                (1, o[1])
            } else {
                (2, o[2])
            })
        };
        return Ok(match (a.ints().zip(b.ints()), a.bools().zip(b.bools())) {
            (Some((x, y)), _) => {
                let v = broadcast_map(&shapes, out, |o| {
                    let (k, off) = pick(o)?;
                    (if k == 1 { x } else { y }).get(off).copied()
                })?;
                T::from_ints(shape, v)
            }
            (_, Some((x, y))) => {
                let v = broadcast_map(&shapes, out, |o| {
                    let (k, off) = pick(o)?;
                    (if k == 1 { x } else { y }).get(off).copied()
                })?;
                T::from_bools(shape, v)
            }
            _ => {
                let (x, y) = (floats(*a)?, floats(*b)?);
                let v = broadcast_map(&shapes, out, |o| {
                    let (k, off) = pick(o)?;
                    (if k == 1 { x } else { y }).get(off).copied()
                })?;
                T::from_floats(shape, v)
            }
        });
    }
    if let Some(ints) = inputs
        .iter()
        .map(|t| t.ints())
        .collect::<Option<Vec<&[i32]>>>()
    {
        let integer = match op {
            ElementwiseOp::Unary(u) => u.takes_i32(),
            ElementwiseOp::Binary(b) => b.takes_i32(),
            ElementwiseOp::Where => false,
        };
        if !integer {
            return Err(format!("'{}' is not defined on i32", op.name()));
        }
        let v = broadcast_map(&shapes, out, |o| {
            let arg = |k: usize| ints.get(k)?.get(*o.get(k)?).copied();
            match op {
                ElementwiseOp::Unary(u) => unary_i32(*u, arg(0)?),
                ElementwiseOp::Binary(b) => binary_i32(*b, arg(0)?, arg(1)?),
                ElementwiseOp::Where => None,
            }
        })?;
        return Ok(T::from_ints(shape, v));
    }
    let vals: Vec<&[T::F]> = inputs
        .iter()
        .map(|t| floats(*t))
        .collect::<Result<_, _>>()?;
    let v = broadcast_map(&shapes, out, |o| {
        let arg = |k: usize| vals.get(k)?.get(*o.get(k)?).copied();
        Some(match op {
            ElementwiseOp::Unary(u) => unary(*u, arg(0)?),
            ElementwiseOp::Binary(b) => binary(*b, arg(0)?, arg(1)?),
            ElementwiseOp::Where => return None,
        })
    })?;
    Ok(T::from_floats(shape, v))
}

#[cfg(test)]
mod tests {
    use crate::ops::{parse, Op};
    use crate::tensor::{Tensor, TensorData};
    use serde_json::{json, Value};

    fn run(op: &str, attrs: Value, inputs: &[&Tensor], out: &[usize]) -> Tensor {
        let Ok(Op::Elementwise(e)) = parse(op, attrs.as_object().unwrap()) else {
            panic!("{op} is in the elementwise family");
        };
        super::eval(&e, inputs, out).unwrap()
    }

    fn ints(shape: &[usize], v: &[i32]) -> Tensor {
        Tensor {
            shape: shape.to_vec(),
            data: TensorData::I32(v.to_vec()),
        }
    }

    fn close(got: &Tensor, want: &[f32]) {
        let got = got.as_f32().unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!(
                g == w || (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                "{got:?} vs {want:?}"
            );
        }
    }

    #[test]
    fn activations_by_hand() {
        let x = Tensor::f32(vec![4], vec![-2.0, -0.5, 0.0, 3.0]);
        let y = |op: &str, attrs: Value| run(op, attrs, &[&x], &[4]);
        close(&y("leaky_relu", json!({})), &[-0.02, -0.005, 0.0, 3.0]);
        close(
            &y("leaky_relu", json!({ "alpha": 0.5 })),
            &[-1.0, -0.25, 0.0, 3.0],
        );
        let e2 = (-2f32).exp() - 1.0;
        let eh = (-0.5f32).exp() - 1.0;
        close(&y("elu", json!({})), &[e2, eh, 0.0, 3.0]);
        let (a, g) = (1.673_263_2_f32, 1.050_701_f32);
        close(
            &y("selu", json!({})),
            &[g * a * e2, g * a * eh, 0.0, g * 3.0],
        );
        close(
            &y("softsign", json!({})),
            &[-2.0 / 3.0, -0.5 / 1.5, 0.0, 0.75],
        );
        close(&y("hard_sigmoid", json!({})), &[0.1, 0.4, 0.5, 1.0]);
        close(
            &y("hard_swish", json!({})),
            &[-2.0 / 6.0, -0.5 * (2.5 / 6.0), 0.0, 3.0],
        );
        let s = |v: f32| 1.0 / (1.0 + (-v).exp());
        close(
            &y("silu", json!({})),
            &[-2.0 * s(-2.0), -0.5 * s(-0.5), 0.0, 3.0 * s(3.0)],
        );
        close(
            &y("swish", json!({ "alpha": 2.0 })),
            &[-2.0 * s(-4.0), -0.5 * s(-1.0), 0.0, 3.0 * s(6.0)],
        );
        let sp = |v: f32| (1.0 + v.exp()).ln();
        close(
            &y("softplus", json!({})),
            &[sp(-2.0), sp(-0.5), sp(0.0), sp(3.0)],
        );
        close(
            &y("mish", json!({})),
            &[
                -2.0 * sp(-2.0).tanh(),
                -0.5 * sp(-0.5).tanh(),
                0.0,
                3.0 * sp(3.0).tanh(),
            ],
        );
        // Softplus stays finite far out.
        let big = Tensor::f32(vec![2], vec![100.0, -100.0]);
        close(
            &run("softplus", json!({}), &[&big], &[2]),
            &[100.0, (-100f32).exp()],
        );
    }

    #[test]
    fn rounding_and_signs_by_hand() {
        let x = Tensor::f32(vec![8], vec![-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.6, -0.0]);
        let y = |op: &str| run(op, json!({}), &[&x], &[8]);
        close(&y("round"), &[-2.0, -2.0, 0.0, 0.0, 2.0, 2.0, 3.0, 0.0]);
        close(&y("floor"), &[-3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 2.0, 0.0]);
        close(&y("ceil"), &[-2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 3.0, 0.0]);
        close(&y("sign"), &[-1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0, 0.0]);
        close(&y("abs"), &[2.5, 1.5, 0.5, 0.5, 1.5, 2.5, 2.6, 0.0]);
        close(&y("neg"), &[2.5, 1.5, 0.5, -0.5, -1.5, -2.5, -2.6, 0.0]);
        close(
            &y("reciprocal"),
            &[
                -0.4,
                -1.0 / 1.5,
                -2.0,
                2.0,
                1.0 / 1.5,
                0.4,
                1.0 / 2.6,
                f32::NEG_INFINITY,
            ],
        );
    }

    #[test]
    fn prelu_broadcasts_the_slope_to_x() {
        let x = Tensor::f32(vec![2, 2], vec![-1.0, 2.0, -3.0, -4.0]);
        let slope = Tensor::f32(vec![2], vec![0.5, 0.25]);
        close(
            &run("prelu", json!({}), &[&x, &slope], &[2, 2]),
            &[-0.5, 2.0, -1.5, -1.0],
        );
    }

    #[test]
    fn mod_takes_the_divisor_sign_or_with_fmod_the_dividend_sign() {
        let a = Tensor::f32(vec![4], vec![-4.5, 7.0, 5.0, -7.0]);
        let b = Tensor::f32(vec![4], vec![2.0, -3.0, 8.0, f32::INFINITY]);
        close(
            &run("mod", json!({}), &[&a, &b], &[4]),
            &[1.5, -2.0, 5.0, f32::INFINITY],
        );
        close(
            &run("mod", json!({ "fmod": 1 }), &[&a, &b], &[4]),
            &[-0.5, 1.0, 5.0, -7.0],
        );
        let a = ints(&[6], &[-4, 7, 5, 4, -7, i32::MIN]);
        let b = ints(&[6], &[3, -3, 0, -2, 3, -1]);
        let m = run("mod", json!({}), &[&a, &b], &[6]);
        assert_eq!(m.data, TensorData::I32(vec![2, -2, 0, 0, 2, 0]));
        let f = run("mod", json!({ "fmod": 1 }), &[&a, &b], &[6]);
        assert_eq!(f.data, TensorData::I32(vec![-1, 1, 0, 0, -1, 0]));
    }

    #[test]
    fn i32_arithmetic_wraps_truncates_and_divides_by_zero_to_zero() {
        let a = ints(&[2, 3], &[-3, 3, 7, i32::MAX, i32::MIN, -7]);
        let b = ints(&[3], &[2, -2, 0]);
        let y = |op: &str| run(op, json!({}), &[&a, &b], &[2, 3]).data;
        assert_eq!(
            y("div"),
            TensorData::I32(vec![-1, -1, 0, i32::MAX / 2, i32::MIN / -2, 0])
        );
        assert_eq!(
            y("add"),
            TensorData::I32(vec![-1, 1, 7, i32::MIN + 1, i32::MAX - 1, -7])
        );
        assert_eq!(y("mul"), TensorData::I32(vec![-6, -6, 0, -2, 0, 0]));
        assert_eq!(y("max"), TensorData::I32(vec![2, 3, 7, i32::MAX, -2, 0]));
        assert_eq!(y("min"), TensorData::I32(vec![-3, -2, 0, 2, i32::MIN, -7]));
        let m = ints(&[3], &[i32::MIN, -5, 0]);
        let u = |op: &str| run(op, json!({}), &[&m], &[3]).data;
        assert_eq!(u("abs"), TensorData::I32(vec![i32::MIN, 5, 0]));
        assert_eq!(u("neg"), TensorData::I32(vec![i32::MIN, 5, 0]));
        assert_eq!(u("sign"), TensorData::I32(vec![-1, -1, 0]));
    }

    #[test]
    fn where_picks_values_of_any_dtype() {
        let c = Tensor {
            shape: vec![2, 1],
            data: TensorData::Bool(vec![true, false]),
        };
        let a = ints(&[2], &[1, 2]);
        let b = ints(&[], &[-9]);
        let w = run("where", json!({}), &[&c, &a, &b], &[2, 2]);
        assert_eq!(w.data, TensorData::I32(vec![1, 2, -9, -9]));
        let t = Tensor {
            shape: vec![2],
            data: TensorData::Bool(vec![true, false]),
        };
        let f = Tensor {
            shape: vec![],
            data: TensorData::Bool(vec![true]),
        };
        let w = run("where", json!({}), &[&c, &t, &f], &[2, 2]);
        assert_eq!(w.data, TensorData::Bool(vec![true, false, true, true]));
    }
}
