"""Field kind ``text``: one UTF-8 string per sample (a transcript, a caption).

Where the text comes from, one of:

* ``extensions: [.txt, .lab]``: a sidecar file per sample, grouped with the sample's other
  files by stem like any field (``x/1.wav`` + ``x/1.txt``);
* ``column: NAME``: a column of an annotation (``source.tables``: a CSV/TSV table, or a
  transcript file of ``<utterance id> <text>`` lines such as LibriSpeech's ``*.trans.txt``),
  or of the ``manifest`` layout's own table.

Stored as the string's UTF-8 bytes, a variable-length uint8 sample (``values`` +
``offsets``, no HDF5 variable-length heap, so it reads like every other field); the reader
returns ``str``. Bytes that are not UTF-8 are the file's fault (a reject naming the byte
offset), never replaced silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..errors import ConfigError, DecodeError
from .base import FieldKind


@dataclass(frozen=True)
class TextField:
    type: Literal["text"] = "text"
    extensions: list[str] = field(default_factory=list)  # sidecar files; or column
    folder: str | None = None
    column: str | None = None  # annotation column holding the text
    strip: bool = True  # drop leading/trailing white space (a sidecar's final newline)
    max_bytes: int = 1 << 20  # a larger text is a reject (a mislabelled binary file)


def utf8_array(text: str | bytes, fc: TextField, where: str = "") -> np.ndarray:
    """The stored form of one text: its UTF-8 bytes as a uint8 array."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DecodeError(where, f"text is not valid UTF-8 (byte {e.start}: {text[e.start:e.start + 4]!r})") from None
    if fc.strip:
        text = text.strip()
    data = text.encode("utf-8")
    if len(data) > fc.max_bytes:
        raise DecodeError(where, f"text of {len(data)} bytes is longer than max_bytes={fc.max_bytes}")
    return np.frombuffer(data, dtype=np.uint8).copy()


class TextKind(FieldKind):
    name = "text"
    config_class = TextField

    def validate(self, fc: TextField, file: str, key: str) -> None:
        if bool(fc.extensions) == bool(fc.column):
            raise ConfigError(file, key, "a text field takes its text from sidecar files (extensions: [.txt]) "
                                         "or from an annotation column (column: NAME): give exactly one")
        if fc.max_bytes < 1:
            raise ConfigError(file, f"{key}.max_bytes", f"must be >= 1, got {fc.max_bytes}")

    def reads_files(self, fc: TextField) -> bool:
        return bool(fc.extensions)

    def decode(self, path: str, fc: TextField) -> np.ndarray:
        try:
            with open(path, "rb") as fh:
                data = fh.read(fc.max_bytes + 1)
        except OSError as e:
            raise DecodeError(path, f"cannot read: {e.strerror}") from None
        if len(data) > fc.max_bytes:
            raise DecodeError(path, f"text file is larger than max_bytes={fc.max_bytes}")
        return utf8_array(data, fc, path)

    def from_value(self, value: Any, fc: TextField) -> np.ndarray:
        return utf8_array("" if value is None else str(value), fc)

    def attrs(self, fc: TextField) -> dict[str, Any]:
        return {"encoding": "utf-8"}

    def float_scale(self, dtype: np.dtype) -> float | None:
        return None  # bytes of text, not pixel values
