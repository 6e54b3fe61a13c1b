#!/usr/bin/env python3
"""PyTorch reference fixtures for Sluice's training step (issue 13, "an oracle from outside").

For each example training graph (assets/graphs/digits_mlp.json, digits_cnn.json) this builds
the same model in PyTorch, straight from the graph file, and writes into
tests/data/training/<graph>/:

  init.safetensors          initial weights: torch.manual_seed(0), PyTorch default init,
                            layers created in the graph's node order; Sluice keys and layouts
  x0.npy, labels0.npy       batch 0: load_digits samples 0..32 (features / 16, f32; i32)
  x1.npy, labels1.npy       batch 1: samples 32..64
  logits0.npy               forward logits on batch 0 (a forward-only check)
  loss0.npy                 mean softmax cross entropy on batch 0, shape []
  loss0_smooth.npy          the same with label_smoothing 0.1
  grad.<key>.npy            d loss0 / d parameter, Sluice layout
  sgd.safetensors           after 1 plain SGD step (lr 0.1) on batch 0
  sgd_nesterov.safetensors  after 2 SGD steps (lr 0.1, momentum 0.9, nesterov,
                            weight_decay 1e-4) on batch 0, then batch 1
  adamw.safetensors         after 2 AdamW steps (lr 1e-3, betas (0.9, 0.999), eps 1e-8,
                            weight_decay 0.01) on batch 0, then batch 1
  manifest.json             what each file is, the versions used, the hyper-parameters

Everything is computed in float64 (model and data cast to double) and saved as float32.
Layouts: Sluice's `linear` weight is [in, out], PyTorch's nn.Linear weight is [out, in], so
linear weights (and their gradients) are transposed on the way out; conv2d weights are
[out, in/groups, kh, kw] in both. Biases are [out] in both.

Run from anywhere:  python tests/data/training/make_fixtures.py
(see README.md beside this file for the environment). The script re-loads what it wrote,
checks shapes and a few identities, and prints a summary table.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np
import safetensors
import safetensors.numpy
import sklearn
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
GRAPHS = ["digits_mlp", "digits_cnn"]

SEED = 0
BATCH = 32
SGD = dict(lr=0.1)
SGD_NESTEROV = dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
LABEL_SMOOTHING = 0.1


# ---------------------------------------------------------------------------------------
# The graph, interpreted in PyTorch (only the operators the training examples use)
# ---------------------------------------------------------------------------------------


def pads4(p):
    """Sluice pads: [top, left, bottom, right] or [ph, pw]."""
    if len(p) == 2:
        p = [p[0], p[1], p[0], p[1]]
    return [int(v) for v in p]


class GraphModel(nn.Module):
    """A Sluice graph as a torch module. Layers with weights are created in the order the
    nodes appear in the file (so torch.manual_seed(0) decides their initial values), with
    the node id as the module name."""

    def __init__(self, graph: dict):
        super().__init__()
        self.graph = graph
        self.layers = nn.ModuleDict()
        self.last_max = False  # max_pool2d gradient to the first maximum (PyTorch's choice)
        shapes = {}  # known (non-batch) shapes of values, batch axis dropped: for fan-ins
        for name, spec in graph["inputs"].items():
            shapes[name] = [d for d in spec["shape"] if not isinstance(d, str)]
        for node in graph["nodes"]:
            op, a = node["op"], node.get("attrs", {}) or {}
            ins = node["inputs"]
            x = shapes.get(ins[0]) if ins else None
            if op == "linear":
                layer = nn.Linear(x[-1], a["out_features"], bias=a.get("bias", True))
                self.layers[node["id"]] = layer
                out = x[:-1] + [a["out_features"]]
            elif op == "conv2d":
                assert a.get("groups", 1) == 1 and a.get("dilations", [1, 1]) == [1, 1]
                p = pads4(a.get("pads", [0, 0, 0, 0]))
                assert p[0] == p[2] and p[1] == p[3], "asymmetric pads are not modelled"
                layer = nn.Conv2d(
                    x[0],
                    a["out_channels"],
                    tuple(a["kernel_size"]),
                    stride=tuple(a.get("strides", [1, 1])),
                    padding=(p[0], p[1]),
                    bias=a.get("bias", True),
                )
                self.layers[node["id"]] = layer
                out = self._conv_out(x, a, a["out_channels"])
            elif op == "max_pool2d":
                out = self._conv_out(x, a, x[0])
            elif op == "reshape":
                # Shapes after the batch axis: the examples reshape [N, 64] to [-1, 1, 8, 8].
                t = a["shape"]
                assert t[0] in (-1, 0) and all(v > 0 for v in t[1:]), t
                out = list(t[1:])
            elif op == "flatten":
                assert a.get("axis", 1) == 1
                out = [int(np.prod(x))]
            elif op in ("relu", "identity"):
                out = x
            elif op == "softmax_cross_entropy":
                out = []
            else:
                raise SystemExit(f"operator {op} is not modelled by make_fixtures.py")
            shapes[node["id"]] = out

    @staticmethod
    def _conv_out(x, a, channels):
        k = a["kernel_size"]
        s = a.get("strides", [1, 1])
        p = pads4(a.get("pads", [0, 0, 0, 0]))
        assert not a.get("ceil_mode", False)
        h = (x[1] + p[0] + p[2] - k[0]) // s[0] + 1
        w = (x[2] + p[1] + p[3] - k[1]) // s[1] + 1
        return [channels, h, w]

    def forward(self, feeds: dict, label_smoothing: float | None = None) -> dict:
        """All values by name; `label_smoothing`, when given, overrides the loss node's."""
        vals = dict(feeds)
        for node in self.graph["nodes"]:
            op, a = node["op"], node.get("attrs", {}) or {}
            ins = [vals[r] for r in node["inputs"]]
            nid = node["id"]
            if op in ("linear", "conv2d"):
                y = self.layers[nid](ins[0])
            elif op == "relu":
                y = F.relu(ins[0])
            elif op == "identity":
                y = ins[0]
            elif op == "max_pool2d":
                p = pads4(a.get("pads", [0, 0, 0, 0]))
                pool = lambda t: F.max_pool2d(
                    t,
                    tuple(a["kernel_size"]),
                    stride=tuple(a.get("strides", [1, 1])),
                    padding=(p[0], p[1]),
                    dilation=tuple(a.get("dilations", [1, 1])),
                )
                if self.last_max:
                    # Ties go to the last maximum instead of PyTorch's first (windows of
                    # the examples tile the input exactly, so flipping H and W is exact).
                    y = pool(ins[0].flip(2, 3)).flip(2, 3)
                else:
                    y = pool(ins[0])
            elif op == "reshape":
                y = ins[0].reshape([ins[0].shape[0]] + list(a["shape"][1:]))
            elif op == "flatten":
                y = torch.flatten(ins[0], 1)
            elif op == "softmax_cross_entropy":
                if label_smoothing is None:
                    label_smoothing = a.get("label_smoothing") or 0.0
                y = F.cross_entropy(
                    ins[0],
                    ins[1].long(),
                    reduction=a.get("reduction", "mean"),
                    label_smoothing=label_smoothing,
                )
            else:
                raise AssertionError(op)
            vals[nid] = y
        return vals


# ---------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------


def sluice_params(model: GraphModel, tensors: dict | None = None) -> dict:
    """Parameters (or same-keyed tensors such as gradients) as Sluice keys -> f32 numpy
    arrays in Sluice layout."""
    out = {}
    for lid, layer in model.layers.items():
        for pname, p in layer.named_parameters():
            key = f"{lid}.{pname}"
            t = p if tensors is None else tensors[key]
            a = t.detach().cpu().numpy().astype(np.float64)
            if isinstance(layer, nn.Linear) and pname == "weight":
                a = a.T  # torch [out, in] -> Sluice [in, out]
            out[key] = np.ascontiguousarray(a.astype(np.float32))
    return out


def named(model: GraphModel) -> dict:
    return {
        f"{lid}.{pname}": p
        for lid, layer in model.layers.items()
        for pname, p in layer.named_parameters()
    }


# ---------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------


def data():
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int32)
    return [(x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH]) for i in (0, 1)]


def feeds(batch, dtype=torch.float64):
    x, y = batch
    return {"x": torch.from_numpy(x).to(dtype), "labels": torch.from_numpy(y).long()}


def fresh(graph: dict) -> GraphModel:
    torch.manual_seed(SEED)
    return GraphModel(graph)


def train(graph, init_state, batches, make_opt, dtype=torch.float64):
    model = GraphModel(graph).to(dtype)
    model.load_state_dict(init_state)
    opt = make_opt(model.parameters())
    for b in batches:
        opt.zero_grad(set_to_none=True)
        loss = model(feeds(b, dtype))["loss"]
        loss.backward()
        opt.step()
    return model


def by_hand(graph, init_state, batches, rule):
    """The optimiser update written out as the manifest states it (float64), to check that
    the manifest's rule is exactly what torch.optim did."""
    model = GraphModel(graph).double()
    model.load_state_dict(init_state)
    state = {}
    for t, b in enumerate(batches, start=1):
        model.zero_grad(set_to_none=True)
        model(feeds(b))["loss"].backward()
        with torch.no_grad():
            for k, p in named(model).items():
                g, st = p.grad.clone(), state.setdefault(k, {})
                if rule == "sgd":
                    p -= SGD["lr"] * g
                elif rule == "sgd_nesterov":
                    h = SGD_NESTEROV
                    g += h["weight_decay"] * p
                    st["b"] = g.clone() if t == 1 else h["momentum"] * st["b"] + g
                    p -= h["lr"] * (g + h["momentum"] * st["b"])
                elif rule == "adamw":
                    h = ADAMW
                    (b1, b2) = h["betas"]
                    p *= 1 - h["lr"] * h["weight_decay"]
                    st["m"] = b1 * st.get("m", 0) + (1 - b1) * g
                    st["v"] = b2 * st.get("v", 0) + (1 - b2) * g * g
                    mhat = st["m"] / (1 - b1**t)
                    vhat = st["v"] / (1 - b2**t)
                    p -= h["lr"] * mhat / (vhat.sqrt() + h["eps"])
    return model


def float32_diffs(graph, init_state32, batches, saved) -> dict:
    model = GraphModel(graph)
    model.load_state_dict(init_state32)
    vals = model(feeds(batches[0], torch.float32))
    vals["loss"].backward()
    got = {
        "logits0.npy": vals["logits"].detach().numpy(),
        "loss0.npy": vals["loss"].detach().numpy(),
        "loss0_smooth.npy": model(feeds(batches[0], torch.float32), label_smoothing=LABEL_SMOOTHING)["loss"]
        .detach()
        .numpy(),
    }
    for k, g in sluice_params(model, {k: p.grad for k, p in named(model).items()}).items():
        got[f"grad.{k}.npy"] = g
    f32 = torch.float32
    got["sgd.safetensors"] = sluice_params(
        train(graph, init_state32, batches[:1], lambda ps: torch.optim.SGD(ps, **SGD), f32))
    got["sgd_nesterov.safetensors"] = sluice_params(
        train(graph, init_state32, batches, lambda ps: torch.optim.SGD(ps, **SGD_NESTEROV), f32))
    got["adamw.safetensors"] = sluice_params(
        train(graph, init_state32, batches, lambda ps: torch.optim.AdamW(ps, **ADAMW), f32))
    out = {}
    for fname, g in got.items():
        want = saved[fname]
        pairs = [(g[k], want[k]) for k in want] if isinstance(want, dict) else [(g, want)]
        err = max(float(np.max(np.abs(np.float64(a) - np.float64(b)))) for a, b in pairs)
        scale = max(float(np.max(np.abs(np.float64(b)))) for _, b in pairs)
        out[fname] = {"max_abs": float(f"{err:.3g}"), "max_abs_over_max": float(f"{err / scale:.3g}")}
    return out


def make(name: str, out_dir: Path) -> dict:
    graph = json.loads((ROOT / "assets/graphs" / f"{name}.json").read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    batches = data()

    model = fresh(graph)  # float32 default init, exactly as PyTorch makes it
    init = sluice_params(model)
    init_state32 = {k: v.clone() for k, v in model.state_dict().items()}
    model = model.double()
    init_state = {k: v.clone() for k, v in model.state_dict().items()}

    files = {}
    saved = {}

    def save_st(fname, tensors, what):
        saved[fname] = tensors
        safetensors.numpy.save_file(tensors, str(out_dir / fname), metadata={"what": what})
        files[fname] = {"what": what, "tensors": {k: list(v.shape) for k, v in sorted(tensors.items())}}

    def save_npy(fname, arr, what):
        arr = np.asarray(arr)
        saved[fname] = arr
        np.save(out_dir / fname, arr)
        files[fname] = {"what": what, "shape": list(arr.shape), "dtype": str(arr.dtype)}

    save_st("init.safetensors", init,
            f"initial weights: torch.manual_seed({SEED}), PyTorch default init (U(±1/sqrt(fan_in)) "
            "for weights and biases), layers created in graph node order; Sluice keys and layouts, f32")
    for i, (x, y) in enumerate(batches):
        lo = i * BATCH
        save_npy(f"x{i}.npy", x, f"batch {i}: load_digits samples {lo}..{lo + BATCH}, features / 16, f32 [32, 64]")
        save_npy(f"labels{i}.npy", y, f"batch {i}: load_digits labels of samples {lo}..{lo + BATCH}, i32 [32]")

    # Loss, logits and gradients on batch 0.
    model.zero_grad(set_to_none=True)
    vals = model(feeds(batches[0]))
    vals["loss"].backward()
    grads = {k: p.grad for k, p in named(model).items()}
    save_npy("logits0.npy", vals["logits"].detach().numpy().astype(np.float32),
             "output 'logits' on batch 0 with the initial weights, f32 [32, 10]")
    save_npy("loss0.npy", np.float32(vals["loss"].item()),
             "output 'loss' (softmax_cross_entropy, reduction mean, label_smoothing 0) on batch 0, f32 []")
    for k, g in sluice_params(model, grads).items():
        save_npy(f"grad.{k}.npy", g, f"d loss0 / d {k} on batch 0, Sluice layout, f32")
    # Tied maxima in a pooling window: PyTorch sends the gradient to the first one. Check
    # that sending it to the last one instead gives the same gradients, so the fixtures do
    # not depend on that choice.
    model.last_max = True
    model.zero_grad(set_to_none=True)
    model(feeds(batches[0]))["loss"].backward()
    tie_diff = max(float((p.grad - grads[k]).abs().max()) for k, p in named(model).items())
    model.last_max = False
    assert tie_diff < 1e-12, f"{name}: gradients depend on max_pool2d tie-breaking ({tie_diff})"
    with torch.no_grad():
        smooth = model(feeds(batches[0]), label_smoothing=LABEL_SMOOTHING)["loss"].item()
    save_npy("loss0_smooth.npy", np.float32(smooth),
             f"loss on batch 0 with label_smoothing {LABEL_SMOOTHING} (PyTorch semantics: "
             "(1-e)*CE + e*mean_c(-log p_c)), reduction mean, f32 []")

    # Optimiser steps, each from the initial weights.
    def agree(m, rule, steps):
        ref = named(by_hand(graph, init_state, batches[:steps], rule))
        diff = max(float((p - ref[k]).abs().max()) for k, p in named(m).items())
        assert diff < 1e-12, f"{name}: torch.optim and the manifest's {rule} rule differ by {diff}"
        return m

    m = agree(train(graph, init_state, batches[:1], lambda ps: torch.optim.SGD(ps, **SGD)), "sgd", 1)
    save_st("sgd.safetensors", sluice_params(m), f"weights after 1 SGD step {SGD} on batch 0")
    m = agree(train(graph, init_state, batches, lambda ps: torch.optim.SGD(ps, **SGD_NESTEROV)),
              "sgd_nesterov", 2)
    save_st("sgd_nesterov.safetensors", sluice_params(m),
            f"weights after 2 SGD steps {SGD_NESTEROV} on batch 0 then batch 1")
    m = agree(train(graph, init_state, batches, lambda ps: torch.optim.AdamW(ps, **ADAMW)), "adamw", 2)
    save_st("adamw.safetensors", sluice_params(m),
            f"weights after 2 AdamW steps {dict(ADAMW, betas=list(ADAMW['betas']))} on batch 0 then batch 1")

    # The same computation in float32 (as the engine does it), against the float64
    # fixtures: a hint for the tolerances a float32 training step can be held to.
    f32 = float32_diffs(graph, init_state32, batches, saved)

    manifest = {
        "graph": f"assets/graphs/{name}.json",
        "generator": "tests/data/training/make_fixtures.py",
        "versions": {
            "torch": torch.__version__,
            "numpy": np.__version__,
            "scikit-learn": sklearn.__version__,
            "safetensors": safetensors.__version__,
            "python": platform.python_version(),
        },
        "precision": "computed in float64 (model and data cast to double), saved as float32",
        "layouts": {
            "linear.weight": "[in, out] (PyTorch's nn.Linear weight transposed)",
            "conv2d.weight": "[out, in/groups, kh, kw] (as PyTorch)",
            "bias": "[out]",
        },
        "init": {
            "seed": f"torch.manual_seed({SEED})",
            "rule": "PyTorch default: weight and bias uniform in ±1/sqrt(fan_in)",
            "creation_order": list(model.layers.keys()),
        },
        "data": {
            "source": "sklearn.datasets.load_digits (8x8 images, 1797 samples)",
            "x": "data / 16 as float32, [32, 64] per batch (row-major 8x8 image)",
            "labels": "target as int32, [32] per batch",
            "batch0": [0, BATCH],
            "batch1": [BATCH, 2 * BATCH],
        },
        **({"max_pool2d_ties": "gradients checked to be the same (max difference "
                               f"{tie_diff:.1e}) whether a tied maximum takes the gradient first or last"}
           if any(n["op"] == "max_pool2d" for n in graph["nodes"]) else {}),
        "loss": {"op": "softmax_cross_entropy", "reduction": "mean", "label_smoothing": 0.0,
                 "smooth_fixture_label_smoothing": LABEL_SMOOTHING},
        "optimisers": {
            "note": "each rule below was re-computed by hand (float64) and matched torch.optim",
            "sgd": dict(SGD, steps=1, batches=[0],
                        rule="p -= lr * g"),
            "sgd_nesterov": dict(SGD_NESTEROV, dampening=0.0, steps=2, batches=[0, 1],
                                 rule="g += wd*p; b = g on step 1, else b = momentum*b + g; "
                                      "p -= lr * (g + momentum*b)  (torch.optim.SGD)"),
            "adamw": dict(ADAMW, betas=list(ADAMW["betas"]), amsgrad=False, steps=2, batches=[0, 1],
                          rule="p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; "
                               "p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)  (torch.optim.AdamW)"),
        },
        "float32_vs_fixtures": {
            "what": "the same steps run by PyTorch in float32, against these float64-made files: "
                    "max |f32 - fixture| over all elements, and that divided by the largest "
                    "|fixture| element (per file, over all its tensors); a float32 engine should "
                    "land within a small multiple of these",
            **f32,
        },
        "values": {"loss0": float(np.float32(vals["loss"].item())), "loss0_smooth": float(np.float32(smooth))},
        "files": files,
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


# ---------------------------------------------------------------------------------------
# Re-load and check
# ---------------------------------------------------------------------------------------


def expected_shapes(graph: dict) -> dict:
    model = GraphModel(graph)
    return {k: list(v.shape) for k, v in sluice_params(model).items()}


def check(name: str, out_dir: Path) -> list:
    graph = json.loads((ROOT / "assets/graphs" / f"{name}.json").read_text())
    manifest = json.loads((out_dir / "manifest.json").read_text())
    want = expected_shapes(graph)
    rows = []
    problems = []
    for fname, info in manifest["files"].items():
        path = out_dir / fname
        if fname.endswith(".safetensors"):
            ts = safetensors.numpy.load_file(str(path))
            if sorted(ts) != sorted(want):
                problems.append(f"{fname}: keys {sorted(ts)} != {sorted(want)}")
            for k, v in sorted(ts.items()):
                if list(v.shape) != want.get(k) or v.dtype != np.float32:
                    problems.append(f"{fname}:{k}: {v.dtype} {list(v.shape)}, want f32 {want.get(k)}")
                if not np.all(np.isfinite(v)):
                    problems.append(f"{fname}:{k}: not finite")
                rows.append((f"{fname}:{k}", v))
        else:
            v = np.load(path)
            if list(v.shape) != info["shape"]:
                problems.append(f"{fname}: shape {list(v.shape)}, manifest says {info['shape']}")
            if fname.startswith("grad."):
                key = fname[len("grad."):-len(".npy")]
                if list(v.shape) != want.get(key) or v.dtype != np.float32:
                    problems.append(f"{fname}: {v.dtype} {list(v.shape)}, want f32 {want.get(key)}")
            elif fname.startswith("x"):
                ok = v.shape == (BATCH, 64) and v.dtype == np.float32 and v.min() >= 0 and v.max() <= 1
                ok or problems.append(f"{fname}: {v.dtype} {v.shape} range [{v.min()}, {v.max()}]")
            elif fname.startswith("labels"):
                ok = v.shape == (BATCH,) and v.dtype == np.int32 and v.min() >= 0 and v.max() <= 9
                ok or problems.append(f"{fname}: {v.dtype} {v.shape}")
            elif fname.startswith("loss"):
                ok = v.shape == () and v.dtype == np.float32 and np.isfinite(v)
                ok or problems.append(f"{fname}: {v.dtype} {v.shape} {v}")
            rows.append((fname, v))

    # Identities between files: one plain SGD step is init - lr * grad.
    init = safetensors.numpy.load_file(str(out_dir / "init.safetensors"))
    sgd = safetensors.numpy.load_file(str(out_dir / "sgd.safetensors"))
    for k in want:
        g = np.load(out_dir / f"grad.{k}.npy").astype(np.float64)
        step = init[k].astype(np.float64) - SGD["lr"] * g
        err = np.max(np.abs(step - sgd[k]))
        if err > 1e-6:
            problems.append(f"sgd.safetensors:{k}: init - lr*grad is off by {err}")
    # The logits give the loss back (float32 log-softmax).
    logits = np.load(out_dir / "logits0.npy").astype(np.float64)
    labels = np.load(out_dir / "labels0.npy")
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    ce = np.mean(lse - logits[np.arange(len(labels)), labels])
    if abs(ce - float(np.load(out_dir / "loss0.npy"))) > 1e-5:
        problems.append(f"loss0.npy disagrees with logits0.npy: {ce}")
    smooth = np.mean((1 - LABEL_SMOOTHING) * (lse - logits[np.arange(len(labels)), labels])
                     + LABEL_SMOOTHING * (lse - logits.mean(1)))
    if abs(smooth - float(np.load(out_dir / "loss0_smooth.npy"))) > 1e-5:
        problems.append(f"loss0_smooth.npy disagrees with logits0.npy: {smooth}")
    # The last layer's bias gradient is mean(softmax - onehot): it sums to zero.
    last = [k for k in want if k.endswith(".bias")][-1]
    total = float(np.load(out_dir / f"grad.{last}.npy").astype(np.float64).sum())
    if abs(total) > 1e-6:
        problems.append(f"grad.{last}.npy sums to {total}, not 0")
    if problems:
        raise SystemExit(f"{name}: " + "\n  ".join(["fixtures failed their checks:"] + problems))
    return rows


def table(name: str, rows: list):
    print(f"\n{name}")
    print(f"  {'file[:key]':<40} {'dtype':<8} {'shape':<16} first values")
    for fname, v in rows:
        flat = np.asarray(v).reshape(-1)[:4]
        vals = ", ".join(f"{t:.6g}" if np.issubdtype(flat.dtype, np.floating) else str(t) for t in flat)
        print(f"  {fname:<40} {str(v.dtype):<8} {str(list(v.shape)):<16} {vals}")


# ---------------------------------------------------------------------------------------
# Batch norm in training mode (tests/data/training/digits_bn/graph.json)
# ---------------------------------------------------------------------------------------

BN_BATCH = 16
BN_SGD = dict(lr=0.1, momentum=0.9)


class BnModel(nn.Module):
    """digits_bn/graph.json by hand: conv2d(1→4, 3x3, pad 1) → BatchNorm2d → relu → flatten
    → linear(256→16) → BatchNorm1d(eps 1e-3, momentum 0.3) → relu → linear(16→10)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.fc1 = nn.Linear(256, 16)
        self.bn2 = nn.BatchNorm1d(16, eps=1e-3, momentum=0.3)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x, labels):
        h = F.relu(self.bn1(self.conv1(x.reshape(-1, 1, 8, 8))))
        h = F.relu(self.bn2(self.fc1(torch.flatten(h, 1))))
        logits = self.fc2(h)
        return logits, F.cross_entropy(logits, labels)


BN_KEYS = {"weight": "scale", "bias": "bias", "running_mean": "mean", "running_var": "var"}


def bn_sluice(model: BnModel, grads: bool = False) -> dict:
    """Weights (or the gradients of the trainable ones) under Sluice keys and layouts."""
    out = {}
    for name, t in model.state_dict().items():
        layer, pname = name.split(".")
        if pname == "num_batches_tracked":
            continue
        if isinstance(getattr(model, layer), nn.BatchNorm1d | nn.BatchNorm2d):
            pname = BN_KEYS[pname]
        if grads:
            p = dict(model.named_parameters()).get(name)
            if p is None:
                continue  # running statistics: no gradient
            t = p.grad
        a = t.detach().double().numpy()
        if isinstance(getattr(model, layer), nn.Linear) and pname == "weight":
            a = a.T
        out[f"{layer}.{pname}"] = np.ascontiguousarray(a.astype(np.float32))
    return out


def make_bn(out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int32)
    batches = [(x[i * BN_BATCH:(i + 1) * BN_BATCH], y[i * BN_BATCH:(i + 1) * BN_BATCH]) for i in (0, 1)]
    torch.manual_seed(SEED)
    model = BnModel()
    files = {}

    def save(fname, value, what):
        if isinstance(value, dict):
            safetensors.numpy.save_file(value, str(out_dir / fname), metadata={"what": what})
            files[fname] = {"what": what, "tensors": {k: list(v.shape) for k, v in sorted(value.items())}}
        else:
            value = np.asarray(value)
            np.save(out_dir / fname, value)
            files[fname] = {"what": what, "shape": list(value.shape), "dtype": str(value.dtype)}

    save("init.safetensors", bn_sluice(model),
         f"initial weights: torch.manual_seed({SEED}), PyTorch default init, layers in graph order; "
         "batch norms: scale 1, bias 0, running mean 0, running var 1")
    for i, (bx, by) in enumerate(batches):
        lo = i * BN_BATCH
        save(f"x{i}.npy", bx, f"batch {i}: load_digits samples {lo}..{lo + BN_BATCH}, features / 16, f32 [16, 64]")
        save(f"labels{i}.npy", by, f"batch {i}: their labels, i32 [16]")
    model = model.double().train()
    opt = torch.optim.SGD(model.parameters(), **BN_SGD)
    losses = []
    for i, (bx, by) in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        _, loss = model(torch.from_numpy(bx).double(), torch.from_numpy(by).long())
        loss.backward()
        losses.append(loss.item())
        if i == 0:
            for k, g in bn_sluice(model, grads=True).items():
                save(f"grad.{k}.npy", g, f"d loss0 / d {k} on batch 0 (train mode: batch statistics), f32")
        opt.step()
        if i == 0:
            save("step1.safetensors", bn_sluice(model),
                 f"after 1 SGD step {BN_SGD} on batch 0 in train mode: weights and running statistics")
        save(f"loss{i}.npy", np.float32(losses[-1]), f"train-mode loss of step {i + 1} (batch {i}), f32 []")
    save("step2.safetensors", bn_sluice(model),
         f"after 2 SGD steps {BN_SGD} on batch 0 then batch 1: weights and running statistics")
    model.eval()
    with torch.no_grad():
        logits, _ = model(torch.from_numpy(batches[0][0]).double(), torch.from_numpy(batches[0][1]).long())
    save("eval_logits0.npy", logits.numpy().astype(np.float32),
         "eval-mode logits (running statistics) on batch 0 after the 2 steps, f32 [16, 10]")
    manifest = {
        "graph": "tests/data/training/digits_bn/graph.json",
        "generator": "tests/data/training/make_fixtures.py (make_bn)",
        "versions": {"torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version()},
        "precision": "computed in float64 (model and data cast to double), saved as float32",
        "batch_norm": "PyTorch train mode: normalised with the batch mean and biased variance; running = "
                      "(1 - momentum) * running + momentum * batch statistic, the variance unbiased (n / (n - 1))",
        "optimizer": dict(BN_SGD, kind="sgd", steps=2, batches=[0, 1]),
        "values": {"loss0": losses[0], "loss1": losses[1]},
        "files": files,
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def check_bn(out_dir: Path) -> list:
    manifest = json.loads((out_dir / "manifest.json").read_text())
    init = safetensors.numpy.load_file(str(out_dir / "init.safetensors"))
    rows = []
    problems = []
    for fname in manifest["files"]:
        if fname.endswith(".safetensors"):
            for k, v in sorted(safetensors.numpy.load_file(str(out_dir / fname)).items()):
                if v.shape != init[k].shape or v.dtype != np.float32 or not np.all(np.isfinite(v)):
                    problems.append(f"{fname}:{k}: {v.dtype} {v.shape}")
                rows.append((f"{fname}:{k}", v))
        else:
            rows.append((fname, np.load(out_dir / fname)))
    # After one momentum-SGD step from a fresh buffer, w = init - lr * grad.
    step1 = safetensors.numpy.load_file(str(out_dir / "step1.safetensors"))
    for k in init:
        g = out_dir / f"grad.{k}.npy"
        if g.exists():
            err = np.max(np.abs(init[k] - BN_SGD["lr"] * np.load(g).astype(np.float64) - step1[k]))
            if err > 1e-6:
                problems.append(f"step1.safetensors:{k}: init - lr*grad is off by {err}")
        elif not k.endswith((".mean", ".var")):
            problems.append(f"{k}: no gradient")
    if problems:
        raise SystemExit("digits_bn: " + "\n  ".join(["fixtures failed their checks:"] + problems))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE, help="folder for <graph>/ (default: beside this script)")
    ap.add_argument("--check-only", action="store_true", help="only re-load and check the files already there")
    ap.add_argument("--only", choices=GRAPHS + ["digits_bn"], help="make (or check) one set of fixtures")
    args = ap.parse_args()
    torch.set_num_threads(1)  # the same reduction order every time
    for name in GRAPHS:
        if args.only not in (None, name):
            continue
        out_dir = args.out / name
        if not args.check_only:
            make(name, out_dir)
        table(name, check(name, out_dir))
    if args.only in (None, "digits_bn"):
        out_dir = args.out / "digits_bn"
        if not args.check_only:
            make_bn(out_dir)
        table("digits_bn", check_bn(out_dir))
    print(f"\nall fixtures checked (torch {torch.__version__}, python {platform.python_version()}, {sys.platform})")


if __name__ == "__main__":
    main()
