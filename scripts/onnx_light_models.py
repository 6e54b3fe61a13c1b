#!/usr/bin/env python3
"""Lay out the ONNX package's "light" model zoo as Sluice test fixtures.

The `onnx` Python package ships, under onnx/backend/test/data/light/, nine classic
ImageNet CNNs converted from Caffe2 (AlexNet, DenseNet-121, Inception v1 and v2,
ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512) as *light* models: the full graph
(opset 9, IR version 3) with every weight replaced by a ConstantOfShape node filling it
with 0.02, so each file is only 4-215 KB. They are Apache-2.0 (the ONNX project's), and
are not committed to Sluice: this script copies them out of the installed package.

For each model, DIR/<name>/ gets:

    model.onnx           the light model as shipped
    input_0.npy          seeded input, uniform [0, 1), the model's shape ([1, 3, 224, 224])
    output_0.npy         onnxruntime's output for it (the oracle)
    onnx_dummy/input_0.npy, onnx_dummy/output_0.npy
                         the input ONNX's own backend test feeds (arange(n)/n) and
                         onnxruntime's output for it, checked against the expected output
                         that ONNX ships (light_<name>_output_0.pb)
    model.json           inputs/outputs, op types with counts and their distinct attribute
                         sets (auto_pad, ceil_mode, pads, LRN size/alpha/beta/bias, Gemm
                         transA/transB, ...), versions, agreement figures

Because every weight of a light model is the same number, every channel of every layer
computes the same thing and the final Softmax sees 1000 equal logits: the output is
exactly uniform (0.001) whatever the arithmetic did before it. That checks that the graph
imports and runs, not that it computes the right numbers. `--random-weights` adds, for
each model, a DIR/<name>_rw/ with the same layout where each ConstantOfShape weight is
replaced by a seeded random initializer (He-normal conv and Gemm weights, small biases,
BatchNorm running statistics calibrated on the seeded input so that activations stay
near unit scale): those outputs do depend on every op. They are large
(the full parameter count: VGG-19 about 550 MB, AlexNet 240 MB, ZFNet 350 MB,
ResNet-50 100 MB; the rest 5-45 MB).

Needs onnx, onnxruntime and numpy (scripts/python-oracle.sh makes such a venv).

    python scripts/onnx_light_models.py DIR
    python scripts/onnx_light_models.py DIR --only resnet50,squeezenet --random-weights
    python scripts/onnx_light_models.py --list        # sizes and op types, writes nothing
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import shutil
import sys

import numpy as np
import onnx
import onnx.numpy_helper as nph
import onnxruntime as ort

SEED = 20261204


def light_dir() -> str:
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def light_models() -> dict[str, str]:
    out = {}
    for p in sorted(glob.glob(os.path.join(light_dir(), "light_*.onnx"))):
        out[os.path.basename(p)[len("light_") : -len(".onnx")]] = p
    return out


def _attr_value(a):
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, onnx.TensorProto):
        arr = nph.to_array(v)
        return {"tensor": arr.tolist(), "dtype": arr.dtype.name} if arr.size <= 8 else {
            "tensor_shape": list(arr.shape), "dtype": arr.dtype.name}
    if isinstance(v, (list, tuple)):
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    if isinstance(v, float):
        return float(np.float32(v))
    return v


def op_summary(model: onnx.ModelProto) -> tuple[dict, dict]:
    counts = collections.Counter()
    attrs = collections.defaultdict(list)
    for n in model.graph.node:
        counts[n.op_type] += 1
        d = {a.name: _attr_value(a) for a in n.attribute}
        if d not in attrs[n.op_type]:
            attrs[n.op_type].append(d)
    return dict(sorted(counts.items())), {k: attrs[k] for k in sorted(attrs)}


def value_info(vi) -> dict:
    t = vi.type.tensor_type
    shape = [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]
    return {"name": vi.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name,
            "shape": shape}


def real_inputs(model: onnx.ModelProto):
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def ort_run(model_bytes: bytes, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    s = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def randomize_weights(model: onnx.ModelProto, rng: np.random.Generator) -> onnx.ModelProto:
    """Replace each weight-filling ConstantOfShape node by a seeded random initializer,
    chosen by what consumes it (following Reshape/Unsqueeze to the real consumer)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name: nph.to_array(t) for t in g.initializer}
    consumers = collections.defaultdict(list)
    for n in g.node:
        for k, i in enumerate(n.input):
            consumers[i].append((n, k))

    def role(name: str, depth: int = 0):
        for n, k in consumers.get(name, []):
            if n.op_type in ("Reshape", "Unsqueeze", "Squeeze", "Flatten") and k == 0 and depth < 4:
                return role(n.output[0], depth + 1)
            return n, k
        return None, None

    keep = []
    new_inits = []
    for n in g.node:
        if n.op_type != "ConstantOfShape" or n.input[0] not in inits:
            keep.append(n)
            continue
        shape = tuple(int(d) for d in inits[n.input[0]])
        user, slot = role(n.output[0])
        op = user.op_type if user is not None else None
        if op == "Conv" and slot == 1:
            fan_in = int(np.prod(shape[1:]))
            w = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        elif op == "Gemm" and slot == 1:
            trans_b = any(a.name == "transB" and a.i for a in user.attribute)
            fan_in = int(np.prod(shape)) // shape[0] if trans_b else shape[0]
            w = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        elif op == "BatchNormalization" and slot in (1, 4):  # scale, variance
            w = rng.uniform(0.8, 1.2, shape)
        elif op == "Mul":  # a per-channel scale
            w = rng.uniform(0.8, 1.2, shape)
        else:  # biases, BatchNorm shift and mean, Add's per-channel shift
            w = rng.standard_normal(shape) * 0.05
        new_inits.append(nph.from_array(w.astype(np.float32), n.output[0]))
    del g.node[:]
    g.node.extend(keep)
    g.initializer.extend(new_inits)
    if m.ir_version < 4:  # IR 3: every initializer must also be a graph input
        for t in new_inits:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    # the shape tensors are no longer used by any node; leave them (harmless) so that
    # the graph's inputs stay as shipped
    return m


def calibrate_batchnorm(model: onnx.ModelProto, feeds: dict) -> int:
    """Set each BatchNormalization's running mean and variance to the per-channel mean
    and variance of what reaches it for `feeds`, so that the random-weight network keeps
    its activations near unit scale (without this, ResNet-50's 16 residual sums and
    ShuffleNet's saturate the final Softmax into a one-hot). Works in passes: each pass
    calibrates the BatchNorms with no uncalibrated BatchNorm upstream. Returns the passes."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    pending = {k for k, n in enumerate(g.node) if n.op_type == "BatchNormalization"}
    passes = 0
    while pending:
        # a pending BatchNorm is ready when no other pending BatchNorm lies upstream
        up: dict[str, bool] = {}  # tensor -> has a pending BatchNorm upstream
        frontier = []
        for k, n in enumerate(g.node):
            tainted = any(up.get(i, False) for i in n.input)
            if k in pending:
                if not tainted:
                    frontier.append(k)
                tainted = True
            for o in n.output:
                up[o] = tainted
        if not frontier:
            raise RuntimeError("BatchNorm calibration found a cycle")
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        for k in frontier:
            n = g.node[k]
            probe.graph.output.append(
                onnx.helper.make_tensor_value_info(n.input[0], onnx.TensorProto.FLOAT, None))
        names = [o.name for o in probe.graph.output]
        vals = dict(zip(names, ort_run(probe.SerializeToString(), feeds)))
        for k in frontier:
            n = g.node[k]
            x = vals[n.input[0]].astype(np.float64)
            axes = (0,) + tuple(range(2, x.ndim))
            mean, var = x.mean(axis=axes), x.var(axis=axes)
            for slot, v in ((3, mean), (4, var)):
                t = inits[n.input[slot]]
                t.CopyFrom(nph.from_array(v.astype(np.float32).reshape(nph.to_array(t).shape), t.name))
            pending.discard(k)
        passes += 1
    return passes


def make_feeds(model: onnx.ModelProto) -> tuple[dict, dict]:
    """The seeded input (uniform [0, 1)) and ONNX's backend-test dummy (arange(n)/n)."""
    rng = np.random.default_rng(SEED)
    seeded, dummy = {}, {}
    for vi in real_inputs(model):
        dims = tuple(d.dim_value if d.HasField("dim_value") else 1
                     for d in vi.type.tensor_type.shape.dim)
        seeded[vi.name] = rng.random(dims, dtype=np.float32)
        n = int(np.prod(dims))
        dummy[vi.name] = (np.arange(n).reshape(dims) / n).astype(np.float32)
    return seeded, dummy


def write_case(dst: str, model: onnx.ModelProto, name: str, note: str, shipped_pb: str | None):
    os.makedirs(dst, exist_ok=True)
    raw = model.SerializeToString()
    with open(os.path.join(dst, "model.onnx"), "wb") as f:
        f.write(raw)
    ins = real_inputs(model)
    seeded, dummy = make_feeds(model)

    out = ort_run(raw, seeded)
    for k, vi in enumerate(ins):
        np.save(os.path.join(dst, f"input_{k}.npy"), seeded[vi.name])
    for k, o in enumerate(out):
        np.save(os.path.join(dst, f"output_{k}.npy"), o)

    dd = os.path.join(dst, "onnx_dummy")
    os.makedirs(dd, exist_ok=True)
    dout = ort_run(raw, dummy)
    for k, vi in enumerate(ins):
        np.save(os.path.join(dd, f"input_{k}.npy"), dummy[vi.name])
    for k, o in enumerate(dout):
        np.save(os.path.join(dd, f"output_{k}.npy"), o)
    shipped_diff = None
    if shipped_pb and os.path.exists(shipped_pb):
        t = onnx.TensorProto()
        with open(shipped_pb, "rb") as f:
            t.ParseFromString(f.read())
        shipped_diff = float(np.max(np.abs(nph.to_array(t) - dout[0])))

    counts, attrs = op_summary(model)
    info = {
        "name": name,
        "note": note,
        "source": f"onnx {onnx.__version__} package, onnx/backend/test/data/light/light_{name.removesuffix('_rw')}.onnx",
        "licence": "Apache-2.0 (Copyright (c) ONNX Project Contributors)",
        "made_by": "python scripts/onnx_light_models.py DIR"
        + (" --random-weights" if name.endswith("_rw") else ""),
        "seed": SEED,
        "opset": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "ir_version": model.ir_version,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "versions": {"onnx": onnx.__version__, "onnxruntime": ort.__version__,
                     "numpy": np.__version__},
        "oracle": "onnxruntime CPUExecutionProvider, graph optimizations disabled, 1 thread",
        "inputs": [value_info(v) for v in ins],
        "outputs": [value_info(v) for v in model.graph.output],
        "constant_inputs": len(model.graph.input) - len(ins),
        "output_stats": {"min": float(out[0].min()), "max": float(out[0].max()),
                         "argmax": int(out[0].reshape(-1).argmax())},
        "onnx_dummy_vs_shipped_expected_max_abs_diff": shipped_diff,
        "nodes": len(model.graph.node),
        "model_bytes": len(raw),
        "op_types": counts,
        "op_attributes": attrs,
    }
    with open(os.path.join(dst, "model.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", help="output directory")
    ap.add_argument("--only", default="", help="comma-separated names (e.g. resnet50,vgg19)")
    ap.add_argument("--random-weights", action="store_true",
                    help="also write <name>_rw/ with seeded random weights (large)")
    ap.add_argument("--list", action="store_true", help="print sizes and op types only")
    args = ap.parse_args()

    models = light_models()
    if not models:
        sys.exit(f"no light_*.onnx under {light_dir()} (onnx {onnx.__version__})")
    names = [n for n in args.only.split(",") if n] or list(models)
    for n in names:
        if n not in models:
            sys.exit(f"unknown light model {n!r}; known: {', '.join(models)}")

    union = collections.Counter()
    if args.list or not args.dir:
        for n in names:
            m = onnx.load(models[n])
            counts, _ = op_summary(m)
            union.update(counts)
            print(f"{n}: {os.path.getsize(models[n])} bytes, opset "
                  f"{m.opset_import[0].version}: " + ", ".join(f"{k}x{v}" for k, v in counts.items()))
        print("union: " + ", ".join(sorted(union)))
        if not args.dir and not args.list:
            ap.print_usage()
        return

    os.makedirs(args.dir, exist_ok=True)
    for n in names:
        src = models[n]
        model = onnx.load(src)
        shipped = os.path.splitext(src)[0] + "_output_0.pb"
        dst = os.path.join(args.dir, n)
        if os.path.isdir(dst):
            shutil.rmtree(dst)
        info = write_case(dst, model, n, "as shipped: every weight is ConstantOfShape(0.02)", shipped)
        union.update(info["op_types"])
        print(f"{n}: {info['model_bytes']} bytes, {info['nodes']} nodes, output "
              f"[{info['output_stats']['min']:.4g}, {info['output_stats']['max']:.4g}], "
              f"vs shipped expected {info['onnx_dummy_vs_shipped_expected_max_abs_diff']}")
        if args.random_weights:
            rw = randomize_weights(model, np.random.default_rng(SEED))
            passes = calibrate_batchnorm(rw, make_feeds(rw)[0])
            dst = os.path.join(args.dir, n + "_rw")
            if os.path.isdir(dst):
                shutil.rmtree(dst)
            info = write_case(
                dst, rw, n + "_rw",
                "weights replaced by seeded random initializers; BatchNorm running "
                "statistics calibrated on input_0.npy "
                f"({passes} passes; see calibrate_batchnorm)", None)
            print(f"{n}_rw: {info['model_bytes']} bytes, {info['nodes']} nodes, output "
                  f"[{info['output_stats']['min']:.4g}, {info['output_stats']['max']:.4g}] "
                  f"argmax {info['output_stats']['argmax']}")
    print("op-type union: " + ", ".join(sorted(union)))


if __name__ == "__main__":
    main()
