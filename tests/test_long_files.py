"""Long recordings decode block by block (h5batch/fields/blocks.py) and, in a conversion,
straight into shared memory (h5batch/conversion/worker.py: _StreamRows), with the samples
and rejects the whole-file path gives. Files of a minute or less: the memory figures for
2-hour files are the benchmark's (``python -m h5batch.bench.longfile``)."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import soundfile as sf
import soxr

from h5batch import ConvertOptions, convert
from h5batch.batches import BatchTask
from h5batch.config import load_job
from h5batch.conversion.worker import STREAM_FILE_BYTES, decode_batch
from h5batch.errors import DecodeError
from h5batch.fields import blocks
from h5batch.fields.audio import AudioField, decode_audio
from h5batch.transport.packing import Attached
from h5batch.transport.segments import new_run_id, remove_segments


def write(path: Path, seconds: float, rate: int, channels: int, subtype: str = "PCM_16", seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = (np.arange(n) / rate)[:, None]
    x = 0.3 * np.sin(2 * np.pi * 440 * t * np.arange(1, channels + 1)) + 0.05 * rng.standard_normal((n, channels))
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), x.astype(np.float32), rate, subtype=subtype)
    return path


def to_int16(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x * 32768.0), -32768, 32767).astype(np.int16)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("long")
    return {
        "mono16k.wav": write(d / "mono16k.wav", 20, 16000, 1),
        "stereo48k.wav": write(d / "stereo48k.wav", 20, 48000, 2, seed=1),
        "stereo44k.flac": write(d / "stereo44k.flac", 20, 44100, 2, seed=2),
        "float48k.wav": write(d / "float48k.wav", 20, 48000, 2, subtype="FLOAT", seed=3),
    }


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of an odd size, so every file spans many and ends in a partial one."""
    monkeypatch.setattr(blocks, "BLOCK_FRAMES", 4099)


def streamed(path: Path, fc: AudioField) -> np.ndarray:
    return decode_audio(str(path), fc, alloc=np.empty)


@pytest.mark.parametrize("name", ["mono16k.wav", "stereo48k.wav", "stereo44k.flac", "float48k.wav"])
@pytest.mark.parametrize("dtype", ["int16", "float32"])
def test_blockwise_decode_equals_soundfile_read(files, small_blocks, name, dtype):
    path = files[name]
    got = streamed(path, AudioField(channels="keep", dtype=dtype))
    want = sf.read(str(path), dtype="float32" if name.startswith("float") else dtype, always_2d=True)[0]
    if name.startswith("float") and dtype == "int16":
        want = to_int16(want)
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape
    assert np.array_equal(got, want)
    # ... and equals the whole-file path byte for byte.
    whole = decode_audio(str(path), AudioField(channels="keep", dtype=dtype))
    assert whole.tobytes() == got.tobytes()


@pytest.mark.parametrize("dtype", ["int16", "float32"])
@pytest.mark.parametrize("name", ["stereo48k.wav", "stereo44k.flac"])
def test_stereo_mixed_to_mono_block_by_block(files, small_blocks, name, dtype):
    path = files[name]
    got = streamed(path, AudioField(channels="mono", dtype=dtype))
    mean = sf.read(str(path), dtype="float32", always_2d=True)[0].mean(axis=1)
    want = to_int16(mean) if dtype == "int16" else mean
    assert got.shape == want.shape and np.array_equal(got, want)
    assert streamed(path, AudioField(channels="first", dtype=dtype)).tobytes() == \
        decode_audio(str(path), AudioField(channels="first", dtype=dtype)).tobytes()


@pytest.mark.parametrize("name,channels", [("mono16k.wav", "mono"), ("stereo48k.wav", "mono"),
                                           ("stereo44k.flac", "keep")])
@pytest.mark.parametrize("dtype", ["int16", "float32"])
def test_resampled_block_by_block_equals_soxr_on_the_whole_signal(files, small_blocks, name, channels, dtype):
    path = files[name]
    fc = AudioField(channels=channels, dtype=dtype, sample_rate=22050, resample=True)
    got = streamed(path, fc)
    x = sf.read(str(path), dtype="float32", always_2d=True)[0]
    sr = sf.info(str(path)).samplerate
    if channels == "mono":
        x = x.mean(axis=1, keepdims=True)
    y = np.asarray(soxr.resample(x, sr, 22050, quality="HQ"), dtype=np.float32).reshape(-1, x.shape[1])
    want = to_int16(y) if dtype == "int16" else y
    want = want[:, 0] if channels != "keep" else want
    assert got.shape == want.shape and np.array_equal(got, want)
    assert decode_audio(str(path), fc).tobytes() == got.tobytes()


@pytest.mark.parametrize("length", [1000, 16000 * 25])  # crops, and pads past the end
def test_fixed_length_crop_and_pad_block_by_block(files, small_blocks, length):
    path = files["mono16k.wav"]
    for fc in (AudioField(length=length), AudioField(length=length, sample_rate=8000, resample=True)):
        got = streamed(path, fc)
        assert got.shape == (length,)
        assert got.tobytes() == decode_audio(str(path), fc).tobytes()


def test_a_plain_wav_streams_without_being_asked(tmp_path, monkeypatch):
    path = write(tmp_path / "a.wav", 40, 16000, 1)  # 1.3 MB decoded
    calls = []
    real = blocks.from_pcm16
    monkeypatch.setattr(blocks, "from_pcm16", lambda *a: calls.append(1) or real(*a))
    got = decode_audio(str(path), AudioField())
    assert calls and np.array_equal(got, sf.read(str(path), dtype="int16")[0])


def cut(src: Path, dst: Path, keep: float) -> Path:
    data = src.read_bytes()
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data[: int(len(data) * keep)])
    return dst


@pytest.mark.parametrize("name", ["stereo48k.wav", "stereo44k.flac"])
def test_file_whose_header_lies_about_its_length_is_a_reject(files, tmp_path, name):
    bad = cut(files[name], tmp_path / f"cut-{name}", 0.6)
    reasons = []
    for alloc in (None, np.empty):
        with pytest.raises(DecodeError) as e:
            decode_audio(str(bad), AudioField(channels="keep"), alloc=alloc)
        reasons.append(e.value.reason)
    assert reasons[0] == reasons[1]
    assert "truncated" in reasons[0], reasons[0]
    if name.endswith(".wav"):
        assert "data chunk declares" in reasons[0]


def _task(root: Path, names: list[str], fc: AudioField, run_id: str) -> BatchTask:
    items = tuple(((n,), 0, ()) for n in names)
    return BatchTask(0, "train", 0, items, str(root), (("audio", fc),), run_id, transport="shm")


def test_worker_decodes_a_batch_with_a_long_file_straight_into_a_growing_segment(tmp_path, small_blocks):
    """Rejected items between good ones leave no hole; a segment grown after the writer
    mapped it is mapped again."""
    big = write(tmp_path / "big.wav", 50, 48000, 2, seed=5)  # 9.6 MB on disk
    assert os.path.getsize(big) >= STREAM_FILE_BYTES
    write(tmp_path / "small.wav", 1.5, 48000, 2, seed=6)
    cut(big, tmp_path / "cut.wav", 0.5)
    (tmp_path / "junk.wav").write_bytes(b"not audio at all")
    write(tmp_path / "bigger.wav", 100, 48000, 2, seed=7)  # grows the reused segment
    fc = AudioField(channels="keep", dtype="float32", sample_rate=48000)
    run_id = new_run_id()
    segments = []
    try:
        for names in (["small.wav", "cut.wav", "big.wav", "junk.wav", "small.wav"], ["bigger.wav", "small.wav"]):
            r = decode_batch(_task(tmp_path, names, fc, run_id))
            kept = [n for n in names if n not in ("cut.wav", "junk.wav")]
            assert [rej.path for rej in r.rejects] == [n for n in names if n not in kept]
            assert {rej.path: rej.reason for rej in r.rejects}.get("cut.wav", "truncated").startswith("truncated")
            segments.append(r.packed.shm_name)
            att = Attached(r.packed)
            samples = att.samples(r.packed.blocks[0])
            for name, got in zip(kept, samples):
                assert np.array_equal(got, sf.read(str(tmp_path / name), dtype="float32", always_2d=True)[0])
            att.release()
        assert segments[0] == segments[1]  # reused, grown past the writer's cached mapping
    finally:
        remove_segments(run_id)


def test_conversion_of_long_recordings_stores_exactly_what_soundfile_reads(tmp_path):
    root = tmp_path / "corpus"
    long_a = write(root / "train" / "a" / "long.wav", 60, 48000, 2, seed=8)  # 11.5 MB on disk
    write(root / "train" / "a" / "short.wav", 2, 48000, 2, seed=9)
    cut(long_a, root / "train" / "b" / "cut.wav", 0.9)  # big enough to stream its batch
    write(root / "train" / "b" / "long.flac", 60, 48000, 2, seed=10)
    job = tmp_path / "job.yaml"
    job.write_text(f"name: long\nsource:\n  root: {root}\n  layout: class_folders\nfields:\n  audio:\n"
                   "    type: audio\n    extensions: [.wav, .flac]\n    sample_rate: 48000\n    channels: keep\n"
                   f"    dtype: float32\noutput:\n  path: {tmp_path / 'out.h5'}\n  codec: none\n"
                   "cluster:\n  kind: local\n  workers: 2\n  batch_size: 2\npolicy:\n  max_reject_fraction: 0.5\n")
    s = convert(load_job(job), ConvertOptions(progress=False))
    assert s.counts == {"train": 3} and s.rejects == 1
    with h5py.File(tmp_path / "out.h5", "r") as f:
        g = f["train"]
        rej = dict(zip(f["rejects/path"].asstr()[...], f["rejects/reason"].asstr()[...]))
        assert list(rej) == ["train/b/cut.wav"] and "truncated audio" in rej["train/b/cut.wav"]
        a = g["audio"]
        for i, src in enumerate(g["source"].asstr()[...]):
            lo, hi = a["offsets"][i], a["offsets"][i + 1]
            got = a["values"][lo:hi].reshape(a["shapes"][i])
            assert np.array_equal(got, sf.read(str(root / src), dtype="float32", always_2d=True)[0]), src


def test_the_stream_decision_takes_the_sizes_discovery_saw(tmp_path, small_blocks):
    """A batch streams when its largest file, as discovery saw it (BatchTask.largest, from
    plan.largest_files), is big: no stat of every file per batch. Without those sizes the
    worker stats the files as before; either way every sample decodes to what soundfile reads."""
    import dataclasses

    from h5batch.config import job_from_dict
    from h5batch.conversion.plan import largest_files, make_tasks
    from h5batch.conversion.worker import _StreamRows
    from h5batch.layouts import discover
    from h5batch.manifest import Items

    big = write(tmp_path / "c" / "big.wav", 50, 48000, 2, seed=5)
    write(tmp_path / "c" / "small.wav", 1.5, 48000, 2, seed=6)
    job = job_from_dict({"source": {"root": str(tmp_path / "c"), "layout": "pattern", "pattern": r".*\.wav"},
                         "fields": {"audio": {"type": "audio", "channels": "keep", "dtype": "float32",
                                              "sample_rate": 48000}},
                         "output": {"path": str(tmp_path / "o.h5")}})
    m = discover(job)
    assert largest_files(m.items) == (os.path.getsize(big),)
    assert largest_files(m.items[1:]) == (os.path.getsize(tmp_path / "c" / "small.wav"),)
    assert largest_files(Items(dataclasses.replace(it, stats=()) for it in m.items)) == ()  # sizes unknown: the worker stats the files
    task = make_tasks(job, m, new_run_id(), "", 8)[0]
    assert task.largest == (os.path.getsize(big),)
    run_id = task.run_id
    try:
        for largest, streams in (((os.path.getsize(big),), True), ((100,), False), ((), True)):
            t = dataclasses.replace(task, largest=largest, transport="shm")
            assert (_StreamRows.maybe(t, "shm") is not None) == streams
            r = decode_batch(t)
            att = Attached(r.packed)
            samples = att.samples(r.packed.blocks[0])
            assert len(samples) == 2
            for it, got in zip(m.items, samples):
                want = sf.read(str(tmp_path / "c" / it.paths[0]), dtype="float32", always_2d=True)[0]
                assert np.array_equal(got, want)
            att.release()
    finally:
        remove_segments(run_id)
