"""What every export target reads: the samples of an h5batch output, decoded, as the reader
yields them, plus the encoders that turn an audio or image sample back into a file.

Rule: samples come from :class:`h5batch.torch.H5Dataset` (``as_float=False``: the stored
int16/float32 audio and uint8 pixels, encoded fields decoded with their recorded settings,
text as ``str``), read in runs of consecutive samples; never from the datasets directly.
Reason: the reader is the one place that knows which rows are live (rows ``h5batch sync``
tombstoned are skipped), how an encoded field decodes and how text is stored, so an export
holds exactly what a training script would see. The file row of each sample is the one the
reader itself maps its index to.

An encoded field (``store: encoded``) is decoded and encoded again, never copied as its
stored bytes: its ``decode`` settings (a resize, a resample, a length) may make the reader's
array differ from the stored file, and the export must hold the reader's array.

What can be exported is checked before anything is written (:meth:`SampleReader.check_exportable`):
audio needs a known sample rate and samples, not log-mel features; a field of an unknown kind
cannot be exported. A sample that does not fit its encoder (a transform that made a 3-D
"audio" array) raises :class:`ExportError` naming the field and the row.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import format as fmt
from ..errors import EXIT_BAD_INPUT, H5batchError

#: the kinds written as a file per sample, and the file's extension
FILE_EXT = {"audio": "wav", "image": "png"}
#: the kinds written as metadata (JSON, CSV cells)
DATA_KINDS = ("text", "value", "multilabel")
READ_RUN = 64  # samples read per reader call: one call per run, not per sample


class ExportError(H5batchError, ValueError):
    """An output that cannot be exported as asked (a field a target cannot write, a target
    folder that is not empty, an unknown target or split)."""

    exit_code = EXIT_BAD_INPUT


@dataclass(frozen=True)
class FieldSpec:
    """What an exporter needs to know about one field (read from its attributes)."""

    name: str
    modality: str
    sample_rate: int = 0  # audio
    names: tuple[str, ...] = ()  # value columns / multilabel targets
    categories: tuple[str, ...] = ()  # value dtype category
    features: bool = False  # audio stored as log-mel features

    @property
    def is_file(self) -> bool:
        return self.modality in FILE_EXT

    @property
    def ext(self) -> str:
        return FILE_EXT[self.modality]


@dataclass
class Sample:
    """One live sample of a split.

    ``row`` is its row in the file (stable across syncs: tombstoning never moves a row).
    ``data`` maps each field to a numpy array (audio, image, value, multilabel) or a ``str``
    (text). ``label`` is the integer label (None when the split is unlabelled or the sample
    has label -1) and ``class_name`` its name.
    """

    split: str
    row: int
    label: int | None
    class_name: str | None
    sources: tuple[str, ...]
    data: dict[str, Any] = field(default_factory=dict)


class SampleReader:
    """The splits, fields and live samples of one complete h5batch output.

    Parameters
    ----------
    path : str or PathLike
        A complete h5batch file.
    fields : sequence of str, optional
        Fields to export, in this order; default every field.
    """

    def __init__(self, path: str | os.PathLike[str], fields: Sequence[str] | None = None):
        from ..shards import check
        from ..tools.index import check_complete, open_file

        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise ExportError(f"{self.path}: no such file")
        with open_file(self.path) as f:
            if f.attrs.get(fmt.ATTR_FORMAT) not in (*fmt.READABLE_FORMATS, fmt.SHARDED_FORMAT):
                raise ExportError(f"{self.path}: not an h5batch output (root attribute {fmt.ATTR_FORMAT} "
                                  f"is {f.attrs.get(fmt.ATTR_FORMAT)!r})")
            check_complete(f, self.path)
            check(self.path, f)  # a sharded output's shards: there, unchanged (read below)
            self.splits: tuple[str, ...] = tuple(json.loads(f.attrs[fmt.ATTR_SPLITS]))
            stored = json.loads(f.attrs[fmt.ATTR_FIELDS])
            wanted = list(stored if fields is None else fields)
            unknown = [n for n in wanted if n not in stored]
            if unknown or not wanted or len(set(wanted)) != len(wanted):
                raise ExportError(f"{self.path}: bad fields {wanted!r} (fields: {', '.join(stored)})")
            self.class_names: tuple[str, ...] = (
                tuple(f[fmt.CLASS_NAMES].asstr()[...]) if fmt.CLASS_NAMES in f else ())
            first = next((s for s in self.splits if s in f), None)
            self.fields: tuple[FieldSpec, ...] = tuple(
                _spec(f[first][n], n) if first else FieldSpec(n, "") for n in wanted)
            self.job_hash = str(f.attrs.get(fmt.ATTR_JOB_HASH, ""))
            self.manifest_hash = str(f.attrs.get(fmt.ATTR_MANIFEST_HASH, ""))
            self.file_fields = {s: _file_fields(f[s]) for s in self.splits if s in f}
            self.labelled = {s: fmt.LABEL in f[s] for s in self.splits if s in f}

    # ----------------------------------------------------------------- checks

    def select_splits(self, splits: Sequence[str] | None) -> tuple[str, ...]:
        """The splits asked for (default all), each checked to exist."""
        chosen = tuple(self.splits if not splits else splits)
        missing = [s for s in chosen if s not in self.splits]
        if missing:
            raise ExportError(f"{self.path}: no split {missing[0]!r} (splits: {', '.join(self.splits)})")
        return chosen

    def check_exportable(self, target: str) -> None:
        """Refuse, naming the field, any field ``target`` cannot write."""
        for fs in self.fields:
            why = None
            if fs.modality == "audio" and fs.features:
                why = "it stores log-mel features, not audio samples (no WAV file can hold them)"
            elif fs.modality == "audio" and fs.sample_rate <= 0:
                why = ("its sample rate is unknown (the job kept each file's own rate, which the "
                       "output does not record): set fields.<name>.sample_rate when converting")
            elif not fs.is_file and fs.modality not in DATA_KINDS:
                why = f"its kind {fs.modality or '(none)'!r} has no export format"
            if why:
                raise ExportError(f"{self.path}: field {fs.name!r} cannot be exported to {target}: {why}; "
                                  f"leave it out with --fields")

    # ---------------------------------------------------------------- reading

    def samples(self, split: str) -> Iterator[Sample]:
        """Every live sample of ``split``, in file order."""
        from ..torch import H5Dataset

        names = [fs.name for fs in self.fields]
        with_source = bool(self.file_fields.get(split))
        ds = H5Dataset(self.path, split, fields=names, as_float=False, with_source=with_source,
                       recycle=False, shared_memory=False)
        rows = ds._check(np.arange(len(ds)))  # the file row of every sample the reader yields
        with ds:
            for start in range(0, len(ds), READ_RUN):
                batch = ds.__getitems__(list(range(start, min(start + READ_RUN, len(ds)))))
                for j in range(len(batch)):
                    yield self._sample(split, int(rows[start + j]), batch.sample(j))

    def _sample(self, split: str, row: int, s: dict[str, Any]) -> Sample:
        label = int(s["label"]) if "label" in s else None
        if label is not None and label < 0:
            label = None
        src = s.get("source")
        sources = () if src is None else (src,) if isinstance(src, str) else tuple(src)
        data = {fs.name: (s[fs.name] if isinstance(s[fs.name], str) else s[fs.name].numpy())
                for fs in self.fields}
        name = self.class_names[label] if label is not None and label < len(self.class_names) else None
        return Sample(split, row, label, name, sources, data)

    def first_source(self, split: str, sample: Sample) -> str | None:
        """The source path of the sample's first file field that is exported, else its first."""
        files = self.file_fields.get(split, [])
        for fs in self.fields:
            if fs.name in files and files.index(fs.name) < len(sample.sources):
                return sample.sources[files.index(fs.name)]
        return sample.sources[0] if sample.sources else None

    def identity(self) -> dict[str, Any]:
        """What names this exact file: path, size, mtime, job and corpus hashes."""
        st = os.stat(self.path)
        return {"path": os.path.abspath(self.path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                "job_hash": self.job_hash, "manifest_hash": self.manifest_hash}


def _spec(node: Any, name: str) -> FieldSpec:
    a = node.attrs
    modality = str(a.get("modality", ""))

    def names(key: str) -> tuple[str, ...]:
        v = a.get(key)
        if v is None:
            return ()
        v = json.loads(v) if isinstance(v, str) else [x.decode() if isinstance(x, bytes) else str(x) for x in v]
        return tuple(str(x) for x in v)

    return FieldSpec(name, modality, int(a.get("sample_rate", 0) or 0), names("names"),
                     names("categories"), "features" in a)


def _file_fields(g: Any) -> list[str]:
    """The fields whose files ``/<split>/source`` names, in its column order."""
    if fmt.SOURCE not in g:
        return []
    raw = g[fmt.SOURCE].attrs.get("fields")
    return list(json.loads(raw)) if raw else []


# ------------------------------------------------------------------- encoders


def wav_bytes(fs: FieldSpec, a: np.ndarray, row: int) -> bytes:
    """A WAV file of one audio sample at the field's rate: 16-bit PCM for int16 (exact),
    32-bit float for float32. ``(T,)`` is mono, ``(T, C)`` C channels."""
    import soundfile as sf

    subtype = {np.dtype(np.int16): "PCM_16", np.dtype(np.float32): "FLOAT"}.get(a.dtype)
    if subtype is None or a.ndim not in (1, 2):
        raise ExportError(f"field {fs.name!r}, row {row}: a {a.dtype} array of shape {a.shape} is not "
                          "audio a WAV file can hold (int16 or float32, (T,) or (T, C))")
    if a.dtype == np.int16:
        return _pcm16_wav(a, fs.sample_rate)
    buf = io.BytesIO()
    sf.write(buf, a, fs.sample_rate, subtype=subtype, format="WAV")
    return buf.getvalue()


def _pcm16_wav(a: np.ndarray, rate: int) -> bytes:
    """A canonical 44-byte-header PCM WAV of int16 samples: what libsndfile writes for
    ``PCM_16``, without its per-call overhead, which cost more than the rest of the export."""
    channels = 1 if a.ndim == 1 else a.shape[1]
    data = np.ascontiguousarray(a, dtype="<i2").tobytes()
    header = struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", 36 + len(data), b"WAVE", b"fmt ", 16, 1, channels,
                         rate, rate * channels * 2, channels * 2, 16, b"data", len(data))
    return header + data


def png_bytes(fs: FieldSpec, a: np.ndarray, row: int) -> bytes:
    """A PNG file of one ``(H, W, C)`` uint8 image (C = 1, 3 or 4): lossless."""
    from PIL import Image

    if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] not in (1, 3, 4):
        raise ExportError(f"field {fs.name!r}, row {row}: a {a.dtype} array of shape {a.shape} is not "
                          "an image a PNG file can hold ((H, W, 1|3|4) uint8)")
    im = Image.fromarray(np.ascontiguousarray(a[:, :, 0] if a.shape[2] == 1 else a))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def encode(fs: FieldSpec, a: np.ndarray, row: int) -> bytes:
    """The file bytes of one audio (WAV) or image (PNG) sample."""
    return wav_bytes(fs, a, row) if fs.modality == "audio" else png_bytes(fs, a, row)


def data_value(fs: FieldSpec, v: Any) -> Any:
    """A text / value / multilabel sample as JSON data: the string; the number (the category
    name for ``dtype: category``); ``{name: value}`` for a field of several columns or
    targets (multilabel 0/1)."""
    if isinstance(v, str):
        return v
    a = np.asarray(v)
    if fs.categories and a.ndim == 0:
        code = int(a)
        return fs.categories[code] if 0 <= code < len(fs.categories) else code
    values = _plain(a)
    if a.ndim == 1 and fs.names and len(fs.names) == a.shape[0]:
        return dict(zip(fs.names, values))
    return values


def _plain(a: np.ndarray) -> Any:
    """``a.tolist()``, float32 values as the shortest decimal that reads back to the same
    float32 (``0.05``, not ``0.05000000074505806``)."""
    if a.dtype != np.float32:
        return a.tolist()
    flat = [float(str(x)) for x in a.reshape(-1)]
    return flat[0] if a.ndim == 0 else np.asarray(flat).reshape(a.shape).tolist()


def metadata(reader: SampleReader, s: Sample) -> dict[str, Any]:
    """The JSON metadata of a sample: its split, file row, class name, source path(s) and
    every text / value / multilabel field."""
    out: dict[str, Any] = {"split": s.split, "row": s.row, "label": s.class_name,
                           "source": s.sources[0] if len(s.sources) == 1 else list(s.sources)}
    for fs in reader.fields:
        if not fs.is_file:
            out[fs.name] = data_value(fs, s.data[fs.name])
    return out


_UNSAFE = re.compile(r"[^A-Za-z0-9_\-]+")


def safe_name(text: str) -> str:
    """``text`` with every run of characters other than letters, digits, ``_`` and ``-``
    replaced by ``_``: no dot (WebDataset cuts keys at the first one), no slash, never
    hidden (no leading dot)."""
    return _UNSAFE.sub("_", text) or "_"
