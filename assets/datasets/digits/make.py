#!/usr/bin/env python3
"""Writes features.npy and labels.npy next to this script from scikit-learn's copy of
the UCI "Optical Recognition of Handwritten Digits" test set (1,797 8x8 images).

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install scikit-learn numpy
    /tmp/venv/bin/python assets/datasets/digits/make.py

The data ships inside scikit-learn (sklearn/datasets/data/digits.csv.gz): nothing is
downloaded. The .npy headers are written here rather than by np.save, so the bytes do
not depend on numpy's version: running the script again gives identical files (their
SHA-256 sums are in README.md, and the script prints them).
"""

import hashlib
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

HERE = Path(__file__).resolve().parent


def npy_bytes(array: np.ndarray, descr: str) -> bytes:
    """A C-order array as .npy format 1.0 bytes, header padded to 64 bytes as numpy does."""
    shape = "(" + ", ".join(str(d) for d in array.shape) + ("," if array.ndim == 1 else "") + ")"
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    total = -(-(10 + len(header) + 1) // 64) * 64
    header = header + " " * (total - 10 - len(header) - 1) + "\n"
    data = np.ascontiguousarray(array, dtype=np.dtype(descr)).tobytes(order="C")
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode("latin1") + data


def main() -> None:
    digits = load_digits()
    pixels = digits.data  # float64, integers 0..16
    labels = digits.target
    assert pixels.shape == (1797, 64) and labels.shape == (1797,)
    assert np.array_equal(pixels, np.round(pixels)) and pixels.min() == 0 and pixels.max() == 16
    assert set(labels.tolist()) == set(range(10))
    # k/16 for integers k in 0..16 is exact in float32.
    features = (pixels / 16.0).astype("<f4")
    files = {
        "features.npy": npy_bytes(features, "<f4"),
        "labels.npy": npy_bytes(labels.astype("<i4"), "<i4"),
    }
    for name, data in files.items():
        path = HERE / name
        path.write_bytes(data)
        back = np.load(path)
        assert back.shape == (features if name == "features.npy" else labels).shape
        print(f"{hashlib.sha256(data).hexdigest()}  {name}")


if __name__ == "__main__":
    main()
