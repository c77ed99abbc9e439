"""Miniature replicas of real corpora's layouts, written at test time: the same folder
names, file names, sidecar and table formats as the downloads (Speech Commands v0.02,
LibriSpeech, Common Voice, ESC-50, CelebA), a handful of short files each.

Each ``make_<corpus>(root)`` writes the corpus under ``root`` and returns what a correct
conversion must hold, per sample key or source path, so tests assert on content.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import soundfile as sf
from PIL import Image

# CelebA's 40 attributes, in list_attr_celeba.txt's order.
CELEBA_ATTRS = (
    "5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose "
    "Black_Hair Blond_Hair Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses Goatee "
    "Gray_Hair Heavy_Makeup High_Cheekbones Male Mouth_Slightly_Open Mustache Narrow_Eyes No_Beard "
    "Oval_Face Pale_Skin Pointy_Nose Receding_Hairline Rosy_Cheeks Sideburns Smiling Straight_Hair "
    "Wavy_Hair Wearing_Earrings Wearing_Hat Wearing_Lipstick Wearing_Necklace Wearing_Necktie Young"
).split()


def _tone(seconds: float, rate: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    x = 0.3 * np.sin(2 * np.pi * (200 + 40 * seed) * t) + 0.02 * rng.standard_normal(t.size)
    return (x * 32767).astype(np.int16)


def _write(path: Path, seconds: float, rate: int, seed: int, fmt: str | None = None) -> np.ndarray:
    path.parent.mkdir(parents=True, exist_ok=True)
    x = _tone(seconds, rate, seed)
    sf.write(path, x, rate, format=fmt) if fmt else sf.write(path, x, rate, subtype="PCM_16")
    return x


def make_speech_commands(root: Path) -> dict:
    """``<word>/<speaker>_nohash_<n>.wav``, the two list files, ``_background_noise_``."""
    words, speakers = ["no", "up", "yes"], ["0a7c2a8d", "1b4c9b89", "c50f55b8"]
    paths = []
    for w, word in enumerate(words):
        for s, spk in enumerate(speakers):
            rel = f"{word}/{spk}_nohash_{s % 2}.wav"
            _write(root / rel, 0.25 + 0.05 * s, 16000, 3 * w + s)  # shorter than 1 s: padded
            paths.append(rel)
    _write(root / "_background_noise_" / "white_noise.wav", 1.5, 16000, 99)
    (root / "_background_noise_" / "README.md").write_text("noise files\n")
    (root / "README.md").write_text("Speech Commands\n")
    (root / "LICENSE").write_text("CC BY 4.0\n")
    val, test = [paths[1], paths[5]], [paths[2], paths[7]]
    (root / "validation_list.txt").write_text("\n".join(val) + "\n")
    (root / "testing_list.txt").write_text("\n".join(test) + "\n")
    split = {p: "val" if p in val else "test" if p in test else "train" for p in paths}
    return {"split": split, "speaker": {p: p.split("/")[1].split("_")[0] for p in paths},
            "label": {p: p.split("/")[0] for p in paths}, "excluded": 4}


def make_librispeech(root: Path) -> dict:
    """``<subset>/<speaker>/<chapter>/<spk>-<ch>-<utt>.flac`` + per-chapter ``.trans.txt``."""
    layout = {"train-clean-100": [(19, 198), (26, 495)], "dev-clean": [(84, 121123)]}
    text, split, speaker, chapter = {}, {}, {}, {}
    seed = 0
    for subset, pairs in layout.items():
        for spk, ch in pairs:
            folder = root / subset / str(spk) / str(ch)
            lines = []
            for utt in range(3):
                uid = f"{spk}-{ch}-{utt:04d}"
                rel = f"{subset}/{spk}/{ch}/{uid}.flac"
                seed += 1
                _write(root / rel, 0.2 + 0.03 * utt, 16000, seed, fmt="FLAC")
                words = f"CHAPTER {utt} THE ÉLAN OF SPEAKER {spk} {'WORD ' * utt}".strip()
                lines.append(f"{uid} {words}")
                text[rel], split[rel], speaker[rel], chapter[rel] = words, subset, spk, ch
            (folder / f"{spk}-{ch}.trans.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for name in ("SPEAKERS.TXT", "CHAPTERS.TXT", "BOOKS.TXT", "README.TXT", "LICENSE.TXT"):
        (root / name).write_text(f"; {name}\n")
    return {"text": text, "split": split, "speaker": speaker, "chapter": chapter, "excluded": 5}


CV_COLUMNS = ["client_id", "path", "sentence", "up_votes", "down_votes", "age", "gender", "accents",
              "variant", "locale", "segment"]


def make_common_voice(root: Path) -> dict:
    """``clips/*.mp3`` + ``train/dev/test.tsv`` and the other tables of a language folder."""
    rows = {"train": [], "dev": [], "test": [], "other": []}
    clients = ["a1" * 32, "b2" * 32, "c3" * 32]
    ages, genders = ["twenties", "", "fourties"], ["male_masculine", "female_feminine", ""]
    for i in range(8):
        name = f"common_voice_en_{1000 + i}.mp3"
        _write(root / "clips" / name, 0.6, 32000, i, fmt="MP3")
        table = ["train", "train", "train", "dev", "test", "test", "other", "other"][i]
        rows[table].append({"client_id": clients[i % 3], "path": name,
                            "sentence": f"Sentence number {i}, with \"quotes\" and a comma.",
                            "up_votes": str(2 + i), "down_votes": "0", "age": ages[i % 3],
                            "gender": genders[i % 3], "accents": "", "variant": "", "locale": "en",
                            "segment": ""})
    for table in ("train", "dev", "test", "other", "validated", "invalidated", "reported"):
        # Common Voice's TSVs are tab-separated with no quoting: quotes in a sentence are text.
        lines = ["\t".join(CV_COLUMNS)] + ["\t".join(r[c] for c in CV_COLUMNS)
                                          for r in rows.get(table, rows["train"] if table == "validated" else [])]
        (root / f"{table}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "clip_durations.tsv").write_text("clip\tduration[ms]\n")
    (root / "times.txt").write_text("0\n")
    expect = {}
    for table in ("train", "dev", "test"):
        for r in rows[table]:
            expect[f"clips/{r['path']}"] = {**r, "split": "val" if table == "dev" else table}
    return {"rows": expect, "excluded": [f"clips/{r['path']}" for r in rows["other"]]}


ESC_CATEGORIES = {0: "dog", 1: "rooster", 10: "rain", 41: "chainsaw"}


def make_esc50(root: Path) -> dict:
    """``audio/<fold>-<src>-<take>-<target>.wav`` + ``meta/esc50.csv`` + the repo's files."""
    (root / "meta").mkdir(parents=True)
    rows = []
    for i, (fold, target, take) in enumerate([(1, 0, "A"), (1, 41, "B"), (2, 10, "A"), (3, 1, "A"),
                                              (4, 0, "C"), (5, 41, "A")]):
        src = 100032 + i
        name = f"{fold}-{src}-{take}-{target}.wav"
        _write(root / "audio" / name, 0.2, 44100, i)
        rows.append({"filename": name, "fold": fold, "target": target, "category": ESC_CATEGORIES[target],
                     "esc10": "True" if target in (0, 1, 10) else "False", "src_file": src, "take": take})
    with open(root / "meta" / "esc50.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for name in ("README.md", "LICENSE", "requirements.txt", "pytest.ini"):
        (root / name).write_text(name + "\n")
    Image.new("RGB", (4, 4)).save(root / "esc50.gif")
    (root / "tests").mkdir()
    (root / "tests" / "test_dataset.py").write_text("def test(): pass\n")
    return {"rows": {f"audio/{r['filename']}": r for r in rows}, "excluded": 6}


def make_celeba(root: Path, n: int = 9) -> dict:
    """``img_align_celeba/*.jpg`` + attribute, partition and identity tables."""
    rng = np.random.default_rng(7)
    (root / "img_align_celeba").mkdir(parents=True)
    attrs = rng.choice([-1, 1], size=(n, len(CELEBA_ATTRS)))
    names = [f"{i + 1:06d}.jpg" for i in range(n)]
    for _i, name in enumerate(names):
        px = rng.integers(0, 256, size=(22, 18, 3), dtype=np.uint8)
        Image.fromarray(px).save(root / "img_align_celeba" / name, quality=90)
    lines = [str(n), " ".join(CELEBA_ATTRS)]
    lines += [f"{name} " + " ".join(f"{v:2d}" for v in row) for name, row in zip(names, attrs)]
    (root / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    partition = [0, 0, 0, 0, 0, 1, 1, 2, 2][:n]
    (root / "list_eval_partition.txt").write_text("".join(f"{a} {p}\n" for a, p in zip(names, partition)))
    identity = [(i * 7) % 4 + 1 for i in range(n)]
    (root / "identity_CelebA.txt").write_text("".join(f"{a} {p}\n" for a, p in zip(names, identity)))
    (root / "list_bbox_celeba.txt").write_text(f"{n}\nimage_id x_1 y_1 width height\n")
    (root / "list_landmarks_align_celeba.txt").write_text(f"{n}\nlefteye_x lefteye_y\n")
    splits = {0: "train", 1: "val", 2: "test"}
    return {"attrs": {f"img_align_celeba/{a}": (row > 0).astype(np.uint8) for a, row in zip(names, attrs)},
            "split": {f"img_align_celeba/{a}": splits[p] for a, p in zip(names, partition)},
            "identity": {f"img_align_celeba/{a}": v for a, v in zip(names, identity)}, "excluded": 2}


REPLICAS = {"speech_commands": make_speech_commands, "librispeech": make_librispeech,
            "common_voice": make_common_voice, "esc50": make_esc50, "celeba": make_celeba}
