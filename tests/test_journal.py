"""The undo journal of an in-place sync (h5batch/writer/journal.py): overwrites of the old
bytes are held back until their records are durable, reads see them meanwhile, and a crash
at any point is undone byte for byte by ``rollback``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np

from h5batch.writer import journal
from h5batch.writer.journal import JournalFile, has_journal, rollback


def _old_file(path) -> bytes:
    data = bytes(range(256)) * 64  # 16 KiB
    path.write_bytes(data)
    return data


def test_overwrites_are_held_back_and_read_back_until_applied(tmp_path):
    path = tmp_path / "out.h5"
    old = _old_file(path)
    jf = JournalFile(str(path))
    jf.seek(100)
    jf.write(b"A" * 50)  # old bytes: held back
    jf.seek(len(old) - 10)
    jf.write(b"B" * 30)  # 10 old bytes held back, 20 past the old end written at once
    jf.seek(120)
    jf.write(b"C" * 10)  # over a held-back write: the later one wins
    assert path.read_bytes()[:len(old)] == old, "no old byte is overwritten before its record is durable"
    assert path.read_bytes()[len(old):] == b"B" * 20
    want = bytearray(old + b"B" * 20)
    want[100:150] = b"A" * 50
    want[len(old) - 10:] = b"B" * 30
    want[120:130] = b"C" * 10
    jf.seek(0)
    assert jf.read() == bytes(want), "reads see the held-back writes"
    jf.seek(90)
    buf = bytearray(70)
    assert jf.readinto(buf) == 70 and bytes(buf) == bytes(want[90:160])
    jf.flush()  # h5py's flush: the records fsync'ed, then the writes made
    assert not jf.pending and path.read_bytes() == bytes(want)
    jf.commit()
    assert not has_journal(str(path)) and path.read_bytes() == bytes(want)


def test_a_crash_before_or_after_the_writes_is_undone_byte_for_byte(tmp_path):
    for applied in (False, True):
        path = tmp_path / f"out-{applied}.h5"
        old = _old_file(path)
        jf = JournalFile(str(path))
        for off in (0, 4000, 8000, 16000):
            jf.seek(off)
            jf.write(b"x" * 1000)
        if applied:
            jf.flush()
            jf.seek(200)
            jf.write(b"y" * 10)  # journaled, held back, never made: the crash comes first
            assert path.read_bytes() != old
        os.close(jf.jfd)  # the process dies: no commit
        os.close(jf.fd)
        assert has_journal(str(path))
        assert rollback(str(path))
        assert path.read_bytes() == old
        assert not has_journal(str(path))


def test_held_back_writes_are_made_once_they_add_up(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "PENDING_MAX", 4096)
    path = tmp_path / "out.h5"
    old = _old_file(path)
    jf = JournalFile(str(path))
    jf.seek(0)
    jf.write(b"z" * 3000)
    assert path.read_bytes() == old
    jf.write(b"z" * 2000)
    assert path.read_bytes()[:5000] == b"z" * 5000 and not jf.pending
    jf.truncate(1000)  # below the old end: from here on each overwrite is made at once
    jf.seek(500)
    jf.write(b"w" * 1000)
    assert path.read_bytes() == b"z" * 500 + b"w" * 1000
    os.close(jf.jfd)
    os.close(jf.fd)
    rollback(str(path))
    assert path.read_bytes() == old


def test_an_hdf5_file_changed_through_the_journal_is_read_back_and_undone(tmp_path):
    """h5py writing through the journal (appends, a resize, new datasets, attributes) reads
    its own held-back metadata correctly; a process killed before the commit leaves a file
    that rollback makes the old one again, byte for byte."""
    path = tmp_path / "out.h5"
    with h5py.File(path, "w", libver=("earliest", "v110")) as f:
        f.create_dataset("x", data=np.arange(1000), maxshape=(None,), chunks=(100,))
        f.attrs["n"] = 1000
    old = path.read_bytes()
    script = textwrap.dedent(r"""
        import os, sys
        import h5py, numpy as np
        from h5batch.writer.journal import JournalFile
        path, how = sys.argv[1], sys.argv[2]
        jf = JournalFile(path)
        f = h5py.File(jf, "r+")
        for k in range(20):
            d = f["x"]
            d.resize((d.shape[0] + 100,))
            d[-100:] = np.arange(100) + 1000 * (k + 1)
            f.create_dataset(f"extra{k}", data=np.full(50, k))
            f.attrs["n"] = d.shape[0]
            if k == 10:
                f.flush()
        assert f["x"][1000:1100].tolist() == list(range(1000, 1100))
        assert f["extra3"][...].tolist() == [3] * 50
        if how == "kill":
            f.flush()
            os.kill(os.getpid(), 9)
        f.close()
        jf.commit()
    """)
    p = subprocess.run([sys.executable, "-c", script, str(path), "kill"], capture_output=True, text=True)
    assert p.returncode == -9, p.stderr
    assert path.read_bytes() != old and has_journal(str(path))
    assert rollback(str(path))
    assert path.read_bytes() == old
    p = subprocess.run([sys.executable, "-c", script, str(path), "commit"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    with h5py.File(path, "r") as f:
        assert f.attrs["n"] == 3000
        assert f["x"][...].tolist()[-100:] == list(range(20000, 20100))
        assert sorted(k for k in f if k.startswith("extra")) == sorted(f"extra{k}" for k in range(20))
