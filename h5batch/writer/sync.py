"""The writer's side of ``h5batch sync``: extend a finished output, all or nothing.

:class:`SyncWriter` is an :class:`~.output.OutputWriter` that opens the finished output and
appends new and changed samples with the same chunk appenders (a padded last chunk is taken
back and completed). Because a sync is one atomic change of a file in use, it differs so:

* no commit record or tail file: a crash is undone, not resumed (redoing is cheap);
* in place, every write goes through :mod:`.journal`'s undo journal and the sync commits by
  dropping it; when a reader has the file open, it works on a copy renamed over the output;
* at the end it rewrites what describes the whole corpus: rejects (carried, discovery's and
  decode's), ``/class_names`` (old names keep their numbers), changed field attributes,
  tombstones, the inventory, and the root attributes (``manifest_hash``, ``num_inputs``,
  ``splits``, ``annotations``, ``synced``).
"""

from __future__ import annotations

import contextlib
import json
import os
from datetime import UTC, datetime

import h5py
import numpy as np

from .. import faults
from .. import format as fmt
from ..fields import field_attrs
from ..fields.base import settings
from .journal import JournalFile, fsync_path, rollback
from .messages import Done, WriterSpec
from .output import OutputWriter
from .store import STR

ATTR_SYNCED = "synced"


class SyncWriter(OutputWriter):
    """Extends the finished output ``spec.final_path`` (see the module docstring)."""

    def __init__(self, spec: WriterSpec):
        self.journal: JournalFile | None = None
        super().__init__(spec)
        # The rejects are rebuilt: those carried over first, the new ones are appended.
        for k in self.rej_ds.values():
            k.ds.resize(0, axis=0)
            k.n = 0
        self.add_rejects(spec.sync.kept_rejects)

    def _open(self, cache: dict) -> dict[str, np.ndarray]:
        if self.spec.sync.in_place:
            self.journal = JournalFile(self.spec.final_path)
        self.f = h5py.File(self.journal or self.spec.partial_path, "r+", **cache)
        return {}

    def commit(self):  # noqa: D102 - a sync does not commit part-way (module docstring)
        return None

    def abort(self) -> None:
        """Undo everything: the output is as it was before the sync."""
        self.close()
        if self.journal is not None:
            self.journal.close()
            rollback(self.spec.final_path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.spec.partial_path)

    def finalize(self, max_reject_fraction: float = 1.0) -> Done:
        spec = self.spec
        rejects, ok = self.last_rejects(max_reject_fraction)
        if not ok:
            summary = self.summary(spec.final_path, rejects, False)
            self.abort()
            return summary
        for s in self.splits.values():
            s.finish()
        self._corpus_datasets()
        self.f.flush()
        faults.pause("finalize", spec.partial_path)
        self.close()
        fmt.write_rejects(fmt.rejects_file(spec.final_path), rejects)
        if self.journal is not None:
            self.journal.commit()
        else:
            fsync_path(spec.partial_path)
            os.replace(spec.partial_path, spec.final_path)
        return self.summary(spec.final_path, rejects, True)

    def _corpus_datasets(self) -> None:
        """What describes the corpus as a whole, rewritten for the corpus as it is now."""
        f, spec = self.f, self.spec
        if spec.labelled:
            if fmt.CLASS_NAMES in f:
                del f[fmt.CLASS_NAMES]
            f.create_dataset(fmt.CLASS_NAMES, data=np.array(spec.class_names, dtype=object), dtype=STR)
        for split, rows in spec.sync.tombstones.items():
            if not len(rows):
                continue  # the split's tombstones stay as they are
            g = f[split]
            old = g[fmt.TOMBSTONES][...] if fmt.TOMBSTONES in g else np.zeros(0, dtype=np.int64)
            dead = np.union1d(old.astype(np.int64), np.asarray(rows, dtype=np.int64))
            if fmt.TOMBSTONES in g:
                del g[fmt.TOMBSTONES]
            g.create_dataset(fmt.TOMBSTONES, data=dead)
        self._field_configs()
        self.store_inventory()
        a = f.attrs
        a[fmt.ATTR_MANIFEST_HASH] = spec.manifest_hash
        a[fmt.ATTR_INPUTS] = spec.num_inputs
        old_splits = json.loads(a[fmt.ATTR_SPLITS])
        a[fmt.ATTR_SPLITS] = fmt.dumps(old_splits + [s for s in spec.splits if s not in old_splits])
        if spec.annotations:
            a[fmt.ATTR_ANNOTATIONS] = fmt.dumps(list(spec.annotations))
        elif fmt.ATTR_ANNOTATIONS in a:
            del a[fmt.ATTR_ANNOTATIONS]
        a[fmt.ATTR_JOB] = spec.job_json
        a[fmt.ATTR_JOB_HASH] = spec.job_hash
        a[ATTR_SYNCED] = datetime.now(UTC).isoformat(timespec="seconds")


    def _field_configs(self) -> None:
        """Each field's attributes that follow its config, where the config changed: the
        category names a sync appended (``h5batch.conversion.sync``), in every split that
        has the field, so that a reader maps every stored code to its name. The codec and
        the choice behind it stay as the datasets were created."""
        f = self.f
        splits = [s for s in json.loads(f.attrs[fmt.ATTR_SPLITS]) + list(self.spec.splits) if s in f]
        for name, fc in self.spec.fields:
            config = fmt.dumps(settings(fc))
            now = {"config": config, **field_attrs(fc)}
            for s in dict.fromkeys(splits):
                node = f[s].get(name)
                if node is not None and node.attrs.get("config") != config:
                    node.attrs.update(now)
