"""MP3, Ogg (Vorbis, Opus) and the formats libsndfile lacks (m4a/AAC, WebM, WMA), valid and
truncated, made at test time: libsndfile writes MP3 (LAME) and Ogg, PyAV's FFmpeg writes
MP3 without a Xing header, m4a, WebM and WMA.

Valid files are samples equal to what their decoder gives (soundfile for MP3/Ogg, PyAV's
own decode loop for the rest); copies cut at 60%, inside the last frame or page, or
exactly on a frame or page boundary are rejects naming the truncation. In a one-field
layout two files of one stem are two samples whose keys keep the extension.
"""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import distributed  # noqa: F401  (before any dask.config.set: see tests/test_bad_inputs.py)
import h5py
import numpy as np
import pytest
import soundfile as sf
import soxr

from h5batch import ConvertOptions, convert
from h5batch.config import job_from_dict
from h5batch.errors import ConfigError, DecodeError
from h5batch.fields import needed_packages
from h5batch.fields.audio import AudioField, decode_audio

av = pytest.importorskip("av")

KEEP = AudioField(channels="keep", dtype="float32", extensions=[".mp3", ".ogg", ".m4a", ".webm", ".wma"])


def _tone(rate: int, seconds: float, channels: int) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    x = np.stack([0.3 * np.sin(2 * np.pi * (440 + 110 * k) * t) for k in range(channels)], axis=1)
    return x.astype(np.float32)


def _with_pyav(path: Path, codec: str, rate: int, channels: int, seconds: float = 2.0, fmt: str | None = None,
               options: dict | None = None) -> Path:
    """Encode a tone with FFmpeg's ``codec`` through PyAV."""
    x = _tone(rate, seconds, channels).T.copy()
    layout = "mono" if channels == 1 else "stereo"
    with av.open(str(path), "w", format=fmt, options=options or {}) as c:
        s = c.add_stream(codec, rate=rate, layout=layout)
        if codec == "wmav2":
            s.bit_rate = 128_000
        src = av.AudioFrame.from_ndarray(x, format="fltp", layout=layout)
        src.sample_rate = rate
        for f in av.AudioResampler(format=s.codec_context.format.name, layout=layout, rate=rate).resample(src):
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("formats")
    out = {}
    for name, rate, ch, fmt, sub in [("lame.mp3", 44100, 2, "MP3", "MPEG_LAYER_III"),
                                     ("lame16.mp3", 16000, 1, "MP3", "MPEG_LAYER_III"),
                                     ("vorbis.ogg", 44100, 2, "OGG", "VORBIS"),
                                     ("opus.ogg", 48000, 1, "OGG", "OPUS")]:
        sf.write(d / name, _tone(rate, 2.0, ch), rate, format=fmt, subtype=sub)
        out[name] = d / name
    out["noxing.mp3"] = _with_pyav(d / "noxing.mp3", "libmp3lame", 44100, 2, options={"write_xing": "0"})
    out["aac.m4a"] = _with_pyav(d / "aac.m4a", "aac", 44100, 2)
    out["faststart.m4a"] = _with_pyav(d / "faststart.m4a", "aac", 44100, 2, options={"movflags": "+faststart"})
    out["opus.webm"] = _with_pyav(d / "opus.webm", "libopus", 48000, 2, fmt="webm")
    out["wma.wma"] = _with_pyav(d / "wma.wma", "wmav2", 44100, 2, fmt="asf")
    return out


def _cut(src: Path, dst: Path, size: int) -> str:
    dst.write_bytes(src.read_bytes()[:size])
    return str(dst)


def _reject(path: str, fc: AudioField = KEEP) -> str:
    with pytest.raises(DecodeError) as e:
        decode_audio(path, fc)
    return e.value.reason


def _pyav_decode(path: Path) -> np.ndarray:
    """PyAV's own decode loop: every frame FFmpeg returns, (frames, channels) float32."""
    with av.open(str(path)) as c:
        parts = [f.to_ndarray() for f in c.decode(audio=0)]  # fltp: (channels, samples)
    return np.concatenate(parts, axis=1).T


def _soundfile(path: Path) -> np.ndarray:
    """libsndfile's samples of the file read from its start, (frames, channels) float32."""
    with sf.SoundFile(path) as f:
        return f.read(dtype="float32", always_2d=True)


def _ogg_last_page(data: bytes) -> int:
    """Offset of the last page of an Ogg file (walked from the start, independently)."""
    pos = last = 0
    while pos < len(data):
        last = pos
        nsegs = data[pos + 26]
        pos += 27 + nsegs + sum(data[pos + 27:pos + 27 + nsegs])
    return last


def _cbr_frame_starts(data: bytes, first: int, bitrate: int, rate: int) -> list[int]:
    """Frame offsets of an MPEG-1 Layer III CBR stream (frame = 144 * bitrate / rate + pad)."""
    starts, pos = [], first
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        starts.append(pos)
        pos += 144 * bitrate // rate + ((data[pos + 2] >> 1) & 1)
    return starts


# ----------------------------------------------------------------------------- valid files


@pytest.mark.parametrize("name", ["lame.mp3", "lame16.mp3", "noxing.mp3", "vorbis.ogg", "opus.ogg"])
def test_valid_mp3_and_ogg_equal_soundfile(files, name):
    """Equal to libsndfile reading the file from its start. (Not to ``sf.read``, which
    seeks to frame 0 first: libmpg123 then returns float samples 1 ULP apart, measured.)"""
    with sf.SoundFile(files[name]) as f:
        want, rate = f.read(dtype="float32", always_2d=True), f.samplerate
    got = decode_audio(str(files[name]), KEEP)
    assert got.shape == want.shape and np.array_equal(got, want)
    assert got.shape[0] >= 0.99 * 2.0 * rate


def test_mp3_without_xing_is_a_sample_though_its_frame_count_is_an_estimate(files):
    """The issue's case: libsndfile's count (from the file size) exceeds what it reads."""
    p = str(files["noxing.mp3"])
    read = sf.read(p, always_2d=True)[0].shape[0]
    assert sf.info(p).frames > read  # measured: 90184 against 89856
    assert decode_audio(p, AudioField(extensions=[".mp3"])).shape == (read,)


def test_mp3_with_junk_after_the_audio_is_a_sample(files, tmp_path):
    p = tmp_path / "junk.mp3"
    p.write_bytes(files["lame.mp3"].read_bytes() + bytes(range(256)) * 8)
    want = _soundfile(p)
    assert np.array_equal(decode_audio(str(p), KEEP), want)


@pytest.mark.parametrize("name", ["aac.m4a", "faststart.m4a", "opus.webm", "wma.wma"])
def test_pyav_formats_equal_pyavs_own_decode(files, name):
    want = _pyav_decode(files[name])
    got = decode_audio(str(files[name]), KEEP)
    assert got.dtype == np.float32 and np.array_equal(got, want)


def test_pyav_path_mixes_converts_and_resamples_like_the_soundfile_path(files):
    """The settings after reading are the same code: mono = channel mean, int16 = rounded
    and clipped, a rate change = soxr HQ, length = crop or zero-pad."""
    p = str(files["aac.m4a"])
    x = _pyav_decode(files["aac.m4a"])
    mono = decode_audio(p, AudioField(channels="mono", dtype="float32"))
    assert np.array_equal(mono, x.mean(axis=1))
    pcm = decode_audio(p, AudioField(channels="first"))
    assert pcm.dtype == np.int16 and np.array_equal(pcm, np.clip(np.rint(x[:, 0] * 32768), -32768, 32767))
    res = decode_audio(p, AudioField(channels="first", dtype="float32", sample_rate=16000, resample=True,
                                     length=40000))
    want = soxr.resample(x[:, :1], 44100, 16000, quality="HQ")[:, 0]
    assert res.shape == (40000,) and np.array_equal(res[:len(want)], want[:40000]) and not res[len(want):].any()
    assert "sample rate 44100 Hz, the field stores 16000 Hz" in _reject(p, AudioField(sample_rate=16000))


# ----------------------------------------------------------------------------- truncated files


@pytest.mark.parametrize("name", ["lame.mp3", "lame16.mp3", "noxing.mp3", "vorbis.ogg", "opus.ogg"])
@pytest.mark.parametrize("where", ["60%", "mid-frame"])
def test_truncated_mp3_and_ogg_are_rejects(files, tmp_path, name, where):
    data = files[name].read_bytes()
    size = int(len(data) * 0.6) if where == "60%" else len(data) - 7
    reason = _reject(_cut(files[name], tmp_path / name, size))
    assert reason.startswith("truncated audio: "), reason
    kind = "MP3 frame" if name.endswith(".mp3") else "Ogg page"
    assert kind in reason, reason


def test_ogg_cut_on_a_page_boundary_lacks_its_end_of_stream_page(files, tmp_path):
    """libsndfile reads such a file without an error (its frame count shrinks with it)."""
    for name in ("vorbis.ogg", "opus.ogg"):
        data = files[name].read_bytes()
        p = _cut(files[name], tmp_path / name, _ogg_last_page(data))
        n = sf.read(p, always_2d=True)[0].shape[0]
        assert n == sf.info(p).frames > 0  # nothing for header-vs-read to notice
        assert "has no end-of-stream page" in _reject(p), name


def test_mp3_cut_on_a_frame_boundary_holds_fewer_frames_than_its_info_header(files, tmp_path):
    data = files["noxing.mp3"].read_bytes()
    first = data.index(b"\xff\xfb")
    starts = _cbr_frame_starts(data, first, 128_000, 44100)
    assert starts[-1] + 417 <= len(data) <= starts[-1] + 418 + 128
    # noxing has no Info header: a boundary cut is a valid shorter file
    assert decode_audio(_cut(files["noxing.mp3"], tmp_path / "short.mp3", starts[40]), KEEP).shape[0] > 0
    # lame.mp3 (VBR) has a Xing header counting its frames: a boundary cut is a truncation.
    lame = files["lame.mp3"].read_bytes()
    cut = 0
    for _ in range(30):  # the Xing frame and 29 audio frames, by the lengths their headers give
        b1, b2 = lame[cut + 1], lame[cut + 2]
        assert b1 == 0xFB and (b2 >> 2) & 3 == 0, "MPEG-1 Layer III at 44.1 kHz"
        bitrate = (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320)[b2 >> 4] * 1000
        cut += 144 * bitrate // 44100 + ((b2 >> 1) & 1)
    reason = _reject(_cut(files["lame.mp3"], tmp_path / "boundary.mp3", cut))
    assert "header says 78 MP3 frames, the file holds 29" in reason, reason


def test_truncated_pyav_formats_are_rejects(files, tmp_path):
    # moov at the end (FFmpeg's default): a cut m4a does not open
    p = _cut(files["aac.m4a"], tmp_path / "a.m4a", int(files["aac.m4a"].stat().st_size * 0.6))
    assert "FFmpeg cannot open it" in _reject(p)
    # faststart, WMA: the cut packet fails to decode
    for name in ("faststart.m4a", "wma.wma"):
        p = _cut(files[name], tmp_path / name, int(files[name].stat().st_size * 0.6))
        assert "truncated or corrupt audio data (FFmpeg: " in _reject(p), name
    # WebM decodes a cut file without an error: it stops early against its own duration
    for frac in (0.6, 0.95):
        p = _cut(files["opus.webm"], tmp_path / "o.webm", int(files["opus.webm"].stat().st_size * frac))
        reason = _reject(p)
        assert reason.startswith("truncated audio: the container says 2.014 s"), reason


# ----------------------------------------------------------------------------- PyAV missing, pre-flight


def test_missing_pyav_is_a_reject_naming_the_extra(files):
    code = ("import sys; sys.modules['av'] = None\n"
            "from h5batch.errors import DecodeError\n"
            "from h5batch.fields.audio import AudioField, decode_audio\n"
            "try:\n    decode_audio(sys.argv[1], AudioField(extensions=['.m4a']))\n"
            "except DecodeError as e:\n    print(e.reason)\n")
    res = subprocess.run([sys.executable, "-c", code, str(files["aac.m4a"])], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == ("decoding .m4a files needs PyAV, which is not installed here: "
                                  "pip install h5batch[audio]")


def test_pyav_is_a_decisive_package_of_fields_that_need_it():
    from h5batch.conversion.preflight import DECISIVE, collect_versions

    assert "av" in DECISIVE and collect_versions(("av",))[0]["av"] == av.__version__
    assert "av" in needed_packages(AudioField(extensions=[".wav", ".m4a"]))
    assert "av" not in needed_packages(AudioField(extensions=[".wav", ".mp3", ".ogg"]))


# ----------------------------------------------------------------------------- through the converter


def test_convert_keeps_valid_files_rejects_truncated_and_keeps_extensions_in_clashing_keys(files, tmp_path):
    root = tmp_path / "corpus"
    (root / "train" / "music").mkdir(parents=True)
    d = root / "train" / "music"
    for name in ("lame.mp3", "noxing.mp3", "vorbis.ogg", "aac.m4a"):
        (d / name).write_bytes(files[name].read_bytes())
    sf.write(d / "lame.flac", _tone(44100, 0.5, 1), 44100)  # the same stem as lame.mp3: two samples
    (d / "cut.mp3").write_bytes(files["lame.mp3"].read_bytes()[:int(files["lame.mp3"].stat().st_size * 0.6)])
    (d / "cut.ogg").write_bytes(files["opus.ogg"].read_bytes()[:_ogg_last_page(files["opus.ogg"].read_bytes())])
    (d / "cut.m4a").write_bytes(files["aac.m4a"].read_bytes()[:20000])
    out = tmp_path / "out.h5"
    spec = {
        "source": {"root": str(root), "layout": "class_folders"},
        "fields": {"audio": {"type": "audio", "channels": "keep", "dtype": "float32",
                             "extensions": [".mp3", ".ogg", ".m4a", ".flac"]}},
        "output": {"path": str(out), "codec": "none"},
        "cluster": {"kind": "local", "workers": 1, "dashboard": False},
        "policy": {"max_reject_fraction": 1.0}}
    # cut.ogg is 48 kHz: without sample_rate, one array of two rates is refused, naming the key
    with pytest.raises(ConfigError, match=r"fields\.audio\.sample_rate: .*44100 Hz, 48000 Hz"):
        convert(job_from_dict(spec, "formats.yaml"), ConvertOptions(progress=False, log=io.StringIO()))
    spec["fields"]["audio"]["sample_rate"] = 44100  # cut.ogg's truncation is found before its rate
    s = convert(job_from_dict(spec, "formats.yaml"), ConvertOptions(progress=False, log=io.StringIO()))
    assert s.ok
    with h5py.File(out, "r") as f:
        g = f["train"]
        src = [str(p) for p in g["source"].asstr()[...].reshape(-1)]
        node = g["audio"]
        offs, shapes, values = node["offsets"][...], node["shapes"][...], node["values"][...]
        stored = {p: values[offs[i]:offs[i + 1]].reshape(shapes[i]) for i, p in enumerate(src)}
        rejects = {p: r for p, r in zip(f["rejects"]["path"].asstr()[...], f["rejects"]["reason"].asstr()[...])}
    assert sorted(stored) == sorted(f"train/music/{n}" for n in
                                    ("aac.m4a", "lame.flac", "lame.mp3", "noxing.mp3", "vorbis.ogg"))
    for p, a in stored.items():
        want = _pyav_decode(root / p) if p.endswith(".m4a") else _soundfile(root / p)
        assert np.array_equal(a, want), p
    assert set(rejects) == {"train/music/cut.mp3", "train/music/cut.ogg", "train/music/cut.m4a"}
    assert all(r.startswith(("truncated audio", "corrupt, truncated")) for r in rejects.values()), rejects
    manifest = json.loads(Path(s.rejects_file).read_text().splitlines()[0])
    assert manifest["path"] in rejects


def test_one_field_keys_keep_the_extension_only_where_stems_clash(tmp_path):
    from h5batch.layouts import discover

    root = tmp_path / "c"
    for rel in ("train/a/song.mp3", "train/a/song.flac", "train/a/other.flac", "train/b/song.flac"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        fmt = ("MP3", "MPEG_LAYER_III") if rel.endswith(".mp3") else ("FLAC", "PCM_16")
        sf.write(root / rel, _tone(8000, 0.1, 1), 8000, format=fmt[0], subtype=fmt[1])
    one = job_from_dict({"source": {"root": str(root), "layout": "class_folders"},
                         "fields": {"audio": {"type": "audio", "extensions": [".mp3", ".flac"]}},
                         "output": {"path": str(tmp_path / "o.h5")}}, "keys.yaml")
    m = discover(one)
    assert [(it.key, it.paths) for it in m.items] == [
        ("a/other", ("train/a/other.flac",)), ("a/song.flac", ("train/a/song.flac",)),
        ("a/song.mp3", ("train/a/song.mp3",)), ("b/song", ("train/b/song.flac",))]
    assert m.rejects == []
    # With two fields the stem pairs the files: a second file of a stem and field is a duplicate.
    (root / "train/a/song.wav").write_bytes((root / "train/a/other.flac").read_bytes())
    (root / "train/a/song.png").write_bytes(b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 0))
    two = job_from_dict({"source": {"root": str(root), "layout": "class_folders"},
                         "fields": {"audio": {"type": "audio", "extensions": [".mp3", ".flac", ".wav"]},
                                    "image": {"type": "image", "extensions": [".png"]}},
                         "output": {"path": str(tmp_path / "o2.h5")}}, "keys2.yaml")
    reasons = {r.path: r.reason for r in discover(two).rejects}
    assert reasons["train/a/song.mp3"].startswith("duplicate key: train/a/song.flac has the same stem")
