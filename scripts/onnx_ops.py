#!/usr/bin/env python3
"""Survey ONNX files: size, opsets, inputs/outputs, op types with counts (nodes inside
If/Loop/Scan subgraphs included) and the distinct attribute sets of each op type.

    python scripts/onnx_ops.py MODEL.onnx...            # text
    python scripts/onnx_ops.py --json MODEL.onnx...     # one JSON object per file
    python scripts/onnx_ops.py --union MODEL.onnx...    # plus the op-type union

Needs only onnx and numpy.
"""

from __future__ import annotations

import argparse
import collections
import json
import os

import numpy as np
import onnx
import onnx.numpy_helper as nph


def _attr(a):
    if a.type == onnx.AttributeProto.GRAPH:
        return "<graph>"
    if a.type == onnx.AttributeProto.GRAPHS:
        return "<graphs>"
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, onnx.TensorProto):
        arr = nph.to_array(v)
        if arr.size <= 8:
            return {"tensor": arr.tolist(), "dtype": arr.dtype.name}
        return {"tensor_shape": list(arr.shape), "dtype": arr.dtype.name}
    if isinstance(v, (list, tuple)):
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    if isinstance(v, float):
        return float(np.float32(v))
    return v


def survey(path: str) -> dict:
    m = onnx.load(path)
    counts = collections.Counter()
    attrs = collections.defaultdict(list)

    def walk(g):
        for n in g.node:
            key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
            counts[key] += 1
            d = {a.name: _attr(a) for a in n.attribute}
            if key != "Constant" and d and d not in attrs[key]:
                attrs[key].append(d)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sg in a.graphs:
                        walk(sg)

    walk(m.graph)
    inits = {t.name for t in m.graph.initializer}

    def vi(v):
        t = v.type.tensor_type
        dt = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else "?"
        return {"name": v.name, "dtype": dt,
                "shape": [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]}

    return {
        "file": path,
        "bytes": os.path.getsize(path),
        "ir_version": m.ir_version,
        "opset": {(o.domain or "ai.onnx"): o.version for o in m.opset_import},
        "producer": f"{m.producer_name} {m.producer_version}".strip(),
        "parameters": int(sum(int(np.prod(t.dims)) for t in m.graph.initializer)),
        "inputs": [vi(v) for v in m.graph.input if v.name not in inits],
        "outputs": [vi(v) for v in m.graph.output],
        "op_types": dict(sorted(counts.items())),
        "op_attributes": {k: attrs[k] for k in sorted(attrs)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--union", action="store_true")
    args = ap.parse_args()
    union = collections.Counter()
    for p in args.models:
        s = survey(p)
        union.update(s["op_types"])
        if args.json:
            print(json.dumps(s))
            continue
        print(f"{p}: {s['bytes']} bytes, IR {s['ir_version']}, opset {s['opset']}, "
              f"{s['producer']}, {s['parameters']} parameters")
        for io in ("inputs", "outputs"):
            print(f"  {io}: " + ", ".join(f"{v['name']} {v['dtype']}{v['shape']}" for v in s[io]))
        print("  ops: " + ", ".join(f"{k} {v}" for k, v in s["op_types"].items()))
        for k, v in s["op_attributes"].items():
            print(f"    {k}: " + "; ".join(json.dumps(a, sort_keys=True) for a in v))
    if args.union:
        print("union: " + ", ".join(sorted(union)))


if __name__ == "__main__":
    main()
