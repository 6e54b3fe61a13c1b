//! The fast CPU device's kernels ([`super::CpuDevice::fast`]): matrix products through a
//! blocked, multi-threaded GEMM (the `gemm` crate on `rayon`'s threads) and fused pointwise
//! units evaluated in one pass over chunks of the output, the chunks spread over threads
//! with `rayon`, sums and means over trailing or leading axes, and transposes. Each kernel
//! takes only f32 data and the broadcasts it handles (scalars and trailing rows); it
//! answers `None` for anything else, and the device then runs the reference operator. The
//! reference stays the oracle: `the_fast_cpu_device_gives_the_references_answers`
//! (tests/execution.rs) compares them.

use super::elementwise::{binary, unary};
use super::grad::derivative;
use crate::ops::elementwise::{Binary, ElementwiseOp, Unary};
use crate::ops::matmul::{batched_problem, MatMulOp, Problem};
use crate::ops::reduce::{ReduceKind, ReduceOp};
use crate::ops::Op;
use crate::plan::expr::{Expr, Operand, Term};
use rayon::prelude::*;
use std::cell::RefCell;

/// Output elements per chunk of a fused unit: each thread evaluates whole chunks, every
/// term of the unit over one chunk before the next, so a chunk's terms stay in cache.
const CHUNK: usize = 2048;

thread_local! {
    /// Each thread's term buffers for [`evaluate`], kept from chunk to chunk (allocating
    /// and zeroing them per chunk cost as much as a cheap term).
    static TERM_BUFFERS: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
    /// Each thread's piece buffer for [`fused_reduce`], kept from call to call: a fresh
    /// one is a fresh mapping of 256 KiB, page faults and zeroing included.
    static PIECE_BUFFER: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// An f32 operand: its shape and elements.
pub(crate) type Operand32<'a> = (&'a [usize], &'a [f32]);

/// `matmul` or `linear` on f32 operands, `None` where the GEMM does not apply.
pub(crate) fn matmul(
    op: &MatMulOp,
    inputs: &[Operand32],
    params: &[Operand32],
) -> Option<Vec<f32>> {
    let (a_shape, a) = *inputs.first()?;
    match op {
        MatMulOp::MatMul => {
            let (b_shape, b) = *inputs.get(1)?;
            let p = batched_problem(a_shape, b_shape).ok()?;
            product(&p, a, b, None)
        }
        MatMulOp::Linear { out_features, bias } => {
            let k = a_shape.last().copied().unwrap_or(1).max(1);
            let p = Problem {
                m: a.len() / k,
                n: *out_features,
                k,
                offsets: vec![(0, 0)],
            };
            let (_, w) = *params.first()?;
            let b = if *bias { Some(params.get(1)?.1) } else { None };
            product(&p, a, w, b)
        }
    }
}

/// C = A·B (+ a bias row) for every batch pair of `p`, all row-major; `None` when an
/// operand is shorter than the problem says.
fn product(p: &Problem, a: &[f32], b: &[f32], bias: Option<&[f32]>) -> Option<Vec<f32>> {
    let (m, n, k) = (p.m, p.n, p.k);
    let size = m.checked_mul(n)?;
    let (a_len, b_len) = (m.checked_mul(k)?, k.checked_mul(n)?);
    let mut c = vec![0.0f32; p.offsets.len().checked_mul(size)?];
    if size == 0 {
        return Some(c);
    }
    if let Some(bias) = bias {
        if bias.len() != n {
            return None;
        }
        for row in c.chunks_exact_mut(n) {
            row.copy_from_slice(bias);
        }
    }
    for (out, &(oa, ob)) in c.chunks_exact_mut(size).zip(&p.offsets) {
        let a = a.get(oa..oa.checked_add(a_len)?)?;
        let b = b.get(ob..ob.checked_add(b_len)?)?;
        gemm_into(m, n, k, out, a, b, bias.is_some())?;
    }
    Some(c)
}

/// `out` (m×n) = A (m×k) · B (k×n), plus what `out` held when `accumulate`; all row-major.
/// `None` unless the slices have exactly those lengths.
fn gemm_into(
    m: usize,
    n: usize,
    k: usize,
    out: &mut [f32],
    a: &[f32],
    b: &[f32],
    accumulate: bool,
) -> Option<()> {
    let fits = |len: usize, rows: usize, cols: usize| rows.checked_mul(cols) == Some(len);
    if !(fits(out.len(), m, n) && fits(a.len(), m, k) && fits(b.len(), k, n)) {
        return None;
    }
    if k == 0 {
        // An empty sum: nothing to multiply.
        if !accumulate {
            out.fill(0.0);
        }
        return Some(());
    }
    let (row_a, row_b) = (isize::try_from(k).ok()?, isize::try_from(n).ok()?);
    // SAFETY: every slice holds exactly rows × columns elements (checked above) and each
    // is read (or written) as a row-major matrix of that size: column stride 1, row stride
    // its column count, so no access leaves its slice; `out` is borrowed mutably and
    // overlaps neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            row_b,
            accumulate,
            a.as_ptr(),
            1,
            row_a,
            b.as_ptr(),
            1,
            row_b,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
    Some(())
}

/// Where a term's operand comes from, for one chunk of the output.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// Every output element has its own (an input of the output's shape, the anchor).
    Full(&'a [f32]),
    /// A trailing row repeated along the leading axes: element i reads `row[i % len]`.
    Row(&'a [f32]),
    /// One value for all.
    Scalar(f32),
    /// An earlier term's result.
    Term(usize),
}

/// How `shape` broadcasts to `out`, `None` for anything but the output's own shape, a
/// single value or a trailing row.
fn source<'a>(shape: &[usize], data: &'a [f32], out: &[usize]) -> Option<Source<'a>> {
    let numel: usize = out.iter().product();
    if data.len() == 1 {
        return Some(Source::Scalar(data[0]));
    }
    let first = shape.iter().position(|&d| d != 1).unwrap_or(shape.len());
    let trailing = &shape[first..];
    if trailing.len() > out.len() || !out.ends_with(trailing) {
        return None;
    }
    Some(if data.len() == numel {
        Source::Full(data)
    } else {
        Source::Row(data)
    })
}

/// One term of a compiled unit.
enum Step<'a> {
    Unary(Unary, Source<'a>),
    Binary(Binary, Source<'a>, Source<'a>),
}

/// A fused unit evaluated into an output of shape `out`: the expression's inputs are the
/// step's (`inputs`) and, in an epilogue, the anchor's result. `None` where a term or an
/// operand is not covered.
pub(crate) fn fused(
    expr: &Expr,
    inputs: &[Operand32],
    anchor: Option<&[f32]>,
    out: &[usize],
) -> Option<Vec<f32>> {
    let numel = out.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
    let steps = compile(expr, inputs, anchor, out)?;
    let slots = slots(&steps);
    let mut result = vec![0.0f32; numel];
    result
        .par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(c, chunk)| evaluate_widest(&steps, &slots, c * CHUNK, chunk));
    Some(result)
}

/// A unary or binary pointwise operator on its own (training keeps each activation, so
/// its forward is not fused): a unit of one term.
pub(crate) fn elementwise(
    op: &ElementwiseOp,
    inputs: &[Operand32],
    out: &[usize],
) -> Option<Vec<f32>> {
    let args = match op {
        ElementwiseOp::Unary(_) => vec![Operand::Input(0)],
        ElementwiseOp::Binary(_) => vec![Operand::Input(0), Operand::Input(1)],
        _ => return None,
    };
    let expr = Expr {
        terms: vec![Term {
            node: String::new(),
            op: Op::Elementwise(op.clone()),
            args,
        }],
    };
    fused(&expr, inputs, None, out)
}

/// The gradient of a unary pointwise operator, `dy · f′(x)`, for `x` and `dy` of the
/// output's shape (the reference's arithmetic, element by element); `None` otherwise.
pub(crate) fn unary_grad(
    u: Unary,
    (x_shape, x): Operand32,
    (dy_shape, dy): Operand32,
    out: &[usize],
) -> Option<Vec<f32>> {
    if x_shape != out || dy_shape != out || x.len() != dy.len() {
        return None;
    }
    let mut result = vec![0.0f32; x.len()];
    result
        .par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
        .for_each(|(o, (x, dy))| {
            for ((o, &x), &d) in o.iter_mut().zip(x).zip(dy) {
                *o = derivative(u, x) * d;
            }
        });
    Some(result)
}

/// The terms of a fused unit over an output of shape `out`, `None` where a term or an
/// operand is not covered.
fn compile<'a>(
    expr: &Expr,
    inputs: &[Operand32<'a>],
    anchor: Option<&'a [f32]>,
    out: &[usize],
) -> Option<Vec<Step<'a>>> {
    let numel = out.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
    let operand = |a: &Operand, terms: usize| -> Option<Source<'a>> {
        match *a {
            Operand::Input(k) => {
                let (shape, data) = *inputs.get(k)?;
                source(shape, data, out)
            }
            Operand::Term(j) if j < terms => Some(Source::Term(j)),
            Operand::Term(_) => None,
            Operand::Scalar(v) => Some(Source::Scalar(v)),
            Operand::Anchor => anchor.filter(|a| a.len() == numel).map(Source::Full),
        }
    };
    let mut steps = Vec::with_capacity(expr.terms.len());
    for (t, term) in expr.terms.iter().enumerate() {
        steps.push(match (&term.op, term.args.as_slice()) {
            (Op::Elementwise(ElementwiseOp::Unary(u)), [x]) => Step::Unary(*u, operand(x, t)?),
            (Op::Elementwise(ElementwiseOp::Binary(b)), [x, y]) => {
                Step::Binary(*b, operand(x, t)?, operand(y, t)?)
            }
            _ => return None,
        });
    }
    (!steps.is_empty()).then_some(steps)
}

/// A sum or mean over trailing axes of a fused unit's values over `shape` (a reduction's
/// prologue), each piece of a row evaluated into a per-thread buffer and summed at once:
/// the partial sums of [`reduce`] over [`fused`]'s output, in the same order (the same
/// bits), without storing the values. Rows shorter than a chunk take that route.
pub(crate) fn fused_reduce(
    op: &ReduceOp,
    expr: &Expr,
    inputs: &[Operand32],
    shape: &[usize],
) -> Option<Vec<f32>> {
    let (block, scale) = trailing_block(op, shape)?;
    let numel = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
    if block < CHUNK {
        let x = fused(expr, inputs, None, shape)?;
        return reduce(op, (shape, &x));
    }
    let steps = compile(expr, inputs, None, shape)?;
    let slots = slots(&steps);
    let pieces = block.div_ceil(PIECE);
    let sums = (0..numel / block).into_par_iter().map(|row| {
        let partial: Vec<f64> = (0..pieces)
            .into_par_iter()
            .map(|p| {
                let mut buffer = PIECE_BUFFER.take();
                buffer.resize(PIECE.min(block - p * PIECE), 0.0);
                let start = row * block + p * PIECE;
                for (c, chunk) in buffer.chunks_mut(CHUNK).enumerate() {
                    evaluate_widest(&steps, &slots, start + c * CHUNK, chunk);
                }
                let sum = lane_sum(&buffer);
                PIECE_BUFFER.set(buffer);
                sum
            })
            .collect();
        (partial.iter().sum::<f64>() * scale) as f32
    });
    Some(sums.collect())
}

/// [`evaluate`] compiled for the widest vectors the CPU has: AVX2 (eight f32 lanes) where
/// present, else the build's baseline (SSE2 on x86-64). Only the vector width differs:
/// no fused multiply-add, so every element gets the bits of the scalar operations.
fn evaluate_widest(steps: &[Step], slot_of: &[usize], start: usize, chunk: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU was just found to have AVX2.
        unsafe { evaluate_avx2(steps, slot_of, start, chunk) };
        return;
    }
    evaluate(steps, slot_of, start, chunk);
}

/// [`evaluate`] with AVX2 enabled for the loops inlined into it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn evaluate_avx2(steps: &[Step], slot_of: &[usize], start: usize, chunk: &mut [f32]) {
    evaluate(steps, slot_of, start, chunk);
}

/// The buffer each term writes: a term's buffer is free again after its last reader, so a
/// chain of any length needs two or three chunk-sized buffers that stay in cache.
fn slots(steps: &[Step]) -> Vec<usize> {
    let reads = |s: &Step| -> Vec<usize> {
        let (Step::Unary(_, x) | Step::Binary(_, x, _)) = s;
        let y = match s {
            Step::Binary(_, _, y) => Some(*y),
            Step::Unary(..) => None,
        };
        [Some(*x), y]
            .into_iter()
            .flatten()
            .filter_map(|src| match src {
                Source::Term(j) => Some(j),
                _ => None,
            })
            .collect()
    };
    let mut last_read = vec![0; steps.len()];
    for (t, s) in steps.iter().enumerate() {
        for j in reads(s) {
            last_read[j] = t;
        }
    }
    let (mut slot_of, mut free, mut count) = (Vec::with_capacity(steps.len()), Vec::new(), 0);
    for (t, s) in steps.iter().enumerate() {
        slot_of.push(free.pop().unwrap_or_else(|| {
            count += 1;
            count - 1
        }));
        // Operands read for the last time here free their buffers for later terms (never
        // for this one, which is written while they are read).
        for j in reads(s) {
            if last_read[j] == t && !free.contains(&slot_of[j]) {
                free.push(slot_of[j]);
            }
        }
    }
    slot_of
}

/// Evaluates every term over the chunk of the output starting at `start`, term `t` into
/// buffer `slot_of[t]`.
#[inline(always)]
fn evaluate(steps: &[Step], slot_of: &[usize], start: usize, chunk: &mut [f32]) {
    let len = chunk.len();
    let count = slot_of.iter().max().map_or(0, |m| m + 1);
    // Every term writes all of its buffer before any reads it: what a reused buffer held
    // is never read.
    let mut buffers = TERM_BUFFERS.take();
    buffers.resize_with(count, Vec::new);
    for b in &mut buffers {
        b.resize(len, 0.0);
    }
    let mut rows = [Vec::new(), Vec::new()];
    for (t, step) in steps.iter().enumerate() {
        let mut dst = std::mem::take(&mut buffers[slot_of[t]]);
        let [row_x, row_y] = &mut rows;
        let at = Chunk {
            start,
            len,
            buffers: &buffers,
            slot_of,
        };
        match *step {
            Step::Unary(u, x) => {
                let x = at.values(x, row_x);
                match u {
                    Unary::Relu => map1(&mut dst, x, relu),
                    Unary::Neg => map1(&mut dst, x, |v| -v),
                    Unary::Exp => map1(&mut dst, x, f32::exp),
                    _ => map1(&mut dst, x, |v| unary(u, v)),
                }
            }
            Step::Binary(b, x, y) => {
                let (x, y) = (at.values(x, row_x), at.values(y, row_y));
                match b {
                    Binary::Add => map2(&mut dst, x, y, |p, q| p + q),
                    Binary::Sub => map2(&mut dst, x, y, |p, q| p - q),
                    Binary::Mul => map2(&mut dst, x, y, |p, q| p * q),
                    Binary::Div => map2(&mut dst, x, y, |p, q| p / q),
                    _ => map2(&mut dst, x, y, |p, q| binary(b, p, q)),
                }
            }
        }
        buffers[slot_of[t]] = dst;
    }
    chunk.copy_from_slice(&buffers[slot_of[steps.len() - 1]]);
    TERM_BUFFERS.set(buffers);
}

/// max(x, 0) with NaN staying NaN, as the reference's relu.
#[inline(always)]
fn relu(v: f32) -> f32 {
    if v.is_nan() {
        v
    } else {
        v.max(0.0)
    }
}

/// `dst[i] = f(x[i])`, the loop monomorphised per operator so it vectorises.
#[inline(always)]
fn map1(dst: &mut [f32], x: Values, f: impl Fn(f32) -> f32) {
    match x {
        Values::Slice(x) => {
            for (d, &v) in dst.iter_mut().zip(x) {
                *d = f(v);
            }
        }
        Values::Scalar(v) => dst.fill(f(v)),
    }
}

/// `dst[i] = f(x[i], y[i])`, scalars held in a register.
#[inline(always)]
fn map2(dst: &mut [f32], x: Values, y: Values, f: impl Fn(f32, f32) -> f32) {
    match (x, y) {
        (Values::Slice(x), Values::Slice(y)) => {
            for ((d, &p), &q) in dst.iter_mut().zip(x).zip(y) {
                *d = f(p, q);
            }
        }
        (Values::Slice(x), Values::Scalar(q)) => {
            for (d, &p) in dst.iter_mut().zip(x) {
                *d = f(p, q);
            }
        }
        (Values::Scalar(p), Values::Slice(y)) => {
            for (d, &q) in dst.iter_mut().zip(y) {
                *d = f(p, q);
            }
        }
        (Values::Scalar(p), Values::Scalar(q)) => dst.fill(f(p, q)),
    }
}

/// An operand's values over one chunk.
enum Values<'a> {
    Slice(&'a [f32]),
    Scalar(f32),
}

/// One chunk of the output being evaluated: where it starts, how long it is, and the
/// buffers holding the terms computed so far.
struct Chunk<'b> {
    start: usize,
    len: usize,
    buffers: &'b [Vec<f32>],
    slot_of: &'b [usize],
}

impl<'b> Chunk<'b> {
    /// The values of `source` over this chunk; a repeated row is written out into `row`.
    fn values<'a>(&self, source: Source<'a>, row: &'a mut Vec<f32>) -> Values<'a>
    where
        'b: 'a,
    {
        let (start, len) = (self.start, self.len);
        match source {
            Source::Full(data) => Values::Slice(&data[start..start + len]),
            Source::Scalar(v) => Values::Scalar(v),
            Source::Term(j) => Values::Slice(&self.buffers[self.slot_of[j]]),
            Source::Row(data) => {
                row.clear();
                row.extend((start..start + len).map(|i| data[i % data.len()]));
                Values::Slice(row)
            }
        }
    }
}

/// `reduce_sum` or `reduce_mean` over trailing axes (each output element sums one
/// contiguous block), accumulated in f64 as the reference does, blocks and long rows
/// spread over threads; `None` for other reductions and axes.
pub(crate) fn reduce(op: &ReduceOp, (shape, x): Operand32) -> Option<Vec<f32>> {
    let Some((block, scale)) = trailing_block(op, shape) else {
        return column_sums(op, shape, x);
    };
    if x.len() % block != 0 {
        return None;
    }
    // Partial sums collected in order and added in order: the same bits on every run,
    // whatever the threads did.
    let sum = |row: &[f32]| -> f64 {
        let partial: Vec<f64> = row.par_chunks(PIECE).map(lane_sum).collect();
        partial.iter().sum()
    };
    Some(
        x.par_chunks(block)
            .map(|row| (sum(row) * scale) as f32)
            .collect(),
    )
}

/// A sum or mean over leading axes (a bias's gradient sums the rows of a batch): each
/// output is its column's f64 sum, rows added in order; `None` for other reductions.
fn column_sums(op: &ReduceOp, shape: &[usize], x: &[f32]) -> Option<Vec<f32>> {
    /// Columns one thread sums together, row by row.
    const COLUMNS: usize = 512;
    let (axes, mean) = summed_axes(op, shape.len())?;
    let kept = axes.len();
    if kept == 0 || kept >= shape.len() || axes.iter().copied().ne(0..kept) {
        return None;
    }
    let rows = shape[..kept]
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))?;
    let cols = shape[kept..]
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))?;
    if rows == 0 || cols == 0 || rows.checked_mul(cols) != Some(x.len()) {
        return None;
    }
    let scale = if mean { 1.0 / rows as f64 } else { 1.0 };
    let mut out = vec![0f32; cols];
    out.par_chunks_mut(COLUMNS)
        .enumerate()
        .for_each(|(c, chunk)| {
            let first = c * COLUMNS;
            let mut sums = vec![0f64; chunk.len()];
            for row in x.chunks_exact(cols) {
                for (sum, &v) in sums.iter_mut().zip(&row[first..first + chunk.len()]) {
                    *sum += f64::from(v);
                }
            }
            for (o, sum) in chunk.iter_mut().zip(&sums) {
                *o = (sum * scale) as f32;
            }
        });
    Some(out)
}

/// Elements of a row summed into one partial sum (by one thread).
const PIECE: usize = 1 << 16;

/// The distinct axes a sum or mean folds, in order, and whether it is a mean; `None` for
/// other reductions or an axis outside `rank`.
fn summed_axes(op: &ReduceOp, rank: usize) -> Option<(Vec<usize>, bool)> {
    let mean = match op.kind {
        ReduceKind::Sum => false,
        ReduceKind::Mean => true,
        _ => return None,
    };
    let mut axes: Vec<usize> = match &op.axes {
        None => (0..rank).collect(),
        Some(a) => a
            .iter()
            .map(|&a| usize::try_from(if a < 0 { a + rank as i64 } else { a }).ok())
            .collect::<Option<_>>()?,
    };
    axes.sort_unstable();
    axes.dedup();
    axes.iter().all(|&a| a < rank).then_some((axes, mean))
}

/// For a sum or mean over trailing axes of `shape`: the elements each output sums (not
/// zero) and the factor applied to the sum; `None` for other reductions and axes.
fn trailing_block(op: &ReduceOp, shape: &[usize]) -> Option<(usize, f64)> {
    let rank = shape.len();
    let (axes, mean) = summed_axes(op, rank)?;
    let first = rank.checked_sub(axes.len())?;
    if axes.iter().copied().ne(first..rank) {
        return None;
    }
    let block: usize = shape[first..].iter().product();
    if block == 0 {
        return None;
    }
    Some((block, if mean { 1.0 / block as f64 } else { 1.0 }))
}

/// `transpose` of an f32 tensor by the resolved permutation `perm` (output axis d is input
/// axis `perm[d]`); `None` when `perm` or the data do not fit `shape`.
pub(crate) fn transpose(perm: &[usize], (shape, x): Operand32) -> Option<Vec<f32>> {
    let rank = shape.len();
    let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    let mut sorted = perm.to_vec();
    sorted.sort_unstable();
    if x.len() != numel || sorted.into_iter().ne(0..rank) {
        return None;
    }
    if numel == 0 || rank < 2 {
        return Some(x.to_vec());
    }
    let mut out = vec![0f32; numel];
    let (rows, cols) = (shape[rank - 2], shape[rank - 1]);
    let leading_kept = perm[..rank - 2].iter().enumerate().all(|(i, &p)| i == p);
    if leading_kept && perm[rank - 2] == rank - 1 && perm[rank - 1] == rank - 2 {
        // Matrices transposed one by one: the weight and activation transposes of a
        // backward pass.
        for (o, m) in out
            .chunks_exact_mut(rows * cols)
            .zip(x.chunks_exact(rows * cols))
        {
            transpose_matrix(m, rows, cols, o);
        }
        return Some(out);
    }
    // Any other permutation: each output row read from the input with a stride.
    let mut strides = vec![1usize; rank];
    for d in (0..rank - 1).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    let dims: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let from: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    let (width, step) = (dims[rank - 1], from[rank - 1]);
    let rows_per_task = (CHUNK / width).max(1);
    out.par_chunks_mut(width * rows_per_task)
        .enumerate()
        .for_each(|(t, task)| {
            for (r, row) in task.chunks_exact_mut(width).enumerate() {
                let (mut rest, mut base) = (t * rows_per_task + r, 0);
                for d in (0..rank - 1).rev() {
                    base += (rest % dims[d]) * from[d];
                    rest /= dims[d];
                }
                for (j, v) in row.iter_mut().enumerate() {
                    *v = x[base + j * step];
                }
            }
        });
    Some(out)
}

/// `out` (cols × rows) = the transpose of `m` (rows × cols), in square tiles that stay in
/// cache, bands of output rows spread over threads.
fn transpose_matrix(m: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    const TILE: usize = 32;
    out.par_chunks_mut(rows * TILE)
        .enumerate()
        .for_each(|(band, block)| {
            let first_col = band * TILE;
            let height = block.len() / rows;
            for r0 in (0..rows).step_by(TILE) {
                for c in 0..height {
                    let dst = &mut block[c * rows + r0..c * rows + (r0 + TILE).min(rows)];
                    for (r, v) in dst.iter_mut().enumerate() {
                        *v = m[(r0 + r) * cols + first_col + c];
                    }
                }
            }
        });
}

/// The f64 sum of `x` over eight lanes (element i into lane i mod 8, the lanes added in
/// order at the end): independent additions that vectorise, in a fixed order.
fn lane_sum(x: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let mut blocks = x.chunks_exact(8);
    for block in &mut blocks {
        for (lane, &v) in lanes.iter_mut().zip(block) {
            *lane += f64::from(v);
        }
    }
    for (lane, &v) in lanes.iter_mut().zip(blocks.remainder()) {
        *lane += f64::from(v);
    }
    lanes.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_reuses_two_buffers_and_a_value_read_later_keeps_its_own() {
        let relu = |j| Step::Unary(Unary::Relu, Source::Term(j));
        let mut chain = vec![Step::Unary(Unary::Relu, Source::Scalar(1.0))];
        chain.extend((0..31).map(relu));
        let slot_of = slots(&chain);
        assert_eq!(slot_of.iter().max(), Some(&1), "{slot_of:?}");
        // t0 is read by t1 and again by t3: t2 must not take its buffer.
        let steps = vec![
            Step::Unary(Unary::Relu, Source::Scalar(2.0)),
            relu(0),
            Step::Unary(Unary::Neg, Source::Term(1)),
            Step::Binary(Binary::Sub, Source::Term(0), Source::Term(2)),
        ];
        let slot_of = slots(&steps);
        assert_ne!(slot_of[2], slot_of[0], "{slot_of:?}");
        let mut out = vec![0.0; 5];
        evaluate(&steps, &slot_of, 0, &mut out);
        assert_eq!(out, vec![4.0; 5], "2 - (-2), t0 kept");
    }

    #[test]
    fn products_of_every_shape_class_equal_the_plain_triple_loop() {
        // Empty sums, empty outputs, single rows and columns, odd sizes across the GEMM's
        // blocks, with and without a bias row, over two batch pairs that share B.
        for &(m, k, n) in &[
            (1, 1, 1),
            (3, 0, 5),
            (0, 4, 2),
            (1, 784, 10),
            (17, 33, 9),
            (70, 129, 65),
        ] {
            let a: Vec<f32> = (0..2 * m * k)
                .map(|i| (i % 13) as f32 * 0.25 - 1.5)
                .collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 * 0.5 - 1.0).collect();
            let bias: Vec<f32> = (0..n).map(|j| j as f32 - 2.0).collect();
            let p = Problem {
                m,
                n,
                k,
                offsets: vec![(0, 0), (m * k, 0)],
            };
            for with_bias in [false, true] {
                let got = product(&p, &a, &b, with_bias.then_some(&bias[..])).unwrap();
                let mut want = vec![0f32; 2 * m * n];
                for (batch, &(oa, _)) in p.offsets.iter().enumerate() {
                    for i in 0..m {
                        for j in 0..n {
                            let dot: f64 = (0..k)
                                .map(|l| f64::from(a[oa + i * k + l]) * f64::from(b[l * n + j]))
                                .sum();
                            let start = if with_bias { f64::from(bias[j]) } else { 0.0 };
                            want[batch * m * n + i * n + j] = (start + dot) as f32;
                        }
                    }
                }
                for (x, y) in got.iter().zip(&want) {
                    assert!(
                        (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                        "{m}×{k}×{n}: {x} {y}"
                    );
                }
                assert_eq!(got.len(), want.len());
            }
        }
        let short = Problem {
            m: 2,
            n: 2,
            k: 2,
            offsets: vec![(0, 0)],
        };
        assert!(product(&short, &[1.0; 3], &[1.0; 4], None).is_none());
        assert!(product(&short, &[1.0; 4], &[1.0; 4], Some(&[1.0; 3])).is_none());
    }

    /// The reference's answer for `op` on one f32 tensor.
    fn reference(op: Op, shape: &[usize], x: &[f32], out: &[usize]) -> Vec<f32> {
        let t = crate::tensor::Tensor::f32(shape.to_vec(), x.to_vec());
        let mut r = crate::cpu::eval(&op, &[&t], &[], &[out.to_vec()]).unwrap();
        match r.pop().unwrap().data {
            crate::tensor::TensorData::F32(v) => v,
            other => panic!("not f32: {other:?}"),
        }
    }

    #[test]
    fn transposes_of_every_permutation_class_give_the_references_elements() {
        use crate::ops::movement::MovementOp;
        for (shape, perm) in [
            (vec![512, 784], vec![1, 0]),
            (vec![33, 70], vec![1, 0]),
            (vec![3, 5, 7], vec![0, 2, 1]),
            (vec![3, 5, 7], vec![2, 0, 1]),
            (vec![2, 3, 4, 5], vec![3, 1, 0, 2]),
            (vec![4, 1], vec![1, 0]),
            (vec![0, 3], vec![1, 0]),
            (vec![6], vec![0]),
        ] {
            let x: Vec<f32> = (0..shape.iter().product::<usize>())
                .map(|i| i as f32)
                .collect();
            let out: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let op = Op::Movement(MovementOp::Transpose {
                perm: Some(perm.iter().map(|&p| p as i64).collect()),
            });
            let want = reference(op, &shape, &x, &out);
            assert_eq!(
                transpose(&perm, (&shape, &x)),
                Some(want),
                "{shape:?} {perm:?}"
            );
        }
        assert!(transpose(&[0, 0], (&[2, 2], &[0.0; 4])).is_none());
        assert!(transpose(&[1, 0], (&[2, 2], &[0.0; 3])).is_none());
    }

    #[test]
    fn sums_and_means_over_leading_axes_give_the_references_answers() {
        use crate::ops::reduce::{ReduceKind, ReduceOp};
        let x: Vec<f32> = (0..4 * 3 * 700)
            .map(|i| ((i * 7919) % 1013) as f32 / 97.0 - 5.0)
            .collect();
        let shape = [4, 3, 700];
        for (kind, axes, out) in [
            (ReduceKind::Sum, vec![0], vec![3, 700]),
            (ReduceKind::Sum, vec![0, 1], vec![700]),
            (ReduceKind::Mean, vec![1, -3], vec![700]),
            (ReduceKind::Mean, vec![0], vec![3, 700]),
        ] {
            let op = ReduceOp {
                kind,
                axes: Some(axes.clone()),
                keepdims: false,
                select_last_index: false,
            };
            let want = reference(Op::Reduce(op.clone()), &shape, &x, &out);
            let got = reduce(&op, (&shape, &x)).unwrap();
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{axes:?}: {g} {w}");
            }
        }
        // A middle axis alone and other folds stay with the reference.
        let middle = ReduceOp {
            kind: ReduceKind::Sum,
            axes: Some(vec![1]),
            keepdims: false,
            select_last_index: false,
        };
        assert!(reduce(&middle, (&shape, &x)).is_none());
        let max = ReduceOp {
            kind: ReduceKind::Max,
            axes: Some(vec![0]),
            ..middle
        };
        assert!(reduce(&max, (&shape, &x)).is_none());
    }

    #[test]
    fn the_widest_vectors_give_the_bits_of_the_baseline_loops() {
        let x: Vec<f32> = (0..1000)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let steps = vec![
            Step::Binary(Binary::Mul, Source::Full(&x), Source::Scalar(1.0001)),
            Step::Binary(Binary::Add, Source::Term(0), Source::Scalar(0.5)),
            Step::Unary(Unary::Relu, Source::Term(1)),
            Step::Binary(Binary::Div, Source::Term(2), Source::Full(&x)),
            Step::Unary(Unary::Exp, Source::Term(3)),
        ];
        let slot_of = slots(&steps);
        let (mut baseline, mut widest) = (vec![0.0; 1000], vec![0.0; 1000]);
        evaluate(&steps, &slot_of, 0, &mut baseline);
        evaluate_widest(&steps, &slot_of, 0, &mut widest);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&widest), bits(&baseline));
    }

    #[test]
    fn a_prologue_summed_as_it_is_evaluated_gives_the_bits_of_storing_it_first() {
        // relu(x·y) − 0.25 summed or averaged over rows of several pieces, one short
        // piece, and rows shorter than a chunk.
        use crate::ops::reduce::ReduceKind;
        use crate::plan::expr::Term;
        let term = |name: &str, args: Vec<Operand>| Term {
            node: name.into(),
            op: crate::ops::parse(name, &serde_json::Map::new()).unwrap(),
            args,
        };
        let expr = Expr {
            terms: vec![
                term("mul", vec![Operand::Input(0), Operand::Input(1)]),
                term("relu", vec![Operand::Term(0)]),
                term("sub", vec![Operand::Term(1), Operand::Scalar(0.25)]),
            ],
        };
        for (shape, axes, kind) in [
            (vec![3, 2 * PIECE + 999], Some(vec![1]), ReduceKind::Sum),
            (vec![3, 2 * PIECE + 999], Some(vec![-1]), ReduceKind::Mean),
            (vec![PIECE + 5], None, ReduceKind::Sum),
            (vec![40, 7], Some(vec![1]), ReduceKind::Mean),
        ] {
            let n: usize = shape.iter().product();
            let x: Vec<f32> = (0..n).map(|i| ((i * 7919 % 1013) as f32).sin()).collect();
            let y: Vec<f32> = (0..n).map(|i| ((i * 31 % 97) as f32).cos()).collect();
            let inputs = [
                (shape.as_slice(), x.as_slice()),
                (shape.as_slice(), y.as_slice()),
            ];
            let op = ReduceOp {
                kind,
                axes,
                keepdims: false,
                select_last_index: false,
            };
            let stored = fused(&expr, &inputs, None, &shape).unwrap();
            let want = reduce(&op, (&shape, &stored)).unwrap();
            let got = fused_reduce(&op, &expr, &inputs, &shape).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{shape:?} {kind:?}");
        }
    }

    #[test]
    fn lane_sums_are_the_sequential_f64_sum_to_f32_precision() {
        for n in [0, 1, 7, 8, 9, 1000, 65_537] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 1013) as f32).sin() * 3.0)
                .collect();
            let sequential: f64 = x.iter().map(|&v| f64::from(v)).sum();
            assert_eq!(lane_sum(&x) as f32, sequential as f32, "n = {n}");
        }
    }
}
