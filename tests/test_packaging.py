"""The environment descriptions stay in sync: pyproject.toml, constraints.txt, environment.yml."""

from __future__ import annotations

import re
import tomllib

import yaml

from tests.conftest import REPO

# PyPI name -> conda-forge name where they differ
CONDA_NAMES = {"soundfile": "pysoundfile", "blosc2": "python-blosc2", "soxr": "soxr-python", "isal": "python-isal", "pillow": "pillow",
               "pyyaml": "pyyaml"}


def _name(req: str) -> str:
    return re.split(r"[<>=!\[ ;]", req, maxsplit=1)[0].lower()


def _pyproject_requirements() -> list[str]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = list(data["dependencies"])
    for extra in ("torch", "bench", "cluster", "dev"):
        reqs += data["optional-dependencies"][extra]
    return sorted({_name(r) for r in reqs})


def _constraints() -> dict[str, str]:
    out = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            out[name.lower()] = version.split("+")[0]
    return out


def _environment() -> tuple[dict[str, str], list[str]]:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    conda, pip = {}, []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip += dep["pip"]
        else:
            name, _, version = dep.partition("=")
            conda[name.lower()] = version
    return conda, pip


def test_every_dependency_is_pinned_in_constraints():
    pins = _constraints()
    missing = [r for r in _pyproject_requirements() if r not in pins]
    assert not missing, f"not pinned in constraints.txt: {missing}"
    assert pins["torch"] == "2.13.0"  # the CPU build that lies on disk; a newer pin pulls CUDA


def test_environment_yml_matches_pyproject_and_constraints():
    pins = _constraints()
    conda, pip = _environment()
    for req in _pyproject_requirements():
        if req == "torch":
            assert "torch==2.13.0" in " ".join(pip)
            continue
        cname = CONDA_NAMES.get(req, req)
        assert cname in conda, f"{req} (conda: {cname}) missing from environment.yml"
        assert conda[cname] == pins[req], f"{cname}: environment.yml {conda[cname]} != constraints {pins[req]}"
