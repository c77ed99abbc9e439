"""Corpus discovery: a job's ``source`` section -> a stable, sorted
:class:`~h5batch.manifest.Manifest`, through the layout named by ``source.layout``.

Layouts (one module each, registered in this order, which job-file errors list):

``class_folders``   ``root/<split>/<class>/<file>`` (ImageFolder style). With several
                    fields, files of one stem form a sample (``x/cat/1.wav`` + ``x/cat/1.png``).
``paired_folders``  ``root/<split>/<field folder>/<name>``: files of the same stem in each
                    field folder form one sample (``data/7.wav`` + ``label/7.wav``).
``pattern``         a regex with named groups (``label``, split group) matched against each
                    file's path relative to ``root``.
``manifest``        a CSV or JSONL table listing the path of each field, ``label`` and
                    ``split`` (module ``table.py``).

Whatever the file system's listing order, the manifest is sorted (split order, then a
natural sort of the key) so outputs are identical from run to run. Hidden files and folders
(``.name``) are skipped. Every other file found ends up either in an item or in the rejects
list with its reason: nothing is silently dropped.

Rule: this file only imports the layout modules and runs the chosen one; walking, building
and hashing are in :mod:`.base`, each layout's rules in its own module. Reason: adding a
layout is one new module, and :mod:`h5batch.config` takes the accepted ``source.layout``
values from :data:`LAYOUTS`.

Adding a layout: write ``h5batch/layouts/<name>.py`` with a :class:`~.base.Layout` subclass
whose ``collect(root, src, b)`` appends :class:`~h5batch.manifest.Item` s to ``b.items``
(sizes and mtimes to ``b.stats``, the hash covers them), every unusable file to
``b.rejects``, and returns the split order; call ``register(...)`` at the bottom and import
the module below. Details and the config side in docs/jobs.md ("Adding a layout").
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

# The layout modules register themselves when imported; their order here is the registry's.
# isort: off
from . import class_folders, paired_folders, pattern, table  # noqa: F401
# isort: on
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
    annotation tables are joined (values, ``label_column``); split rules apply; the builder
    sorts, drops duplicates and hashes."""
    root = Path(job.source.root)
    b = Builder(job)
    splits = get(job.source.layout).collect(root, job.source, b)
    exclude.apply(job.source, b)
    cols = annotate.join(root, job, b)
    splits = split_rules.apply(root, job, b, cols) or splits
    return b.finish(str(root), splits)


def resolved_job(job: JobConfig, manifest: Manifest) -> JobConfig:
    """``job`` with the field configs discovery completed (category and target names):
    the job every later stage, the stored job and the job hash use."""
    if not manifest.resolved:
        return job
    return dataclasses.replace(job, fields={n: manifest.resolved.get(n, fc) for n, fc in job.fields.items()})
