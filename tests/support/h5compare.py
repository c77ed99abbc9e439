"""Comparing two h5batch outputs object by object (tests only)."""

from __future__ import annotations

from typing import Any

import h5py
import hdf5plugin  # noqa: F401  (plugin filters for reading)
import numpy as np

VOLATILE_ROOT_ATTRS = {"created", "versions", "job", "synced"}


def _attrs(obj) -> dict[str, Any]:
    out = {}
    for k, v in obj.attrs.items():
        out[k] = v.tolist() if isinstance(v, np.ndarray) else v
    return out


def h5_contents(path) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
    """``(datasets, attributes)`` of every object of a file, keyed by HDF5 path; the root's
    volatile attributes (created, versions, job) left out."""
    data: dict[str, np.ndarray] = {}
    attrs: dict[str, dict[str, Any]] = {}
    with h5py.File(path, "r") as f:
        attrs["/"] = {k: v for k, v in _attrs(f).items() if k not in VOLATILE_ROOT_ATTRS}

        def visit(name, obj):
            attrs[name] = _attrs(obj)
            if isinstance(obj, h5py.Dataset):
                data[name] = obj.asstr()[...] if obj.dtype.kind == "O" else obj[...]
                attrs[name]["__dtype__"] = str(obj.dtype)
                attrs[name]["__chunks__"] = obj.chunks
                attrs[name]["__compression__"] = obj.compression

        f.visititems(visit)
    return data, attrs


def assert_same_h5(a, b) -> None:
    """Two h5batch outputs hold the same datasets (names, dtypes, shapes, chunks, values)
    and the same attributes on every group and dataset, except the root's ``created``,
    ``versions`` and ``job``."""
    da, aa = h5_contents(a)
    db, ab = h5_contents(b)
    assert sorted(da) == sorted(db), f"datasets differ: only in one: {sorted(set(da) ^ set(db))}"
    for name in da:
        x, y = da[name], db[name]
        assert x.dtype == y.dtype and x.shape == y.shape, f"{name}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}"
        assert np.array_equal(x, y), f"{name}: values differ"
    assert sorted(aa) == sorted(ab), f"objects differ: {sorted(set(aa) ^ set(ab))}"
    for name in aa:
        assert aa[name] == ab[name], f"{name}: attributes differ: {aa[name]} vs {ab[name]}"


