"""The RIFF/WAVE container as h5batch reads it: its chunks, the format tag and data chunk
(``wav_header``, for precise reject reasons and the truncation check), and the layout of a
plain 16-bit PCM file (``pcm16_layout``), read straight from its data chunk without a
decoder library (:mod:`.audio`, :mod:`.blocks`)."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

# WAV format tags libsndfile decodes (wav.c); any other tag is a codec it does not have.
SNDFILE_WAV_TAGS = {0x0001, 0x0002, 0x0003, 0x0006, 0x0007, 0x0011, 0x0031, 0x0040, 0x0055, 0xFFFE}
WAV_TAG_NAMES = {
    0x0050: "MPEG-1 Layer I/II", 0x0092: "Dolby AC-3 SPDIF", 0x00FF: "AAC", 0x0160: "WMA v1",
    0x0161: "WMA v2", 0x0162: "WMA Pro", 0x0163: "WMA Lossless", 0x1610: "HE-AAC",
    0x2000: "Dolby AC-3", 0x2001: "DTS", 0x0022: "DSP Group TrueSpeech", 0x0270: "Sony ATRAC3",
}


@dataclass(frozen=True)
class WavHeader:
    """What the RIFF chunks of a WAV file say (``None`` fields: chunk not found)."""

    format_tag: int | None
    data_offset: int | None
    data_size: int | None
    file_size: int


def wav_header(path: str, head: bytes = b"", size: int | None = None) -> WavHeader | None:
    """Walk the RIFF chunks of a WAV file; None when it is not RIFF/WAVE.

    The declared data size is checked here because libsndfile quietly shortens a cut file.
    ``head`` (the file's first bytes, with ``size``) saves reopening the file when the data
    chunk's header lies within it; otherwise the whole file is walked, through a memory map.
    """
    h = _scan(head, size) if head and size is not None else None
    if h is not None and h.data_offset is not None:
        return h
    if head and h is None:
        return None  # not RIFF/WAVE
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _scan(buf, len(buf))
    except ValueError:  # an empty file cannot be mapped
        return None


def _riff_chunks(head, size: int):
    """``(chunk id, header position, declared length)`` of the RIFF/WAVE chunks whose
    8-byte header lies within ``head`` (the first bytes of a file of ``size`` bytes)."""
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return
    pos = 12
    while pos + 8 <= min(size, len(head)):
        cid, clen = struct.unpack_from("<4sI", head, pos)
        yield cid, pos, clen
        pos += 8 + clen + (clen & 1)


def _scan(buf, size: int) -> WavHeader | None:
    """What the chunks whose headers lie within ``buf`` (a file's first bytes, or all of it)
    say: ``data_offset`` None when the data chunk's header is not among them."""
    if len(buf) < 12 or buf[:4] != b"RIFF" or buf[8:12] != b"WAVE":
        return None
    tag = None
    for cid, pos, clen in _riff_chunks(buf, size):
        if cid == b"fmt " and pos + 10 <= len(buf):
            tag = struct.unpack_from("<H", buf, pos + 8)[0]
        elif cid == b"data":
            return WavHeader(tag, pos + 8, clen, size)
    return WavHeader(tag, None, None, size)


@dataclass(frozen=True)
class Pcm16:
    """Where the samples of a plain 16-bit PCM WAV lie (all parsed from its first bytes)."""

    channels: int
    sample_rate: int
    data_offset: int
    frames: int


def pcm16_layout(head: bytes, size: int) -> Pcm16 | None:
    """The layout of a little-endian 16-bit PCM WAV whose ``fmt`` and ``data`` chunk
    headers lie within ``head``, and whose data is all present; None for anything else
    (other codecs, RIFX, truncated or streaming files: libsndfile handles those and
    their errors). See the module docstring for why.
    """
    fmt = None
    for cid, pos, clen in _riff_chunks(head, size):
        if cid == b"fmt ":
            if pos + 8 + min(clen, 26) > len(head) or clen < 16:
                return None
            tag, channels, rate, _, align, bits = struct.unpack_from("<HHIIHH", head, pos + 8)
            if tag == 0xFFFE:  # WAVE_FORMAT_EXTENSIBLE: the sub-format GUID starts with the tag
                if clen < 26:
                    return None
                tag = struct.unpack_from("<H", head, pos + 8 + 24)[0]
            fmt = (tag, channels, rate, align, bits)
        elif cid == b"data":
            if fmt is None:
                return None
            tag, channels, rate, align, bits = fmt
            if tag != 1 or bits != 16 or channels < 1 or rate < 1 or align != 2 * channels:
                return None
            if clen in (0, 0xFFFFFFFF) or pos + 8 + clen > size:
                return None
            frames = clen // align
            return Pcm16(channels, rate, pos + 8, frames) if frames else None
    return None
