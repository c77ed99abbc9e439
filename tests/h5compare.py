"""Comparing two h5batch outputs dataset by dataset (tests only)."""

from __future__ import annotations

import h5py
import hdf5plugin  # noqa: F401  (plugin filters for reading)
import numpy as np

VOLATILE_ATTRS = {"created", "versions", "job"}


def datasets(path) -> dict[str, np.ndarray]:
    """Every dataset of a file as an array (strings decoded)."""
    out: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                data = obj[...]
                if obj.dtype.kind == "O":
                    data = obj.asstr()[...]
                out[name] = data
        f.visititems(visit)
    return out


def root_attrs(path) -> dict:
    with h5py.File(path, "r") as f:
        return {k: v for k, v in f.attrs.items() if k not in VOLATILE_ATTRS}


def assert_same_h5(a, b) -> None:
    """Same datasets with the same values and dtypes, and the same content attributes."""
    da, db = datasets(a), datasets(b)
    assert sorted(da) == sorted(db), f"dataset names differ: {sorted(set(da) ^ set(db))}"
    for name in da:
        assert da[name].dtype == db[name].dtype, name
        assert da[name].shape == db[name].shape, name
        assert np.array_equal(da[name], db[name]), f"{name} differs"
    assert root_attrs(a) == root_attrs(b)
