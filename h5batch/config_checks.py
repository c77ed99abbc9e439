"""Semantic checks of a job: values that type-check but cannot work (a pattern that is not a
regex, two split rules, a level the codec does not take, a missing corpus root).

Rule: :mod:`h5batch.config` turns YAML into the typed dataclasses of
:mod:`h5batch.config_types` and calls :func:`validate`;
every check that needs more than a type is here, each raising
:class:`~h5batch.errors.ConfigError` with the file, the dotted key and what is wrong.
Reason: config.py had grown past the size one concept should have; the checks of a field
kind stay with the kind (``FieldKind.validate``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from . import codecs
from .errors import ConfigError
from .fields import file_fields, reads_files, validate_field

if TYPE_CHECKING:
    from .config_types import JobConfig


def url_scheme(path: str | None) -> str | None:
    """The scheme of ``path`` when it is a URL (``s3``, ``gs``, ``https``), else None."""
    m = re.match(r"([A-Za-z][A-Za-z0-9+.-]+)://", path or "")
    return m.group(1).lower() if m else None


def validate(job: JobConfig, check_paths: bool) -> None:
    """Raise :class:`ConfigError` for the first setting of ``job`` that cannot work."""
    f = job.file
    s = job.source
    # A URL is never taken for a local path (it would make a folder named "s3:").
    for key, value in (("source.root", s.root), ("source.manifest", s.manifest), ("output.path", job.output.path)):
        scheme = url_scheme(value)
        if scheme == "s3" and key == "output.path":  # built locally, then uploaded (remote/upload.py)
            from .remote import split_url

            try:
                split_url(value)
            except ValueError as e:
                raise ConfigError(f, key, str(e)) from None
            continue
        if scheme:
            raise ConfigError(f, key, f"{value.split('?')[0]!r}: {scheme}:// is not a storage h5batch can "
                                      f"{'write' if key == 'output.path' else 'read a corpus from'}; "
                                      "give a local path")
    if s.layout == "pattern":
        if not s.pattern:
            raise ConfigError(f, "source.pattern", "is required for layout 'pattern'")
        try:
            rx = re.compile(s.pattern)
        except re.error as e:
            raise ConfigError(f, "source.pattern", f"is not a valid regex: {e}") from e
        if s.split.group not in rx.groupindex and s.split.ranges:
            raise ConfigError(f, "source.split.group", f"group {s.split.group!r} is not in source.pattern")
        for split, rng in s.split.ranges.items():
            if len(rng) != 2 or rng[0] > rng[1]:
                raise ConfigError(f, f"source.split.ranges.{split}", f"must be [lo, hi] with lo <= hi, got {rng}")
        if len(file_fields(job.fields)) != 1:
            raise ConfigError(f, "fields", "layout 'pattern' takes exactly one field of files "
                                           "(value, text-from-column and multilabel fields aside)")
    if s.layout == "manifest" and not s.manifest:
        raise ConfigError(f, "source.manifest", "is required for layout 'manifest'")
    if s.layout == "paired_folders" and len(file_fields(job.fields)) < 2:
        raise ConfigError(f, "fields", "layout 'paired_folders' needs at least two fields")
    if s.layout == "class_folders" and len(file_fields(job.fields)) > 1:
        exts = [e for fc in job.fields.values() for e in {x.lower() for x in fc.extensions}]
        if len(exts) != len(set(exts)):  # an extension of two fields
            raise ConfigError(f, "fields", "with several fields in class_folders, each field needs its own extensions (files are grouped by stem)")
    if not file_fields(job.fields):
        raise ConfigError(f, "fields", "needs at least one field of files (audio, image, text with extensions)")
    _validate_annotations(job)
    for name, fc in job.fields.items():
        key = f"fields.{name}"
        for ext in fc.extensions:
            if not ext.startswith("."):
                raise ConfigError(f, f"{key}.extensions", f"extensions start with '.', got {ext!r}")
        validate_field(fc, f, key)  # the kind's checks, then store/features/transform
    o = job.output
    if o.level is not None:  # the codec's own range (auto: the codec it compresses with)
        by = codecs.AUTO_CODEC if o.codec == codecs.AUTO else o.codec
        try:
            codecs.get(by).parse_level(o.level)
        except ValueError as e:
            raise ConfigError(f, "output.level", str(e) + (f" (codec auto uses {by})" if by != o.codec else "")) from None
    if o.prefer != "speed" and o.codec != codecs.AUTO:
        raise ConfigError(f, "output.prefer", f"only codec 'auto' chooses by it; codec is {o.codec!r} "
                                              f"(got prefer {o.prefer!r}: remove it or set codec auto)")
    if o.chunk_bytes < 4096:
        raise ConfigError(f, "output.chunk_bytes", f"must be at least 4096, got {o.chunk_bytes}")
    if not o.path.endswith((".h5", ".hdf5")):
        raise ConfigError(f, "output.path", f"must end in .h5 or .hdf5, got {o.path!r}")
    if o.writers < 1:
        raise ConfigError(f, "output.writers", f"must be >= 1, got {o.writers}")
    c = job.cluster
    if c.workers is not None and c.workers < 1:
        raise ConfigError(f, "cluster.workers", f"must be >= 1, got {c.workers}")
    if c.batch_size != "auto" and c.batch_size < 1:
        raise ConfigError(f, "cluster.batch_size", f"must be >= 1, got {c.batch_size}")
    if c.security and c.kind == "processes":
        raise ConfigError(f, "cluster.security", "is for Dask's connections, and kind 'processes' (the default) "
                                                 "has none: set cluster.kind to local or to a scheduler's kind")
    if c.kind in ("address", "scheduler_file") and not getattr(c, c.kind):
        raise ConfigError(f, f"cluster.{c.kind}", f"is required for kind {c.kind!r}")
    p = job.policy
    if not 0.0 <= p.max_reject_fraction <= 1.0:
        raise ConfigError(f, "policy.max_reject_fraction", f"must be within 0..1, got {p.max_reject_fraction}")
    for k in ("decode_timeout", "no_worker_timeout", "frozen_worker_timeout"):
        if getattr(p, k) <= 0:
            raise ConfigError(f, f"policy.{k}", "must be > 0 seconds")
    if check_paths:
        root = Path(s.root)
        if not root.is_dir() and not s.generate:
            raise ConfigError(f, "source.root", f"corpus root {s.root!r} does not exist or is not a directory")
        if s.layout == "manifest" and s.manifest and not Path(s.manifest).is_file() and not s.generate:
            raise ConfigError(f, "source.manifest", f"manifest file {s.manifest!r} does not exist")


def _validate_annotations(job: JobConfig) -> None:
    """Checks of the annotation settings that need no file: the columns themselves are
    checked against the tables at discovery (h5batch/layouts/annotate.py)."""
    f, s = job.file, job.source
    rule = s.split
    given = [k for k in ("lists", "column", "hash") if getattr(rule, k)]
    if len(given) > 1:
        raise ConfigError(f, f"source.split.{given[1]}", f"give one split rule, not {' and '.join(given)}")
    if rule.values and not rule.column:
        raise ConfigError(f, "source.split.values", "maps the values of source.split.column, which is not set")
    if rule.hash:
        bad = {k: v for k, v in rule.hash.items() if not 0 < v < 1}
        if bad or sum(rule.hash.values()) >= 1:
            raise ConfigError(f, "source.split.hash", f"fractions must be within (0, 1) and sum below 1 "
                                                      f"(the rest is {rule.default!r}), got {rule.hash}")
        if rule.default in rule.hash:
            raise ConfigError(f, "source.split.hash", f"{rule.default!r} is the default split: it gets the rest")
    if rule.hash_key and not rule.hash:
        raise ConfigError(f, "source.split.hash_key", "is only for source.split.hash")
    for name, path in rule.lists.items():
        if os.path.isabs(path) or ".." in Path(path).parts:
            raise ConfigError(f, f"source.split.lists.{name}", f"must be relative to source.root, got {path!r}")
    for i, t in enumerate(s.tables):
        key = f"source.tables[{i}]"
        paths = [t.path] if isinstance(t.path, str) else t.path
        if not paths or any(not p or os.path.isabs(p) or ".." in Path(p).parts for p in paths):
            raise ConfigError(f, f"{key}.path", f"must be relative to source.root, got {t.path!r}")
        if t.skip < 0:
            raise ConfigError(f, f"{key}.skip", f"must be >= 0, got {t.skip}")
        if not t.header and not t.columns and t.format not in ("transcript", "jsonl"):
            raise ConfigError(f, f"{key}.columns", "names the columns of a table without a header line")
    uses = [key for key, col in (("source.label_column", s.label_column),
                                 ("source.split.column", rule.column)) if col]
    uses += [f"fields.{name}" for name, fc in job.fields.items() if not reads_files(fc)]
    if uses and not s.tables and s.layout not in ("manifest", "pattern"):
        raise ConfigError(f, uses[0], "reads an annotation column, but source.tables lists no table "
                                      f"(and layout {s.layout!r} has no columns of its own)")
    if s.limit is not None and s.limit < 1:
        raise ConfigError(f, "source.limit", f"must be >= 1 samples, got {s.limit}")
    for pat in s.exclude:
        if not pat or os.path.isabs(pat):
            raise ConfigError(f, "source.exclude", f"patterns are relative to source.root, got {pat!r}")
