"""The registry of field kinds (``h5batch.fields``): the shipped kinds answer every question
the rest of h5batch asks, from real files written here; a kind defined in this module and
registered at run time is accepted by the job-file checks and decoded, with no edit
outside its own code; errors name the registered kinds."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from h5batch import fields
from h5batch.config import job_from_dict
from h5batch.errors import ConfigError, DecodeError
from h5batch.fields import (
    KINDS,
    FieldKind,
    decode_field,
    field_attrs,
    fixed_sample_shape,
    is_fixed_shape,
    kind_of,
    needed_packages,
    reader_hooks,
    rows_per_chunk,
)
from h5batch.fields.audio import AudioField
from h5batch.fields.files import check_readable
from h5batch.fields.image import ImageField
from h5batch.torch.batch import divide_in_place, float_copy

# ---------------------------------------------------------------------------
# A throwaway kind: the whole of it is this class pair (what a new module would hold)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoField:
    """UTF-8 text as its bytes, cropped or zero-padded to ``length``."""

    type: Literal["memo"] = "memo"
    extensions: list[str] = field(default_factory=lambda: [".memo"])
    length: int | None = None
    folder: str | None = None
    column: str | None = None


class MemoKind(FieldKind):
    name = "memo"
    config_class = MemoField

    def validate(self, fc: MemoField, file: str, key: str) -> None:
        if fc.length is not None and fc.length <= 0:
            raise ConfigError(file, f"{key}.length", f"must be positive, got {fc.length}")

    def decode(self, path: str, fc: MemoField) -> np.ndarray:
        head, _ = check_readable(path, 1 << 20)
        try:
            head.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DecodeError(path, f"not UTF-8 text: {e}") from e
        a = np.frombuffer(head, dtype=np.uint8)
        if fc.length is not None:
            a = np.concatenate([a[: fc.length], np.zeros(max(0, fc.length - len(a)), np.uint8)])
        return np.ascontiguousarray(a)

    def fixed_shape(self, fc: MemoField):
        return None if fc.length is None else ((fc.length,), np.dtype(np.uint8))

    def attrs(self, fc: MemoField) -> dict[str, Any]:
        return {"encoding": "utf-8"}

    def float_scale(self, dtype: np.dtype) -> float | None:
        return None  # byte values are codes, not intensities


@pytest.fixture
def text_kind():
    kind = fields.register(MemoKind())
    try:
        yield kind
    finally:
        fields.KINDS.pop("memo", None)


def _job(flds: dict[str, Any], root) -> dict[str, Any]:
    return {"source": {"root": str(root), "layout": "class_folders"}, "fields": flds,
            "output": {"path": str(root / "out.h5")}}


# ---------------------------------------------------------------------------
# The shipped kinds
# ---------------------------------------------------------------------------


def test_registry_lists_audio_and_image():
    assert list(KINDS) == ["audio", "image", "text", "value", "multilabel"]
    assert KINDS["audio"].config_class is AudioField and KINDS["image"].config_class is ImageField
    assert kind_of(AudioField()) is KINDS["audio"] and kind_of(ImageField()) is KINDS["image"]
    assert [k.modality for k in KINDS.values()][:2] == ["audio", "image"]
    with pytest.raises(TypeError, match="unknown field config"):
        kind_of(object())
    with pytest.raises(ValueError, match="clashes"):
        fields.register(type(KINDS["audio"])())

    class Nameless(FieldKind):
        config_class = MemoField

        def decode(self, path, fc):
            raise AssertionError

    with pytest.raises(TypeError, match="'type' field defaults to that name"):
        fields.register(Nameless())
    assert list(KINDS) == ["audio", "image", "text", "value", "multilabel"]


def test_audio_kind_from_a_real_wav(tmp_path):
    x = (np.sin(np.arange(5000) / 9) * 12000).astype(np.int16)
    path = str(tmp_path / "a.wav")
    sf.write(path, x, 16000, subtype="PCM_16")
    variable = AudioField(sample_rate=16000)
    assert np.array_equal(decode_field(path, variable), x)
    assert not is_fixed_shape(variable) and fixed_sample_shape(variable) is None
    fixed = AudioField(sample_rate=16000, length=6000)
    assert fixed_sample_shape(fixed) == ((6000,), np.dtype(np.int16))
    row = decode_field(path, fixed)
    assert row.shape == (6000,) and np.array_equal(row[:5000], x) and not row[5000:].any()
    assert field_attrs(fixed) == {"modality": "audio", "dtype": "int16", "channels": "mono", "sample_rate": 16000,
                                  "length_rule": "keep start; crop or zero-pad the end", "axes": "time"}
    assert list(field_attrs(AudioField(channels="keep"))) == ["modality", "dtype", "channels", "sample_rate",
                                                              "length_rule", "axes"]
    assert field_attrs(AudioField(channels="keep"))["axes"] == "time,channel"
    assert needed_packages(fixed) == {"soundfile", "libsndfile"}
    assert needed_packages(AudioField(sample_rate=8000, resample=True)) == {"soundfile", "libsndfile", "soxr"}
    assert reader_hooks("audio", np.int16, 1) == (32768.0, None)
    assert reader_hooks("audio", np.float32, 1) == (None, None)


def test_image_kind_from_a_real_png(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 256, size=(12, 20, 3), dtype=np.uint8)
    path = str(tmp_path / "a.png")
    Image.fromarray(rgb).save(path)
    assert np.array_equal(decode_field(path, ImageField()), rgb)
    gray = decode_field(path, ImageField(mode="L"))
    assert gray.shape == (12, 20, 1) and gray.dtype == np.uint8
    fixed = ImageField(size=[6, 10])
    assert fixed_sample_shape(fixed) == ((6, 10, 3), np.dtype(np.uint8))
    assert decode_field(path, fixed).shape == (6, 10, 3)
    assert field_attrs(ImageField()) == {"modality": "image", "mode": "RGB", "axes": "height,width,channel",
                                         "resize": "native size"}
    assert field_attrs(fixed)["resize"] == "shorter side to fit, centre crop"
    assert needed_packages(fixed) == {"pillow"}
    assert reader_hooks("image", np.uint8, 3) == (255.0, (2, 0, 1))
    assert rows_per_chunk((6, 10, 3), np.uint8, 1 << 10) == 1024 // 180


def test_kind_checks_run_from_the_job_file(tmp_path):
    with pytest.raises(ConfigError, match=r"fields\.a\.resample: needs sample_rate"):
        job_from_dict(_job({"a": {"type": "audio", "resample": True}}, tmp_path), check_paths=False)
    with pytest.raises(ConfigError, match=r"fields\.i\.size: must be \[height, width\] > 0"):
        job_from_dict(_job({"i": {"type": "image", "size": [0, 4]}}, tmp_path), check_paths=False)


def test_unknown_type_names_the_registered_kinds(tmp_path):
    with pytest.raises(ConfigError, match=r"fields\.v\.type: must be one of 'audio', 'image', 'text', 'value', 'multilabel', got 'video'"):
        job_from_dict(_job({"v": {"type": "video"}}, tmp_path), check_paths=False)
    with pytest.raises(ConfigError, match=r"fields\.v\.type: is required \(audio or image or text or value or multilabel\)"):
        job_from_dict(_job({"v": {"extensions": [".mp4"]}}, tmp_path), check_paths=False)
    with pytest.raises(ConfigError, match="must be one of"):
        job_from_dict(_job({"v": {"type": ["audio"]}}, tmp_path), check_paths=False)


def test_unknown_modality_falls_back_to_the_stored_dtype():
    assert reader_hooks("", np.int16, 1) == (32768.0, None)  # a file without the attribute
    assert reader_hooks("video", np.uint8, 3) == (255.0, None)
    assert reader_hooks("video", np.float32, 2) == (None, None)


# ---------------------------------------------------------------------------
# A kind added without touching anything else
# ---------------------------------------------------------------------------


def test_a_registered_kind_is_accepted_and_decoded(text_kind, tmp_path):
    assert "memo" in KINDS and kind_of(MemoField()) is text_kind
    job = job_from_dict(_job({"note": {"type": "memo", "length": 8}}, tmp_path), check_paths=False)
    fc = job.fields["note"]
    assert isinstance(fc, MemoField) and fc.length == 8 and fc.extensions == [".memo"]
    assert len(job.hash()) == 64 and job.to_dict()["fields"]["note"]["type"] == "memo"
    (tmp_path / "a.memo").write_text("héllo")
    want = np.frombuffer("héllo".encode() + b"\0\0", dtype=np.uint8)
    assert np.array_equal(decode_field(str(tmp_path / "a.memo"), fc), want)
    assert fixed_sample_shape(fc) == ((8,), np.dtype(np.uint8)) and is_fixed_shape(fc)
    # A kind whose decode breaks its own fixed shape: the file's reject, never a cast.
    short = dataclasses.replace(fc, length=None)
    text_kind.fixed_shape = lambda _fc: ((8,), np.dtype(np.uint8))
    try:
        with pytest.raises(DecodeError, match=r"decoded to \(6,\) uint8, the field stores \(8,\) uint8"):
            decode_field(str(tmp_path / "a.memo"), short)
    finally:
        del text_kind.fixed_shape
    assert field_attrs(fc) == {"modality": "memo", "encoding": "utf-8"}
    assert needed_packages(fc) == set()
    assert reader_hooks("memo", np.uint8, 1) == (None, None)  # the kind says: no scaling
    (tmp_path / "b.memo").write_bytes(b"\xff\xfe")
    with pytest.raises(DecodeError, match="not UTF-8 text"):
        decode_field(str(tmp_path / "b.memo"), fc)
    (tmp_path / "c.memo").write_bytes(b"")
    with pytest.raises(DecodeError, match=r"empty file \(0 bytes\)"):
        decode_field(str(tmp_path / "c.memo"), fc)


def test_a_registered_kind_validates_and_is_listed_in_errors(text_kind, tmp_path):
    with pytest.raises(ConfigError, match=r"fields\.note\.length: must be positive, got 0"):
        job_from_dict(_job({"note": {"type": "memo", "length": 0}}, tmp_path), check_paths=False)
    with pytest.raises(ConfigError, match=r"fields\.note\.size: unknown key"):
        job_from_dict(_job({"note": {"type": "memo", "size": 3}}, tmp_path), check_paths=False)
    with pytest.raises(ConfigError, match=r"must be one of 'audio', 'image', 'text', 'value', 'multilabel', 'memo', got 'video'"):
        job_from_dict(_job({"v": {"type": "video"}}, tmp_path), check_paths=False)
    with pytest.raises(ConfigError, match=r"is required \(audio or image or text or value or multilabel or memo\)"):
        job_from_dict(_job({"v": {}}, tmp_path), check_paths=False)


def test_unregistered_kind_is_gone(tmp_path):
    assert "memo" not in KINDS
    with pytest.raises(ConfigError, match="must be one of 'audio', 'image', 'text', 'value', 'multilabel', got 'memo'"):
        job_from_dict(_job({"note": {"type": "memo"}}, tmp_path), check_paths=False)
    with pytest.raises(TypeError):
        decode_field(str(tmp_path), MemoField())


def test_reader_scaling_by_the_kinds_divisor():
    src = np.array([[-32768, 0, 16384]], dtype=np.int16)
    # the usual divisors give exactly float32 x / divisor (int16: x * 2**-15, exact)
    for divisor, values in ((32768.0, src), (255.0, np.array([[0, 51, 255]], np.uint8))):
        got = np.empty(values.shape, np.float32)
        float_copy(divisor)(got, values)
        assert got.tobytes() == (values.astype(np.float32) / np.float32(divisor)).tobytes(), divisor
    dst = np.empty(src.shape, dtype=np.float32)
    float_copy(2.0)(dst, np.array([[1, 3, -8]], dtype=np.float16))
    assert dst.tolist() == [[0.5, 1.5, -4.0]]
    a = src.astype(np.float32)
    divide_in_place(a, 32768.0)
    assert a.tolist() == [[-1.0, 0.0, 0.5]]
    b = np.array([51.0], dtype=np.float32)
    divide_in_place(b, 255.0)
    assert b[0] == np.float32(51) / np.float32(255)


def test_the_registry_imports_neither_config_nor_decoder_libraries():
    code = ("import sys, h5batch.fields, h5batch.torch.dataset; "
            "print(sorted(m for m in ('h5batch.config', 'soundfile', 'soxr', 'PIL') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
