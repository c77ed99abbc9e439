"""Audio formats libsndfile cannot read (m4a/AAC, WebM/Matroska Opus, WMA), decoded by
FFmpeg through PyAV (the optional extra ``audio``: ``pip install h5batch[audio]``).

Rules, and why:

* The ``audio`` kind sends a file here by its extension (:data:`EXTENSIONS`), everything
  else to libsndfile: one decoder per format, so a format's samples never depend on
  which library happened to open it. Lossy decoders disagree by their priming samples;
  here a file gives every sample FFmpeg's decoder returns, frame after frame, as PyAV's
  own ``container.decode(stream)`` loop gives them (``tests/test_audio_formats.py`` holds
  the two equal), converted to interleaved float32 by FFmpeg's resampler at the file's
  own rate and layout (exact: a change of sample format only), or to int16 when the
  decoder's output is 16-bit PCM and the field keeps it exact.
* What :func:`h5batch.fields.audio.decode_audio` does after reading (channels, sample
  rate check, resampling with soxr, dtype, length) is the same for both decoders.
* Truncation, as measured with PyAV 18 (FFmpeg 7): an m4a whose ``moov`` index is at the
  end does not open when cut; one written ``faststart``, an ADTS .aac or a WMA cut inside a
  packet fails in ``avcodec_send_packet``; a WebM cut anywhere decodes without an error and
  only stops early. So a file is a reject when it does not open, when decoding fails, or
  when it decodes to less than its container says it lasts (the stream's duration, else
  the container's), by more than 1% plus two codec frames (an Opus pre-skip, a WMA
  header duration that counts the last frame whole).
* Without PyAV the file is a reject whose reason names the extra, not a crash.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ..errors import DecodeError

#: Extensions decoded through PyAV (lower case): containers libsndfile 1.2 has no reader for.
EXTENSIONS = frozenset({".m4a", ".m4b", ".mp4", ".aac", ".webm", ".mka", ".wma", ".asf"})

_MISSING = "pip install h5batch[audio]"


def wants_ffmpeg(path: str) -> bool:
    """Whether ``path`` goes to PyAV rather than libsndfile (by its extension)."""
    dot = path.rfind(".")
    return dot > path.rfind("/") and path[dot:].lower() in EXTENSIONS


def available() -> bool:
    """Whether PyAV can be imported here (without importing it)."""
    from importlib.util import find_spec

    return find_spec("av") is not None


def _import_av(path: str):
    try:
        import av
    except ImportError as e:
        ext = path[path.rfind("."):].lower()
        raise DecodeError(path, f"decoding {ext} files needs PyAV, which is not installed here: {_MISSING}") from e
    return av


def _declared_seconds(container, stream) -> float | None:
    """How long the container says the stream lasts (None when it does not say)."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000  # AV_TIME_BASE
    return None


def _ffmpeg_reason(err: Exception) -> str:
    """FFmpeg's message without the file name (the reject names it already)."""
    strerror = getattr(err, "strerror", None)
    return strerror or str(err)


def read_with_ffmpeg(path: str, want_int16: bool) -> tuple[np.ndarray, int]:
    """``((frames, channels) float32, or int16 when ``want_int16`` and the decoder gives
    16-bit PCM, sample rate)`` of the first audio stream of ``path``; raises
    :class:`DecodeError` for a file that does not open, fails to decode or stops early."""
    av = _import_av(path)
    try:
        container = av.open(path)
    except av.error.FFmpegError as e:
        raise DecodeError(path, f"corrupt, truncated or unsupported audio file (FFmpeg cannot open it: "
                                f"{_ffmpeg_reason(e)})") from e
    with container:
        if not container.streams.audio:
            raise DecodeError(path, "no audio stream in the file")
        stream = container.streams.audio[0]
        ctx = stream.codec_context
        rate, channels, layout = ctx.sample_rate, ctx.channels, ctx.layout.name
        if not rate or not channels:
            raise DecodeError(path, f"audio stream without a sample rate or channels ({ctx.name})")
        fmt = "s16" if want_int16 and ctx.format is not None and ctx.format.name in ("s16", "s16p") else "flt"
        resampler = av.AudioResampler(format=fmt, layout=layout, rate=rate)
        parts: list[np.ndarray] = []
        frame_size = 0  # the largest decoded frame, in samples (the slack of the length check)
        try:
            for frame in container.decode(stream):
                frame_size = max(frame_size, frame.samples)
                parts.extend(f.to_ndarray() for f in resampler.resample(frame))
            parts.extend(f.to_ndarray() for f in resampler.resample(None))
        except av.error.FFmpegError as e:
            raise DecodeError(path, f"truncated or corrupt audio data (FFmpeg: {_ffmpeg_reason(e)})") from e
        declared = _declared_seconds(container, stream)
    dtype = np.int16 if fmt == "s16" else np.float32
    x = (np.concatenate(parts, axis=1) if parts else np.zeros((1, 0), dtype)).reshape(-1, channels)
    _check_length(path, x.shape[0], rate, declared, frame_size)
    return np.ascontiguousarray(x, dtype=dtype), rate


def _check_length(path: str, frames: int, rate: int, declared: float | None, frame_size: int) -> None:
    """Reject a stream that decodes to clearly less than the container's duration."""
    if frames == 0:
        raise DecodeError(path, "audio has zero frames")
    if declared is None or declared <= 0:
        return
    want = Fraction(declared).limit_denominator(1 << 20) * rate
    slack = want / 100 + 2 * frame_size
    if frames < want - slack:
        raise DecodeError(path, f"truncated audio: the container says {declared:.3f} s "
                                f"({int(want)} frames at {rate} Hz), the stream decodes to {frames}")

