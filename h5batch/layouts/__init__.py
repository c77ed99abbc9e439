"""Corpus discovery: a job's ``source`` section -> a stable, sorted
:class:`~h5batch.manifest.Manifest`, through the layout named by ``source.layout``.

Layouts (registered in this order, which job-file errors list):

``class_folders``   ``root/<split>/<class>/<file>``; with several fields, files of one stem
                    form a sample.
``paired_folders``  ``root/<split>/<field folder>/<name>``, paired by stem.
``pattern``         a regex with named groups matched against each relative path.
``manifest``        a CSV or JSONL table (module ``table.py``).

Ordering, hidden files and rejects: see :mod:`.base`.

Rule: this file only imports the layouts and runs the chosen one; walking, building and
hashing are in :mod:`.base`. Reason: a new layout is one new module (a
:class:`~.base.Layout` subclass that calls ``register``, imported below), and
:mod:`h5batch.config` takes ``source.layout`` values from :data:`LAYOUTS`. See docs/jobs.md
("Adding a layout").
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

# The layout modules register themselves when imported; their order here is the registry's.
# isort: off
from . import class_folders, paired_folders, pattern, table  # noqa: F401
# isort: on
from ..forking import return_free_memory
from ..manifest import Manifest
from . import annotate, exclude
from . import splits as split_rules
from .base import LAYOUTS, Builder, Layout, get, names, register

if TYPE_CHECKING:
    from ..config_types import JobConfig

__all__ = ["LAYOUTS", "Builder", "Layout", "discover", "get", "names", "register", "resolved_job"]


def discover(job: JobConfig) -> Manifest:
    """Walk the corpus of ``job`` and return its manifest (items in output order).

    Stages: the layout collects items; ``source.exclude`` sets excluded files aside;
    annotation tables are joined (values, ``label_column``); split rules apply;
    ``source.limit`` keeps a spread of the samples; the builder sorts, drops duplicates and
    hashes."""
    root = Path(job.source.root)
    b = Builder(job)
    splits = get(job.source.layout).collect(root, job.source, b)
    exclude.apply(job.source, b, str(root))
    cols = annotate.join(root, job, b)
    splits = split_rules.apply(root, job, b, cols) or splits
    exclude.limit(job.source, b)
    return_free_memory()  # the walk's columns, let go: the sort below reuses no pages of them
    manifest = b.finish(str(root), splits)
    del b
    return_free_memory()  # what discovery let go, not inherited by the processes forked next
    return manifest


def resolved_job(job: JobConfig, manifest: Manifest) -> JobConfig:
    """``job`` with the field configs discovery completed (category and target names):
    the job every later stage, the stored job and the job hash use."""
    if not manifest.resolved:
        return job
    return dataclasses.replace(job, fields={n: manifest.resolved.get(n, fc) for n, fc in job.fields.items()})
