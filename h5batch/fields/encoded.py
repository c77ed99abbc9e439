"""``store: encoded``: a media field that keeps its file's bytes (or a transcode of them)
and is decoded by the reader, in the DataLoader workers, into the arrays decoded storage
would hold.

Rules, and why:

* The stored sample is a 1-D uint8 array, a variable-length field like any other
  (``values`` + ``offsets``, no HDF5 variable-length heap): the source file's bytes, or
  with ``transcode`` the re-encoded ones (:mod:`h5batch.fields.transcode`): much smaller
  than the pixels, for a decode per sample at read time.
* At conversion the file is still decoded once, with the field's settings: a file that
  does not decode is a reject, exactly as with decoded storage, so the reader never meets
  bytes that do not decode.
* The reader decodes with the kind's own decoder and the field's settings, recorded in the
  field's ``decode`` attribute (:func:`decode_settings`), so ``H5Dataset`` returns exactly
  what ``store: decoded`` would have stored. The decoders take paths and pick some decoders
  by extension, so the bytes go through a short-lived tmpfs file (``/dev/shm``) with the
  extension their content calls for (:func:`suffix_for`). BEWARE: a
  process killed (SIGKILL) in the middle of a decode leaves that one file
  (``/dev/shm/h5batch-decode-*``) behind.
* ``transform`` and ``features`` run on decoded arrays at conversion; with ``store:
  encoded`` there is none to run them on (use ``H5Dataset(transform=...)``), so the job is
  refused.
* A file with an encoded field is of format 2 (docs/FORMAT.md): an h5batch of format 1
  only would read the bytes as if they were pixels, so it must refuse the file instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError, DecodeError
from .files import open_checked, read_head

ENCODED = "encoded"
#: Settings about what is stored, not about how a file decodes: left out of ``decode``.
STORAGE_SETTINGS = ("store", "transcode", "transform", "features")
#: The format version of a file that has an encoded field.
FORMAT_VERSION = 2


def is_encoded(fc: Any) -> bool:
    """True when the field keeps encoded bytes (``store: encoded``)."""
    return getattr(fc, "store", "decoded") == ENCODED


def validate(fc: Any, file: str, key: str) -> None:
    """The common checks of ``store`` and ``transcode`` (ConfigError naming the key)."""
    if getattr(fc, "transcode", None) is not None and not is_encoded(fc):
        raise ConfigError(file, f"{key}.transcode", "needs store: encoded (decoded storage keeps arrays)")
    if not is_encoded(fc):
        return
    for name in ("transform", "features"):
        if getattr(fc, name, None):
            raise ConfigError(file, f"{key}.{name}", "runs on decoded arrays at conversion; with store: encoded "
                                                     "decode in the reader (H5Dataset(transform=...)) or use "
                                                     "store: decoded")


def stored_bytes(kind: Any, path: str, fc: Any) -> np.ndarray:
    """The stored sample of an encoded field: the file's bytes (or those of
    ``kind.transcode``), once they decoded as the reader will decode them (a
    :class:`~h5batch.errors.DecodeError` naming ``path`` for a bad file)."""
    transcoded = getattr(fc, "transcode", None) is not None
    if transcoded:
        data = kind.transcode(path, fc)
    else:
        with open_checked(path) as fh:
            data, _ = read_head(path, fh, -1)
    if transcoded or os.path.splitext(path)[1].lower() != suffix_for(data[:16]):
        try:
            decode_bytes(kind, fc, data)  # exactly as the reader will
        except DecodeError as e:
            raise DecodeError(path, e.reason) from None
    else:  # the same decoder the reader's file name selects: decode in place, no copy
        kind.decode(path, fc)
    return np.frombuffer(data, dtype=np.uint8)


def decode_settings(fc: Any) -> dict[str, Any]:
    """The field's settings the reader decodes with (``store: decoded``, no transcode)."""
    return {k: v for k, v in vars(fc).items() if k not in STORAGE_SETTINGS}


def attrs(fc: Any) -> dict[str, Any]:
    """Field attributes of an encoded field (docs/FORMAT.md): ``store``, ``encoded_format``
    (``source``: the file's own bytes; else the transcode format) and ``decode``."""
    t = getattr(fc, "transcode", None)
    return {"store": ENCODED, "encoded_format": "source" if t is None else str(t.format),
            "decode": json.dumps(decode_settings(fc), sort_keys=True)}


# ---------------------------------------------------------------------------------- reader


@dataclass(frozen=True)
class StoredDecoder:
    """The reader's decoder of one encoded field: its kind and the config it decodes with
    (picklable: DataLoader workers get a copy)."""

    kind: Any
    fc: Any

    def __call__(self, data: np.ndarray) -> np.ndarray:
        return self.kind.decode_stored(data, self.fc)

    @property
    def fixed(self) -> tuple[tuple[int, ...], np.dtype] | None:
        """Shape and dtype every decoded sample has, or None."""
        return self.kind.fixed_shape(self.fc)


def reader_config(kind: Any, attrs: Any) -> Any:
    """The config the reader decodes an encoded field with, from its ``decode`` attribute."""
    settings = json.loads(attrs["decode"])
    try:
        return kind.config_class(**settings)
    except TypeError as e:  # a setting this installation's kind does not have
        raise ValueError(f"encoded {kind.name} field with settings this h5batch does not know ({e}); "
                         f"upgrade h5batch") from None


# (magic at offset, bytes, extension): the file types h5batch's decoders tell apart.
_SUFFIXES = [
    (0, b"\xff\xd8\xff", ".jpg"), (0, b"\x89PNG", ".png"), (0, b"GIF8", ".gif"), (0, b"BM", ".bmp"),
    (0, b"II*\x00", ".tif"), (0, b"MM\x00*", ".tif"), (0, b"fLaC", ".flac"), (0, b"OggS", ".ogg"),
    (0, b"ID3", ".mp3"), (4, b"ftyp", ".m4a"), (0, b"\x1a\x45\xdf\xa3", ".webm"),
    (0, b"\x30\x26\xb2\x75\x8e\x66\xcf\x11", ".wma"), (8, b"AIFF", ".aiff"), (8, b"AIFC", ".aiff"),
]


def suffix_for(head: bytes) -> str:
    """The extension a file of these first bytes gets from the decoders ("" when unknown)."""
    if head[:4] == b"RIFF":
        return {b"WAVE": ".wav", b"WEBP": ".webp"}.get(bytes(head[8:12]), "")
    for at, magic, ext in _SUFFIXES:
        if head[at:at + len(magic)] == magic:
            return ext
    if len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:  # MPEG audio frame sync
        return ".mp3"
    return ""


def _scratch() -> str:
    """Where the decoders' short-lived files go: tmpfs when there is one."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


@contextlib.contextmanager
def bytes_path(data: np.ndarray | bytes) -> Iterator[str]:
    """A path whose content is ``data``, with the extension :func:`suffix_for` gives, for
    decoders that open paths; removed on exit."""
    buf = memoryview(data).cast("B") if isinstance(data, np.ndarray) else memoryview(data)
    suffix = suffix_for(bytes(buf[:16]))
    with tempfile.NamedTemporaryFile(prefix="h5batch-decode-", suffix=suffix, dir=_scratch()) as fh:
        fh.write(buf)
        fh.flush()
        yield fh.name


def decode_bytes(kind: Any, fc: Any, data: np.ndarray | bytes) -> np.ndarray:
    """``kind.decode`` of stored bytes with the reader's config (raises DecodeError)."""
    with bytes_path(data) as path:
        return kind.decode(path, fc)
