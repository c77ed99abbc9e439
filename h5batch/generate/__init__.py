"""Deterministic generated media corpora: for the demo job, the benchmark and the tests.

This package is part of the product, not of the test suite, because users run it:
``source.generate: demo`` is what the default job of ``make convert`` (``jobs/demo.yaml``)
converts, ``jobs/paired_audio.yaml`` generates ``paired_audio``, and ``h5batch bench``
generates every corpus it measures. :data:`CORPORA` names what ``source.generate`` may ask
for; the converter makes that corpus when the job's ``source.root`` is missing or empty.

The rule: every generator is a pure function of its arguments. Randomness comes from
``numpy.random.default_rng`` seeded with ``seed`` plus fixed per-sample tags, nothing reads
the clock, and calling a generator twice with the same arguments writes byte-identical files
(PNG, WAV and, with a fixed ``quality``, JPEG; given the same Pillow/libjpeg/zlib/libsndfile
builds). That is what lets a test compare a whole converted file with a recorded fingerprint,
and a benchmark reuse a corpus it made earlier: each root holds a marker
(``.h5batch-synth.json``) with the generator and its arguments, and a generator asked for a
complete corpus that is already there returns at once (see :func:`common.begin`).

Modules: :mod:`common` (marker, atomic writes, per-sample random streams, WAV and PNG
bytes) and one module per corpus:

========================  ==================================================================
``demo``                  ``root/{train,test}/{circle,square,triangle}/<class>_<NNNN>.{wav,png}``
``paired_audio``          ``root/{train,test}/{data,label}/<N>.wav``
``images``                ``root/<split>/<class>/<class>_<NNNN>.{jpg,png}``
``audio``                 ``root/<label>_<speaker>_<index>.wav`` (flat, FSDD-style)
========================  ==================================================================

Command line (:mod:`h5batch.generate.__main__`)::

    python -m h5batch.generate demo ROOT
    python -m h5batch.generate paired ROOT --n-train 64 --n-test 16
    python -m h5batch.generate images ROOT --n-per-class 50
    python -m h5batch.generate audio ROOT --n-files 100000
"""

from __future__ import annotations

from collections.abc import Callable

from .audio import FSDD_SPEAKERS, make_audio_corpus
from .common import MARKER_NAME, SynthSummary
from .demo import DEMO_CLASSES, DEMO_SAMPLE_RATE, DEMO_SPLITS, make_demo_corpus
from .images import make_image_corpus
from .paired_audio import make_paired_audio

__all__ = [
    "CORPORA",
    "DEMO_CLASSES",
    "DEMO_SAMPLE_RATE",
    "DEMO_SPLITS",
    "FSDD_SPEAKERS",
    "MARKER_NAME",
    "SynthSummary",
    "make_audio_corpus",
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
