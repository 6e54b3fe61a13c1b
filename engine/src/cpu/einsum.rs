//! CPU reference of the einsum family.

use super::{floats, Float, Host};
use crate::ops::einsum::EinsumOp;

/// Evaluates `einsum`: for every output element, the sum over the summed indices of the
/// operands' product.
pub fn eval<T: Host>(op: &EinsumOp, inputs: &[&T], out: &[usize]) -> Result<T, String> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    let (sizes, strides) = op.layout(&shapes)?;
    let values: Vec<&[T::F]> = inputs
        .iter()
        .map(|t| floats(*t))
        .collect::<Result<_, _>>()?;
    let n_out = out.len();
    let total_out: usize = sizes[..n_out].iter().product();
    let total_sum: usize = sizes[n_out..].iter().product();
    let mut y = vec![T::F::ZERO; total_out];
    let offset = |index: usize, range: std::ops::Range<usize>, k: usize| -> usize {
        let mut rem = index;
        let mut o = 0;
        for p in range.rev() {
            let c = rem % sizes[p].max(1);
            rem /= sizes[p].max(1);
            o += c * strides[k][p];
        }
        o
    };
    for (i, slot) in y.iter_mut().enumerate() {
        let base: Vec<usize> = (0..values.len()).map(|k| offset(i, 0..n_out, k)).collect();
        let mut acc = T::F::ZERO;
        for c in 0..total_sum {
            let mut prod = T::F::ONE;
            for (k, v) in values.iter().enumerate() {
                prod = prod * v[base[k] + offset(c, n_out..sizes.len(), k)];
            }
            acc += prod;
        }
        *slot = acc;
    }
    Ok(T::from_floats(out.to_vec(), y))
}

#[cfg(test)]
mod tests {
    use crate::ops::{parse, Op};
    use crate::tensor::Tensor;
    use serde_json::json;

    fn einsum(eq: &str, inputs: &[&Tensor], out: Vec<usize>) -> Vec<f32> {
        let op = parse("einsum", json!({ "equation": eq }).as_object().unwrap()).unwrap();
        let Op::Einsum(e) = &op else { panic!() };
        super::eval(e, inputs, &out)
            .unwrap()
            .as_f32()
            .unwrap()
            .to_vec()
    }

    #[test]
    fn small_equations_by_hand() {
        let a = Tensor::f32(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = Tensor::f32(vec![3, 2], vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        assert_eq!(
            einsum("ij,jk->ik", &[&a, &b], vec![2, 2]),
            [4.0, 5.0, 10.0, 11.0]
        );
        assert_eq!(
            einsum("ij->ji", &[&a], vec![3, 2]),
            [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
        );
        assert_eq!(einsum("ij->", &[&a], vec![]), [21.0]);
        assert_eq!(einsum("ij,ij->i", &[&a, &a], vec![2]), [14.0, 77.0]);
        let v = Tensor::f32(vec![2], vec![1.0, 2.0]);
        assert_eq!(
            einsum("i,j->ij", &[&v, &v], vec![2, 2]),
            [1.0, 2.0, 2.0, 4.0]
        );
        // Ellipsis broadcast: [2, 1, 2] against [3, 2] → [2, 3].
        let x = Tensor::f32(vec![2, 1, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let w = Tensor::f32(vec![3, 2], vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        assert_eq!(
            einsum("...j,...j->...", &[&x, &w], vec![2, 3]),
            [1.0, 2.0, 3.0, 3.0, 4.0, 7.0]
        );
    }
}
