"""Job files: YAML -> frozen, validated dataclasses.

A job file has five sections, ``source``, ``fields``, ``output``, ``cluster`` and
``policy``. Every key is checked at the door: an unknown key, a wrong type, a missing
corpus root or an impossible value raises :class:`ConfigError` naming the file, the
dotted key and what is wrong, before any work starts (the CLI turns it into one line
and exit code 2).

The dataclasses themselves are in :mod:`h5batch.config_types` (re-exported here); this
module turns YAML into them, checking each value against its type, and
:mod:`h5batch.config_checks` checks what needs more than a type. Rule: config imports the
layouts' registry (the accepted ``source.layout`` values), and nothing the layouts import
imports config. The settings of each kind of field (``type: audio``, ``type: image``, ...)
and their semantic checks live with the kind in :mod:`h5batch.fields`; this module looks
the kind up in that registry and keeps only the generic machinery, so adding a kind needs
no edit here.

Relative paths in a job file are resolved against the current working directory
(``make convert`` runs from the repository root), not against the job file.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

from . import codecs, layouts
from .config_checks import validate
from .config_types import (
    ClusterConfig,
    CodecName,
    JobConfig,
    LayoutName,
    OutputConfig,
    PolicyConfig,
    SourceConfig,
    SplitRule,
    TableSpec,
)
from .errors import ConfigError
from .fields import KINDS, FieldConfig

__all__ = ["KIND_ALIASES", "ClusterConfig", "CodecName", "ConfigError", "JobConfig", "LayoutName",
           "OutputConfig", "PolicyConfig", "SourceConfig", "SplitRule", "TableSpec", "job_from_dict",
           "load_job", "parse_overrides", "with_overrides"]

# Kinds of older job files and what they mean now: ``auto`` chose between a thread of the
# driver and a LocalCluster by a timing probe, ``inprocess`` decoded in the driver.
KIND_ALIASES = {"auto": "processes", "inprocess": "processes"}


# ---------------------------------------------------------------------------
# Generic dict -> dataclass conversion with precise errors
# ---------------------------------------------------------------------------

# Scalar types of a job file: the Python types a YAML value of each may have, and their words.
_SCALARS = {bool: (bool, "true or false"), int: (int, "an integer"), float: ((int, float), "a number"),
            str: (str, "a string")}


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
    if tp in (CodecName, LayoutName):  # checked like a Literal of the registered names (below)
        args = codecs.choices() if tp is CodecName else layouts.names()
        origin = Literal
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
    if tp in _SCALARS:
        accepted, words = _SCALARS[tp]
        if not isinstance(value, accepted) or (isinstance(value, bool) and tp is not bool):
            raise ConfigError(file, key, f"must be {words}, got {value!r}")
        return float(value) if tp is float else value
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
        # libyaml's parser where PyYAML has it: the same documents, several times faster.
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "yaml"
        raise ConfigError(file, where, f"not valid YAML: {getattr(e, 'problem', e)}") from e
    return with_overrides(data, overrides, file, check_paths)


def with_overrides(data: Any, overrides: list[str] | None, file: str, check_paths: bool = True) -> JobConfig:
    """A parsed job mapping (a job file's, or :mod:`h5batch.folder_job`'s) with ``--set``
    overrides merged in, validated."""
    if overrides:
        data = _merge(data or {}, parse_overrides(overrides))
    return job_from_dict(data, file, check_paths=check_paths)
