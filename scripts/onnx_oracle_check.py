#!/usr/bin/env python3
"""Re-run onnxruntime over ONNX fixtures and compare with their stored outputs.

For each folder under the given roots (default tests/data/onnx-models) that holds a
model.onnx: feeds input_K.npy to onnxruntime (CPU, graph optimizations off, one thread,
as the fixture scripts do) and compares with output_K.npy. Needs only onnxruntime, onnx
and numpy (scripts/python-oracle.sh makes such a venv):

    "$(scripts/python-oracle.sh --python)" scripts/onnx_oracle_check.py [DIR...]

Exits non-zero when any fixture disagrees beyond --atol/--rtol or fails to run.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

import numpy as np
import onnxruntime as ort


def session(path: str) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def check(folder: str, atol: float, rtol: float) -> str | None:
    model = os.path.join(folder, "model.onnx")
    ins = sorted(glob.glob(os.path.join(folder, "input_*.npy")),
                 key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]))
    sess = session(model)
    names = [i.name for i in sess.get_inputs()]
    if len(ins) != len(names):
        return f"{len(ins)} input files for {len(names)} graph inputs"
    feeds = {n: np.load(p) for n, p in zip(names, ins)}
    outs = sess.run(None, feeds)
    for k, o in enumerate(outs):
        p = os.path.join(folder, f"output_{k}.npy")
        if not os.path.exists(p):
            return f"missing output_{k}.npy"
        want = np.load(p)
        if want.shape != o.shape or want.dtype != o.dtype:
            return f"output_{k}: {o.dtype}{list(o.shape)} != stored {want.dtype}{list(want.shape)}"
        if not np.allclose(o, want, atol=atol, rtol=rtol):
            return f"output_{k}: max |diff| {float(np.max(np.abs(o - want))):.3g}"
    return None


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="*",
                    default=[os.path.join(here, "..", "tests", "data", "onnx-models")])
    ap.add_argument("--atol", type=float, default=1e-5)
    ap.add_argument("--rtol", type=float, default=1e-5)
    args = ap.parse_args()
    folders = []
    for r in args.roots:
        for m in sorted(glob.glob(os.path.join(r, "**", "model.onnx"), recursive=True)):
            folders.append(os.path.dirname(m))
    passed = failed = 0
    for f in folders:
        try:
            err = check(f, args.atol, args.rtol)
        except Exception as e:  # noqa: BLE001 - report every failure, then exit non-zero
            err = f"{type(e).__name__}: {e}"
        name = os.path.relpath(f)
        if err:
            failed += 1
            print(f"FAIL {name}: {err}")
        else:
            passed += 1
            print(f"ok   {name}")
    print(f"onnx oracle check (onnxruntime {ort.__version__}): {passed} passed, {failed} failed")
    sys.exit(1 if failed or not folders else 0)


if __name__ == "__main__":
    main()
