"""The HDF5 layout of a split: one dataset per fixed-shape field, a ``values`` +
``offsets`` + ``shapes`` group per variable-shape field, and the per-sample ``source``,
``checksum`` and ``label`` datasets, with their attributes (docs/FORMAT.md)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import h5py
import numpy as np

from .. import format as fmt
from ..codecs import CodecSpec, make_encoder, self_check
from ..fields import (
    FieldConfig,
    field_attrs,
    file_fields,
    fixed_sample_shape,
    is_fixed_shape,
    rows_per_chunk,
)
from ..fields.audio import TrueLength
from ..fields.base import settings
from .append import ChunkAppender, SmallAppender, small_dataset
from .messages import WriterSpec

STR = h5py.string_dtype("utf-8")


def small_rows(default: int, rows: int) -> int:
    """Chunk rows of a per-sample dataset: ``default``, or fewer where the split holds fewer
    samples (0: unknown), at least 64 so that a sync's rows do not each cost a chunk."""
    return max(64, min(default, rows)) if rows else default


class FieldStore:
    """Storage of one field in one split: fixed ``(N, *shape)`` or variable
    (``values`` flat + ``offsets`` (N+1,) + ``shapes`` (N, ndim))."""

    def __init__(self, group: h5py.Group, name: str, fc: FieldConfig, spec: WriterSpec, pool: ThreadPoolExecutor,
                 tail: np.ndarray | None = None, rows: int = 0):
        self.group, self.name, self.fc, self.spec, self.pool = group, name, fc, spec, pool
        self.rows = rows  # samples the split will hold (0: unknown); chunks are no bigger than they need
        self.fixed = is_fixed_shape(fc)
        self.data: ChunkAppender | None = None
        self.offsets: SmallAppender | None = None
        self.shapes: SmallAppender | None = None
        self.shape: tuple[int, ...] | None = None
        self.dtype: np.dtype | None = None
        self.end = 0  # variable: element offset after the last sample
        if name in group:
            self._open_existing(tail)

    @property
    def codec(self) -> CodecSpec:
        return self.spec.codecs[self.name]

    def _appender(self, ds: h5py.Dataset, tail: np.ndarray | None = None) -> ChunkAppender:
        encoder = make_encoder(self.codec, ds.dtype) if self_check(self.codec, ds.dtype.str) else None
        return ChunkAppender(ds, encoder, self.pool, tail=tail, raw=self.codec.name == "none")

    def _open_existing(self, tail: np.ndarray | None = None) -> None:
        node = self.group[self.name]
        if self.fixed:
            self.shape, self.dtype = node.shape[1:], node.dtype
            self.data = self._appender(node, tail)
        else:
            values = node[fmt.VALUES]
            self.dtype = values.dtype
            self.data = self._appender(values, tail)
            self.offsets = SmallAppender(node[fmt.OFFSETS])
            self.shapes = SmallAppender(node[fmt.SHAPES])
            self.end = int(node[fmt.OFFSETS][-1])

    def _create(self, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.dtype = np.dtype(dtype)
        kw = self.codec.dataset_kwargs(self.dtype.itemsize)
        # modality, then the kind's own (h5batch.fields)
        attrs: dict[str, Any] = {"codec": self.codec.label(), "config": fmt.dumps(settings(self.fc)), **field_attrs(self.fc)}
        if self.spec.codec_notes.get(self.name):
            attrs["codec_choice"] = self.spec.codec_notes[self.name]
        if self.fixed:
            self.shape = shape
            if isinstance(self.fc, TrueLength):  # chunked as its audio field: samplers group rows by chunk
                shape_of, dtype_of = fixed_sample_shape(dict(self.spec.fields)[self.fc.of])
                k = rows_per_chunk(shape_of, dtype_of, self.spec.chunk_bytes)
            else:
                k = rows_per_chunk(shape, self.dtype, self.spec.chunk_bytes)
            k = min(k, self.rows) if self.rows else k
            ds = self.group.create_dataset(self.name, shape=(0, *shape), maxshape=(None, *shape),
                                           dtype=self.dtype, chunks=(k, *shape), **kw)
            ds.attrs["kind"] = fmt.KIND_FIXED
            ds.attrs.update(attrs)
            self.data = self._appender(ds)
        else:
            g = self.group.create_group(self.name)
            g.attrs["kind"] = fmt.KIND_VARIABLE
            g.attrs["ndim"] = len(shape)
            g.attrs.update(attrs)
            k = max(1024, self.spec.chunk_bytes // self.dtype.itemsize)
            need = self.rows * self.spec.field_bytes.get(self.name, 0) // self.dtype.itemsize
            if need:  # the trial's estimate of the split's elements, + 1/8 for its error
                k = min(k, max(1024, -(-(need + need // 8) // 1024) * 1024))
            values = g.create_dataset(fmt.VALUES, shape=(0,), maxshape=(None,), dtype=self.dtype, chunks=(k,), **kw)
            offs = small_dataset(g, fmt.OFFSETS, (), np.int64, small_rows(8192, self.rows + 1))
            offs.resize(1, axis=0)
            offs[0] = 0
            self.data = self._appender(values)
            self.offsets = SmallAppender(offs)
            self.shapes = SmallAppender(small_dataset(g, fmt.SHAPES, (len(shape),), np.int64, small_rows(4096, self.rows)))

    def check(self, sample: np.ndarray) -> str | None:
        """Why ``sample`` cannot be stored in this field (None when it can)."""
        if self.dtype is not None and sample.dtype != self.dtype:
            return f"dtype {sample.dtype} differs from the field's {self.dtype}"
        if self.fixed and self.shape is not None and tuple(sample.shape) != tuple(self.shape):
            return f"shape {tuple(sample.shape)} differs from the field's {tuple(self.shape)}"
        return None

    def append(self, samples: list[np.ndarray], flat: np.ndarray | None) -> None:
        """Append samples (all passed :meth:`check`). ``flat`` is their bytes back to back
        when every sample is kept (saves a concatenation)."""
        if not samples:
            return
        if self.data is None:
            self._create(samples[0].dtype, tuple(samples[0].shape))
        assert self.data is not None and self.dtype is not None
        if self.fixed:
            rows = flat.view(self.dtype).reshape(len(samples), *self.shape) if flat is not None else np.stack(samples)
            self.data.append(rows)
            return
        values = flat.view(self.dtype) if flat is not None else np.concatenate([s.reshape(-1) for s in samples])
        sizes = np.fromiter((s.size for s in samples), dtype=np.int64, count=len(samples))
        self.data.append(values)
        self.offsets.append(self.end + np.cumsum(sizes))
        self.end += int(sizes.sum())
        self.shapes.append(np.asarray([s.shape for s in samples], dtype=np.int64))

    def checkpoint(self) -> tuple[int, np.ndarray | None]:
        """(rows of the data dataset in the file, rows held back in the tail)."""
        if self.data is None:
            return 0, None
        tail = self.data.checkpoint()
        return self.data.rows_in_file, tail

    def finish(self) -> None:
        if self.data is not None:
            self.data.finish()

    @staticmethod
    def truncate(node: h5py.Dataset | h5py.Group, n: int, rows_in_file: int) -> None:
        """Cut a field back to its first ``n`` samples, keeping ``rows_in_file`` data rows
        (the rest of the last committed chunk comes from the commit's tail file)."""
        if isinstance(node, h5py.Dataset):
            node.resize(rows_in_file, axis=0)
        else:
            node[fmt.OFFSETS].resize(n + 1, axis=0)
            node[fmt.SHAPES].resize(n, axis=0)
            node[fmt.VALUES].resize(rows_in_file, axis=0)


class SplitStore:
    """All datasets of one split."""

    def __init__(self, f: h5py.File, split: str, spec: WriterSpec, pool: ThreadPoolExecutor,
                 tails: dict[str, np.ndarray] | None = None):
        self.group = f.require_group(split)
        self.names = [n for n, _ in spec.fields]
        tails = tails or {}
        rows = spec.split_rows.get(split, 0)
        self.fields = {n: FieldStore(self.group, n, fc, spec, pool, tails.get(f"{split}/{n}"), rows)
                       for n, fc in spec.fields}
        # One source path per field of files; fields of annotation values have none.
        files = file_fields(dict(spec.fields))
        nf, ns = len(spec.fields), len(files)
        self.source = SmallAppender(small_dataset(self.group, fmt.SOURCE, (ns,) if ns > 1 else (), STR,
                                                  small_rows(1024, rows)))
        self.checksum = SmallAppender(small_dataset(self.group, fmt.CHECKSUM, (nf,), np.uint32, small_rows(8192, rows)))
        self.source.ds.attrs["fields"] = fmt.dumps(files)
        self.checksum.ds.attrs["fields"] = fmt.dumps(self.names)
        self.checksum.ds.attrs["algorithm"] = "crc32"
        self.label = (SmallAppender(small_dataset(self.group, fmt.LABEL, (), np.int64, small_rows(8192, rows)))
                      if spec.labelled else None)
        self.n = self.source.n

    def checkpoint(self) -> dict[str, tuple[int, np.ndarray | None]]:
        self.group.attrs[fmt.ATTR_NUM_SAMPLES] = self.n
        return {name: fs.checkpoint() for name, fs in self.fields.items()}

    def finish(self) -> None:
        for fs in self.fields.values():
            fs.finish()
        self.group.attrs[fmt.ATTR_NUM_SAMPLES] = self.n
