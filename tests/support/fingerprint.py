"""Fingerprints of h5batch outputs: every dataset's dtype, shape, chunks, filters and a
sha256 of its values, and every object's attributes, keyed by HDF5 path (tests only).

``python -m tests.support.fingerprint OUT.h5 > tests/golden/NAME.json`` records one; the identity
test converts the job again and compares. Left out, as they change from run to run: the
root's ``created``, ``versions`` and ``job`` (the job's text; ``job_hash`` stays)."""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import h5py
import hdf5plugin  # noqa: F401  (plugin filters for reading)
import numpy as np

VOLATILE_ROOT_ATTRS = {"created", "versions", "job"}


def _plain(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, bytes):
        return v.decode()
    return v


def fingerprint(path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with h5py.File(path, "r") as f:
        out["/"] = {"attrs": {k: _plain(v) for k, v in sorted(f.attrs.items()) if k not in VOLATILE_ROOT_ATTRS}}

        def visit(name: str, obj: Any) -> None:
            entry: dict[str, Any] = {"attrs": {k: _plain(v) for k, v in sorted(obj.attrs.items())}}
            if isinstance(obj, h5py.Dataset):
                if obj.dtype.kind == "O":
                    values = json.dumps([str(s) for s in obj.asstr()[...].reshape(-1)]).encode()
                else:
                    values = np.ascontiguousarray(obj[...]).tobytes()
                dcpl = obj.id.get_create_plist()
                entry.update(dtype=str(obj.dtype), shape=list(obj.shape), chunks=list(obj.chunks or ()),
                             filters=[json.loads(json.dumps(dcpl.get_filter(i)[:3])) for i in range(dcpl.get_nfilters())],
                             sha256=hashlib.sha256(values).hexdigest())
            out[name] = entry

        f.visititems(visit)
    return out


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between two fingerprints, one line per object."""
    lines = [f"{k}: only in the first" for k in sorted(set(a) - set(b))]
    lines += [f"{k}: only in the second" for k in sorted(set(b) - set(a))]
    for k in sorted(set(a) & set(b)):
        for key in sorted(set(a[k]) | set(b[k])):
            if a[k].get(key) != b[k].get(key):
                lines.append(f"{k}: {key}: {a[k].get(key)!r} != {b[k].get(key)!r}")
    return lines


if __name__ == "__main__":
    json.dump(fingerprint(sys.argv[1]), sys.stdout, indent=1, sort_keys=True)
    print()
