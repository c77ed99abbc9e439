"""Resumable sampler state: ``(seed, epoch, position)``, O(1), no replay of data or indices.

Every h5batch sampler inherits :class:`EpochState`. ``position`` counts the units this
epoch's iterator has handed out so far: samples for a sampler, batches for a batch sampler
(global batches for the world-size-invariant ones, so their state means the same on any
number of ranks). The rules, chosen so that torchdata's ``StatefulDataLoader`` restored in a
fresh process continues with exactly the batches an uninterrupted run gives, epochs included,
without any ``set_epoch`` call:

* ``iter()`` decides where it starts *when it is called* (``StatefulDataLoader`` snapshots the
  sampler right after calling it, before any index is drawn): the first ``iter()`` after
  :meth:`load_state_dict` continues the saved epoch at the saved position (a saved epoch that
  was fully drawn yields nothing: the interrupted loop was about to end); otherwise an epoch
  that was fully drawn rolls on to the next epoch, and one left half-way starts again from 0.
* The position is counted when a unit is handed out, so a state saved between two batches
  resumes at the next one; a finished iterator leaves ``(epoch, len)``, never a new epoch,
  so that a loader snapshot taken at the last batch and one taken after the loop agree.
* :meth:`set_epoch` still works: it chooses the epoch of the next ``iter()`` (from 0), except
  that ``set_epoch(e)`` on a just-restored state of epoch ``e`` keeps the restored position.

Only the newest iterator moves the position (an older one still running is not counted).
:func:`sampler_state` pulls the sampler's state at the last *delivered* batch out of a
``StatefulDataLoader.state_dict()`` (with workers the live sampler runs ahead by the
prefetched batches), to restore a sampler under another ``num_workers`` or world size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..argcheck import integer

STATE_VERSION = 1


class EpochState:
    """Mixin: ``epoch``, ``seed``, ``position`` and the resume rules above.

    A subclass sets ``self.seed`` and calls :meth:`_init_state`; defines ``_units()`` (units
    in one epoch), ``_state_checks()`` (values a state must match, e.g. the number of
    samples) and ``_units_of(epoch, start)`` (an iterator over the epoch's units from
    ``start``). ``__iter__`` and ``__len__`` (the current epoch's units) come from here.
    """

    seed: int

    def _init_state(self) -> None:
        self.epoch = 0
        self._position = 0
        self._resume = False
        self._generation = 0

    # -------------------------------------------------------------- subclass

    def _units(self) -> int:
        raise NotImplementedError

    def _state_checks(self) -> dict[str, Any]:
        return {}

    def _units_of(self, epoch: int, start: int) -> Iterator[Any]:
        raise NotImplementedError

    # ---------------------------------------------------------------- public

    @property
    def position(self) -> int:
        """Units (samples or batches) handed out in the current epoch."""
        return self._position

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next ``iter()`` yields, from its start.

        Not needed with h5batch samplers (an exhausted epoch rolls on by itself), kept for
        code written for ``DistributedSampler``. Called with the epoch of a state just
        restored by :meth:`load_state_dict`, it keeps the restored position.
        """
        epoch = integer("epoch", epoch, 0)
        if self._resume and epoch == self.epoch:
            return
        self.epoch, self._position, self._resume = epoch, 0, False

    def state_dict(self) -> dict[str, Any]:
        """``{"sampler", "version", "seed", "epoch", "position", "length", ...}``: plain ints/strs.

        ``length`` is the number of units in an epoch; the other keys are what a state must
        match to be loaded (the number of samples, the window, ...).
        """
        return {"sampler": type(self).__name__, "version": STATE_VERSION, "seed": self.seed,
                "epoch": self.epoch, "position": self._position, "length": self._units(),
                **self._state_checks()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict` of a sampler of the same kind).

        The next ``iter()`` continues that epoch at that position. The seed comes from the
        state. Raises ``ValueError`` naming the key when the state is of another sampler
        kind or was made for other data (number of samples, batch size, world size where
        it matters).
        """
        if not isinstance(state, dict):
            raise TypeError(f"{type(self).__name__}.load_state_dict expects a dict, got {type(state).__name__}")
        kind = state.get("sampler")
        if kind != type(self).__name__:
            raise ValueError(f"state of a {kind!r} sampler cannot be loaded into {type(self).__name__}")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"sampler state version {state.get('version')!r} is not {STATE_VERSION}")
        for key, want in self._state_checks().items():
            if state.get(key) != want:
                raise ValueError(f"sampler state was saved with {key}={state.get(key)!r}, "
                                 f"this {type(self).__name__} has {key}={want!r}")
        seed = integer("state['seed']", state.get("seed"), 0)
        epoch = integer("state['epoch']", state.get("epoch"), 0)
        position = integer("state['position']", state.get("position"), 0)
        before = self.seed, self.epoch
        self.seed, self.epoch = seed, epoch  # an epoch's length may depend on both (bucketing)
        units = self._units()
        if position > units:
            self.seed, self.epoch = before
            raise ValueError(f"sampler state position {position} is past the end of epoch {epoch} "
                             f"({units} in all)")
        self._position, self._resume = position, True

    # --------------------------------------------------------------- iterate

    def __len__(self) -> int:
        return self._units()

    def __iter__(self) -> Iterator[Any]:
        """A new iterator: its epoch and start by the rules of the module docstring."""
        if self._resume:
            self._resume = False
        elif self._position and self._position >= self._units():
            self.epoch, self._position = self.epoch + 1, 0
        else:
            self._position = 0
        self._generation += 1
        return self._count(self._generation, self.epoch, self._position)

    def _count(self, generation: int, epoch: int, start: int) -> Iterator[Any]:
        position = start
        for unit in self._units_of(epoch, start):
            position += 1
            if generation == self._generation:
                self._position = position
            yield unit


def sampler_state(loader_state: dict[str, Any], batch_size: int | None = None) -> dict[str, Any]:
    """The h5batch sampler state at the last batch a ``StatefulDataLoader`` delivered.

    ``loader_state`` is ``StatefulDataLoader.state_dict()`` (any ``num_workers``); the
    sampler is either the loader's ``batch_sampler`` or its ``sampler`` (torchdata wraps it in
    a ``BatchSampler``). Load the result into a sampler of a loader with another
    ``num_workers`` (torchdata refuses to load its own state there), or, for a
    world-size-invariant sampler, into every rank of another world size.

    ``batch_size`` is needed only when the loader snapshots less often than every step
    (``snapshot_every_n_steps > 1``) and the sampler is a per-sample one.
    """
    snapshot = loader_state.get("_snapshot")
    steps = 0
    main = loader_state
    if snapshot is not None:  # multiprocess layout: the main process's snapshot
        main = snapshot.get("_main_snapshot", {})
        steps = int(loader_state.get("_steps_since_snapshot", 0))
    direct = main.get("_index_sampler_state")
    if isinstance(direct, dict) and "sampler" in direct:
        state, per_unit = dict(direct), 1
    else:
        wrapped = (main.get("_sampler_iter_state") or {}).get("sampler_state")
        if not (isinstance(wrapped, dict) and "sampler" in wrapped):
            raise ValueError("no h5batch sampler state in this loader state: the loader's sampler "
                             "or batch_sampler must be an h5batch sampler")
        state, per_unit = dict(wrapped), batch_size
    if steps:
        if per_unit is None:
            raise ValueError(f"the loader state is {steps} batches past its last snapshot: "
                             "pass batch_size= to account for them")
        state["position"] = min(state["position"] + steps * integer("batch_size", per_unit, 1),
                                state["length"])
    return state
