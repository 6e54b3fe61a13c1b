//! Training data: a [`Dataset`] of named host tensors sharing sample axis 0, built from
//! `.npy` or CSV bytes and checked (sample counts, labels, the graph inputs they feed); a
//! seeded split into training and validation samples; and epochs of batches in a seeded
//! order per epoch, keyed by graph input. Pure: no I/O, no threads, and the same seed
//! gives the same samples in the same order everywhere (`docs/datasets.md`).

use super::csv::{self, CsvError, CsvOptions};
use crate::error::LimitError;
use crate::graph::limits::{Limit, Limits, Widen};
use crate::graph::Graph;
use crate::npy::{self, NpyError};
use crate::ops::TensorType;
use crate::rng::Rng;
use crate::shape::{self, Dim, Product};
use crate::tensor::{Tensor, TensorData};
use std::collections::HashMap;

/// The name of the features array of a dataset read from CSV.
pub const FEATURES: &str = "features";
/// The name of the labels array of a dataset read from CSV.
pub const LABELS: &str = "labels";

/// Why a dataset could not be built or used.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A size over one of the limits, refused before it was allocated.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// A CSV table could not be read.
    #[error("CSV {0}")]
    Csv(#[from] CsvError),
    /// An array's `.npy` bytes could not be read.
    #[error("array '{name}': {source}")]
    Npy {
        /// The array.
        name: String,
        /// Why.
        source: NpyError,
    },
    /// An array is unusable as it is.
    #[error("array '{name}': {message}")]
    Array {
        /// The array.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// Two arrays disagree on the number of samples.
    #[error("array '{name}' has {found} samples but array '{other}' has {expected}")]
    Samples {
        /// The array that disagrees.
        name: String,
        /// Its samples.
        found: usize,
        /// The array it disagrees with.
        other: String,
        /// That array's samples.
        expected: usize,
    },
    /// An array does not fit the graph input it feeds.
    #[error("input '{input}': expected {expected}, found {found}")]
    Fit {
        /// The graph input.
        input: String,
        /// What the graph declares.
        expected: String,
        /// What the dataset holds.
        found: String,
    },
    /// A split, batching or feed that cannot be honoured.
    #[error("{0}")]
    Invalid(String),
}

/// One named array of a dataset.
#[derive(Debug, Clone, PartialEq)]
struct Array {
    name: String,
    tensor: Tensor,
    /// Elements per sample (the product of the dimensions after axis 0).
    row: usize,
}

/// Named host tensors that share sample axis 0 (features and labels, say), checked to
/// hold the same number of samples, at least one.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    arrays: Vec<Array>,
    samples: usize,
}

impl Dataset {
    /// A dataset of named tensors, each checked: its elements match its shape, it has
    /// a sample axis, its elements are within `limits` and finite (a NaN or an infinity
    /// is refused, naming its sample and element); the names are distinct; every
    /// array has the same number of samples (the error names both arrays), at least one
    /// and at most `max_dataset_rows`.
    pub fn new(arrays: Vec<(String, Tensor)>, limits: &Limits) -> Result<Dataset, DataError> {
        let mut out: Vec<Array> = Vec::with_capacity(arrays.len());
        for (name, tensor) in arrays {
            let bad = |message: String| DataError::Array {
                name: name.clone(),
                message,
            };
            if out.iter().any(|a| a.name == name) {
                return Err(bad("named twice".into()));
            }
            tensor.check().map_err(bad)?;
            limits.check(
                Limit::MaxTensorElements,
                format!("array '{name}'"),
                "elements",
                Some(tensor.len().widen()),
            )?;
            let Some((&samples, rest)) = tensor.shape.split_first() else {
                return Err(bad(
                    "is a scalar: a dataset's arrays hold samples along axis 0".into(),
                ));
            };
            if let Some(first) = out.first() {
                let expected = first.tensor.shape.first().copied().unwrap_or(0);
                if samples != expected {
                    return Err(DataError::Samples {
                        name,
                        found: samples,
                        other: first.name.clone(),
                        expected,
                    });
                }
            }
            let row = shape::numel(rest).map_err(bad)?;
            if let Some((i, x)) = first_non_finite(&tensor) {
                return Err(bad(format!(
                    "sample {}, element {} is {x}: training data must be finite numbers",
                    i / row.max(1),
                    i % row.max(1)
                )));
            }
            out.push(Array { name, tensor, row });
        }
        let Some(first) = out.first() else {
            return Err(DataError::Invalid(
                "a dataset needs at least one array".into(),
            ));
        };
        let samples = first.tensor.shape.first().copied().unwrap_or(0);
        if samples == 0 {
            return Err(DataError::Array {
                name: first.name.clone(),
                message: "holds no samples".into(),
            });
        }
        limits.check(
            Limit::MaxDatasetRows,
            "the dataset",
            "samples",
            Some(samples.widen()),
        )?;
        Ok(Dataset {
            arrays: out,
            samples,
        })
    }

    /// A dataset of `.npy` arrays, each named: every file's bytes are checked against
    /// `max_dataset_bytes` before it is parsed.
    pub fn from_npy(files: &[(&str, &[u8])], limits: &Limits) -> Result<Dataset, DataError> {
        let mut arrays = Vec::with_capacity(files.len());
        for (name, bytes) in files {
            check_bytes(&format!("array '{name}'"), bytes, limits)?;
            let tensor = npy::parse(bytes).map_err(|source| DataError::Npy {
                name: (*name).to_string(),
                source,
            })?;
            arrays.push(((*name).to_string(), tensor));
        }
        Dataset::new(arrays, limits)
    }

    /// A dataset read from a CSV table (bytes checked against `max_dataset_bytes`
    /// first): [`FEATURES`] (f32 `[rows, columns - 1]`) and [`LABELS`] (i32 `[rows]`).
    pub fn from_csv(
        bytes: &[u8],
        options: &CsvOptions,
        limits: &Limits,
    ) -> Result<Dataset, DataError> {
        check_bytes("the CSV dataset", bytes, limits)?;
        let (features, labels) = csv::parse(bytes, options, limits)?;
        Dataset::new(
            vec![(FEATURES.into(), features), (LABELS.into(), labels)],
            limits,
        )
    }

    /// The number of samples.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// The array called `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.arrays
            .iter()
            .find(|a| a.name == name)
            .map(|a| &a.tensor)
    }

    /// The arrays' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.arrays.iter().map(|a| a.name.as_str())
    }

    /// The position of the array called `name`, or an error listing the arrays there
    /// are.
    fn position(&self, name: &str) -> Result<usize, DataError> {
        self.arrays
            .iter()
            .position(|a| a.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = self.names().collect();
                DataError::Invalid(format!(
                    "the dataset has no array '{name}' (arrays: {})",
                    names.join(", ")
                ))
            })
    }

    /// The array called `name`, or an error listing the arrays there are.
    fn array(&self, name: &str) -> Result<&Array, DataError> {
        let at = self.position(name)?;
        self.arrays
            .get(at)
            .ok_or_else(|| DataError::Invalid(format!("array '{name}' is missing")))
    }

    /// Checks that array `name` holds class labels: i32 values in `[0, classes)`. The
    /// error names the first sample out of range.
    pub fn check_labels(&self, name: &str, classes: usize) -> Result<(), DataError> {
        let array = self.array(name)?;
        let bad = |message: String| DataError::Array {
            name: name.to_string(),
            message,
        };
        let TensorData::I32(values) = &array.tensor.data else {
            return Err(bad(format!(
                "labels must be i32, but the array is {}",
                array.tensor.dtype()
            )));
        };
        if classes == 0 {
            return Err(bad("a class count of 0 leaves no valid label".into()));
        }
        let out = |y: i32| usize::try_from(y).map_or(true, |y| y >= classes);
        if let Some((i, &y)) = values.iter().enumerate().find(|(_, &y)| out(y)) {
            let sample = i.checked_div(array.row).unwrap_or(i);
            return Err(bad(format!(
                "sample {sample} has label {y}, outside the {classes} classes (0 to {})",
                classes - 1
            )));
        }
        Ok(())
    }

    /// Checks that every array `feed` names exists and fits the graph input it feeds:
    /// the input is declared with its batch on axis 0 as one symbol (`["N", 64]`), the
    /// same dtype, rank and other dimensions as the array. The error names the input,
    /// what it expects and what the dataset holds.
    pub fn check_fits(&self, graph: &Graph, feed: &Feed) -> Result<(), DataError> {
        feed.resolve(self)?;
        for (array, input) in &feed.pairs {
            let a = self.array(array)?;
            let decl = graph.doc.inputs.get(input).ok_or_else(|| {
                let names: Vec<&str> = graph.doc.inputs.keys().map(String::as_str).collect();
                DataError::Invalid(format!(
                    "array '{array}' feeds input '{input}', but the graph has no such input \
                     (inputs: {})",
                    names.join(", ")
                ))
            })?;
            let declared = TensorType {
                shape: decl.shape.clone(),
                dtype: decl.dtype,
            };
            let fail = |why: &str| DataError::Fit {
                input: input.clone(),
                expected: format!("{declared}{why}"),
                found: format!("array '{array}' {} {:?}", a.tensor.dtype(), a.tensor.shape),
            };
            let batch = decl
                .shape
                .first()
                .and_then(|d| Product::of(std::slice::from_ref(d)));
            let batched = batch.is_some_and(|p| p.coeff == 1 && p.syms.len() == 1);
            let rest_known = decl
                .shape
                .iter()
                .skip(1)
                .all(|d| matches!(d, Dim::Known(_)));
            if !batched || !rest_known {
                return Err(fail(
                    " (a dataset feeds inputs with the batch on axis 0 as one symbol and every \
                     other dimension fixed, such as [N, 64])",
                ));
            }
            let same = decl.dtype == a.tensor.dtype()
                && decl.shape.len() == a.tensor.shape.len()
                && decl
                    .shape
                    .iter()
                    .zip(&a.tensor.shape)
                    .skip(1)
                    .all(|(d, &n)| *d == Dim::Known(n));
            if !same {
                return Err(fail(""));
            }
        }
        Ok(())
    }

    /// The samples at `indices` (each below [`Dataset::samples`]), in that order, as a
    /// dataset.
    fn gather(&self, indices: &[usize]) -> Result<Dataset, DataError> {
        let arrays = self
            .arrays
            .iter()
            .map(|a| {
                Ok(Array {
                    name: a.name.clone(),
                    tensor: gather(a, indices)?,
                    row: a.row,
                })
            })
            .collect::<Result<_, DataError>>()?;
        Ok(Dataset {
            arrays,
            samples: indices.len(),
        })
    }

    /// Splits off a validation set: `round(samples × validation)` samples (halves
    /// rounded up), chosen by a Fisher–Yates permutation from the stream
    /// `Rng::for_name(seed, "split")`; the rest are the training set. Both parts keep
    /// the dataset's order. Returns (training, validation). `validation` must lie in
    /// (0, 1) and leave both parts at least one sample.
    pub fn split(&self, validation: f64, seed: u64) -> Result<(Dataset, Dataset), DataError> {
        if !(validation > 0.0 && validation < 1.0) {
            return Err(DataError::Invalid(format!(
                "the validation fraction must lie between 0 and 1, not {validation}"
            )));
        }
        let n = self.samples;
        // n ≤ max_dataset_rows, far below 2^53: exact as f64, and the product below 1.
        let count = (n as f64 * validation + 0.5).floor() as usize;
        if count == 0 || count >= n {
            return Err(DataError::Invalid(format!(
                "a validation fraction of {validation} of {n} samples leaves {count} for \
                 validation and {} for training; both need at least one",
                n.saturating_sub(count)
            )));
        }
        let mut order: Vec<usize> = (0..n).collect();
        shuffle(&mut order, &mut Rng::for_name(seed, "split"));
        let (val, train) = order.split_at_mut(count);
        val.sort_unstable();
        train.sort_unstable();
        Ok((self.gather(train)?, self.gather(val)?))
    }

    /// The order epoch `epoch` visits the samples in: `0..samples` unshuffled, or a
    /// Fisher–Yates permutation from the stream `Rng::for_name(seed, "epoch {epoch}")`.
    fn order(&self, epoch: u64, batching: &Batching) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.samples).collect();
        if batching.shuffle {
            let mut rng = Rng::for_name(batching.seed, &format!("epoch {epoch}"));
            shuffle(&mut order, &mut rng);
        }
        order
    }

    /// Epoch `epoch` (from 0) cut into batches as `batching` says, each a map from graph
    /// input to tensor as `feed` says. Every sample is in exactly one batch, except
    /// those of a partial last batch that is dropped.
    pub fn epoch(
        &self,
        epoch: u64,
        batching: &Batching,
        feed: &Feed,
    ) -> Result<Epoch<'_>, DataError> {
        let size = batching.size;
        if size == 0 {
            return Err(DataError::Invalid(
                "the batch size must be at least 1".into(),
            ));
        }
        let batches = if batching.drop_last {
            self.samples / size
        } else {
            self.samples.div_ceil(size)
        };
        if batches == 0 {
            return Err(DataError::Invalid(format!(
                "the dataset's {} samples make no whole batch of {size}, and the partial one \
                 is dropped",
                self.samples
            )));
        }
        Ok(Epoch {
            feed: feed.resolve(self)?,
            data: self,
            order: self.order(epoch, batching),
            size,
            batches,
            next: 0,
        })
    }
}

/// Checks a file's bytes against `max_dataset_bytes`.
/// The flat index and value of a tensor's first NaN or infinity, if it has one.
fn first_non_finite(t: &Tensor) -> Option<(usize, f32)> {
    match &t.data {
        TensorData::F32(v) => v.iter().copied().enumerate().find(|(_, x)| !x.is_finite()),
        TensorData::I32(_) | TensorData::Bool(_) => None,
    }
}

fn check_bytes(subject: &str, bytes: &[u8], limits: &Limits) -> Result<(), LimitError> {
    limits.check(
        Limit::MaxDatasetBytes,
        subject,
        "bytes",
        Some(bytes.len().widen()),
    )
}

/// Shuffles `order` in place: Fisher–Yates, from the last position down, each swap
/// partner drawn with [`Rng::below`].
fn shuffle(order: &mut [usize], rng: &mut Rng) {
    for i in (1..order.len()).rev() {
        let j = usize::try_from(rng.below(i.widen().saturating_add(1))).unwrap_or(i);
        order.swap(i, j.min(i));
    }
}

/// The samples of `array` at `indices`, in that order.
fn gather(array: &Array, indices: &[usize]) -> Result<Tensor, DataError> {
    fn pick<T: Copy>(v: &[T], row: usize, indices: &[usize]) -> Option<Vec<T>> {
        let mut out = Vec::with_capacity(indices.len().checked_mul(row)?);
        for &i in indices {
            let start = i.checked_mul(row)?;
            out.extend_from_slice(v.get(start..start.checked_add(row)?)?);
        }
        Some(out)
    }
    let data = match &array.tensor.data {
        TensorData::F32(v) => pick(v, array.row, indices).map(TensorData::F32),
        TensorData::I32(v) => pick(v, array.row, indices).map(TensorData::I32),
        TensorData::Bool(v) => pick(v, array.row, indices).map(TensorData::Bool),
    }
    .ok_or_else(|| DataError::Array {
        name: array.name.clone(),
        message: "a sample index is past the array".into(),
    })?;
    let mut shape = array.tensor.shape.clone();
    if let Some(n) = shape.first_mut() {
        *n = indices.len();
    }
    Ok(Tensor { shape, data })
}

/// How an epoch is cut into batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batching {
    /// Samples per batch.
    pub size: usize,
    /// The seed of the per-epoch shuffles.
    pub seed: u64,
    /// Whether each epoch visits the samples in a seeded order (otherwise in the
    /// dataset's order).
    pub shuffle: bool,
    /// Whether a partial last batch is dropped (otherwise it is kept, smaller).
    pub drop_last: bool,
}

impl Batching {
    /// Batches of `size` samples in a seeded order per epoch, the partial last batch
    /// kept.
    pub fn new(size: usize, seed: u64) -> Batching {
        Batching {
            size,
            seed,
            shuffle: true,
            drop_last: false,
        }
    }
}

/// Which graph input each dataset array feeds: pairs of (array, input). Arrays not
/// named are not fed; an input is fed by at most one array.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Feed {
    pairs: Vec<(String, String)>,
}

impl Feed {
    /// A feed of (array, input) pairs.
    pub fn new<A: Into<String>, I: Into<String>>(pairs: impl IntoIterator<Item = (A, I)>) -> Feed {
        Feed {
            pairs: pairs
                .into_iter()
                .map(|(a, i)| (a.into(), i.into()))
                .collect(),
        }
    }

    /// The (array, input) pairs.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    /// The position in `data` of each array fed, with its input; checked: at least one
    /// pair, every array present, no input fed twice.
    fn resolve(&self, data: &Dataset) -> Result<Vec<(usize, String)>, DataError> {
        if self.pairs.is_empty() {
            return Err(DataError::Invalid(
                "the feed maps no array to an input".into(),
            ));
        }
        let mut out: Vec<(usize, String)> = Vec::with_capacity(self.pairs.len());
        for (array, input) in &self.pairs {
            if out.iter().any(|(_, i)| i == input) {
                return Err(DataError::Invalid(format!(
                    "input '{input}' is fed by two arrays"
                )));
            }
            out.push((data.position(array)?, input.clone()));
        }
        Ok(out)
    }
}

/// One epoch's batches, in order: an iterator of maps from graph input to tensor.
#[derive(Debug)]
pub struct Epoch<'a> {
    data: &'a Dataset,
    feed: Vec<(usize, String)>,
    order: Vec<usize>,
    size: usize,
    batches: usize,
    next: usize,
}

impl Epoch<'_> {
    /// The number of batches.
    pub fn batches(&self) -> usize {
        self.batches
    }

    /// The samples in the order the epoch visits them (a dropped partial batch's at
    /// the end).
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// Batch `k` (from 0): the samples at positions `k × size ..` of the order, at most
    /// `size` of them, each fed array gathered under its input's name.
    pub fn batch(&self, k: usize) -> Result<HashMap<String, Tensor>, DataError> {
        let from = k.saturating_mul(self.size);
        let indices = self
            .order
            .get(from..from.saturating_add(self.size).min(self.order.len()))
            .filter(|_| k < self.batches)
            .ok_or_else(|| {
                DataError::Invalid(format!("batch {k} is past the epoch's {}", self.batches))
            })?;
        self.feed
            .iter()
            .map(|(at, input)| {
                let array =
                    self.data.arrays.get(*at).ok_or_else(|| {
                        DataError::Invalid(format!("input '{input}' lost its array"))
                    })?;
                Ok((input.clone(), gather(array, indices)?))
            })
            .collect()
    }
}

impl Iterator for Epoch<'_> {
    type Item = Result<HashMap<String, Tensor>, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.batches {
            return None;
        }
        let batch = self.batch(self.next);
        self.next += 1;
        Some(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::load_graph;
    use std::collections::BTreeSet;

    /// `n` samples: features `[i, -i]` and labels `i % 3`, so a sample's index can be
    /// read back from any batch.
    fn numbered(n: usize) -> Dataset {
        let xy = (0..n).flat_map(|i| [i as f32, -(i as f32)]).collect();
        let labels = (0..n).map(|i| (i % 3) as i32).collect();
        Dataset::new(
            vec![
                (FEATURES.into(), Tensor::f32(vec![n, 2], xy)),
                (
                    LABELS.into(),
                    Tensor {
                        shape: vec![n],
                        data: TensorData::I32(labels),
                    },
                ),
            ],
            &Limits::default(),
        )
        .unwrap()
    }

    /// The sample indices a dataset or batch holds, from its features.
    fn indices(features: &Tensor) -> Vec<usize> {
        let v = features.as_f32().unwrap();
        v.chunks(2).map(|c| c[0] as usize).collect()
    }

    fn feed() -> Feed {
        Feed::new([(FEATURES, "x"), (LABELS, "y")])
    }

    /// Every batch of an epoch, as sample indices.
    fn batches(data: &Dataset, epoch: u64, batching: &Batching) -> Vec<Vec<usize>> {
        data.epoch(epoch, batching, &feed())
            .unwrap()
            .map(|b| {
                let b = b.unwrap();
                let x = indices(&b["x"]);
                let TensorData::I32(y) = &b["y"].data else {
                    panic!("labels are not i32")
                };
                let expected: Vec<i32> = x.iter().map(|&i| (i % 3) as i32).collect();
                assert_eq!(y, &expected, "labels travel with their features");
                assert_eq!(b["x"].shape, vec![x.len(), 2]);
                x
            })
            .collect()
    }

    #[test]
    fn splits_have_the_documented_sizes_and_are_disjoint() {
        for (n, fraction, val) in [(10, 0.2, 2), (1797, 0.2, 359), (5, 0.5, 3), (3, 0.1, 0)] {
            let data = numbered(n);
            let split = data.split(fraction, 7);
            if val == 0 {
                let e = split.unwrap_err().to_string();
                assert!(e.contains("leaves 0 for validation"), "{e}");
                continue;
            }
            let (train, validation) = split.unwrap();
            assert_eq!((train.samples(), validation.samples()), (n - val, val));
            let t = indices(train.get(FEATURES).unwrap());
            let v = indices(validation.get(FEATURES).unwrap());
            assert!(
                t.windows(2).all(|w| w[0] < w[1]),
                "training keeps the order"
            );
            assert!(
                v.windows(2).all(|w| w[0] < w[1]),
                "validation keeps the order"
            );
            let all: BTreeSet<usize> = t.iter().chain(&v).copied().collect();
            assert_eq!(all.len(), n, "disjoint and complete");
            let labels = train.get(LABELS).unwrap();
            assert_eq!(labels.shape, vec![n - val]);
        }
        let data = numbered(100);
        let (_, a) = data.split(0.2, 1).unwrap();
        let (_, b) = data.split(0.2, 1).unwrap();
        let (_, c) = data.split(0.2, 2).unwrap();
        assert_eq!(a, b, "same seed, same split");
        assert_ne!(a, c, "another seed, another split");
        for bad in [0.0, 1.0, -0.5, f64::NAN] {
            assert!(data.split(bad, 1).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_epoch_visits_every_sample_once_in_a_seeded_order() {
        let data = numbered(10);
        let keep = Batching::new(3, 42);
        let first = batches(&data, 0, &keep);
        assert_eq!(
            first.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![3, 3, 3, 1],
            "the partial last batch is kept by default"
        );
        let mut seen: Vec<usize> = first.concat();
        seen.sort_unstable();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
        assert_eq!(first, batches(&data, 0, &keep), "same seed, same batches");
        assert_ne!(
            first,
            batches(&data, 1, &keep),
            "another epoch, another order"
        );
        let other = Batching::new(3, 43);
        assert_ne!(
            first,
            batches(&data, 0, &other),
            "another seed, another order"
        );
        assert_ne!(first.concat(), (0..10).collect::<Vec<_>>(), "shuffled");

        let drop = Batching {
            drop_last: true,
            ..keep.clone()
        };
        let dropped = batches(&data, 0, &drop);
        assert_eq!(dropped.len(), 3);
        assert_eq!(
            dropped,
            first[..3],
            "dropping the last batch changes nothing else"
        );

        let plain = Batching {
            shuffle: false,
            ..keep
        };
        assert_eq!(
            batches(&data, 5, &plain).concat(),
            (0..10).collect::<Vec<_>>()
        );

        let epoch = data.epoch(0, &Batching::new(4, 1), &feed()).unwrap();
        assert_eq!(epoch.batches(), 3);
        assert_eq!(epoch.order().len(), 10);
        assert!(epoch.batch(3).is_err());
    }

    #[test]
    fn a_million_samples_shuffle_to_a_permutation() {
        let n = 1 << 20;
        let mut order: Vec<usize> = (0..n).collect();
        shuffle(&mut order, &mut Rng::new(3));
        let fixed = order.iter().enumerate().filter(|(i, &j)| *i == j).count();
        assert!(fixed < 20, "{fixed} samples stayed in place");
        order.sort_unstable();
        assert!(order.iter().enumerate().all(|(i, &j)| i == j));
    }

    #[test]
    fn batching_and_feeds_that_cannot_work_are_refused() {
        let data = numbered(10);
        let error = |batching: &Batching, feed: &Feed| {
            data.epoch(0, batching, feed).unwrap_err().to_string()
        };
        assert_eq!(
            error(&Batching::new(0, 1), &feed()),
            "the batch size must be at least 1"
        );
        let big = Batching {
            drop_last: true,
            ..Batching::new(11, 1)
        };
        assert!(error(&big, &feed()).contains("make no whole batch of 11"));
        assert_eq!(
            data.epoch(0, &Batching::new(11, 1), &feed())
                .unwrap()
                .batches(),
            1
        );
        assert_eq!(
            error(&Batching::new(2, 1), &Feed::new([("pixels", "x")])),
            "the dataset has no array 'pixels' (arrays: features, labels)"
        );
        assert_eq!(
            error(
                &Batching::new(2, 1),
                &Feed::new([(FEATURES, "x"), (LABELS, "x")])
            ),
            "input 'x' is fed by two arrays"
        );
        assert!(data
            .epoch(0, &Batching::new(2, 1), &Feed::default())
            .is_err());
        // Only the arrays fed appear, under their inputs' names.
        let b = data
            .epoch(0, &Batching::new(4, 1), &Feed::new([(LABELS, "target")]))
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(b.keys().collect::<Vec<_>>(), vec!["target"]);
    }

    #[test]
    fn arrays_must_agree_on_their_samples() {
        let features = npy::to_bytes(&Tensor::f32(vec![5, 2], vec![0.0; 10])).unwrap();
        let labels = npy::to_bytes(&Tensor {
            shape: vec![4],
            data: TensorData::I32(vec![0; 4]),
        })
        .unwrap();
        let e = Dataset::from_npy(
            &[
                ("features", features.as_slice()),
                ("labels", labels.as_slice()),
            ],
            &Limits::default(),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "array 'labels' has 4 samples but array 'features' has 5"
        );
        let e = Dataset::from_npy(&[("features", b"not npy".as_slice())], &Limits::default())
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("array 'features': not a valid .npy file"),
            "{e}"
        );
        let small = Limits {
            max_dataset_bytes: 100,
            ..Limits::default()
        };
        let e = Dataset::from_npy(&[("features", features.as_slice())], &small).unwrap_err();
        assert!(e.to_string().contains("max_dataset_bytes"), "{e}");
        let scalar = Tensor::f32(vec![], vec![1.0]);
        let e = Dataset::new(vec![("s".into(), scalar)], &Limits::default()).unwrap_err();
        assert!(e.to_string().contains("is a scalar"), "{e}");
        let empty = Tensor::f32(vec![0, 2], vec![]);
        let e = Dataset::new(vec![("e".into(), empty)], &Limits::default()).unwrap_err();
        assert_eq!(e.to_string(), "array 'e': holds no samples");
        let twice = vec![
            ("a".into(), Tensor::f32(vec![1], vec![1.0])),
            ("a".into(), Tensor::f32(vec![1], vec![1.0])),
        ];
        assert!(Dataset::new(twice, &Limits::default()).is_err());
        let rows = Limits {
            max_dataset_rows: 9,
            ..Limits::default()
        };
        let tensor = Tensor::f32(vec![10], vec![0.0; 10]);
        let e = Dataset::new(vec![("a".into(), tensor)], &rows).unwrap_err();
        assert!(e.to_string().contains("max_dataset_rows"), "{e}");
    }

    #[test]
    fn the_shipped_digits_load_and_check() {
        let data = Dataset::from_npy(
            &[
                (
                    FEATURES,
                    include_bytes!("../../../assets/datasets/digits/features.npy").as_slice(),
                ),
                (
                    LABELS,
                    include_bytes!("../../../assets/datasets/digits/labels.npy").as_slice(),
                ),
            ],
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(data.get(FEATURES).unwrap().shape, vec![1797, 64]);
        let pixels = data.get(FEATURES).unwrap().as_f32().unwrap();
        assert!(pixels
            .iter()
            .all(|&p| (0.0..=1.0).contains(&p) && (p * 16.0).fract() == 0.0));
        data.check_labels(LABELS, 10).unwrap();
        let (train, validation) = data.split(0.2, 0).unwrap();
        assert_eq!((train.samples(), validation.samples()), (1438, 359));
        let graph = load_graph(
            r#"{ "format": "sluice/graph@1",
                 "inputs": { "x": { "shape": ["N", 64] }, "y": { "shape": ["N"], "dtype": "i32" } },
                 "nodes": [
                   { "id": "fc", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 10 } }
                 ],
                 "outputs": ["fc", "y"] }"#,
        )
        .unwrap();
        train.check_fits(&graph, &feed()).unwrap();
    }

    #[test]
    fn labels_are_checked_against_the_classes() {
        let data = numbered(10);
        data.check_labels(LABELS, 3).unwrap();
        assert_eq!(
            data.check_labels(LABELS, 2).unwrap_err().to_string(),
            "array 'labels': sample 2 has label 2, outside the 2 classes (0 to 1)"
        );
        assert_eq!(
            data.check_labels(FEATURES, 2).unwrap_err().to_string(),
            "array 'features': labels must be i32, but the array is f32"
        );
        assert!(data.check_labels("nothing", 2).is_err());
    }

    #[test]
    fn csv_tables_become_features_and_labels() {
        let options = CsvOptions {
            classes: Some(2),
            ..CsvOptions::default()
        };
        let data =
            Dataset::from_csv(b"a,b,y\n1,2,0\n3,4,1\n", &options, &Limits::default()).unwrap();
        assert_eq!(data.names().collect::<Vec<_>>(), vec![FEATURES, LABELS]);
        assert_eq!(data.get(FEATURES).unwrap().shape, vec![2, 2]);
        let e =
            Dataset::from_csv(b"a,b,y\n1,2,0\n3,4\n", &options, &Limits::default()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "CSV line 3, column 3: missing field: the row has 2 fields but line 1 has 3"
        );
        let small = Limits {
            max_dataset_bytes: 8,
            ..Limits::default()
        };
        let e = Dataset::from_csv(b"a,b,y\n1,2,0\n", &options, &small).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the CSV dataset needs 12 bytes, over the limit of 8 bytes \
             (max_dataset_bytes; raise it with --max-dataset-bytes)"
        );
    }

    #[test]
    fn arrays_must_fit_the_inputs_they_feed() {
        let graph = load_graph(
            r#"{ "format": "sluice/graph@1",
                 "inputs": { "x": { "shape": ["N", 2] },
                             "y": { "shape": ["N"], "dtype": "i32" },
                             "fixed": { "shape": [4, 2] } },
                 "nodes": [
                   { "id": "fc", "op": "linear", "inputs": ["x"], "attrs": { "out_features": 3 } },
                   { "id": "k", "op": "add", "inputs": ["fixed", "fixed"] }
                 ],
                 "outputs": ["fc", "k", "y"] }"#,
        )
        .unwrap();
        let data = numbered(10);
        data.check_fits(&graph, &feed()).unwrap();
        let error = |feed: Feed| data.check_fits(&graph, &feed).unwrap_err().to_string();
        assert_eq!(
            error(Feed::new([(LABELS, "x")])),
            "input 'x': expected f32 [N, 2], found array 'labels' i32 [10]"
        );
        assert_eq!(
            error(Feed::new([(FEATURES, "y")])),
            "input 'y': expected i32 [N], found array 'features' f32 [10, 2]"
        );
        assert!(error(Feed::new([(FEATURES, "fixed")]))
            .starts_with("input 'fixed': expected f32 [4, 2] (a dataset feeds inputs with"));
        assert_eq!(
            error(Feed::new([(FEATURES, "z")])),
            "array 'features' feeds input 'z', but the graph has no such input \
             (inputs: fixed, x, y)"
        );
        let wide = Dataset::new(
            vec![("w".into(), Tensor::f32(vec![10, 3], vec![0.0; 30]))],
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(
            wide.check_fits(&graph, &Feed::new([("w", "x")]))
                .unwrap_err()
                .to_string(),
            "input 'x': expected f32 [N, 2], found array 'w' f32 [10, 3]"
        );
    }
}
