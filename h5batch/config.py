"""Job files: YAML -> frozen, validated dataclasses.

A job file has five sections, ``source``, ``fields``, ``output``, ``cluster`` and
``policy``. Every key is checked at the door: an unknown key, a wrong type, a missing
corpus root or an impossible value raises :class:`ConfigError` naming the file, the
dotted key and what is wrong, before any work starts (the CLI turns it into one line
and exit code 2).

The settings of each kind of field (``type: audio``, ``type: image``, ...) and their
semantic checks live with the kind in :mod:`h5batch.fields`; this module looks the kind up
in that registry and keeps only the generic machinery, so adding a kind needs no edit here.

Relative paths in a job file are resolved against the current working directory
(``make convert`` runs from the repository root), not against the job file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from . import codecs, layouts
from .config_checks import validate
from .errors import ConfigError
from .fields import KINDS, FieldConfig, content_settings
from .fields.base import late, settings

# ---------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------

# The registered layouts (h5batch/layouts/, one module each), in registration order. The
# layouts import this module for type checking only, so reading their registry here is no
# import cycle.
Layout = Literal[layouts.names()]  # type: ignore[valid-type]


class CodecName(str):
    """Type of ``output.codec``: ``auto`` or the name of a registered codec. Checked against
    the registry (:func:`h5batch.codecs.choices`) each time a job is loaded, not frozen into a
    ``Literal`` here, so a codec module added later (or registered by a test) is accepted with
    no edit to this file."""


@dataclass(frozen=True)
class SplitRule:
    """How samples get their split, when the layout's own rule (a split folder, the
    ``pattern`` layout's regex group) is not the one (h5batch/layouts/splits.py).

    ``group`` names a regex group of the ``pattern`` layout. Without ``ranges`` its text
    *is* the split name; with ``ranges`` it must hold an integer and the split is the
    first range (inclusive ``[lo, hi]``) containing it, else ``default``.

    At most one of these replaces the layout's split: ``lists`` (split -> a list file of
    root-relative paths, one per line, as Speech Commands ships them; unlisted samples get
    ``default``), ``column`` (an annotation column; ``values`` maps its values to split
    names) or ``hash`` (split -> fraction, by a hash of ``hash_key``: the sample key or an
    annotation column such as a speaker, so a file keeps its split when the corpus grows).
    """

    group: str = "split"
    ranges: dict[str, list[int]] = field(default_factory=dict)
    default: str = "train"
    lists: dict[str, str] = late(factory=dict)
    column: str | None = late()
    values: dict[str, str] = late(factory=dict)
    hash: dict[str, float] = late(factory=dict)
    hash_key: str | None = late()


@dataclass(frozen=True)
class TableSpec:
    """An annotation table joined to the samples (h5batch/layouts/annotate.py): its
    columns feed value/text/multilabel fields, ``source.label_column`` and split rules.

    ``path`` is root-relative: a file, a glob (``**/*.trans.txt``) or a list of them; each
    row also has the column ``_table``, the stem of its file (``train`` for train.tsv).
    ``key`` is the column matched against each sample's root-relative path, file name,
    stem or key (default: the first column). ``format`` ``auto`` goes by suffix (.csv
    comma, .tsv tab, .jsonl, .txt white space); ``transcript`` reads ``<id> <text>``
    lines (columns ``id``, ``text``). ``skip`` lines come before the header; without a
    header, ``columns`` names the columns. ``unlisted``: what happens to a sample the
    table has no row for (a reject, or excluded: listed with stage ``excluded``, which
    ``policy.max_reject_fraction`` does not count).
    """

    path: str | list[str]
    key: str | None = None
    format: Literal["auto", "csv", "tsv", "whitespace", "jsonl", "transcript"] = "auto"
    header: bool = True
    skip: int = 0
    columns: list[str] = field(default_factory=list)
    unlisted: Literal["reject", "exclude"] = "reject"


@dataclass(frozen=True)
class SourceConfig:
    """Where the corpus is and how its files map to samples (see docs/jobs.md)."""

    root: str
    layout: Layout = "class_folders"
    splits: list[str] | None = None
    pattern: str | None = None
    label_group: str = "label"
    split: SplitRule = field(default_factory=SplitRule)
    manifest: str | None = None
    generate: str | None = None  # a corpus of h5batch.generate.CORPORA to make when root is missing
    tables: list[TableSpec] = late(factory=list)  # annotation tables joined by key
    label_column: str | None = late()  # the class label from an annotation column
    exclude: list[str] = late(factory=list)  # root-relative globs: not part of the corpus


@dataclass(frozen=True)
class OutputConfig:
    """The HDF5 file. ``chunk_bytes`` is the target uncompressed chunk size (bytes);
    ``cache_bytes`` the per-dataset chunk cache (``rdcc_nbytes``), default 4 chunks."""

    path: str
    codec: CodecName = "auto"  # blosc2-lz4 where a trial shows it pays, else none (auto.py)
    # What ``codec: auto`` weighs: read speed (compress only where decoding costs less than
    # reading the bytes it saves) or size (compress wherever the trial shrinks >= 1.15x).
    prefer: Literal["speed", "size"] = late("speed")
    level: int | None = None
    shuffle: bool = True
    chunk_bytes: int = 1 << 20
    cache_bytes: int | None = None
    overwrite: bool = False


@dataclass(frozen=True)
class ClusterConfig:
    """Where decoding runs, one engine per setting: ``processes`` (the default) runs
    ``workers`` decoder processes on this machine, without Dask
    (:mod:`h5batch.conversion.pool`); ``local`` starts a Dask LocalCluster on 127.0.0.1;
    ``address`` / ``scheduler_file`` join an existing Dask scheduler; slurm/pbs/sge/lsf
    start workers through dask-jobqueue. ``auto`` and ``inprocess`` (older job files) mean
    ``processes`` (:data:`KIND_ALIASES`)."""

    kind: Literal["processes", "local", "address", "scheduler_file", "slurm", "pbs", "sge", "lsf"] = "processes"
    workers: int | None = None
    address: str | None = None
    scheduler_file: str | None = None
    batch_size: int | Literal["auto"] = "auto"  # items per task; auto: ~16 MB decoded (processes), 32 MB (Dask)
    max_in_flight: int | None = None
    transport: Literal["auto", "shm", "network"] = "auto"
    # Where whole chunks of fixed-shape fields are compressed. "auto": in the writer on one
    # machine (processes, local: every core already decodes), in the workers on other
    # clusters (spreads the codec over the cluster's cores).
    compress_on: Literal["auto", "writer", "workers"] = "auto"
    dashboard: bool = True
    # dask-jobqueue keyword arguments (cores, memory, walltime, queue, jobs, ...)
    jobqueue: dict[str, Any] = field(default_factory=dict)
    security: dict[str, Any] = field(default_factory=dict)


# Kinds of older job files and what they mean now: ``auto`` chose between a thread of the
# driver and a LocalCluster by a timing probe, ``inprocess`` decoded in the driver.
KIND_ALIASES = {"auto": "processes", "inprocess": "processes"}


@dataclass(frozen=True)
class PolicyConfig:
    """What to do with bad inputs and failures."""

    max_reject_fraction: float = 0.05
    decode_timeout: float = 120.0  # seconds per file
    commit_every: float = 10.0  # seconds between durable commits
    retries: int = 2  # extra attempts for a batch whose worker died
    no_worker_timeout: float = 60.0  # seconds a run's own LocalCluster may have no worker at all
    frozen_worker_timeout: float = 60.0  # seconds a decoder process or a worker of the run's own LocalCluster may go without a heartbeat


@dataclass(frozen=True)
class JobConfig:
    """A whole job. ``fields`` keeps the order of the job file."""

    name: str
    source: SourceConfig
    fields: dict[str, FieldConfig]
    output: OutputConfig
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    file: str = "<job>"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON/YAML-able) of the job, without the file name."""
        d = dataclasses.asdict(self)
        d.pop("file")
        return d

    def public_dict(self) -> dict[str, Any]:
        """Like :meth:`to_dict` with credentials removed (stored in the output, logged)."""
        d = self.to_dict()
        if d["cluster"]["security"]:
            d["cluster"]["security"] = {k: "<redacted>" for k in d["cluster"]["security"]}
        return d

    def hash(self) -> str:
        """sha256 of what decides the output's content (not where or how fast it runs).
        Late settings at their default are left out (:data:`h5batch.fields.base.LATE`)."""
        d = settings(self)
        d["fields"] = {name: content_settings(fc) for name, fc in self.fields.items()}  # transform: + its source
        d.pop("file")
        d.pop("cluster")
        d["output"] = {k: v for k, v in d["output"].items() if k not in ("path", "overwrite", "cache_bytes")}
        d.pop("policy")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    @property
    def labelled(self) -> bool:
        """True when samples carry a class label."""
        if self.source.layout == "class_folders":
            return True
        if self.source.label_column:
            return True
        if self.source.layout == "pattern":
            return self.source.label_group in re.compile(self.source.pattern or "").groupindex
        return self.source.layout == "manifest"


# ---------------------------------------------------------------------------
# Generic dict -> dataclass conversion with precise errors
# ---------------------------------------------------------------------------

def _check(value: Any, tp: Any, file: str, key: str) -> Any:
    """Convert ``value`` to type ``tp`` or raise ConfigError for ``key``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _check(value, a, file, key)
            except ConfigError as e:
                errors.append(e.message)
        raise ConfigError(file, key, errors[0] if len(errors) == 1 else " / ".join(errors))
    if tp is CodecName:
        args = codecs.choices()
        origin = Literal  # checked like a Literal of the registered names (below)
    if origin is Literal:
        if value not in args:
            choices = ", ".join(repr(a) for a in args)
            raise ConfigError(file, key, f"must be one of {choices}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(file, key, f"must be a list, got {type(value).__name__} {value!r}")
        return [_check(v, args[0], file, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(file, key, f"must be a mapping, got {type(value).__name__}")
        return {str(k): _check(v, args[1], file, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, file, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(file, key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(file, key, f"must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(file, key, f"must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(file, key, f"must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp!r}")  # a bug in this module, not in the job


def _build(cls: type, data: Any, file: str, key: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(file, key, f"must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.name != "file"}
    for k in data:
        if k not in known:
            raise ConfigError(file, f"{key}.{k}" if key else k,
                              f"unknown key (expected one of: {', '.join(known)})")
    kwargs = {}
    for name, f in known.items():
        sub = f"{key}.{name}" if key else name
        if name in data:
            kwargs[name] = _check(data[name], hints[name], file, sub)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(file, sub, "is required")
    return cls(**kwargs)


def _build_fields(data: Any, file: str) -> dict[str, FieldConfig]:
    if not isinstance(data, dict) or not data:
        raise ConfigError(file, "fields", "must be a non-empty mapping of field name -> settings")
    out: dict[str, FieldConfig] = {}
    for name, spec in data.items():
        key = f"fields.{name}"
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)):
            raise ConfigError(file, key, "field names must be identifiers (letters, digits, _)")
        if name in ("label", "source", "checksum", "rejects"):
            raise ConfigError(file, key, f"'{name}' is reserved by the output format; rename the field")
        if not isinstance(spec, dict) or "type" not in spec:
            raise ConfigError(file, f"{key}.type", f"is required ({' or '.join(KINDS)})")
        kind = KINDS.get(spec["type"]) if isinstance(spec["type"], str) else None
        if kind is None:
            choices = ", ".join(repr(n) for n in KINDS)
            raise ConfigError(file, f"{key}.type", f"must be one of {choices}, got {spec['type']!r}")
        out[str(name)] = _build(kind.config_class, spec, file, key)
    return out


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def _yaml():
    """PyYAML, imported on first use: the writer and the Dask workers import this module
    for the config classes only, and every process start pays for its imports."""
    import yaml

    return yaml


def parse_overrides(pairs: list[str], file: str = "--set") -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` -> nested dict; values are parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(file, pair, "expected key=value")
        key, raw = pair.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = _yaml().safe_load(raw) if raw != "" else None
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict):
            merged[k] = _merge(merged[k], v)
        else:
            merged[k] = v
    return merged


def job_from_dict(data: Any, file: str = "<job>", check_paths: bool = True) -> JobConfig:
    """Validate a parsed job mapping. Raises :class:`ConfigError`."""
    if not isinstance(data, dict):
        raise ConfigError(file, "", "a job file must be a YAML mapping")
    allowed = {"name", "source", "fields", "output", "cluster", "policy"}
    for k in data:
        if k not in allowed:
            raise ConfigError(file, str(k), f"unknown key (expected one of: {', '.join(sorted(allowed))})")
    for k in ("source", "fields", "output"):
        if k not in data:
            raise ConfigError(file, k, "is required")
    name = data.get("name") or Path(file).stem
    if not isinstance(name, str):
        raise ConfigError(file, "name", "must be a string")
    job = JobConfig(
        name=name,
        source=_build(SourceConfig, data["source"], file, "source"),
        fields=_build_fields(data["fields"], file),
        output=_build(OutputConfig, data["output"], file, "output"),
        cluster=_build(ClusterConfig, _cluster_aliases(data.get("cluster") or {}), file, "cluster"),
        policy=_build(PolicyConfig, data.get("policy") or {}, file, "policy"),
        file=file,
    )
    validate(job, check_paths)
    return job


def _cluster_aliases(data: Any) -> Any:
    """``data`` with an older ``kind`` replaced by what it means now (:data:`KIND_ALIASES`)."""
    if isinstance(data, dict) and data.get("kind") in KIND_ALIASES:
        return {**data, "kind": KIND_ALIASES[data["kind"]]}
    return data


def load_job(path: str | os.PathLike[str], overrides: list[str] | None = None,
             check_paths: bool = True) -> JobConfig:
    """Read, merge ``--set`` overrides into, and validate a job file."""
    file = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(file, "", f"cannot read job file: {e.strerror}") from e
    yaml = _yaml()
    try:
        # libyaml's parser where PyYAML has it (the same documents, ~5x faster than the
        # Python one: a job file's ~2 ms on the way to a small job's first batch).
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "yaml"
        raise ConfigError(file, where, f"not valid YAML: {getattr(e, 'problem', e)}") from e
    if overrides:
        data = _merge(data or {}, parse_overrides(overrides))
    return job_from_dict(data, file, check_paths=check_paths)
