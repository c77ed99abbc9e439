"""The ``audio`` field kind: settings, decoders and what the output and the reader say.

Arrays are ``(frames,)`` (``channels: mono`` or ``first``) or ``(frames, channels)``
(``keep``), dtype int16 (16-bit PCM kept exact) or float32 in [-1, 1].

Rules, and why:

* A plain little-endian 16-bit PCM WAV is read straight from its data chunk
  (:func:`pcm16_layout`); anything else goes through libsndfile. Reason: the samples *are*
  the chunk's bytes, so this equals ``soundfile.read(path, dtype="int16")`` without a second
  open (``tests/test_decode_audio.py`` holds the two paths equal).
* A WAV whose data chunk declares more bytes than the file holds is a reject
  (:func:`wav_header`), not a short sample: libsndfile quietly shortens it.
* An MP3 or Ogg (Vorbis, Opus) file is judged truncated from its own frames or pages
  (:mod:`h5batch.fields.truncation`), not from libsndfile's frame count, an estimate for MP3
  that shrinks with a cut Ogg file. Elsewhere fewer frames than the header says is
  truncation.
* m4a/AAC, WebM/Matroska, WMA (:data:`h5batch.fields.ffmpeg.EXTENSIONS`) are decoded by
  FFmpeg through PyAV (the ``audio`` extra), by extension; everything after reading
  (channels, rate, resampling, dtype, length) is the same code for both decoders.
* A file at another sample rate is a reject unless ``resample: true``; ``length`` keeps
  the start and crops or zero-pads the end (recorded in the ``length_rule`` attribute).
* Every failure raises :class:`~h5batch.errors.DecodeError` naming the cause as
  specifically as the bytes allow (codec tag, truncation, sample rate); the job puts the
  file in the rejects list and goes on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..errors import ConfigError, DecodeError
from . import blocks
from .base import FieldKind, late
from .features import LogMel
from .ffmpeg import EXTENSIONS as FFMPEG_EXTENSIONS
from .ffmpeg import available as ffmpeg_available
from .ffmpeg import read_with_ffmpeg, wants_ffmpeg
from .files import open_checked, read_head, sniff
from .transcode import AudioTranscode
from .truncation import truncation
from .value import ValueField
from .wav import SNDFILE_WAV_TAGS, WAV_TAG_NAMES, pcm16_layout, wav_header


@dataclass(frozen=True)
class AudioField:
    """Decode with soundfile. Arrays are ``(frames,)`` for mono, ``(frames, channels)``
    otherwise; ``dtype`` int16 keeps 16-bit PCM exact, float32 is in [-1, 1]."""

    type: Literal["audio"] = "audio"
    extensions: list[str] = field(default_factory=lambda: [".wav", ".flac", ".ogg"])
    sample_rate: int | None = None
    resample: bool = False
    channels: Literal["mono", "keep", "first"] = "mono"
    length: int | None = None  # frames after resampling; None = variable length
    dtype: Literal["int16", "float32"] = "int16"
    folder: str | None = None  # paired_folders: folder name in the corpus (default: field name)
    column: str | None = None  # manifest: column holding the path (default: field name)
    # Late settings (h5batch.fields.base.late): what is stored, run after decoding.
    store: Literal["decoded", "encoded"] = late("decoded")  # encoded: keep the file's bytes
    transcode: AudioTranscode | None = late()  # with store: encoded, re-encode the decoded audio (flac)
    transform: str | None = late()  # "package.module:function" run on the decoded array
    features: Literal["log_mel"] | LogMel | None = late()  # stored instead of the samples (features.py)
    # Crop-only limits: a longer file keeps its start, a shorter one its own length (variable).
    max_length: int | None = late()  # frames after resampling
    max_seconds: float | None = late()  # at sample_rate (or the corpus's rate)


def _check_rate(path: str, fc: AudioField, sr: int) -> None:
    """A file at another rate than the field's is a reject unless the field resamples. The
    field's rate may be the job's or the corpus's (learned by the trial), so the words name
    the field, and both settings that convert it."""
    if fc.sample_rate not in (None, sr) and not fc.resample:
        raise DecodeError(path, f"sample rate {sr} Hz, the field stores {fc.sample_rate} Hz "
                                "(set sample_rate and resample: true to convert)")


def max_frames(fc: AudioField, rate: int) -> int | None:
    """The crop-only limit in frames at ``rate`` (None: no limit)."""
    if fc.max_length is not None:
        return fc.max_length
    return max(1, round(fc.max_seconds * rate)) if fc.max_seconds is not None else None


def _limited(fc: AudioField, frames: int, sr: int) -> AudioField:
    """``fc`` with ``length`` at the crop-only limit where this file (``frames`` at ``sr``,
    exact) is longer than it, so the paths that stop reading at ``length`` stop there; never
    where it would pad."""
    target = fc.sample_rate or sr
    limit = max_frames(fc, target)
    if limit is None or blocks.out_frames(frames, sr, target, None) - 1 < limit:
        return fc
    return dataclasses.replace(fc, length=limit)


def _audio_open_reason(path: str, err: Exception) -> str:
    """Why libsndfile could not open ``path``, as specifically as the bytes allow."""
    kind = sniff(path)
    err = str(err).replace(f"Error opening {path!r}: ", "")  # the reject names the file already
    if kind == "WAV (RIFF)":
        h = wav_header(path)
        if h is None or h.format_tag is None or h.data_offset is None:
            return f"truncated or malformed WAV header (no complete fmt/data chunk): {err}"
        if h.format_tag not in SNDFILE_WAV_TAGS:
            name = WAV_TAG_NAMES.get(h.format_tag, "unknown codec")
            return (f"unsupported audio codec: WAV format tag 0x{h.format_tag:04X} ({name}), "
                    f"which libsndfile cannot decode")
        return f"corrupt WAV file: {err}"
    if kind in ("FLAC", "Ogg", "MP3"):
        return truncation(path, kind.upper()) or f"corrupt or unsupported {kind} file: {err}"
    if kind in ("text", "empty", "unknown binary") or "does not exist" in err:
        # libsndfile's words for bytes no format claims ("File does not exist or is not a
        # regular file") would contradict the facts: the file exists; its content is wrong.
        return f"not an audio file: its content looks like {kind}"
    return f"not a readable audio file (content looks like {kind}): {err}"


def _check_wav_complete(path: str, frames: int, head: bytes = b"", size: int | None = None) -> None:
    """Raise when a WAV's data chunk declares more bytes than the file holds."""
    h = wav_header(path, head, size)
    if h is None or h.data_offset is None or h.data_size in (None, 0, 0xFFFFFFFF):
        return  # not WAV, or a streaming writer's "size unknown" header
    present = h.file_size - h.data_offset
    if h.data_size > present:
        raise DecodeError(path, f"truncated audio: the WAV data chunk declares {h.data_size} bytes "
                                f"but the file holds {max(present, 0)} ({frames} whole frames)")


def _open_soundfile(path: str, fc: AudioField, head: bytes, size: int):
    """Any format libsndfile reads, opened and checked before reading: ``(SoundFile, the
    dtype to read it as)``; the caller closes it."""
    import soundfile as sf

    try:
        f = sf.SoundFile(path)
    except Exception as e:  # libsndfile's message alone ("Malformed 'fmt ' chunk") is too vague
        raise DecodeError(path, _audio_open_reason(path, e)) from e
    try:
        sr, frames, channels, container = f.samplerate, f.frames, f.channels, f.format
        _check_wav_complete(path, frames, head, size)
        cut = truncation(path, container)  # MP3 and Ogg: judged by their frames or pages
        if cut:
            raise DecodeError(path, cut)
        if frames <= 0:
            raise DecodeError(path, "audio has zero frames")
        _check_rate(path, fc, sr)
    except BaseException:
        f.close()
        raise
    exact_int = fc.dtype == "int16" and fc.sample_rate in (None, sr) and (channels == 1 or fc.channels != "mono")
    is_float_src = f.subtype in ("FLOAT", "DOUBLE")
    return f, "int16" if exact_int and not is_float_src else "float32"


def _read_with_soundfile(path: str, f, dtype: str) -> tuple[np.ndarray, int]:
    """All of an open, checked file: ``((frames, channels) int16 or float32, sample rate)``."""
    frames, container = f.frames, f.format
    try:
        x = f.read(dtype=dtype, always_2d=True)
    except Exception as e:
        raise DecodeError(path, f"truncated or corrupt audio data: {e}") from e
    if x.shape[0] == 0:
        raise DecodeError(path, "audio has zero frames")
    if x.shape[0] < frames and container != "MP3":  # MP3: the count is an estimate (see above)
        raise DecodeError(path, f"truncated audio: header says {frames} frames, read {x.shape[0]}")
    return x, f.samplerate


def decode_audio(path: str, fc: AudioField, alloc: blocks.Alloc | None = None,
                 facts: dict | None = None) -> np.ndarray:
    """Read one audio file and apply the field's preprocessing.

    Returns ``(frames,)`` or ``(frames, channels)`` of ``fc.dtype``. 16-bit PCM read as
    int16 without resampling or mixing is bit-exact with ``soundfile.read(path, dtype='int16')``.
    The sample is made in ``alloc``'s array (default: a new one) by :class:`.blocks.BlockSink`,
    block by block where the frame count is exact, else from the whole file read as one
    block; the result is (a view of) that array. ``facts`` (a dict)
    gets ``length``: the frames of the sample before zero-padding to ``length``.
    """
    with open_checked(path) as fh:
        head, size = read_head(path, fh, 4096)
        ffmpeg = wants_ffmpeg(path)
        layout = None if ffmpeg else pcm16_layout(head, size)
        if ffmpeg:
            x, sr = read_with_ffmpeg(path, want_int16=fc.dtype == "int16")
            _check_rate(path, fc, sr)
        elif layout is not None:
            _check_rate(path, fc, layout.sample_rate)
            fc = _limited(fc, layout.frames, layout.sample_rate)
            return blocks.from_pcm16(path, fh, layout, fc, alloc or np.empty, facts)
        else:
            f, dtype = _open_soundfile(path, fc, head, size)
            with f:
                if f.format in blocks.EXACT_FORMATS:
                    fc = _limited(fc, f.frames, f.samplerate)
                    return blocks.from_soundfile(path, f, dtype, fc, alloc or np.empty, facts)
                x, sr = _read_with_soundfile(path, f, dtype)
    # The whole file is read: the same rules as block by block, in one block.
    sink = blocks.BlockSink(_limited(fc, x.shape[0], sr), sr, x.shape[1], x.shape[0], x.dtype, alloc or np.empty)
    sink.feed(x)
    return sink.finish(path, facts)


def _variable_rule(fc: AudioField) -> str:
    if fc.max_length is not None:
        return f"variable; longer files keep their first {fc.max_length} frames"
    if fc.max_seconds is not None:
        return f"variable; longer files keep their first {fc.max_seconds:g} s"
    return "variable"


@dataclass(frozen=True)
class TrueLength(ValueField):
    """The column ``<field>_lengths`` a run adds after each audio field padded to ``length``:
    every sample's frames before zero-padding (at most ``length``), which the worker takes
    from the decode of field ``of``. Never in a job file; stored and read as an int64 value
    field, so the reader yields ``<field>_lengths`` as it does for variable fields."""

    of: str = ""


def with_true_lengths(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with a :class:`TrueLength` after each audio field that pads its samples
    (``length``, decoded samples, no transform or features)."""
    out: dict[str, Any] = {}
    for name, fc in fields.items():
        out[name] = fc
        if isinstance(fc, AudioField) and fc.length is not None and blocks.streams(fc):
            out[f"{name}_lengths"] = TrueLength(column=name, dtype="int64", of=name)
    return out


def rate_unknown(fc: Any) -> bool:
    """An audio field that sets no ``sample_rate``: each run learns it from the corpus's
    files (:func:`h5batch.conversion.auto.resolve`), which must share one."""
    return isinstance(fc, AudioField) and fc.sample_rate is None


def native_rate(path: str) -> int | None:
    """The sample rate a file's header declares (None where neither libsndfile nor PyAV
    reads it: the decode rejects that file with its reason)."""
    try:
        if wants_ffmpeg(path):
            import av

            with av.open(path) as c:
                return int(c.streams.audio[0].rate)
        import soundfile as sf

        return int(sf.info(path).samplerate)
    except Exception:  # noqa: BLE001 - unreadable: the decode says why
        return None


class AudioKind(FieldKind):
    """``type: audio``: decoded with soundfile, or PyAV for the formats libsndfile lacks
    (and soxr to resample)."""

    name = "audio"
    config_class = AudioField

    def validate(self, fc: AudioField, file: str, key: str) -> None:
        if fc.sample_rate is not None and not 100 <= fc.sample_rate <= 768_000:
            raise ConfigError(file, f"{key}.sample_rate", f"must be 100..768000 Hz, got {fc.sample_rate}")
        if fc.resample and fc.sample_rate is None:
            raise ConfigError(file, f"{key}.resample", "needs sample_rate (the target rate)")
        if fc.length is not None and fc.length <= 0:
            raise ConfigError(file, f"{key}.length", f"must be a positive number of frames, got {fc.length}")
        for k in ("max_length", "max_seconds"):
            v = getattr(fc, k)
            if v is not None and v <= 0:
                raise ConfigError(file, f"{key}.{k}", f"must be > 0, got {v}")
            if v is not None and (fc.length is not None or (k == "max_seconds" and fc.max_length is not None)):
                raise ConfigError(file, f"{key}.{k}", "give one of length (pad and crop), max_length and "
                                                      "max_seconds (crop only)")

    def decode(self, path: str, fc: AudioField) -> np.ndarray:
        return decode_audio(path, fc)

    def decode_to(self, path: str, fc: AudioField, alloc: blocks.Alloc | None = None,
                  facts: dict | None = None) -> np.ndarray:
        """Decode into ``alloc``'s array (:func:`decode_audio`); ``facts`` gets the sample's
        true length."""
        return decode_audio(path, fc, alloc=alloc, facts=facts)

    def transcode(self, path: str, fc: AudioField) -> bytes:
        from .transcode import encode_audio

        a = decode_audio(path, fc)  # resampled, mixed, cropped: the reader decodes it as it is
        rate = fc.sample_rate
        if rate is None:
            import soundfile as sf

            rate = sf.info(path).samplerate
        return encode_audio(path, a, rate, fc.transcode)

    def fixed_shape(self, fc: AudioField) -> tuple[tuple[int, ...], np.dtype] | None:
        if fc.length is None or fc.channels == "keep":
            return None
        return (int(fc.length),), np.dtype(fc.dtype)

    def attrs(self, fc: AudioField) -> dict[str, Any]:
        return {"dtype": fc.dtype, "channels": fc.channels, "sample_rate": fc.sample_rate or 0,
                "length_rule": "keep start; crop or zero-pad the end" if fc.length else _variable_rule(fc),
                "axes": "time,channel" if fc.channels == "keep" else "time"}

    def packages(self, fc: AudioField) -> set[str]:
        need = {"soundfile", "libsndfile", "soxr"} if fc.resample else {"soundfile", "libsndfile"}
        # PyAV decides the samples of its formats, so the workers must have the driver's; a
        # driver without it makes those files rejects naming the extra (ffmpeg.py), not an error.
        if any(e.lower() in FFMPEG_EXTENSIONS for e in fc.extensions) and ffmpeg_available():
            need.add("av")
        return need

    def float_scale(self, dtype: np.dtype) -> float | None:
        # int16 PCM -> [-1, 1) (x * 2**-15 is exact); float32 is in [-1, 1] already.
        return 32768.0 if np.dtype(dtype) == np.int16 else None
