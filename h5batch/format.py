"""Names and small helpers of the on-disk format (documented in docs/FORMAT.md).

Kept in one place so the writer, the reader, ``inspect`` and ``verify`` agree.
"""

from __future__ import annotations

import json
import math
from typing import Any

FORMAT_VERSION = 1  # a file without encoded fields; 2 with one (h5batch.fields.format_version)
READABLE_FORMATS = (1, 2)  # what the reader, inspect and verify accept
# An output joined from shard files (output.writers > 1, h5batch/shards.py); each shard is
# itself a file of a version above. The readers that know shards accept it too.
SHARDED_FORMAT = 3

# Root attributes
ATTR_FORMAT = "h5batch_format"
ATTR_JOB = "job"
ATTR_JOB_HASH = "job_hash"
ATTR_MANIFEST_HASH = "manifest_hash"
ATTR_VERSIONS = "versions"
ATTR_CREATED = "created"
ATTR_SPLITS = "splits"
ATTR_FIELDS = "fields"
ATTR_COMPLETE = "complete"
ATTR_INPUTS = "num_inputs"  # files discovered (samples x files per sample + rejects)
ATTR_ANNOTATIONS = "annotations"  # annotation files read (tables, split lists), root-relative
ATTR_SHARDS = "shards"  # a sharded output: JSON list of its shard files (h5batch/shards.py)
ATTR_SHARD = "shard"  # a shard file: JSON {"index", "of", "host"}
STAGE_EXCLUDED = "excluded"  # the reject stage of files set aside by source.exclude (not failures)

PARTIAL_SUFFIX = ".partial"  # X.h5 is written as X.h5.partial, renamed when finished

CLASS_NAMES = "class_names"
REJECTS = "rejects"  # group with path / stage / reason string datasets

# Per split
LABEL = "label"
SOURCE = "source"
CHECKSUM = "checksum"
ATTR_NUM_SAMPLES = "num_samples"
VIEWS = "views"  # group of named row subsets: /<split>/views/<name> (N_view,) int64, sorted unique
# Rows that `h5batch sync` removed (their file was removed or changed): (T,) int64, sorted,
# unique. Readers skip them; the rows stay in the file so that row numbers never move.
TOMBSTONES = "tombstones"

# Variable-length field group members
VALUES = "values"
OFFSETS = "offsets"
SHAPES = "shapes"

KIND_FIXED = "fixed"
KIND_VARIABLE = "variable"

RESERVED = {LABEL, SOURCE, CHECKSUM, VIEWS, TOMBSTONES}


def dumps(obj: Any) -> str:
    """JSON for attributes (sorted keys, so the same job gives the same bytes)."""
    return json.dumps(obj, sort_keys=True)


def next_prime(n: int) -> int:
    """Smallest prime >= n (for ``rdcc_nslots``, which HDF5 wants prime)."""
    while n < 2 or any(n % d == 0 for d in range(2, math.isqrt(n) + 1)):
        n += 1
    return n


def cache_settings(chunk_bytes: int, smallest_chunk: int, cache_bytes: int | None = None) -> dict[str, Any]:
    """h5py ``File`` keyword arguments for a chunk cache holding several chunks.

    ``rdcc_nbytes`` defaults to 4 chunks (a chunk larger than the cache bypasses it and is
    re-read on every access, h5py#2526); ``rdcc_nslots`` is a prime ~100x the number of
    chunks that fit; ``rdcc_w0=1`` evicts fully read/written chunks first, which suits
    append-only writing and streaming reads.
    """
    nbytes = cache_bytes if cache_bytes else max(4 * chunk_bytes, 4 << 20)
    slots = next_prime(max(521, 100 * (nbytes // max(smallest_chunk, 1))))
    return {"rdcc_nbytes": int(nbytes), "rdcc_nslots": int(min(slots, 1_000_003)), "rdcc_w0": 1.0}


def chunk_table(dsid: Any, k: int, n_rows: int) -> tuple[Any, Any, Any]:
    """Every written chunk of a dataset chunked by ``k`` rows along axis 0 (``dsid``: its
    h5py ``DatasetID``), by block ``row // k`` for the first ``n_rows`` rows: three int64
    arrays, the file offset (-1: not written), the stored bytes and the filter mask.

    One ``chunk_iter`` call lists the whole index. Reason: HDF5 2.0's
    ``get_chunk_info_by_coord`` walks the index, so a lookup per chunk costs more the more
    chunks there are and looking each one up is quadratic; one listing is linear. Raises
    what h5py raises where it has no ``chunk_iter`` (HDF5 before 1.14) or HDF5 refuses;
    callers fall back to lookups."""
    import numpy as np

    n_blocks = -(-n_rows // k)
    offsets = np.full(n_blocks, -1, dtype=np.int64)
    sizes = np.zeros(n_blocks, dtype=np.int64)
    masks = np.zeros(n_blocks, dtype=np.int64)

    def put(info: Any) -> None:
        b = info.chunk_offset[0] // k
        if b < n_blocks and info.byte_offset is not None:
            offsets[b], sizes[b], masks[b] = info.byte_offset, info.size, info.filter_mask

    dsid.chunk_iter(put)
    return offsets, sizes, masks


def rejects_file(final_path: str) -> str:
    """The rejects list written beside an output: ``out/x.h5`` -> ``out/x.rejects.jsonl``."""
    return final_path.rsplit(".", 1)[0] + ".rejects.jsonl"


def warnings_file(final_path: str) -> str:
    """The decoder warnings log beside an output: ``out/x.h5`` -> ``out/x.warnings.txt``
    (one line per file whose decoder warned: ``path<TAB>messages``)."""
    return final_path.rsplit(".", 1)[0] + ".warnings.txt"


def write_rejects(path: str, rejects: Any) -> None:
    """One JSON object per reject (``path``, ``stage``, ``reason``) per line."""
    with open(path, "w") as fh:
        for r in rejects:
            fh.write(json.dumps({"path": r.path, "stage": r.stage, "reason": r.reason}) + "\n")


def rejects_words(rejects: int, excluded: int) -> str:
    """The one way every command counts inputs that are not samples: ``rejects`` (failures,
    without the excluded) and ``excluded`` (``source.exclude``, unlisted, ``--limit``)."""
    return f"{rejects} rejects" + (f", {excluded} excluded" if excluded else "")
