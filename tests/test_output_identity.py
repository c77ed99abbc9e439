"""The shipped jobs give the same output, dataset by dataset and attribute by attribute,
as the fingerprints in ``tests/golden/`` recorded before the package was reorganised.

A change that moves code must not move a byte of the output. A change that means to alter
the output (a new attribute, another chunk shape) updates the fingerprint on purpose, in
the same commit, with ``python -m tests.support.fingerprint OUT.h5 > tests/golden/JOB.json``."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import REPO, shared_corpus
from tests.support.fingerprint import differences, fingerprint
from tests.support.run import convert

# job -> the shared corpus it reads (None: the job generates its corpus under data/)
JOBS = {"demo": None, "paired_audio": None, "fsdd": "fsdd", "hymenoptera": "images"}


@pytest.mark.parametrize("name", sorted(JOBS))
def test_shipped_job_output_matches_its_fingerprint(name, tmp_path):
    if JOBS[name]:
        shared_corpus(JOBS[name])
        cwd = REPO  # the job's root is relative: ../shared/corpora/...
    else:
        cwd = tmp_path / "repo"  # the generated corpus goes to data/ below the working directory
        (cwd / "jobs").mkdir(parents=True)
        shutil.copy(REPO / "jobs" / f"{name}.yaml", cwd / "jobs")
    out = tmp_path / f"{name}.h5"
    res = convert(f"jobs/{name}.yaml", output=out, cwd=cwd, timeout=600)
    assert res.returncode == 0, res.stderr
    golden = json.loads((REPO / "tests" / "golden" / f"{name}.json").read_text())
    now = fingerprint(str(out))
    # The manifest hash covers the files' modification times: new for a generated corpus, and
    # another machine's checkout of ../shared has its own. The files themselves are compared
    # through every dataset, ``source`` included.
    # The inventory's stamps, stats and hash records (docs/FORMAT.md) cover mtimes too: its
    # keys and order are compared, those by dtype and shape only.
    for fp in (golden, now):
        fp["/"]["attrs"].pop("manifest_hash")
        for ds in ("stamp", "stat", "record"):  # not `name`: the message below names the job
            fp.get(f"inventory/{ds}", {}).pop("sha256", None)
    diff = differences(golden, now)
    assert not diff, f"{name}: output differs from tests/golden/{name}.json:\n" + "\n".join(diff[:20])

