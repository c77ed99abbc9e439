"""``to_dataset(path)``: an h5batch output as a Hugging Face ``datasets.Dataset`` (one split)
or ``DatasetDict`` (every split), with features that say what each column is.

Why not ``load_dataset("hdf5", ...)``: that loader (datasets 5.2) reads a file as one table
whose columns must have equal lengths, so it refuses an h5batch file (``ArrowInvalid``,
tests/test_hf.py), and would return offsets, undecoded fields and tombstoned rows.

Rule: the rows are what :class:`h5batch.torch.H5Dataset` yields (live rows, decoded, text as
``str``; :mod:`h5batch.export.samples`), read in runs of 64, each run one Arrow table
appended with ``datasets``' ``ArrowWriter``, the file memory-mapped by ``Dataset.from_file``:
the .h5 is never loaded whole. Not ``Dataset.from_generator``: it converts row by row, far
slower (docs/interop.md). The Arrow file is named by a hash of the output's identity (path,
size, mtime, job and corpus hashes) and the arguments, so a changed output is never served
stale; it is written under a temporary name and renamed. ``streaming=True`` returns an
``IterableDataset`` of the rows of the same tables instead: no cache, nothing written.

Features, per column:

=============  ============================================================================
label          ``ClassLabel(names=class_names)`` (labelled splits; -1 = no label)
audio field    struct ``{"array": List(Value(int16|float32)), "sampling_rate": int32}``;
               ``(T, C)`` is ``List(List(Value, length=C))``. Not ``datasets.Audio``: it
               needs ``torchcodec`` and FFmpeg even to store WAV bytes
image field    ``Image()`` holding PNG bytes (``(H, W, 1)`` comes back as mode ``L``)
text field     ``Value("string")``
value field    ``Value(dtype)``; ``ClassLabel(names=categories)`` for ``dtype: category``;
               K columns: struct ``{name: Value(dtype)}``
multilabel     struct ``{name: Value("uint8")}`` (0/1 per target)
source         ``Value("string")`` (``List(Value("string"))`` for several files)
=============  ============================================================================

Needs ``datasets`` and the reader (``h5batch[torch]``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .export.samples import READ_RUN, ExportError, FieldSpec, SampleReader, png_bytes

__all__ = ["features", "to_dataset"]

BRIDGE_VERSION = 1  # part of the cache key: bump when the rows or features change


def features(reader: SampleReader, split: str, as_float: bool = False, probe: dict[str, Any] | None = None) -> Any:
    """The ``datasets.Features`` of ``split``'s rows. ``probe`` is one sample's data (the
    dtype and rank of audio and values come from it)."""
    import datasets as hf

    cols = {fs.name: _feature(hf, fs, None if probe is None else probe.get(fs.name), as_float)
            for fs in reader.fields}
    if reader.labelled.get(split):
        cols["label"] = hf.ClassLabel(names=list(reader.class_names))
    if reader.file_fields.get(split):
        n = len(reader.file_fields[split])
        cols["source"] = hf.Value("string") if n == 1 else hf.List(hf.Value("string"))
    return hf.Features(cols)


def _feature(hf: Any, fs: FieldSpec, sample: Any, as_float: bool) -> Any:
    a = None if sample is None or isinstance(sample, str) else np.asarray(sample)
    if fs.modality == "audio":
        dtype = "float32" if as_float or a is None or a.dtype != np.int16 else "int16"
        frame = hf.Value(dtype) if a is None or a.ndim == 1 else hf.List(hf.Value(dtype), length=a.shape[1])
        return {"array": hf.List(frame), "sampling_rate": hf.Value("int32")}
    if fs.modality == "image":
        return hf.Image()
    if fs.modality == "text":
        return hf.Value("string")
    if fs.modality == "multilabel":
        return {n: hf.Value("uint8") for n in fs.names}
    if fs.modality == "value":
        dtype = "int64" if a is None else str(a.dtype)
        if fs.categories and (a is None or a.ndim == 0):
            return hf.ClassLabel(names=list(fs.categories))
        if fs.names and a is not None and a.ndim == 1:
            return {n: hf.Value(dtype) for n in fs.names}
        return hf.Value(dtype)
    raise ExportError(f"field {fs.name!r} (kind {fs.modality!r}) has no datasets feature")


# ------------------------------------------------------------------ Arrow columns


def _table(reader: SampleReader, split: str, feats: Any, run: list[Any], as_float: bool) -> Any:
    """One Arrow table of a run of samples, each column built from numpy in one call."""
    import pyarrow as pa

    schema = feats.arrow_schema
    arrays = []
    for name in feats:
        t = schema.field(name).type
        if name == "label":
            arrays.append(pa.array([-1 if s.label is None else s.label for s in run], pa.int64()))
        elif name == "source":
            one = len(reader.file_fields[split]) == 1
            arrays.append(pa.array([s.sources[0] if one else list(s.sources) for s in run], t))
        else:
            fs = next(f for f in reader.fields if f.name == name)
            arrays.append(_column(fs, run, t, as_float))
    return pa.Table.from_arrays(arrays, schema=schema)


def _column(fs: FieldSpec, run: list[Any], t: Any, as_float: bool) -> Any:
    import pyarrow as pa

    if fs.modality == "audio":
        samples = [s.data[fs.name] for s in run]
        if as_float:  # int16 -> float32 x / 32768
            samples = [v.astype(np.float32) * np.float32(1 / 32768) if v.dtype == np.int16 else v for v in samples]
        frame_t = t.field("array").type.value_type
        flat = np.concatenate([a.reshape(-1) for a in samples]) if samples else np.zeros(0, np.int16)
        values = pa.array(flat, frame_t if not pa.types.is_fixed_size_list(frame_t) else frame_t.value_type)
        if pa.types.is_fixed_size_list(frame_t):
            values = pa.FixedSizeListArray.from_arrays(values, frame_t.list_size)
        offsets = np.concatenate([[0], np.cumsum([len(a) for a in samples])]).astype(np.int32)
        arrays = pa.ListArray.from_arrays(pa.array(offsets), values)
        rates = pa.array([fs.sample_rate] * len(run), pa.int32())
        return pa.StructArray.from_arrays([arrays, rates], names=["array", "sampling_rate"])
    if fs.modality == "image":
        png = pa.array([png_bytes(fs, s.data[fs.name], s.row) for s in run], pa.binary())
        return pa.StructArray.from_arrays([png, pa.nulls(len(run), pa.string())], names=["bytes", "path"])
    if fs.modality == "text":
        return pa.array([s.data[fs.name] for s in run], pa.string())
    stacked = np.stack([np.asarray(s.data[fs.name]) for s in run]) if run else np.zeros((0, len(fs.names)))
    if pa.types.is_struct(t):
        return pa.StructArray.from_arrays([pa.array(stacked[:, k], t.field(k).type) for k in range(t.num_fields)],
                                          names=[t.field(k).name for k in range(t.num_fields)])
    return pa.array(stacked.reshape(len(run)), t)


def _tables(reader: SampleReader, split: str, feats: Any, as_float: bool) -> Iterator[Any]:
    """The split's rows as Arrow tables of up to :data:`READ_RUN` samples; an empty split
    still gives one (empty) table, which carries the schema."""
    run: list[Any] = []
    whole = False
    for s in reader.samples(split):
        run.append(s)
        if len(run) == READ_RUN:
            yield _table(reader, split, feats, run, as_float)
            run, whole = [], True
    if run or not whole:
        yield _table(reader, split, feats, run, as_float)


def _write_split(reader: SampleReader, split: str, feats: Any, dest: str, as_float: bool) -> None:
    """The split's rows into the Arrow file ``dest`` (written beside it, then renamed)."""
    from datasets.arrow_writer import ArrowWriter

    tmp = f"{dest}.partial-{os.getpid()}"
    writer = ArrowWriter(features=feats, path=tmp)
    try:
        for table in _tables(reader, split, feats, as_float):
            writer.write_table(table)
        writer.finalize()
    finally:
        writer.close()
    os.replace(tmp, dest)


# --------------------------------------------------------------------- streaming


def _generate(path: str, split: str, fields: tuple[str, ...] | None, as_float: bool,
              feats: Any) -> Iterator[dict[str, Any]]:
    """The rows of one split, one at a time (``streaming=True``): the rows of the tables
    the Arrow file would hold."""
    reader = SampleReader(path, fields)
    for table in _tables(reader, split, feats, as_float):
        yield from table.to_pylist()


# ------------------------------------------------------------------------ public


def _fingerprint(reader: SampleReader, split: str, fields: Any, as_float: bool) -> str:
    ident = {"bridge": BRIDGE_VERSION, "file": reader.identity(), "split": split,
             "fields": None if fields is None else list(fields), "as_float": as_float}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]


def to_dataset(path: str | os.PathLike[str], split: str | None = None, *,
               fields: Sequence[str] | None = None, as_float: bool = False,
               cache_dir: str | os.PathLike[str] | None = None, streaming: bool = False) -> Any:
    """An h5batch output as a ``datasets.Dataset`` (``split`` given) or ``DatasetDict``.

    Parameters
    ----------
    path : str or PathLike
        A complete h5batch output.
    split : str, optional
        One split; default every split, as a ``DatasetDict`` in file order.
    fields : sequence of str, optional
        Fields to include (default all).
    as_float : bool
        int16 audio as float32 ``x / 32768``; default the stored int16. Images stay uint8.
    cache_dir : str or PathLike, optional
        Folder of the Arrow files; default the ``datasets`` cache (``HF_DATASETS_CACHE``).
        BEWARE: the Arrow copy is as large as the decoded samples, often several times the .h5.
    streaming : bool
        Return an ``IterableDataset`` (or ``IterableDatasetDict``): nothing written, no cache.

    Examples
    --------
    >>> ds = to_dataset("out/demo.h5", "train", cache_dir="/tmp/hf")  # doctest: +SKIP
    """
    if "://" in os.fspath(path):  # s3://: a whole local copy in the node cache (remote/local.py)
        from .remote.local import local_copy

        path = local_copy(os.fspath(path))
    import datasets as hf

    reader = SampleReader(path, fields)
    splits = reader.select_splits([split] if split is not None else None)
    path = os.path.abspath(reader.path)
    fields_t = None if fields is None else tuple(fields)
    folder = os.fspath(cache_dir) if cache_dir is not None else str(hf.config.HF_DATASETS_CACHE)
    built = {}
    for name in splits:
        feats = features(reader, name, as_float, next((s.data for s in reader.samples(name)), None))
        if streaming:
            kwargs = {"path": path, "split": name, "fields": fields_t, "as_float": as_float, "feats": feats}
            built[name] = hf.IterableDataset.from_generator(_generate, features=feats, gen_kwargs=kwargs,
                                                            split=hf.NamedSplit(name))
            continue
        os.makedirs(folder, exist_ok=True)
        dest = os.path.join(folder, f"h5batch-{_fingerprint(reader, name, fields_t, as_float)}-{name}.arrow")
        if not os.path.exists(dest):
            _write_split(reader, name, feats, dest, as_float)
        built[name] = hf.Dataset.from_file(dest, info=hf.DatasetInfo(features=feats), split=hf.NamedSplit(name))
    if split is not None:
        return built[split]
    return hf.IterableDatasetDict(built) if streaming else hf.DatasetDict(built)
