//! How a micro-batch's inputs travel from the dataset to the stages: each is a tensor of
//! its own, or samples still inside the caller's dataset, handed over without a copy. A
//! GPU writes borrowed samples straight from the dataset into device memory; a device
//! that computes on tensors of its own makes one from them (the copy the cut used to
//! make for every device).

use crate::dtype::DType;
use crate::tensor::{Tensor, TensorData};
use std::collections::HashMap;

/// Samples `from..to` along `axis` of a float tensor in the caller's dataset (its whole
/// extent for an input without a batch axis).
#[derive(Debug, Clone, Copy)]
pub struct Rows<'d> {
    whole: &'d Tensor,
    axis: usize,
    from: usize,
    to: usize,
}

impl<'d> Rows<'d> {
    /// `from..to` along `axis` of `whole`; `None` unless `whole` holds floats, has that
    /// axis and the range lies inside it (other tensors are cut into tensors of their own).
    pub fn new(whole: &'d Tensor, axis: usize, from: usize, to: usize) -> Option<Rows<'d>> {
        let len = *whole.shape.get(axis)?;
        let floats = matches!(whole.data, TensorData::F32(_));
        (floats && from <= to && to <= len && whole.check().is_ok()).then_some(Rows {
            whole,
            axis,
            from,
            to,
        })
    }

    /// All of `whole` (an unbatched input), where it can be borrowed.
    pub fn all(whole: &'d Tensor) -> Option<Rows<'d>> {
        Rows::new(whole, 0, 0, *whole.shape.first()?)
    }

    /// The shape of the samples.
    pub fn shape(&self) -> Vec<usize> {
        let mut shape = self.whole.shape.clone();
        shape[self.axis] = self.to - self.from;
        shape
    }

    /// The samples' elements as one slice of the dataset, where they lie side by side
    /// (cut along the first axis, or all of it): what a host device reads in place.
    pub fn contiguous(&self) -> Option<&'d [f32]> {
        let mut runs = self.runs();
        let first = runs.next()?;
        runs.next().is_none().then_some(first)
    }

    /// The samples' elements as contiguous runs, in order: one per index of the axes
    /// before `axis`.
    pub fn runs(&self) -> impl Iterator<Item = &'d [f32]> {
        let (inner, len, outer) = self.extents();
        let (from, to) = (self.from, self.to);
        let data: &'d [f32] = match &self.whole.data {
            TensorData::F32(v) => v,
            // `new` borrows floats only.
            TensorData::I32(_) | TensorData::Bool(_) => &[],
        };
        (0..outer).filter_map(move |o| {
            let base = o.checked_mul(len)?.checked_mul(inner)?;
            data.get(base + from * inner..base + to * inner)
        })
    }

    /// (elements per sample, axis length, blocks before the axis); `new` checked the
    /// tensor, so these products stay inside its length.
    fn extents(&self) -> (usize, usize, usize) {
        let shape = &self.whole.shape;
        let inner = shape[self.axis + 1..].iter().product();
        let outer = shape[..self.axis].iter().product();
        (inner, shape[self.axis], outer)
    }

    /// The samples as a tensor of their own.
    pub fn to_tensor(&self) -> Tensor {
        let shape = self.shape();
        let mut data = Vec::with_capacity(shape.iter().product());
        for run in self.runs() {
            data.extend_from_slice(run);
        }
        Tensor::f32(shape, data)
    }
}

/// One input of a micro-batch.
#[derive(Debug, Clone)]
pub enum Input<'d> {
    /// A tensor of its own.
    Owned(Tensor),
    /// Samples borrowed from the dataset.
    Rows(Rows<'d>),
}

impl Input<'_> {
    /// Its shape.
    pub fn shape(&self) -> Vec<usize> {
        match self {
            Input::Owned(t) => t.shape.clone(),
            Input::Rows(r) => r.shape(),
        }
    }

    /// Its element type.
    pub fn dtype(&self) -> DType {
        match self {
            Input::Owned(t) => t.dtype(),
            Input::Rows(_) => DType::F32,
        }
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.shape().contains(&0)
    }

    /// The tensor itself, where it is one of its own.
    pub fn owned(&self) -> Option<&Tensor> {
        match self {
            Input::Owned(t) => Some(t),
            Input::Rows(_) => None,
        }
    }

    /// It as a tensor of its own (borrowed samples are copied).
    pub fn into_tensor(self) -> Tensor {
        match self {
            Input::Owned(t) => t,
            Input::Rows(r) => r.to_tensor(),
        }
    }
}

/// A micro-batch's inputs (and, between stages, the values it carries on), by name.
pub type Inputs<'d> = HashMap<String, Input<'d>>;

/// Tensors of their own as inputs.
pub fn owned(values: HashMap<String, Tensor>) -> Inputs<'static> {
    values
        .into_iter()
        .map(|(name, t)| (name, Input::Owned(t)))
        .collect()
}

/// Inputs as tensors of their own (borrowed samples are copied).
pub fn into_values(inputs: Inputs<'_>) -> HashMap<String, Tensor> {
    inputs
        .into_iter()
        .map(|(name, input)| (name, input.into_tensor()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::dataset::slice_axis;

    #[test]
    fn borrowed_samples_are_the_cut_they_stand_for() {
        // 2 × 5 × 3 floats, cut along each axis: the runs, joined, are the slice's data.
        let whole = Tensor::f32(vec![2, 5, 3], (0..30).map(|i| i as f32).collect());
        for (axis, from, to) in [(0, 1, 2), (1, 1, 4), (1, 0, 5), (2, 2, 3), (1, 3, 3)] {
            let rows = Rows::new(&whole, axis, from, to).unwrap();
            let want = slice_axis(&whole, axis, from, to).unwrap();
            assert_eq!(rows.to_tensor(), want, "axis {axis} {from}..{to}");
            assert_eq!(rows.shape(), want.shape);
            let joined: Vec<f32> = rows.runs().flatten().copied().collect();
            // Only a cut along the first axis lies in one piece.
            let one_piece = rows.contiguous().map(<[f32]>::to_vec);
            assert_eq!(one_piece.is_some(), axis == 0, "axis {axis}");
            if let Some(piece) = one_piece {
                assert_eq!(piece, joined);
            }
            assert_eq!(TensorData::F32(joined), want.data);
        }
    }

    #[test]
    fn only_float_ranges_inside_a_sound_tensor_are_borrowed() {
        let floats = Tensor::f32(vec![4, 2], vec![0.0; 8]);
        assert!(Rows::new(&floats, 0, 3, 5).is_none(), "past the end");
        assert!(Rows::new(&floats, 0, 3, 2).is_none(), "reversed");
        assert!(Rows::new(&floats, 2, 0, 1).is_none(), "no such axis");
        assert!(
            Rows::all(&Tensor::f32(vec![], vec![1.0])).is_none(),
            "a scalar"
        );
        let short = Tensor::f32(vec![4, 2], vec![0.0; 7]);
        assert!(
            Rows::new(&short, 0, 0, 1).is_none(),
            "data shorter than its shape"
        );
        let ints = Tensor {
            shape: vec![2],
            data: TensorData::I32(vec![1, 2]),
        };
        assert!(Rows::all(&ints).is_none());
        let input = Input::Rows(Rows::new(&floats, 0, 1, 3).unwrap());
        assert_eq!(input.shape(), vec![2, 2]);
        assert_eq!(input.into_tensor(), Tensor::f32(vec![2, 2], vec![0.0; 4]));
    }
}
