"""Run an ONNX model in onnxruntime on .npy inputs and write its outputs as .npy files.

    python scripts/onnx_run.py MODEL.onnx OUT_DIR NAME=INPUT.npy ...

Writes OUT_DIR/output_K.npy for the model's K-th output (graph output order). Inputs are
cast to the dtype the model declares (so int32 arrays feed int64 inputs). The oracle the
export tests compare Sluice against: CPU provider, graph optimisations off, one thread.
"""
import sys

import numpy as np
import onnxruntime as ort

TYPES = {
    "tensor(float)": np.float32,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(bool)": np.bool_,
}


def main():
    model, out_dir, *pairs = sys.argv[1:]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    declared = {i.name: i.type for i in session.get_inputs()}
    feeds = {}
    for pair in pairs:
        name, path = pair.split("=", 1)
        if name not in declared:
            sys.exit(f"the model has no input '{name}' (it has {sorted(declared)})")
        feeds[name] = np.load(path).astype(TYPES.get(declared[name], np.float32))
    for k, value in enumerate(session.run(None, feeds)):
        np.save(f"{out_dir}/output_{k}.npy", value)


if __name__ == "__main__":
    main()
