"""The commands on a sharded output (``output.writers`` > 1, h5batch/shards.py): ``export``,
``preview``, ``h5batch.hf``, ``view`` give what they give for the one-writer output of the
same corpus; ``compact`` makes it one file with the one-writer file's values, order and
layout; ``sync`` adds a shard and gives what a sync of the one-writer output gives, and a
``kill -9`` inside it leaves the output as it was; a missing shard fails each of them naming
it (exit 1, never fill values).
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from h5batch import format as fmt
from h5batch.export import export
from h5batch.shards import shard_path, sync_shard_path
from h5batch.torch import H5Dataset
from tests.support.processes import kill_group, wait_for
from tests.support.run import h5batch_cmd, run, start
from tests.test_shards import JOB, _same, cmd, corpus, digest, outputs  # noqa: F401  -- module fixtures: writers 1, 2, 4


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def members(folder: Path) -> dict[str, bytes]:
    """Every member of every tar shard under ``folder``: name -> bytes (mtimes differ: each
    export stamps its output file's)."""
    out = {}
    for tar in sorted(folder.glob("*.tar")):
        with tarfile.open(tar) as t:
            out.update({f"{tar.name}/{m.name}": t.extractfile(m).read() for m in t.getmembers()})
    return out


def copy_output(path: Path, n: int, dest: Path) -> Path:
    """The output ``path`` and its ``n`` shards copied into the folder ``dest``."""
    dest.mkdir()
    for p in [path, *(Path(shard_path(str(path), k, n)) for k in range(n) if n > 1)]:
        shutil.copy2(p, dest / p.name)
    return dest / path.name


def test_export_preview_and_hf_of_two_writers_equal_one_writers(outputs, tmp_path):  # noqa: F811
    from h5batch.tools.preview import build_preview

    got = {}
    for n in (1, 2):
        export(outputs[n], "files", tmp_path / f"files{n}")
        export(outputs[n], "webdataset", tmp_path / f"wds{n}", shard_size=64)
        build_preview(str(outputs[n]), str(tmp_path / f"page{n}"), ["test"], 6)
        got[n] = (tree(tmp_path / f"files{n}"), members(tmp_path / f"wds{n}"),
                  tree(tmp_path / f"page{n}" / "preview-files"))
    assert len(got[1][0]) == 199 + 40 + 1 + 199 + 40  # data + target wavs of each pair, labels.csv
    assert len(got[1][1]) == 3 * 239 and len(got[1][2]) > 6
    assert got[2] == got[1]
    datasets = pytest.importorskip("datasets")
    from h5batch.hf import to_dataset

    one, two = (to_dataset(outputs[n], "train", cache_dir=tmp_path / "hf") for n in (1, 2))
    assert isinstance(two, datasets.Dataset) and len(two) == len(one) == 199
    for a, b in zip(one, two, strict=True):
        assert a["source"] == b["source"] and a["data"]["sampling_rate"] == b["data"]["sampling_rate"]
        np.testing.assert_array_equal(a["data"]["array"], b["data"]["array"])
        np.testing.assert_array_equal(a["target"]["array"], b["target"]["array"])


def test_a_view_of_a_sharded_output_reads_the_same_samples(outputs, tmp_path):  # noqa: F811
    paths = {n: copy_output(outputs[n], n, tmp_path / f"w{n}") for n in (1, 4)}
    for path in paths.values():
        res = run(h5batch_cmd("view", "add", str(path), "fold", "--where", "index % 3 == 1 or index > 150"))
        assert res.returncode == 0 and "train/fold: 98 rows" in res.stderr, res.stderr
    one, four = (H5Dataset(paths[n], "train", view="fold", with_source=True) for n in (1, 4))
    assert len(one) == len(four) == 98
    for i in range(len(one)):
        _same(one[i], four[i])
    starts = four.chunk_starts()  # positions in the view, ascending, each shard starting a group
    assert starts[0] == 0 and np.all(np.diff(starts) > 0) and starts[-1] < len(four)
    assert len([s for b in four.loader(batch_size=16) for s in b["data"]]) == 98
    for k in range(4):  # the view lives in the joined file; no shard was written
        assert Path(shard_path(str(paths[4]), k, 4)).read_bytes() == Path(shard_path(str(outputs[4]), k, 4)).read_bytes()
    res = run(h5batch_cmd("verify", str(paths[4])))
    assert res.returncode == 0, res.stderr
    res = run(h5batch_cmd("view", "list", str(paths[4])))
    assert res.stdout == "train/fold\t98\n"
    assert run(h5batch_cmd("view", "remove", str(paths[4]), "fold")).returncode == 0
    assert run(h5batch_cmd("view", "list", str(paths[4]))).stdout == ""


def layout(path: Path) -> dict[str, tuple]:
    """Every dataset's shape, chunks, maximum shape, filters and attributes."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                plist = obj.id.get_create_plist()
                filters = [plist.get_filter(i)[:3] for i in range(plist.get_nfilters())]
                out[name] = (obj.shape, obj.dtype, obj.chunks, obj.maxshape, filters, dict(obj.attrs))
        f.visititems(visit)
    return out


def test_compact_of_1_2_4_writers_gives_the_same_values_order_and_layout(corpus, outputs, tmp_path):  # noqa: F811
    paths = {n: copy_output(outputs[n], n, tmp_path / f"w{n}") for n in (1, 2, 4)}
    # gzip: the chunks across two shards are compressed again by HDF5, the others copied.
    paths["gzip"] = tmp_path / "gzip" / "out.h5"
    assert run(cmd(corpus, paths["gzip"], 2, "--set", "output.codec=gzip")).returncode == 0
    for path in paths.values():
        res = run(h5batch_cmd("compact", str(path)))
        assert res.returncode == 0 and "checked and verified" in res.stderr, res.stderr
        assert not list(path.parent.glob("out.shard-*"))  # the shards are gone
    assert digest(paths[2]) == digest(paths[4]) == digest(paths["gzip"]) == digest(paths[1]) == digest(outputs[1])
    assert str(layout(paths[2])) == str(layout(paths[4])) == str(layout(paths[1]))
    with h5py.File(paths[4], "r") as f, h5py.File(outputs[1], "r") as g:
        assert f.attrs[fmt.ATTR_FORMAT] == g.attrs[fmt.ATTR_FORMAT] and fmt.ATTR_SHARDS not in f.attrs
        assert f.attrs[fmt.ATTR_INPUTS] == g.attrs[fmt.ATTR_INPUTS]
        assert not any(f[k].is_virtual for k in layout(paths[4]))
    one, four = (H5Dataset(paths[n], "train", with_source=True) for n in (1, 4))
    for i in range(0, len(one), 7):
        _same(one[i], four[i])


def test_sync_adds_a_shard_as_a_one_writer_sync_and_a_kill_leaves_the_output(corpus, tmp_path):  # noqa: F811
    root = tmp_path / "corpus"
    shutil.copytree(corpus, root)
    outs = {n: tmp_path / f"w{n}" / "out.h5" for n in (1, 2)}
    for n, out in outs.items():
        assert run(cmd(root, out, n)).returncode == 0

    def sync(n: int) -> list[str]:
        return ["sync" if a == "convert" else a for a in cmd(root, outs[n], n)]

    for sub in ("data", "label"):  # a new pair, a removed one, a changed one
        shutil.copy(root / "train" / sub / "3.wav", root / "train" / sub / "new.wav")
        (root / "train" / sub / "5.wav").unlink()
    changed = root / "train" / "data" / "7.wav"
    changed.write_bytes(changed.read_bytes()[:-2] + b"\x01\x02")
    before = digest(outs[2])
    added = Path(sync_shard_path(str(outs[2]), 2))
    proc = start(sync(2), env_extra={"H5BATCH_FAULTS": "pause_at=finalize"}, new_session=True)
    wait_for(Path(f"{added}{fmt.PARTIAL_SUFFIX}.paused"), proc)  # the new shard written, not renamed
    kill_group(proc)
    assert digest(outs[2]) == before and len(H5Dataset(outs[2], "train")) == 199
    joining = Path(f"{outs[2]}.joining")  # as a kill inside the join's write would leave it
    joining.write_bytes(b"half a file")
    for n in (1, 2):
        res = run(sync(n))
        assert res.returncode == 0 and "1 new, 1 changed, 1 removed" in res.stderr, res.stderr
    assert f"removed {added}{fmt.PARTIAL_SUFFIX}" in res.stderr  # what the killed sync left
    assert f"removed {joining}" in res.stderr and not joining.exists()
    assert sorted(p.name for p in outs[2].parent.glob("out.shard-*")) == [
        "out.shard-0-of-2.h5", "out.shard-1-of-2.h5", "out.shard-2.h5"]
    assert digest(outs[2]) == digest(outs[1])  # values, tombstones and rejects
    one, two = (H5Dataset(outs[n], "train", with_source=True) for n in (1, 2))
    assert len(one) == len(two) == 199
    for i in range(len(one)):
        _same(one[i], two[i])
    assert "train/data/new.wav" in two[-1]["source"]
    assert run(h5batch_cmd("verify", str(outs[2]))).returncode == 0
    res = run(sync(2))
    assert res.returncode == 0 and "is up to date" in res.stderr, res.stderr
    assert run(h5batch_cmd("compact", str(outs[2]))).returncode == 0
    assert digest(outs[2]) == digest(outs[1]) and not list(outs[2].parent.glob("out.shard-*"))


def test_a_missing_shard_fails_each_command_naming_it(corpus, outputs, tmp_path):  # noqa: F811
    path = copy_output(outputs[2], 2, tmp_path / "w2")
    gone = Path(shard_path(str(path), 1, 2))
    gone.unlink()
    for args in (("export", str(path), "--to", "files", str(tmp_path / "x")),
                 ("preview", str(path), "--html", str(tmp_path / "p")),
                 ("view", "add", str(path), "v", "--where", "index < 3"), ("inspect", str(path)),
                 ("compact", str(path)), ("sync", str(JOB), "--output", str(path), "--set", f"source.root={corpus}",
                                         "--set", "output.writers=2")):
        res = run(h5batch_cmd(*args))
        assert res.returncode == 1, (args, res.stderr)
        assert f"h5batch {args[0]}: {path}: its shard {gone} is missing" in res.stderr, res.stderr
    assert not (tmp_path / "x").exists()
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.h5", "out.shard-0-of-2.h5"]  # as it was
