"""Deterministic generated media corpora: for the demo job, the benchmark and the tests.

Part of the product because users run it: ``source.generate`` (e.g. ``jobs/demo.yaml``) and
``h5batch bench`` generate corpora. :data:`CORPORA` names what ``source.generate`` may ask
for; the converter makes it when ``source.root`` is missing or empty.

Rule: every generator is a pure function of its arguments (see :mod:`.common`), so the same
arguments write byte-identical files given the same codec library builds. Reason: tests
compare converted files with fingerprints, and a complete corpus with the same arguments is
reused at once (:func:`common.begin`).

========================  ==================================================================
``demo``                  ``root/{train,test}/{circle,square,triangle}/<class>_<NNNN>.{wav,png}``
``paired_audio``          ``root/{train,test}/{data,label}/<N>.wav``
``images``                ``root/<split>/<class>/<class>_<NNNN>.jpg``
========================  ==================================================================
"""

from __future__ import annotations

from collections.abc import Callable

from .common import MARKER_NAME, SynthSummary
from .demo import DEMO_CLASSES, DEMO_SAMPLE_RATE, DEMO_SPLITS, make_demo_corpus
from .images import make_image_corpus
from .paired_audio import make_paired_audio

__all__ = [
    "CORPORA",
    "DEMO_CLASSES",
    "DEMO_SAMPLE_RATE",
    "DEMO_SPLITS",
    "MARKER_NAME",
    "SynthSummary",
    "make_demo_corpus",
    "make_image_corpus",
    "make_paired_audio",
]

# What ``source.generate`` in a job file may name: the maker is called with the job's
# ``source.root`` and its default arguments.
CORPORA: dict[str, Callable[..., SynthSummary]] = {
    "demo": make_demo_corpus,
    "paired_audio": make_paired_audio,
}
