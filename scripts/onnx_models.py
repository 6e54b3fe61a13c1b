#!/usr/bin/env python3
"""Build Sluice's real-model ONNX fixtures (tests/data/onnx-models/<name>/).

Each model is a small network of our own, built in PyTorch with a fixed seed, exported
to ONNX (opset 17) by the TorchScript exporter (`torch.onnx.export(..., dynamo=False)`,
which writes plain ONNX ops), with a dynamic batch axis named "batch". For each model the
fixture folder gets:

    model.onnx      the exported model (weights inline, no external data)
    input_K.npy     seeded inputs, batch 2, one file per graph input in graph order
    output_K.npy    onnxruntime's outputs for those inputs (the oracle), graph order
    model.json      inputs/outputs (name, dtype, shape), op types with counts and their
                    attributes, opset, versions of the tools, and torch-vs-onnxruntime
                    agreement

Needs torch, onnx, onnxruntime and numpy (only this script needs torch; tests only read
the files). Run from the repository root:

    python scripts/onnx_models.py            # writes tests/data/onnx-models/
    python scripts/onnx_models.py --out DIR  # elsewhere
    python scripts/onnx_models.py --only gru_seq,mlp_tiny
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import shutil
import sys
import tempfile
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F

OPSET = 17
SEED = 20261204
BATCH = 2


# --------------------------------------------------------------------------- models


def randomize_norms(model: nn.Module, gen: torch.Generator) -> None:
    """Give every BatchNorm non-trivial statistics and affine parameters (and every
    LayerNorm a non-trivial scale and shift), so that an importer that ignores or mixes
    up any of those tensors gets a wrong answer. (It also keeps the exporter from
    deduplicating the all-ones/all-zeros LayerNorm tensors into Identity nodes.)"""
    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            c = m.normalized_shape
            with torch.no_grad():
                m.weight.copy_(torch.rand(c, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(c, generator=gen) * 0.2)
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(c, generator=gen) * 0.2)
                m.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(c, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(c, generator=gen) * 0.2)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, 0, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + identity)


class ResNet18Style(nn.Module):
    """ResNet-18 layout (stem, max pool, 4 stages of 2 BasicBlocks, global average pool,
    linear head) with a quarter of the channels, for 32x32 inputs."""

    def __init__(self, widths=(16, 32, 64, 128), classes=10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        layers = []
        cin = widths[0]
        for i, w in enumerate(widths):
            stride = 1 if i == 0 else 2
            layers += [BasicBlock(cin, w, stride), BasicBlock(w, w, 1)]
            cin = w
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        layers += [
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2Style(nn.Module):
    """MobileNetV2 layout (stem, inverted residual blocks, 1x1 head conv, global average
    pool, dropout, linear) with few channels, for 32x32 inputs."""

    # (expansion t, channels c, repeats n, stride s) as in the paper's table 2
    SETTINGS = [(1, 8, 1, 1), (4, 12, 2, 2), (4, 16, 3, 2), (4, 24, 2, 1), (4, 32, 1, 2)]

    def __init__(self, classes=10):
        super().__init__()
        layers = [nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6()]
        cin = 16
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [nn.Conv2d(cin, 96, 1, bias=False), nn.BatchNorm2d(96), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(96, classes))

    def forward(self, x):
        x = self.features(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.classifier(x)


class SelfAttention(nn.Module):
    """Multi-head self-attention written out: projections, split heads, scaled
    QK^T, key-padding mask, softmax, weighted V, merge heads, output projection."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)

    def forward(self, x, pad):  # x [b, s, d]; pad [b, s] bool, True = padding
        b, s, d = x.shape
        q = self.q(x).reshape(b, s, self.h, self.dh).transpose(1, 2)
        k = self.k(x).reshape(b, s, self.h, self.dh).transpose(1, 2)
        v = self.v(x).reshape(b, s, self.h, self.dh).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.dh)
        scores = scores.masked_fill(pad[:, None, None, :], -1e9)
        attn = torch.softmax(scores, dim=-1)
        y = torch.matmul(attn, v).transpose(1, 2).reshape(b, s, d)
        return self.o(y)


class EncoderLayer(nn.Module):
    """Post-norm layer as in nn.TransformerEncoderLayer: LN(x + attn), LN(x + FFN)."""

    def __init__(self, d: int, heads: int, ff: int):
        super().__init__()
        self.attn = SelfAttention(d, heads)
        self.ln1 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, ff)
        self.ff2 = nn.Linear(ff, d)
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x, pad):
        x = self.ln1(x + self.attn(x, pad))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class TransformerEncoder(nn.Module):
    """Float features [b, seq, 16] -> linear embedding -> + learned positions ->
    2 encoder layers (d_model 32, 4 heads, FFN 64, GELU) -> hidden states [b, seq, 32]."""

    def __init__(self, features=16, d=32, heads=4, ff=64, seq=8, layers=2):
        super().__init__()
        self.embed = nn.Linear(features, d)
        self.pos = nn.Parameter(torch.randn(1, seq, d) * 0.1)
        self.layers = nn.ModuleList(EncoderLayer(d, heads, ff) for _ in range(layers))

    def forward(self, x, key_padding_mask):
        h = self.embed(x) + self.pos
        for layer in self.layers:
            h = layer(h, key_padding_mask)
        return h


class TorchTransformerEncoder(nn.Module):
    """The same shape of model from PyTorch's own modules: nn.TransformerEncoder of 2
    nn.TransformerEncoderLayer (batch_first, post-norm, GELU, no dropout) with
    src_key_padding_mask. Its export is the realistic, noisy kind: the in-projection is one
    packed [96, 32] weight sliced three ways, head split/merge through Shape chains, and
    the bool mask is turned into an additive float mask inside the graph."""

    def __init__(self, features=16, d=32, heads=4, ff=64, layers=2):
        super().__init__()
        self.embed = nn.Linear(features, d)
        layer = nn.TransformerEncoderLayer(
            d, heads, ff, dropout=0.0, activation="gelu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        # nn.TransformerEncoder deep-copies one layer, so every layer starts with the same
        # weights (and the exporter would share them through Identity nodes): make each
        # layer's weights its own
        with torch.no_grad():
            for p in self.encoder.parameters():
                p.add_(torch.randn_like(p) * 0.05)

    def forward(self, x, key_padding_mask):
        return self.encoder(self.embed(x), src_key_padding_mask=key_padding_mask)


class GruSeq(nn.Module):
    """nn.GRU (batch_first, 1 layer) over [b, seq, 8], linear head on the last step."""

    def __init__(self, features=8, hidden=16, classes=4):
        super().__init__()
        self.rnn = nn.GRU(features, hidden, num_layers=1, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y[:, -1, :])


class LstmSeq(nn.Module):
    """nn.LSTM (batch_first, 1 layer) over [b, seq, 8], linear head on the last step."""

    def __init__(self, features=8, hidden=16, classes=4):
        super().__init__()
        self.rnn = nn.LSTM(features, hidden, num_layers=1, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y[:, -1, :])


class MlpTiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


# --------------------------------------------------------------------------- specs


def _images(rng):
    return [rng.standard_normal((BATCH, 3, 32, 32)).astype(np.float32)]


def _transformer_inputs(rng):
    x = rng.standard_normal((BATCH, 8, 16)).astype(np.float32)
    pad = np.zeros((BATCH, 8), dtype=bool)
    pad[1, 5:] = True  # second sequence: last 3 positions are padding
    return [x, pad]


def _sequences(rng):
    return [rng.standard_normal((BATCH, 10, 8)).astype(np.float32)]


MODELS = {
    "mlp_tiny": dict(
        build=MlpTiny,
        inputs=lambda rng: [rng.standard_normal((BATCH, 4)).astype(np.float32)],
        input_names=["x"],
        output_names=["logits"],
        batch_dims={"x": 0, "logits": 0},
        description="2-layer MLP 4 -> 8 -> 3 with ReLU: the simplest case.",
        exercises="Gemm (transB=1) with bias, Relu, a dynamic batch dim.",
    ),
    "resnet18_style": dict(
        build=ResNet18Style,
        inputs=_images,
        input_names=["image"],
        output_names=["logits"],
        batch_dims={"image": 0, "logits": 0},
        # TrainingMode.PRESERVE with the model in eval mode: the exporter's eval-mode
        # peephole (which folds BatchNorm into the previous Conv) does not run, so the
        # graph keeps BatchNormalization nodes (training_mode=0, running statistics).
        export_kwargs=dict(training=torch.onnx.TrainingMode.PRESERVE),
        description=(
            "ResNet-18 layout at a quarter width (16/32/64/128 channels): 3x3 stem, "
            "3x3/2 max pool, 4 stages of 2 BasicBlocks, 1x1/2 projection shortcuts, "
            "global average pool, linear head; input [batch, 3, 32, 32]."
        ),
        exercises=(
            "Conv (3x3 pad 1, stride 1 and 2; 1x1 stride 2, no bias), "
            "BatchNormalization in inference mode (kept unfused, random statistics), "
            "Relu, MaxPool (3x3/2 pad 1), residual Add, GlobalAveragePool, Flatten, Gemm."
        ),
    ),
    "mobilenetv2_style": dict(
        build=MobileNetV2Style,
        inputs=_images,
        input_names=["image"],
        output_names=["logits"],
        batch_dims={"image": 0, "logits": 0},
        # default TrainingMode.EVAL: BatchNorm is folded into the Conv weights and
        # biases by the exporter, as in any ordinary eval-mode export.
        description=(
            "MobileNetV2 layout with few channels: 3x3/2 stem, inverted residual blocks "
            "(1x1 expand, 3x3 depthwise, 1x1 linear projection, residual where shapes "
            "match), 1x1 head conv, global average pool, dropout (a no-op in inference), "
            "linear; input [batch, 3, 32, 32]."
        ),
        exercises=(
            "Depthwise Conv (group = channels, stride 1 and 2), pointwise Conv, Conv with "
            "bias (BatchNorm folded in by the exporter), Clip(0, 6) for ReLU6 with min/max "
            "as constant inputs, residual Add, GlobalAveragePool, Flatten, Gemm."
        ),
    ),
    "transformer_encoder": dict(
        build=TransformerEncoder,
        inputs=_transformer_inputs,
        input_names=["features", "key_padding_mask"],
        output_names=["hidden"],
        batch_dims={"features": 0, "key_padding_mask": 0, "hidden": 0},
        description=(
            "Transformer encoder: float features [batch, 8, 16] -> linear embedding "
            "(d_model 32) + learned positions -> 2 post-norm layers of 4-head "
            "self-attention (written out: matmul, scale, masked_fill, softmax) and a GELU "
            "FFN (64), each followed by residual + LayerNorm; key_padding_mask [batch, 8] "
            "bool, true = padding (batch item 1 has its last 3 positions padded); output "
            "hidden states [batch, 8, 32]."
        ),
        exercises=(
            "MatMul + Add for linear layers on 3-D inputs, batched MatMul (4-D), Reshape "
            "whose shape comes from Shape/Gather/Unsqueeze/Concat of the runtime input, "
            "Transpose, Div by a scalar, bool input, Where (masked_fill) with a broadcast "
            "mask, Softmax(axis=-1), LayerNormalization, exact GELU as Erf arithmetic."
        ),
    ),
    "transformer_torch_layers": dict(
        build=TorchTransformerEncoder,
        inputs=_transformer_inputs,
        input_names=["features", "key_padding_mask"],
        output_names=["hidden"],
        batch_dims={"features": 0, "key_padding_mask": 0, "hidden": 0},
        description=(
            "Same sizes as transformer_encoder (features [batch, 8, 16], d_model 32, 4 "
            "heads, FFN 64, GELU, 2 post-norm layers, bool key_padding_mask) but built from "
            "nn.TransformerEncoder/nn.TransformerEncoderLayer (nn.MultiheadAttention "
            "inside), no positional term; output hidden states [batch, 8, 32]."
        ),
        exercises=(
            "What PyTorch's stock attention exports to: Gemm and MatMul projections, the "
            "packed in-projection split with Slice, long Shape/Gather/Unsqueeze/Concat/"
            "Reshape chains, Expand, Mod, Equal, Sqrt, Squeeze, the bool mask turned into "
            "a float additive mask (Cast/Where), Softmax, LayerNormalization, Erf GELU."
        ),
    ),
    "gru_seq": dict(
        build=GruSeq,
        inputs=_sequences,
        input_names=["sequence"],
        output_names=["logits"],
        batch_dims={"sequence": 0, "logits": 0},
        description=(
            "nn.GRU (batch_first, 1 layer, 8 -> 16) over [batch, 10, 8], linear head "
            "(16 -> 4) on the last time step."
        ),
        exercises=(
            "ONNX GRU (linear_before_reset=1, as PyTorch computes it), the Transpose/"
            "Squeeze around it for batch_first, slicing the last step, Gemm."
        ),
    ),
    "lstm_seq": dict(
        build=LstmSeq,
        inputs=_sequences,
        input_names=["sequence"],
        output_names=["logits"],
        batch_dims={"sequence": 0, "logits": 0},
        description=(
            "nn.LSTM (batch_first, 1 layer, 8 -> 16) over [batch, 10, 8], linear head "
            "(16 -> 4) on the last time step."
        ),
        exercises=(
            "ONNX LSTM (gates in iofc order, PyTorch's ifgo reordered by the exporter), "
            "the Transpose/Squeeze around it for batch_first, slicing the last step, Gemm."
        ),
    ),
}


# --------------------------------------------------------------------------- helpers

_NP_TO_NAME = {np.dtype(np.float32): "float32", np.dtype(bool): "bool", np.dtype(np.int64): "int64"}


def onnx_dtype_name(elem_type: int) -> str:
    return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name


def value_info(vi) -> dict:
    t = vi.type.tensor_type
    shape = [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]
    return {"name": vi.name, "dtype": onnx_dtype_name(t.elem_type), "shape": shape}


def _attr_value(a):
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, onnx.TensorProto):
        arr = onnx.numpy_helper.to_array(v)
        if arr.size <= 8:
            return {"tensor": arr.tolist(), "dtype": arr.dtype.name}
        return {"tensor_shape": list(arr.shape), "dtype": arr.dtype.name}
    if isinstance(v, (list, tuple)):
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    if isinstance(v, float):
        return float(np.float32(v))
    return v


def op_summary(model: onnx.ModelProto) -> tuple[dict, dict]:
    """Op types with counts (including nodes inside subgraphs), and for each op type the
    distinct attribute sets it is used with."""
    counts = collections.Counter()
    attrs = collections.defaultdict(list)

    def walk(graph):
        for n in graph.node:
            key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
            counts[key] += 1
            d = {}
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                    d[a.name] = "<graph>"
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for g in a.graphs:
                        walk(g)
                    d[a.name] = "<graphs>"
                else:
                    d[a.name] = _attr_value(a)
            if d and d not in attrs[key]:
                attrs[key].append(d)

    walk(model.graph)
    return dict(sorted(counts.items())), {k: attrs[k] for k in sorted(attrs)}


def ort_session(path: str) -> ort.InferenceSession:
    so = ort.SessionOptions()
    # the oracle runs the graph as written: no fusions or rewrites, one thread
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def export(name: str, spec: dict, out_dir: str) -> dict:
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED + 1)
    model = spec["build"]()
    randomize_norms(model, gen)
    model.eval()

    rng = np.random.default_rng(SEED)
    inputs = spec["inputs"](rng)
    tinputs = tuple(torch.from_numpy(a) for a in inputs)

    dynamic_axes = {k: {v: "batch"} for k, v in spec["batch_dims"].items()}
    fixture = os.path.join(out_dir, name)
    if os.path.isdir(fixture):
        shutil.rmtree(fixture)
    os.makedirs(fixture)
    path = os.path.join(fixture, "model.onnx")

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = os.path.join(tmp, "model.onnx")
        torch.onnx.export(
            model,
            tinputs,
            raw,
            dynamo=False,
            opset_version=OPSET,
            input_names=spec["input_names"],
            output_names=spec["output_names"],
            dynamic_axes=dynamic_axes,
            do_constant_folding=True,
            **spec.get("export_kwargs", {}),
        )
        m = onnx.load(raw)
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, path)  # small: weights stay inline

    with torch.no_grad():
        expect = model(*tinputs)
    expect = [expect] if isinstance(expect, torch.Tensor) else list(expect)

    sess = ort_session(path)
    feed = {i.name: a for i, a in zip(sess.get_inputs(), inputs)}
    outputs = sess.run(None, feed)

    diffs = [float(np.max(np.abs(o - e.numpy()))) for o, e in zip(outputs, expect)]
    if max(diffs) > 1e-4:
        raise SystemExit(f"{name}: onnxruntime and torch disagree by {max(diffs)}")

    for k, a in enumerate(inputs):
        np.save(os.path.join(fixture, f"input_{k}.npy"), a)
    for k, o in enumerate(outputs):
        np.save(os.path.join(fixture, f"output_{k}.npy"), o)

    counts, attrs = op_summary(m)
    n_params = sum(int(np.prod(t.dims)) for t in m.graph.initializer)
    info = {
        "name": name,
        "description": spec["description"],
        "exercises": spec["exercises"],
        "licence": "MIT OR Apache-2.0 (Sluice's own model, random weights)",
        "made_by": f"python scripts/onnx_models.py --only {name}",
        "seed": SEED,
        "opset": {(o.domain or "ai.onnx"): o.version for o in m.opset_import},
        "ir_version": m.ir_version,
        "producer": f"{m.producer_name} {m.producer_version}",
        "exporter": "torch.onnx.export(dynamo=False, do_constant_folding=True"
        + (", training=PRESERVE" if "export_kwargs" in spec else "")
        + ")",
        "versions": {
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": ort.__version__,
            "numpy": np.__version__,
        },
        "oracle": "onnxruntime CPUExecutionProvider, graph optimizations disabled, 1 thread",
        "inputs": [value_info(v) for v in m.graph.input],
        "outputs": [value_info(v) for v in m.graph.output],
        "test_data": {
            "inputs": [
                {"file": f"input_{k}.npy", "dtype": _NP_TO_NAME[a.dtype], "shape": list(a.shape)}
                for k, a in enumerate(inputs)
            ],
            "outputs": [
                {"file": f"output_{k}.npy", "dtype": _NP_TO_NAME[o.dtype], "shape": list(o.shape)}
                for k, o in enumerate(outputs)
            ],
        },
        "torch_vs_onnxruntime_max_abs_diff": max(diffs),
        "initializers": len(m.graph.initializer),
        "parameters": n_params,
        "nodes": len(m.graph.node),
        "model_bytes": os.path.getsize(path),
        "op_types": counts,
        "op_attributes": attrs,
    }
    with open(os.path.join(fixture, "model.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
    return info


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "onnx-models"))
    ap.add_argument("--only", default="", help="comma-separated model names")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(MODELS)
    for n in names:
        if n not in MODELS:
            sys.exit(f"unknown model {n!r}; known: {', '.join(MODELS)}")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    for n in names:
        info = export(n, MODELS[n], args.out)
        ops = ", ".join(f"{k}x{v}" for k, v in info["op_types"].items())
        print(f"{n}: {info['model_bytes']} bytes, {info['nodes']} nodes, "
              f"max |torch-ort| {info['torch_vs_onnxruntime_max_abs_diff']:.2e}: {ops}")


if __name__ == "__main__":
    main()
