//! CPU reference of the conv family's backward operators (of the gradient family:
//! `conv2d_grad_input`, `conv2d_grad_filter`, `max_pool2d_grad`, `avg_pool2d_grad`), NCHW.
//! Each output element is a sum over the windows that meet it, as the GPU kernels compute
//! it, accumulated in f64. The kernels are functions over float slices, f32 or f64.

use super::{floats, Float, Host};
use crate::ops::conv::Window;
use crate::ops::grad::GradOp;

/// The four dimensions of an NCHW tensor.
fn dims4<T: Host>(t: &T, what: &str) -> Result<[usize; 4], String> {
    let [n, c, h, w] = t.shape()[..] else {
        return Err(format!("{what} must be 4-D, got {:?}", t.shape()));
    };
    Ok([n, c, h, w])
}

/// Checks that a slice holds the elements of `dims`.
fn check<F>(v: &[F], dims: &[usize], what: &str) -> Result<(), String> {
    let n = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("{what} {dims:?} overflows"))?;
    if v.len() == n {
        Ok(())
    } else {
        Err(format!("{what} has {} values for {dims:?}", v.len()))
    }
}

/// The output position along one axis whose window puts tap `k` on input position `i`
/// (`o·stride + k·dilation − pad = i`), if it exists and is below `limit`.
fn tap(i: usize, k: usize, axis: usize, w: &Window, limit: usize) -> Option<usize> {
    let t = (i + w.pads[axis]).checked_sub(k * w.dilations[axis])?;
    let s = w.strides[axis].max(1);
    (t % s == 0 && t / s < limit).then_some(t / s)
}

/// The input position of tap `k` of output position `o` along one axis (may be padding:
/// negative or past the input).
fn at(o: usize, k: usize, axis: usize, w: &Window) -> i64 {
    (o * w.strides[axis] + k * w.dilations[axis]) as i64 - w.pads[axis] as i64
}

/// Evaluates a conv-family backward into an output of shape `out`.
pub fn eval<T: Host>(op: &GradOp, inputs: &[&T], out: &[usize]) -> Result<T, String> {
    let name = op.name();
    let (Some(&x), Some(&dy)) = (inputs.first(), inputs.last()) else {
        return Err(format!("{name} takes x and dy"));
    };
    let (xd, yd) = (dims4(x, "x")?, dims4(dy, "dy")?);
    let dv = floats(dy)?;
    check(dv, &yd, "dy")?;
    let data = match op {
        GradOp::ConvGradInput { window, groups } => {
            let &[_, weight, _] = inputs else {
                return Err(format!("{name} takes x, weight and dy"));
            };
            let wv = floats(weight)?;
            conv2d_grad_input(dv, wv, xd, yd, window, *groups)?
        }
        GradOp::ConvGradFilter { window, groups } => {
            let xv = floats(x)?;
            check(xv, &xd, "x")?;
            conv2d_grad_filter(xv, dv, xd, yd, window, *groups)?
        }
        GradOp::MaxPoolGrad(window) => {
            let xv = floats(x)?;
            check(xv, &xd, "x")?;
            max_pool2d_grad(xv, dv, xd, yd, window)
        }
        GradOp::AvgPoolGrad {
            window,
            count_include_pad,
        } => avg_pool2d_grad(dv, xd, yd, window, *count_include_pad),
        _ => return Err(format!("internal: {name} is no conv-family backward")),
    };
    check(&data, out, name)?;
    Ok(T::from_floats(out.to_vec(), data))
}

/// (input channels, output channels) per group, when `groups` divides both counts.
fn group_sizes(name: &str, groups: usize, c: usize, oc: usize) -> Result<(usize, usize), String> {
    match (c.checked_div(groups), oc.checked_div(groups)) {
        (Some(cg), Some(per_group)) if cg * groups == c && per_group * groups == oc => {
            Ok((cg, per_group))
        }
        _ => Err(format!("{name}: {groups} groups for {c} and {oc} channels")),
    }
}

/// dx of conv2d: dx[n, c, ih, iw] = Σ over the output channels of c's group and the taps
/// (kh, kw) whose window covers (ih, iw) of dy[n, oc, oh, ow] · weight[oc, c mod C/g, kh,
/// kw].
pub fn conv2d_grad_input<F: Float>(
    dy: &[F],
    weight: &[F],
    [n, c, h, w]: [usize; 4],
    [_, oc_n, oh_n, ow_n]: [usize; 4],
    win: &Window,
    groups: usize,
) -> Result<Vec<F>, String> {
    let [kh_n, kw_n] = win.kernel;
    let (cg, per_group) = group_sizes("conv2d_grad_input", groups, c, oc_n)?;
    check(weight, &[oc_n, cg, kh_n, kw_n], "weight")?;
    let mut dx = Vec::with_capacity(n * c * h * w);
    for ni in 0..n {
        for ci in 0..c {
            let g = ci / cg.max(1);
            for ih in 0..h {
                for iw in 0..w {
                    let mut acc = 0.0f64;
                    for oc in g * per_group..(g + 1) * per_group {
                        for kh in 0..kh_n {
                            let Some(oh) = tap(ih, kh, 0, win, oh_n) else {
                                continue;
                            };
                            for kw in 0..kw_n {
                                let Some(ow) = tap(iw, kw, 1, win, ow_n) else {
                                    continue;
                                };
                                let d = dy[((ni * oc_n + oc) * oh_n + oh) * ow_n + ow];
                                let k = weight[((oc * cg + ci % cg) * kh_n + kh) * kw_n + kw];
                                acc += d.to_f64() * k.to_f64();
                            }
                        }
                    }
                    dx.push(F::from_f64(acc));
                }
            }
        }
    }
    Ok(dx)
}

/// The weight gradient of conv2d: dw[oc, ci, kh, kw] = Σ over samples and output
/// positions of dy[n, oc, oh, ow] · x[n, g·C/g + ci, ih, iw] at the tap's input position.
pub fn conv2d_grad_filter<F: Float>(
    x: &[F],
    dy: &[F],
    [n, c, h, w]: [usize; 4],
    [_, oc_n, oh_n, ow_n]: [usize; 4],
    win: &Window,
    groups: usize,
) -> Result<Vec<F>, String> {
    let [kh_n, kw_n] = win.kernel;
    let (cg, per_group) = group_sizes("conv2d_grad_filter", groups, c, oc_n)?;
    let mut dw = Vec::with_capacity(oc_n * cg * kh_n * kw_n);
    for oc in 0..oc_n {
        let g = oc / per_group.max(1);
        for ci in 0..cg {
            for kh in 0..kh_n {
                for kw in 0..kw_n {
                    let mut acc = 0.0f64;
                    for ni in 0..n {
                        let plane = (ni * c + g * cg + ci) * h;
                        for oh in 0..oh_n {
                            let Ok(ih) = usize::try_from(at(oh, kh, 0, win)) else {
                                continue;
                            };
                            if ih >= h {
                                continue;
                            }
                            for ow in 0..ow_n {
                                let Ok(iw) = usize::try_from(at(ow, kw, 1, win)) else {
                                    continue;
                                };
                                if iw >= w {
                                    continue;
                                }
                                let d = dy[((ni * oc_n + oc) * oh_n + oh) * ow_n + ow];
                                acc += d.to_f64() * x[(plane + ih) * w + iw].to_f64();
                            }
                        }
                    }
                    dw.push(F::from_f64(acc));
                }
            }
        }
    }
    Ok(dw)
}

/// The position in its plane of the maximum of window (oh, ow): the first valid position
/// in scan order, replaced only by a strictly greater value (so ties go to the first, as
/// PyTorch's), `None` for a window wholly in the padding.
fn argmax<F: Float>(
    plane: &[F],
    [h, w]: [usize; 2],
    oh: usize,
    ow: usize,
    win: &Window,
) -> Option<usize> {
    let mut best: Option<(usize, F)> = None;
    for kh in 0..win.kernel[0] {
        let Some(ih) = usize::try_from(at(oh, kh, 0, win)).ok().filter(|&i| i < h) else {
            continue;
        };
        for kw in 0..win.kernel[1] {
            let Some(iw) = usize::try_from(at(ow, kw, 1, win)).ok().filter(|&i| i < w) else {
                continue;
            };
            let v = plane[ih * w + iw];
            if best.is_none_or(|(_, b)| v > b) {
                best = Some((ih * w + iw, v));
            }
        }
    }
    best.map(|(i, _)| i)
}

/// dx of max_pool2d: each element gets the dy of every window whose (first) maximum it
/// is.
pub fn max_pool2d_grad<F: Float>(
    x: &[F],
    dy: &[F],
    [n, c, h, w]: [usize; 4],
    [_, _, oh_n, ow_n]: [usize; 4],
    win: &Window,
) -> Vec<F> {
    let mut dx = Vec::with_capacity(n * c * h * w);
    for p in 0..n * c {
        let plane = &x[p * h * w..(p + 1) * h * w];
        for ih in 0..h {
            for iw in 0..w {
                let mut acc = 0.0f64;
                for kh in 0..win.kernel[0] {
                    let Some(oh) = tap(ih, kh, 0, win, oh_n) else {
                        continue;
                    };
                    for kw in 0..win.kernel[1] {
                        let Some(ow) = tap(iw, kw, 1, win, ow_n) else {
                            continue;
                        };
                        if argmax(plane, [h, w], oh, ow, win) == Some(ih * w + iw) {
                            acc += dy[(p * oh_n + oh) * ow_n + ow].to_f64();
                        }
                    }
                }
                dx.push(F::from_f64(acc));
            }
        }
    }
    dx
}

/// How many taps of output position `o`'s window fall inside the input along one axis,
/// or, with `include`, inside the padded input (avg_pool2d's divisor is the product over
/// both axes).
fn covered(o: usize, axis: usize, size: usize, win: &Window, include: bool) -> usize {
    let (lo, hi) = if include {
        (-(win.pads[axis] as i64), (size + win.pads[axis + 2]) as i64)
    } else {
        (0, size as i64)
    };
    (0..win.kernel[axis])
        .filter(|&k| (lo..hi).contains(&at(o, k, axis, win)))
        .count()
}

/// dx of avg_pool2d: each element gets dy / divisor of every window that covers it.
pub fn avg_pool2d_grad<F: Float>(
    dy: &[F],
    [n, c, h, w]: [usize; 4],
    [_, _, oh_n, ow_n]: [usize; 4],
    win: &Window,
    include: bool,
) -> Vec<F> {
    let mut dx = Vec::with_capacity(n * c * h * w);
    for p in 0..n * c {
        for ih in 0..h {
            for iw in 0..w {
                let mut acc = 0.0f64;
                for kh in 0..win.kernel[0] {
                    let Some(oh) = tap(ih, kh, 0, win, oh_n) else {
                        continue;
                    };
                    for kw in 0..win.kernel[1] {
                        let Some(ow) = tap(iw, kw, 1, win, ow_n) else {
                            continue;
                        };
                        let count =
                            covered(oh, 0, h, win, include) * covered(ow, 1, w, win, include);
                        let d = dy[(p * oh_n + oh) * ow_n + ow].to_f64();
                        acc += d / count.max(1) as f64;
                    }
                }
                dx.push(F::from_f64(acc));
            }
        }
    }
    dx
}
