"""Writes a ResNet-101-style ONNX model with a few hundred nodes and tiny weights.

The editor's browser tests import it to check that a large real architecture is laid out
readably and stays responsive. It has ResNet-101's topology (a stem, then bottleneck
blocks in stages of 3, 4, 23 and 3, each block conv-bn-relu x3 with a projection on the
first block of a stage, an add and a relu; global average pooling and a classifier) with
8 to 32 channels, so the file stays small. The weights are random (seed 0): the model is
for layout and editing, not accuracy.

Usage: python onnx_deep_resnet.py OUT.onnx  (needs onnx and numpy: the oracle venv has
both; scripts/python-oracle.sh --python prints its interpreter).
"""

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

STAGES = [(3, 8), (4, 16), (23, 24), (3, 32)]
rng = np.random.default_rng(0)
nodes, weights = [], []


def tensor(name, shape, scale=0.1):
    weights.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
    return name


def conv_bn(x, name, cin, cout, k, stride, relu):
    w = tensor(f"{name}.weight", (cout, cin, k, k), scale=(2.0 / (cin * k * k)) ** 0.5)
    nodes.append(helper.make_node("Conv", [x, w], [f"{name}.conv"], name=f"{name}/Conv",
                                  kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4))
    bn = [tensor(f"{name}.bn.{p}", (cout,)) for p in ("scale", "bias", "mean")]
    weights.append(numpy_helper.from_array(np.ones(cout, np.float32), f"{name}.bn.var"))
    nodes.append(helper.make_node("BatchNormalization", [f"{name}.conv", *bn, f"{name}.bn.var"],
                                  [f"{name}.bn"], name=f"{name}/BatchNormalization"))
    if not relu:
        return f"{name}.bn"
    nodes.append(helper.make_node("Relu", [f"{name}.bn"], [f"{name}.relu"], name=f"{name}/Relu"))
    return f"{name}.relu"


def main(out):
    x = conv_bn("image", "stem", 3, 8, 3, 1, True)
    nodes.append(helper.make_node("MaxPool", [x], ["stem.pool"], name="stem/MaxPool",
                                  kernel_shape=[2, 2], strides=[2, 2]))
    x, cin = "stem.pool", 8
    for s, (blocks, width) in enumerate(STAGES):
        for b in range(blocks):
            name = f"layer{s + 1}.{b}"
            stride = 2 if b == 0 and s > 0 else 1
            y = conv_bn(x, f"{name}.a", cin, width, 1, 1, True)
            y = conv_bn(y, f"{name}.b", width, width, 3, stride, True)
            y = conv_bn(y, f"{name}.c", width, width, 1, 1, False)
            skip = x if b > 0 else conv_bn(x, f"{name}.down", cin, width, 1, stride, False)
            nodes.append(helper.make_node("Add", [y, skip], [f"{name}.add"], name=f"{name}/Add"))
            nodes.append(helper.make_node("Relu", [f"{name}.add"], [f"{name}.out"], name=f"{name}/Relu"))
            x, cin = f"{name}.out", width
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"], name="head/GlobalAveragePool"))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], name="head/Flatten"))
    w, bias = tensor("fc.weight", (10, cin)), tensor("fc.bias", (10,))
    nodes.append(helper.make_node("Gemm", ["flat", w, bias], ["logits"], name="head/Gemm", transB=1))
    graph = helper.make_graph(
        nodes, "deep_resnet",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, out)
    print(f"{out}: {len(nodes)} ONNX nodes")


if __name__ == "__main__":
    main(sys.argv[1])
