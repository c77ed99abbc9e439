"""Telling a truncated MP3 or Ogg file from a valid one, from the file's own structure.

Rule: an MP3 or Ogg file is judged by its frames or pages, never by libsndfile's frame
count against what it read. Reason (libsndfile 1.2.2):

* **MP3** without a Xing/Info/VBRI header: the frame count is an estimate from the file
  size (valid files read fewer frames than it says), and a truncated file reads short
  without an error;
* **Ogg** (Vorbis, Opus): the count is the last page's granule position, so a file cut at a
  page boundary reads all it claims without an error.

So a file is truncated when its last frame or page runs past the end of the file, or

* MP3: the first frame's Xing/Info/VBRI header promises more than one frame more than the
  file holds, or (byte count only) more than 1% more bytes (libmpg123's threshold);
* Ogg: a logical stream has no end-of-stream page.

Junk after the audio stops the walk without a verdict (the decoder skips it). An MP3
without Xing cut exactly on a frame boundary passes. Only headers are read, from a memory map.
"""

from __future__ import annotations

import mmap
import struct

# Bitrates in kbit/s by (MPEG-1?, layer) and the header's index 1..14 (0 = free format).
_BITRATES = {
    (True, 1): (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_BITRATES[(False, 3)] = _BITRATES[(False, 2)]
_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}  # by version bits
_RESYNC_BYTES = 1 << 16  # how far past a broken header the MP3 walk looks for the next frame


def _mp3_frame(buf, pos: int) -> tuple[int, tuple[int, int, int]] | None:
    """``(frame length in bytes, (version, layer, sample rate))`` of a valid MPEG audio
    frame header at ``pos``; None when the 4 bytes there are not one (or free format)."""
    if pos + 4 > len(buf) or buf[pos] != 0xFF or buf[pos + 1] & 0xE0 != 0xE0:
        return None
    b1, b2 = buf[pos + 1], buf[pos + 2]
    version, layer_bits, br_index, sr_index = (b1 >> 3) & 3, (b1 >> 1) & 3, b2 >> 4, (b2 >> 2) & 3
    if version == 1 or layer_bits == 0 or br_index in (0, 15) or sr_index == 3:
        return None
    layer = 4 - layer_bits
    rate = _RATES[version][sr_index]
    bitrate = _BITRATES[(version == 3, layer)][br_index] * 1000
    pad = (b2 >> 1) & 1
    if layer == 1:
        length = (12 * bitrate // rate + pad) * 4
    elif layer == 3 and version != 3:
        length = 72 * bitrate // rate + pad
    else:
        length = 144 * bitrate // rate + pad
    return length, (version, layer, rate)


def _mp3_start(buf) -> int:
    """Offset of the first byte after the ID3v2 tags at the start of the file."""
    pos = 0
    while pos + 10 <= len(buf) and buf[pos:pos + 3] == b"ID3":
        size = 0
        for b in buf[pos + 6:pos + 10]:
            size = (size << 7) | (b & 0x7F)
        pos += 10 + size + (10 if buf[pos + 5] & 0x10 else 0)  # footer present
    return pos


def _mp3_end(buf) -> int:
    """Where the audio ends: before an ID3v1, Lyrics3v2 and APEv2 tag at the end."""
    end = len(buf)
    if end >= 128 and buf[end - 128:end - 125] == b"TAG":
        end -= 128
    if end >= 15 and buf[end - 9:end] == b"LYRICS200":
        digits = bytes(buf[end - 15:end - 9])
        if digits.isdigit():
            end -= 15 + int(digits)
    if end >= 32 and buf[end - 32:end - 24] == b"APETAGEX":
        size, flags = struct.unpack_from("<I4xI", buf, end - 20)
        end -= size + (32 if flags & 0x80000000 else 0)
    return max(end, 0)


def _vbr_header(buf, pos: int, version: int, mono: bool) -> tuple[str, int | None, int | None] | None:
    """``(name, frames, bytes)`` of a Xing/Info or VBRI header in the frame at ``pos``."""
    side = (32 if not mono else 17) if version == 3 else (17 if not mono else 9)
    x = pos + 4 + side
    if buf[x:x + 4] in (b"Xing", b"Info") and x + 8 <= len(buf):
        flags = struct.unpack_from(">I", buf, x + 4)[0]
        at, frames, nbytes = x + 8, None, None
        if flags & 1 and at + 4 <= len(buf):
            frames, at = struct.unpack_from(">I", buf, at)[0], at + 4
        if flags & 2 and at + 4 <= len(buf):
            nbytes = struct.unpack_from(">I", buf, at)[0]
        return bytes(buf[x:x + 4]).decode(), frames, nbytes
    v = pos + 36
    if buf[v:v + 4] == b"VBRI" and v + 18 <= len(buf):
        nbytes, frames = struct.unpack_from(">II", buf, v + 10)
        return "VBRI", frames, nbytes
    return None


def _sync(buf, start: int, end: int, kind: tuple[int, int, int] | None = None) -> int | None:
    """The first frame at or after ``start`` (of ``kind``, after a broken header) whose
    successor is a valid header of its kind, or that ends the audio: one valid header alone
    is too easily a pattern inside the audio data. The first frame of a file may also run
    past the end (the walk then calls the file truncated); a resync's may not."""
    for p in range(start, min(end, start + _RESYNC_BYTES)):
        if buf[p] != 0xFF:
            continue
        head = _mp3_frame(buf, p)
        if head is None or kind not in (None, head[1]):
            continue
        nxt = _mp3_frame(buf, p + head[0])
        ends = p + head[0] >= end if kind is None else p + head[0] == end
        if ends or (nxt is not None and nxt[1] == head[1]):
            return p
    return None


def mp3_truncation(buf) -> str | None:
    """Why the MP3 in ``buf`` (bytes or a memory map) is truncated, or None."""
    end = _mp3_end(buf)
    first = _sync(buf, _mp3_start(buf), end)  # the first frame after the ID3v2 tags
    if first is None:
        return None  # no frame found: the decoder's own error says more
    head = _mp3_frame(buf, first)
    length, kind = head  # type: ignore[misc]
    vbr = _vbr_header(buf, first, kind[0], buf[first + 3] >> 6 == 3)
    pos, frames, in_sync = first + (length if vbr else 0), 0, True
    while pos < end:
        if end - pos < 4:  # too short for a header: a cut one, or a few bytes of junk
            if buf[pos] == 0xFF:
                return f"truncated audio: the file ends inside an MP3 frame header (at byte {pos})"
            break
        head = _mp3_frame(buf, pos)
        if head is None or head[1] != kind:
            nxt = _sync(buf, pos + 1, end, kind)
            if nxt is None:
                in_sync = False  # junk after the audio: no verdict from here on
                break
            pos = nxt
            continue
        if pos + head[0] > end:
            return (f"truncated audio: the last MP3 frame (at byte {pos}) needs {head[0]} bytes, "
                    f"the file ends after {end - pos}")
        frames += 1
        pos += head[0]
    if vbr is None:
        return None
    name, want_frames, want_bytes = vbr
    if want_frames is not None and in_sync and frames < want_frames - 1:
        return f"truncated audio: the {name} header says {want_frames} MP3 frames, the file holds {frames}"
    if want_frames is None and want_bytes is not None and end - first < 0.99 * want_bytes:
        return f"truncated audio: the {name} header says {want_bytes} bytes of MP3 frames, the file holds {end - first}"
    return None


def ogg_truncation(buf) -> str | None:
    """Why the Ogg file in ``buf`` (bytes or a memory map) is truncated, or None."""
    pos, size = 0, len(buf)
    open_streams: dict[int, int] = {}  # serial -> pages seen, for streams without their last page yet
    pages = 0
    while pos + 27 <= size:
        if buf[pos:pos + 4] != b"OggS":
            return None  # junk after the pages: not a truncation
        flags, serial, nsegs = buf[pos + 5], struct.unpack_from("<I", buf, pos + 14)[0], buf[pos + 26]
        if pos + 27 + nsegs > size:
            break
        length = 27 + nsegs + sum(buf[pos + 27:pos + 27 + nsegs])
        if pos + length > size:
            return (f"truncated audio: the last Ogg page (at byte {pos}) needs {length} bytes, "
                    f"the file ends after {size - pos}")
        pages += 1
        open_streams[serial] = open_streams.get(serial, 0) + 1
        if flags & 0x04:  # end of stream
            del open_streams[serial]
        pos += length
    if pos < size and b"OggS".startswith(bytes(buf[pos:min(size, pos + 4)])):
        return f"truncated audio: the file ends inside the header of an Ogg page (at byte {pos})"
    if pos < size:
        return None  # a few bytes of junk after the pages
    if open_streams:
        serial, n = next(iter(open_streams.items()))
        return (f"truncated audio: Ogg stream {serial:#x} has no end-of-stream page (the file ends "
                f"after its page {n})")
    return None


def truncation(path: str, container: str) -> str | None:
    """Why the file at ``path`` is a truncated ``container`` (``"MP3"`` or ``"OGG"``, as
    libsndfile names the major format), or None: valid, or not judged here."""
    judge = {"MP3": mp3_truncation, "OGG": ogg_truncation}.get(container)
    if judge is None:
        return None
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return judge(buf)
    except (OSError, ValueError):  # empty or vanished: the decoder says so
        return None
