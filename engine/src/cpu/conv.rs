//! CPU reference of the conv/pool family (NCHW; [N, C, L] as [N, C, 1, L]).

use super::{floats, Float, Host};
use crate::ops::conv::{as_2d, ConvOp, Resize};

/// Evaluates a convolution or pooling.
pub fn eval<T: Host>(op: &ConvOp, x: &T, params: &[&T], out: &[usize]) -> Result<T, String> {
    let v = floats(x)?;
    if let ConvOp::Resize(r) = op {
        return resize(r, x.shape(), v, out);
    }
    // 1-D operators compute on [N, C, 1, L].
    let s = as_2d(x.shape(), 1);
    let o = as_2d(out, 1);
    let (n, c) = (s[0], s[1]);
    let mut y = Vec::with_capacity(out.iter().product());
    if let ConvOp::GlobalAvgPool = op {
        let area: usize = s[2..].iter().product();
        for plane in v.chunks(area.max(1)).take(n * c) {
            y.push(T::F::from_f64(
                plane.iter().map(|&a| a.to_f64()).sum::<f64>() / area.max(1) as f64,
            ));
        }
        return Ok(T::from_floats(out.to_vec(), y));
    }
    let [h, w] = [s[2], s[3]];
    let [oc_n, oh_n, ow_n] = [o[1], o[2], o[3]];
    match op {
        ConvOp::GlobalAvgPool | ConvOp::Resize(_) => return Err("internal: handled above".into()),
        ConvOp::ConvTranspose2d { groups, bias, .. } => {
            // conv2d's input gradient is the transposed convolution: x plays dy.
            let (_, win) = op.transpose_geometry([h, w])?;
            let wt = floats(params[0])?;
            y = super::conv_grad::conv2d_grad_input(
                v,
                wt,
                [o[0], o[1], o[2], o[3]],
                [n, c, h, w],
                &win,
                *groups,
            )?;
            if *bias {
                let b = floats(params[1])?;
                let plane = (oh_n * ow_n).max(1);
                for (i, d) in y.iter_mut().enumerate() {
                    *d += b[(i / plane) % oc_n.max(1)];
                }
            }
        }
        ConvOp::Conv2d {
            window: win,
            groups,
            bias,
            ..
        } => {
            let wt = floats(params[0])?;
            let b = if *bias {
                Some(floats(params[1])?)
            } else {
                None
            };
            let cg = c / groups;
            let per_group = oc_n / groups;
            for ni in 0..n {
                for oc in 0..oc_n {
                    let g = oc / per_group;
                    for oh in 0..oh_n {
                        for ow in 0..ow_n {
                            let mut acc = T::F::ZERO;
                            for ci in 0..cg {
                                for kh in 0..win.kernel[0] {
                                    let ih = (oh * win.strides[0] + kh * win.dilations[0]) as i64
                                        - win.pads[0] as i64;
                                    if ih < 0 || ih >= h as i64 {
                                        continue;
                                    }
                                    for kw in 0..win.kernel[1] {
                                        let iw = (ow * win.strides[1] + kw * win.dilations[1])
                                            as i64
                                            - win.pads[1] as i64;
                                        if iw < 0 || iw >= w as i64 {
                                            continue;
                                        }
                                        let xi = ((ni * c + g * cg + ci) * h + ih as usize) * w
                                            + iw as usize;
                                        let wi = ((oc * cg + ci) * win.kernel[0] + kh)
                                            * win.kernel[1]
                                            + kw;
                                        acc += v[xi] * wt[wi];
                                    }
                                }
                            }
                            y.push(acc + b.map_or(T::F::ZERO, |b| b[oc]));
                        }
                    }
                }
            }
        }
        ConvOp::MaxPool(win) | ConvOp::AvgPool { window: win, .. } => {
            let include = matches!(
                op,
                ConvOp::AvgPool {
                    count_include_pad: true,
                    ..
                }
            );
            let is_max = matches!(op, ConvOp::MaxPool(_));
            for plane in 0..n * c {
                for oh in 0..oh_n {
                    for ow in 0..ow_n {
                        let (mut best, mut sum, mut valid, mut padded) =
                            (T::F::NEG_INFINITY, T::F::ZERO, 0usize, 0usize);
                        for kh in 0..win.kernel[0] {
                            let ih = (oh * win.strides[0] + kh * win.dilations[0]) as i64
                                - win.pads[0] as i64;
                            for kw in 0..win.kernel[1] {
                                let iw = (ow * win.strides[1] + kw * win.dilations[1]) as i64
                                    - win.pads[1] as i64;
                                let in_pad = ih >= -(win.pads[0] as i64)
                                    && ih < (h + win.pads[2]) as i64
                                    && iw >= -(win.pads[1] as i64)
                                    && iw < (w + win.pads[3]) as i64;
                                padded += usize::from(in_pad);
                                if ih >= 0 && ih < h as i64 && iw >= 0 && iw < w as i64 {
                                    let a = v[(plane * h + ih as usize) * w + iw as usize];
                                    // NaN-propagating, as onnxruntime's and PyTorch's.
                                    best = best.maximum(a);
                                    sum += a;
                                    valid += 1;
                                }
                            }
                        }
                        let count = if include { padded } else { valid }.max(1);
                        y.push(if is_max {
                            best
                        } else {
                            sum / T::F::from_f64(count as f64)
                        });
                    }
                }
            }
        }
    }
    Ok(T::from_floats(out.to_vec(), y))
}

/// `resize`: each output element sums the input at every corner of its taps (two per
/// axis), weighted by the product of the axes' weights; corners of weight 0 are skipped,
/// as in the kernel.
fn resize<T: Host>(r: &Resize, dims: &[usize], v: &[T::F], out: &[usize]) -> Result<T, String> {
    let (shape, taps) = r.plan(dims)?;
    if shape != out {
        return Err(format!("resize of {dims:?} gives {shape:?}, not {out:?}"));
    }
    let rank = dims.len();
    let n: usize = out.iter().product();
    let mut idx = vec![0; rank];
    let mut y = Vec::with_capacity(n);
    for i in 0..n {
        super::unravel(i, out, &mut idx);
        let mut acc = T::F::ZERO;
        for corner in 0..(1usize << rank) {
            let (mut weight, mut off) = (1f32, 0usize);
            for a in 0..rank {
                let (lo, hi, w) = taps[a][idx[a]];
                let up = corner >> a & 1 == 1;
                weight *= if up { w } else { 1.0 - w };
                off = off * dims[a] + if up { hi } else { lo };
            }
            if weight != 0.0 {
                acc += T::F::from_f32(weight) * v[off];
            }
        }
        y.push(acc);
    }
    Ok(T::from_floats(out.to_vec(), y))
}

#[cfg(test)]
mod tests {
    use crate::ops::{parse, Op};
    use crate::tensor::Tensor;
    use serde_json::json;

    #[test]
    fn conv_transpose_on_hand_checked_numbers() {
        // 1-D, stride 2, kernel [1, 10], bias 0.5: every input spreads to two outputs.
        let attrs = json!({ "out_channels": 1, "kernel_size": [2], "strides": [2] });
        let Ok(Op::Conv(op)) = parse("conv_transpose2d", attrs.as_object().unwrap()) else {
            panic!("conv_transpose2d is in the conv family");
        };
        let x = Tensor::f32(vec![1, 1, 2], vec![2.0, 3.0]);
        let w = Tensor::f32(vec![1, 1, 2], vec![1.0, 10.0]);
        let b = Tensor::f32(vec![1], vec![0.5]);
        let y = super::eval(&op, &x, &[&w, &b], &[1, 1, 4]).unwrap();
        assert_eq!(y.to_f32_vec(), vec![2.5, 20.5, 3.5, 30.5]);
        // Stride 1 overlaps: [2, 3] with [1, 10] is [2, 23, 30]; pads [1, 0] drop the 2.
        let attrs = json!({ "out_channels": 1, "kernel_size": [2], "pads": [1, 0], "bias": false });
        let Ok(Op::Conv(op)) = parse("conv_transpose2d", attrs.as_object().unwrap()) else {
            panic!("conv_transpose2d is in the conv family");
        };
        let y = super::eval(&op, &x, &[&w], &[1, 1, 2]).unwrap();
        assert_eq!(y.to_f32_vec(), vec![23.0, 30.0]);
        // output_padding at or above the stride is refused, naming the attribute.
        let attrs =
            json!({ "out_channels": 1, "kernel_size": [2], "output_padding": [2], "strides": [2] });
        let e = parse("conv_transpose2d", attrs.as_object().unwrap()).unwrap_err();
        assert_eq!(e[0].0, "output_padding");
    }

    /// A graph of every windowed operator, its window attributes written as `k`.
    fn windows_graph(k: impl Fn(i64, usize) -> serde_json::Value) -> crate::graph::Graph {
        let doc = json!({
            "format": "sluice/graph@1",
            "inputs": { "x": { "shape": ["N", 2, 9, 9] } },
            "nodes": [
                { "id": "c", "op": "conv2d", "inputs": ["x"], "attrs": {
                    "out_channels": 4, "kernel_size": k(3, 2), "pads": k(1, 4),
                    "strides": k(2, 2), "dilations": k(1, 2) } },
                { "id": "m", "op": "max_pool2d", "inputs": ["c"],
                  "attrs": { "kernel_size": k(2, 2), "strides": k(1, 2), "pads": k(1, 4) } },
                { "id": "a", "op": "avg_pool2d", "inputs": ["m"],
                  "attrs": { "kernel_size": k(3, 2), "pads": k(1, 4) } },
                { "id": "t", "op": "conv_transpose2d", "inputs": ["a"], "attrs": {
                    "out_channels": 3, "kernel_size": k(2, 2), "strides": k(2, 2),
                    "output_padding": k(1, 2) } }
            ],
            "outputs": ["t"]
        });
        crate::graph::load_graph(&doc.to_string()).unwrap()
    }

    #[test]
    fn a_single_integer_window_is_the_same_on_every_axis() {
        let short = windows_graph(|v, _| json!(v));
        let long = windows_graph(|v, len| json!(vec![v; len]));
        let shape = |g: &crate::graph::Graph| {
            let o = &g.outputs[0];
            crate::shape::show(&g.dag[o.node].outputs[o.port].shape)
        };
        assert_eq!(shape(&short), shape(&long));
        // (9 + 2 − 3) / 2 + 1 = 5, pooled to 6 then 6, transposed to 2·5 + 1 + 2 = 13.
        assert_eq!(shape(&short), "[N, 3, 13, 13]");
        let (short, long) = (
            crate::exec::dataset::bind(&short, 2).unwrap(),
            crate::exec::dataset::bind(&long, 2).unwrap(),
        );
        let inputs = crate::exec::dataset::random_inputs(&long, 3).unwrap();
        let weights = crate::weights::init_weights(&long, 5);
        let run = |g| crate::cpu::run(g, &weights, &inputs).unwrap();
        let (a, b) = (run(&short), run(&long));
        assert_eq!(a[0].1.shape, b[0].1.shape);
        assert_eq!(a[0].1.to_f32_vec(), b[0].1.to_f32_vec());
    }

    #[test]
    fn a_bad_single_integer_window_names_its_attribute() {
        for (attr, v) in [("kernel_size", 0), ("strides", -1), ("pads", -2)] {
            let mut attrs = json!({ "out_channels": 1, "kernel_size": 3 });
            attrs[attr] = json!(v);
            let e = parse("conv2d", attrs.as_object().unwrap()).unwrap_err();
            assert_eq!(e[0].0, attr, "{e:?}");
            assert!(e[0].1.contains(attr), "{e:?}");
        }
        // A list of the wrong length, and a scalar where the list is no window's.
        let e = parse(
            "max_pool2d",
            json!({ "kernel_size": [2, 2, 2] }).as_object().unwrap(),
        );
        assert_eq!(e.unwrap_err()[0].0, "kernel_size");
        let e = parse("reshape", json!({ "shape": 3 }).as_object().unwrap());
        assert!(e.unwrap_err()[0].1.contains("list of integers"));
    }
}
