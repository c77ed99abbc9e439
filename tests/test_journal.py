"""The undo journal of an in-place sync (h5batch/writer/journal.py): no old byte is
overwritten before its record is durable, and a crash at any point is undone byte for byte
by ``rollback``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np

from h5batch.writer.journal import JournalFile, has_journal, rollback


def _old_file(path) -> bytes:
    data = bytes(range(256)) * 64  # 16 KiB
    path.write_bytes(data)
    return data


def test_writes_are_made_after_their_old_bytes_are_journaled(tmp_path):
    path = tmp_path / "out.h5"
    old = _old_file(path)
    jf = JournalFile(str(path))
    jf.seek(100)
    jf.write(b"A" * 50)
    jf.seek(len(old) - 10)
    jf.write(b"B" * 30)  # 10 old bytes, 20 past the old end
    jf.seek(120)
    jf.write(b"C" * 10)  # over bytes journaled already
    want = bytearray(old + b"B" * 20)
    want[100:150] = b"A" * 50
    want[len(old) - 10:] = b"B" * 30
    want[120:130] = b"C" * 10
    assert path.read_bytes() == bytes(want)
    jf.seek(90)
    buf = bytearray(70)
    assert jf.readinto(buf) == 70 and bytes(buf) == bytes(want[90:160])
    jf.commit()
    assert not has_journal(str(path)) and path.read_bytes() == bytes(want)


def test_a_crash_is_undone_byte_for_byte(tmp_path):
    path = tmp_path / "out.h5"
    old = _old_file(path)
    jf = JournalFile(str(path))
    for off in (0, 4000, 8000, 16000):
        jf.seek(off)
        jf.write(b"x" * 1000)
    jf.seek(200)
    jf.write(b"y" * 10)
    jf.truncate(1000)  # below the old end, then written again
    jf.seek(500)
    jf.write(b"w" * 1000)
    assert path.read_bytes() != old
    os.close(jf.jfd)  # the process dies: no commit
    os.close(jf.fd)
    assert has_journal(str(path))
    assert rollback(str(path))
    assert path.read_bytes() == old
    assert not has_journal(str(path))


def test_an_hdf5_file_changed_through_the_journal_is_read_back_and_undone(tmp_path):
    """h5py writing through the journal (appends, a resize, new datasets, attributes) reads
    its own metadata back; a process killed before the commit leaves a file
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
