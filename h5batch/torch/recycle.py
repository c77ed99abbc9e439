"""Batch memory reused once nothing holds it: shared-memory buffers that DataLoader workers
reuse once the main process is done (:class:`SharedBatchPool`), and private ones the main
process reuses without workers (:class:`PrivatePool`).

Why: with a fresh shared storage per batch, every page is faulted in and zeroed when the
worker fills it and freed when the main process drops it, which caps ``num_workers > 0``
throughput (``docs/benchmarks.md``).

A storage may be reused only when the main process holds no tensor on it, which only the
main process knows:

* each worker keeps up to :data:`MAX_SLOTS` storages ("slots") per pool and carves batches
  from them (:meth:`SharedBatchPool.storage`);
* when a slot's tensor is pickled for the main process, this module's reducer stamps it with
  a *lease* ``(pool token, worker row, slot, generation, worker pid)``;
* once nothing else in the main process holds that storage (checked as leased tensors
  arrive), it writes the generation into the pool's shared int64 *control block*; the
  storage stays mapped until its worker exits (:class:`_Releases`);
* a worker reuses a slot only when it holds the last local reference and the control block
  shows the generation it last sent; an unsent slot is reused once dropped.

A slot still leased is not used (another one or a fresh storage is taken). BEWARE: if the
main process passes a batch tensor to *another* process and drops its own reference, the
worker may overwrite it while that process reads it; copy such tensors, or turn recycling off.

Without workers (:class:`PrivatePool`) each batch would be a fresh allocation in the main
process. Whether the C library hands back the pages of the last one or maps fresh ones (each
4 KiB page then faulted in and zeroed by the kernel as the batch is filled) depends on its
heap's history, so the same loop's speed varied from one process to the next. Reusing the
storage of a batch the caller has dropped removes that cost and that variance. A private
storage is reused only when the pool holds the only reference to it (torch's use count of the
storage is 1: no tensor, view or numpy array of the caller's is left on it), so a batch the
caller still holds is never overwritten. The pool keeps at most :data:`PRIVATE_SLOTS` storages
and :data:`MAX_POOLED_BYTES`; past that (a caller who keeps many batches), batches get fresh
memory as before. It belongs to one process: after a fork it starts empty.
"""

from __future__ import annotations

import itertools
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from torch.multiprocessing.reductions import reduce_tensor
from torch.utils.data import get_worker_info

from ..transport.segments import pid_alive

MAX_WORKERS = 64  # rows of the control block; loaders with more workers do not recycle
MAX_SLOTS = 32  # storages one worker keeps per pool
PRIVATE_SLOTS = 4  # a training loop holds one batch while the next is read: 2 are enough, 4 spare
MAX_POOLED_BYTES = 1 << 30  # per worker and pool (or private pool); past it, fresh storages as before
ALIGN = 64  # bytes; slot capacities are rounded up to this

#: pools created or unpickled in this process, by token (the main process looks leases up here)
_POOLS: weakref.WeakValueDictionary[int, SharedBatchPool] = weakref.WeakValueDictionary()
#: in a worker: data_ptr of a slot's storage -> (pool state, slot index), for the reducer
_SLOT_OF_PTR: dict[int, tuple[_WorkerSlots, int]] = {}
_reducer_pid: int | None = None


@dataclass(slots=True)
class _Slot:
    storage: torch.UntypedStorage
    capacity: int
    issued: int | None = None  # generation of the last lease sent, None if never sent


class _WorkerSlots:
    """One worker process's slots of one pool."""

    def __init__(self, pool: SharedBatchPool, worker: int):
        self.pool = pool
        self.worker = worker
        self.slots: list[_Slot] = []
        # Unique per process: a late release for an earlier worker process with the same id
        # can never match a generation this one issues.
        self.generations = itertools.count(secrets.randbits(40) << 20)
        self.lock = threading.Lock()  # the reducer runs in the queue's feeder thread

    def _free(self, k: int) -> bool:
        slot = self.slots[k]
        # Local references first: once the feeder thread has pickled a batch (and issued
        # its lease) it drops it, so a count of 1 means ``issued`` is already up to date.
        if torch._C._storage_Use_Count(slot.storage._cdata) != 1:
            return False
        return slot.issued is None or int(self.pool.released[self.worker, k]) == slot.issued

    def take(self, nbytes: int) -> torch.UntypedStorage | None:
        with self.lock:
            free = [k for k in range(len(self.slots)) if self._free(k)]
            fits = [k for k in free if nbytes <= self.slots[k].capacity <= 2 * nbytes + ALIGN]
            if fits:
                k = min(fits, key=lambda k: self.slots[k].capacity)
                return self.slots[k].storage
            capacity = -(-nbytes // ALIGN) * ALIGN
            pooled = sum(s.capacity for s in self.slots)
            if len(self.slots) >= MAX_SLOTS or pooled + capacity > MAX_POOLED_BYTES:
                if not free:
                    return None
                k = max(free, key=lambda k: self.slots[k].capacity)  # make room
                _SLOT_OF_PTR.pop(self.slots[k].storage.data_ptr(), None)
                self.slots[k] = _Slot(torch.UntypedStorage._new_shared(capacity), capacity)
            else:
                k = len(self.slots)
                self.slots.append(_Slot(torch.UntypedStorage._new_shared(capacity), capacity))
            _SLOT_OF_PTR[self.slots[k].storage.data_ptr()] = (self, k)
            return self.slots[k].storage

    def lease(self, k: int) -> tuple[int, int, int, int, int]:
        with self.lock:
            gen = next(self.generations)
            self.slots[k].issued = gen
            return (self.pool.token, self.worker, k, gen, os.getpid())


class SharedBatchPool:
    """Recycled shared-memory storages for the batches a Dataset builds in DataLoader workers.

    Create it in the main process, before the DataLoader starts its workers (datasets take
    :func:`shared_pool` in ``__init__``); in a worker, :meth:`storage` returns reused
    storage, elsewhere fresh storage (``h5batch.torch.batch.empty_columns`` carves it).
    """

    def __init__(self) -> None:
        self.token = secrets.randbits(62)
        storage = torch.UntypedStorage._new_shared(MAX_WORKERS * MAX_SLOTS * 8)
        self._control = torch.empty(0, dtype=torch.int64).set_(storage, 0, (MAX_WORKERS, MAX_SLOTS))
        self._control.fill_(-1)
        self._clear_process_state()
        _POOLS[self.token] = self

    def _clear_process_state(self) -> None:
        self._pid: int | None = None
        self._worker: _WorkerSlots | None = None
        self.released = self._control.numpy()  # (MAX_WORKERS, MAX_SLOTS) int64 view of the control block

    def __getstate__(self) -> dict[str, Any]:
        # The control tensor goes by file descriptor under torch's multiprocessing pickler
        # (spawn, forkserver); a plain pickle copies it, which only disables recycling.
        return {"token": self.token, "_control": self._control}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._clear_process_state()
        _POOLS.setdefault(self.token, self)

    def _slots(self) -> _WorkerSlots | None:
        pid = os.getpid()
        if self._pid != pid:
            self._pid = pid
            info = get_worker_info()
            self._worker = None
            if info is not None and info.num_workers <= MAX_WORKERS:
                _install_reducer()
                # The control row comes from the worker's seed, not its id, so two loaders at
                # once (train and validation share this pool) rarely share rows. A shared row
                # is only slower, never wrong: generations are unique per worker process.
                self._worker = _WorkerSlots(self, info.seed % MAX_WORKERS)
        return self._worker

    def storage(self, nbytes: int) -> torch.UntypedStorage:
        """A shared storage of at least ``nbytes``; recycled inside DataLoader workers."""
        slots = self._slots() if nbytes else None
        storage = slots.take(nbytes) if slots is not None else None
        return storage if storage is not None else torch.UntypedStorage._new_shared(nbytes)



_shared: SharedBatchPool | None = None


def shared_pool() -> SharedBatchPool:
    """The pool every recycling dataset of this process uses.

    One pool, so one control block and file descriptor however many datasets (a
    ``ConcatDataset`` of thousands of files would otherwise hit the open-file limit). Slots
    are per worker and lease, so datasets can share them.
    """
    global _shared
    if _shared is None:
        _shared = SharedBatchPool()
    return _shared


# ------------------------------------------------------------------ worker side: leases

def _install_reducer() -> None:
    """Route tensor pickling in this worker through :func:`_reduce_leased` (once per process)."""
    global _reducer_pid
    if _reducer_pid != os.getpid():
        ForkingPickler.register(torch.Tensor, _reduce_leased)
        _reducer_pid = os.getpid()


def _reduce_leased(tensor: torch.Tensor) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    rebuild, args = reduce_tensor(tensor)
    found = _SLOT_OF_PTR.get(tensor.untyped_storage().data_ptr()) if tensor.device.type == "cpu" else None
    if found is None:
        return rebuild, args
    slots, k = found
    return _rebuild_leased, (rebuild, args, slots.lease(k))


# ------------------------------------------------------------- main side: releases

#: seconds between checks for exited workers whose storages this process still maps
WATCH_INTERVAL = 1.0


@dataclass(slots=True)
class _Held:
    """One worker slot's storage as mapped in this process."""

    storage: torch.UntypedStorage
    control: Any  # the pool's (MAX_WORKERS, MAX_SLOTS) numpy view
    row: int  # the worker's row in it
    gen: int = -1
    released: bool = True


class _Releases:
    """The leased storages this (main) process has received, one per worker slot.

    A storage is *released* to its worker (the lease's generation written to the control
    block) once every batch tensor on it has died. It stays mapped here so that when the
    worker sends that slot again torch's rebuild finds it cached and no page faults in
    again. A slot replaced in the worker is replaced here; storages of exited workers are
    dropped by a watcher thread within :data:`WATCH_INTERVAL`.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[tuple[int, int, int], _Held] = {}  # (pool token, worker pid, slot)
        self.watcher: threading.Thread | None = None

    def track(self, storage: torch.UntypedStorage, lease: tuple[int, ...]) -> None:
        token, worker, k, gen, pid = lease
        pool = _POOLS.get(token)
        with self.lock:
            if pool is not None:
                key = (token, pid, k)
                h = self.held.get(key)
                if h is None or h.storage.data_ptr() != storage.data_ptr():
                    h = self.held[key] = _Held(storage, pool.released, worker)
                h.gen, h.released = gen, False
            for (_, _, slot), h in self.held.items():
                if not h.released and torch._C._storage_Use_Count(h.storage._cdata) == 1:
                    h.control[h.row, slot] = h.gen
                    h.released = True
            if self.held and (self.watcher is None or not self.watcher.is_alive()):
                self.watcher = threading.Thread(target=self._watch, name="h5batch-recycle-watch", daemon=True)
                self.watcher.start()

    def _watch(self) -> None:
        """Drop the storages of exited workers; end once nothing is held."""
        while True:
            time.sleep(WATCH_INTERVAL)
            with self.lock:
                for key in [key for key in self.held if not pid_alive(key[1])]:
                    del self.held[key]
                if not self.held:
                    self.watcher = None
                    return


_RELEASES = _Releases()
# Started afresh in a forked child (the next epoch's DataLoader workers), which would otherwise
# keep the previous workers' storages mapped for its whole life; and the lock may have been
# held by the watcher thread, which does not exist in the child.
os.register_at_fork(after_in_child=_RELEASES.__init__)


def _rebuild_leased(rebuild: Callable[..., torch.Tensor], args: tuple[Any, ...],
                    lease: tuple[int, ...]) -> torch.Tensor:
    tensor = rebuild(*args)
    _RELEASES.track(tensor.untyped_storage(), lease)
    return tensor


# ------------------------------------------------- main process without workers

class PrivatePool:
    """Up to :data:`PRIVATE_SLOTS` private storages, each handed out again once only the pool
    holds it (see the module docstring)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.slots: list[torch.UntypedStorage] = []
        self.reused = 0  # storages handed out again (for tests and tuning)

    def __getstate__(self) -> dict[str, object]:
        return {"pid": None, "slots": [], "reused": 0}

    def storage(self, nbytes: int) -> torch.UntypedStorage:
        """A storage of at least ``nbytes`` (at most about twice that) nobody else holds."""
        if self.pid != os.getpid():  # a forked copy: the parent's storages are not ours
            self.pid, self.slots = os.getpid(), []
        free = [k for k, s in enumerate(self.slots) if torch._C._storage_Use_Count(s._cdata) == 1]
        fits = [k for k in free if nbytes <= self.slots[k].nbytes() <= 2 * nbytes + ALIGN]
        if fits:
            self.reused += 1
            return self.slots[min(fits, key=lambda k: self.slots[k].nbytes())]
        new = torch.UntypedStorage(-(-max(nbytes, 1) // ALIGN) * ALIGN)
        pooled = sum(s.nbytes() for s in self.slots)
        if len(self.slots) < PRIVATE_SLOTS and pooled + new.nbytes() <= MAX_POOLED_BYTES:
            self.slots.append(new)
        elif free:  # make room: the largest free slot goes
            self.slots[max(free, key=lambda k: self.slots[k].nbytes())] = new
        return new
