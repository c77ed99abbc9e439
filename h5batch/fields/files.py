"""Opening and recognising input files: the helpers every field kind's decoder shares.

Rule: a decoder opens its file through :func:`open_checked` / :func:`check_readable` and
names what the bytes look like with :func:`sniff`, so every kind rejects an unreadable,
vanished or empty file with the same reason, and says "content looks like PNG" rather
than a library's bare "cannot open". Reason: a reject's text is what a person acts on,
and the same fault should read the same whichever kind of field hit it.
"""

from __future__ import annotations

import os

from ..errors import DecodeError

_MAGIC = [
    (b"RIFF", "WAV (RIFF)"), (b"fLaC", "FLAC"), (b"OggS", "Ogg"), (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG", "PNG"), (b"GIF8", "GIF"), (b"BM", "BMP"), (b"ID3", "MP3"), (b"\xff\xfb", "MP3"),
    (b"PK\x03\x04", "ZIP"), (b"%PDF", "PDF"), (b"\xff\xf3", "MP3"), (b"\xff\xf1", "AAC (ADTS)"),
    (b"\xff\xf9", "AAC (ADTS)"), (b"\x1a\x45\xdf\xa3", "Matroska/WebM"),
    (b"\x30\x26\xb2\x75\x8e\x66\xcf\x11", "ASF/WMA"),
]


def sniff(path: str) -> str:
    """A short description of what a file's first bytes look like (for error messages)."""
    with open(path, "rb") as fh:
        head = fh.read(16)
    if not head:
        return "empty"
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    if head[4:8] == b"ftyp":  # ISO base media: the box type follows the box size
        return "MP4/M4A"
    if all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        return "text"
    return "unknown binary"


def open_checked(path: str):
    """``path`` opened for reading, with errors turned into :class:`DecodeError`."""
    try:
        return open(path, "rb")
    except PermissionError as e:
        raise DecodeError(path, f"cannot read file: {e.strerror}") from e
    except FileNotFoundError as e:
        raise DecodeError(path, "file disappeared since discovery") from e
    except IsADirectoryError as e:
        raise DecodeError(path, "is a directory") from e
    except OSError as e:  # EIO from a failing disk, ELOOP, ...
        raise DecodeError(path, f"cannot read file: {e.strerror or e}") from e


def read_head(path: str, fh, head: int) -> tuple[bytes, int]:
    """The first ``head`` bytes and the size of an open, non-empty file."""
    try:
        data = fh.read(head)
        size = os.fstat(fh.fileno()).st_size
    except OSError as e:
        raise DecodeError(path, f"cannot read file: {e.strerror or e}") from e
    if not data:
        raise DecodeError(path, "empty file (0 bytes)")
    return data, size


def check_readable(path: str, head: int = 1) -> tuple[bytes, int]:
    """The first ``head`` bytes and the size of a readable, non-empty file (one open)."""
    with open_checked(path) as fh:
        return read_head(path, fh, head)
