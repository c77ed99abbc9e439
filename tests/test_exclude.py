"""``source.exclude`` (h5batch/layouts/exclude.py): a pattern excludes a path it matches
or a path inside a folder it matches, with fnmatch's rules, decided by one compiled regex.
The reference is the rule itself: every folder prefix of the path tried with fnmatchcase."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest

from h5batch.layouts.exclude import matching


def _by_prefixes(path: str, patterns: list[str]) -> str | None:
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pat in patterns:
        pat = pat.rstrip("/")
        if any(fnmatchcase(p, pat) for p in prefixes):
            return pat
    return None


PATTERNS = [["_background_noise_", "README.md", "LICENSE", ".DS_Store"], ["*.txt"], ["a*/b", "x/"],
            ["*/[!a]*", "d?r/*.wav"], ["**/junk*"], [], ["a/b/c.wav"], ["[abc]/*", "dir/sub/"], ["*"],
            ["README.md", "*.md"]]
PATHS = ["yes/0a_nohash_0.wav", "_background_noise_/white.wav", "README.md", "x/y/README.md", "sub/notes.txt",
         "a1/b", "a1/b/c", "ab/c/b", "x", "x/1.wav", "dir/1.wav", "dar/2.wav", "a/b/c.wav", "a/b/c.wavx",
         "deep/junk1/z", "b/q", "dir/sub/f", "dir/subx/f", "ü/ß.txt", "line\nbreak/x", ".DS_Store", "q/.DS_Store"]


@pytest.mark.parametrize("patterns", PATTERNS, ids=lambda p: ",".join(p) or "none")
def test_matching_is_the_folder_prefix_rule(patterns):
    got = {p: matching(p, patterns) for p in PATHS}
    assert got == {p: _by_prefixes(p, patterns) for p in PATHS}


def test_the_first_matching_pattern_is_named():
    assert matching("docs/README.md", ["*.md", "docs"]) == "*.md"
    assert matching("docs/README.md", ["docs/", "*.md"]) == "docs"
    assert matching("_background_noise_/a.wav", ["README.md", "_background_noise_"]) == "_background_noise_"
    assert matching("yes/a.wav", ["README.md", "_background_noise_"]) is None
