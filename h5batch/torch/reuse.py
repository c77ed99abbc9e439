"""Private batch memory that the main process reuses once nothing holds it (``num_workers=0``).

Why: without workers each batch is a fresh allocation in the main process. Whether the C
library hands back the pages of the last one or maps fresh ones (each 4 KiB page then
faulted in and zeroed by the kernel as the batch is filled) depends on its heap's history,
so the same loop's speed varied from one process to the next. Reusing the storage of a
batch the caller has dropped removes that cost and that variance. The workers'
counterpart, for shared memory, is :mod:`h5batch.torch.recycle`.

The rule: a storage is reused only when this pool holds the only reference to it (torch's
use count of the storage is 1: no tensor, view or numpy array of the caller's is left on
it), so a batch the caller still holds is never overwritten. The pool keeps at most
:data:`MAX_SLOTS` storages and :data:`MAX_POOLED_BYTES`; past that (a caller who keeps many
batches), batches get fresh memory as before. The pool belongs to one process: after a fork
it starts empty (:meth:`PrivatePool.storage` checks the pid).
"""

from __future__ import annotations

import os

import torch

MAX_SLOTS = 4  # a training loop holds one batch while the next is read: 2 are enough, 4 spare
MAX_POOLED_BYTES = 1 << 30
ALIGN = 64


class PrivatePool:
    """Up to :data:`MAX_SLOTS` private storages, each handed out again once only the pool holds it."""

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
        if len(self.slots) < MAX_SLOTS and pooled + new.nbytes() <= MAX_POOLED_BYTES:
            self.slots.append(new)
        elif free:  # make room: the largest free slot goes
            self.slots[max(free, key=lambda k: self.slots[k].nbytes())] = new
        return new


__all__ = ["MAX_SLOTS", "PrivatePool"]
