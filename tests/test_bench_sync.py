"""``python -m h5batch.bench.sync`` (the sync's cost against a full conversion): on a
small corpus of each shape it converts, syncs with nothing changed, puts the held 1 % back
and syncs it in, and leaves the corpus as it found it (the held files moved out again)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_sync_bench_measures_each_shape_and_restores_its_corpus(tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "h5batch.bench.sync", "--files", "400", "--syncs", "1", "--fulls", "1",
                        "--dir", str(tmp_path / "b"), "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    results = {r["shape"]: r for r in json.loads(out.read_text())}
    assert set(results) == {"fsdd", "speech_commands"}
    for name, r in results.items():
        assert r["added"] == 4 and r["files"] == 400
        assert r["full"] > 0 and len(r["syncs"]) == 1 and r["syncs"][0]["wall"] > 0
        assert f"[{name}] 400 files: full conversion" in p.stdout
        assert 0 < r["floor"] < r["full"] and f"[{name}]   floor of a one-shot sync" in p.stdout
        assert set(r["memory"]) == {"start", "end"} and r["memory"]["end"]["hot_ms"] > 0
        assert f"[{name}]   memory at the start: 16 MiB written into the page cache" in p.stdout
        base = tmp_path / "b" / f"{name}-400"
        held = json.loads((base / "generated.json").read_text())["held"]
        assert all((base / "held" / rel).is_file() and not (base / "corpus" / rel).exists() for rel in held)
    # Speech Commands' layout: word folders, the two lists, the noise folder the job excludes
    sc = tmp_path / "b" / "speech_commands-400" / "corpus"
    assert (sc / "validation_list.txt").read_text().count("\n") == 40
    assert (sc / "_background_noise_" / "README.md").is_file()
