"""Orderly end of a multi-process run.

Lightning leaves the default process group alive when ``fit`` returns; it is then destroyed by
the interpreter's exit, in whatever order the ranks happen to exit. Rank 0 hosts the rendezvous
store, so when it exits first another rank's gloo threads can be torn down mid-operation and
abort the process (SIGABRT, "terminate called without an active exception"), which Lightning's
launcher reports as a failed child and answers by killing every rank. Meeting at a barrier and
destroying the group explicitly on every rank removes that race.
"""

from __future__ import annotations

import torch.distributed as dist


def shutdown_distributed() -> bool:
    """Barrier, then destroy the default process group if one is up; returns whether it was.

    Call once per process after the last collective (end of ``fit``/``validate``/``test``).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return False
    dist.barrier()
    dist.destroy_process_group()
    return True
