"""Write errors: a full disk or a read-only output directory fail cleanly, and a partial
file stays resumable. Uses real tmpfs mounts (root only; skipped elsewhere)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from h5batch import generate
from tests.conftest import REPO
from tests.support import run
from tests.support.h5compare import assert_same_h5

JOB = REPO / "jobs" / "paired_audio.yaml"


@pytest.fixture
def tmpfs(tmp_path):
    """A 6 MB tmpfs, unmounted afterwards."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6M", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or 'not root'}); disk-full test needs one")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def convert(root: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return run.convert(JOB, *extra, workers=1, output=out, root=root, settings=("policy.commit_every=0",))


def test_disk_full_fails_cleanly_and_resumes_identically(tmpfs, tmp_path):
    root = tmp_path / "corpus"
    generate.make_paired_audio(root, n_train=100, n_test=0, seconds=1.0, seed=11)
    ref = tmp_path / "ref.h5"
    assert convert(root, ref).returncode == 0

    out = tmpfs / "out.h5"
    res = convert(root, out)
    assert res.returncode == 1
    assert "No space left on device" in res.stderr and "run the same command again to resume" in res.stderr
    assert "Traceback" not in res.stderr
    assert Path(str(out) + ".partial").exists() and Path(str(out) + ".partial.commit.json").exists()

    subprocess.run(["mount", "-o", "remount,size=64M", str(tmpfs)], check=True)
    res = convert(root, out)
    assert res.returncode == 0, res.stderr
    assert "already committed" in res.stderr
    assert_same_h5(ref, out)


def test_read_only_output_directory_is_refused_before_any_work(tmpfs, tmp_path):
    root = tmp_path / "corpus"
    generate.make_paired_audio(root, n_train=4, n_test=0, seconds=0.25, seed=12)
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    res = convert(root, tmpfs / "out.h5")
    assert res.returncode == 2
    assert "not writable" in res.stderr
    assert os.listdir(tmpfs) == []
