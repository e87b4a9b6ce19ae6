"""A preflight at the start of every multi-process run: all ranks meet at the rendezvous within a
deadline, before Lightning creates the process group.

Without it, a rank that never starts (a node whose launch failed, a wrong ``--node-rank``, a
``srun`` task stuck on a bad node) leaves every other rank waiting inside
``init_process_group`` for torch's collective timeout, 30 minutes by default, and a wrong
``MASTER_ADDR`` / ``MASTER_PORT`` does the same on every rank but 0. The preflight runs right
before the strategy's ``setup_environment`` (the first thing Lightning does on each rank once
the processes exist): each rank writes its rank, node, local rank, world size, host and process
id into the rendezvous store at ``MASTER_ADDR:MASTER_PORT``, then waits until every rank's
record is there. Past the deadline (``LIT_RLHF_PREFLIGHT_TIMEOUT_S``, default 60 s) it raises a
:class:`PreflightError` whose one line names the missing ranks, the rendezvous address and the
fix; ``lit-rlhf`` prints that line and exits with 1. Ranks that disagree on the world size, and
two processes claiming one rank, are refused the same way. Rank 0 logs one line with every
rank's record (which node and host each rank runs on).

The store is the one the process group then uses: rank 0 hosts it with multi-tenancy, as
torch's ``env://`` rendezvous does, so Lightning's ``init_process_group`` right after shares the
same server and port; under torchrun (``TORCHELASTIC_USE_AGENT_STORE=True``) every rank is a
client of the agent's store, as torch's own ranks are. Torchrun's agents meet before they start
any rank: their own wait is ``--rdzv-conf timeout=S`` (docs/scaling.md).
"""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_info

from lit_rlhf.errors import SettingError

TIMEOUT_VARIABLE = "LIT_RLHF_PREFLIGHT_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 60.0
_FIX_MISSING = (
    "start the launch of every node (same MASTER_ADDR, MASTER_PORT and --nnodes, each its own "
    "--node-rank 0..N-1; under Slurm one srun task per rank) and check that the missing ranks' "
    f"hosts can reach the rendezvous, or raise {TIMEOUT_VARIABLE}"
)


class PreflightError(SettingError, RuntimeError):
    """The ranks of a multi-process run did not all meet at the rendezvous within the preflight's
    deadline, or disagree on the run's shape; the message names the ranks, the address and the
    fix (one line)."""


def preflight_timeout() -> float:
    """``LIT_RLHF_PREFLIGHT_TIMEOUT_S`` in seconds (default 60); a value that is not a positive
    number is refused with the fix."""
    raw = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise PreflightError(
            f"{TIMEOUT_VARIABLE}={raw!r} is not a positive number of seconds. Fix: set it to "
            f"the preflight's deadline, e.g. {DEFAULT_TIMEOUT_S:.0f}, or unset it"
        )
    return value


def install_preflight(strategy: Any) -> None:
    """Run :func:`run_preflight` at the start of ``strategy.setup_environment`` (once per
    process, before the process group exists). A strategy without ranks (one device) is left
    as it is."""
    original = getattr(strategy, "setup_environment", None)
    if original is None or getattr(original, "_lit_rlhf_preflight", False):
        return
    if getattr(strategy, "set_world_ranks", None) is None:
        return

    def setup_environment() -> None:
        store = run_preflight(strategy)
        original()
        del store  # the process group holds the server from here on

    setup_environment._lit_rlhf_preflight = True  # type: ignore[attr-defined]
    strategy.setup_environment = setup_environment


def run_preflight(strategy: Any) -> Any:
    """The preflight of ``strategy``'s rank (see the module docstring); returns the store (keep
    it until the process group is up) or None when there is nothing to check (one process, or a
    process group already up)."""
    env = getattr(strategy, "cluster_environment", None)
    if env is None or (dist.is_available() and dist.is_initialized()):
        return None
    strategy.set_world_ranks()
    world, rank = int(strategy.world_size), int(strategy.global_rank)
    if world <= 1 or not dist.is_available():
        return None
    timeout = preflight_timeout()
    start = time.monotonic()
    address, port = str(env.main_address), int(env.main_port)
    where = f"{address}:{port}"
    store = _connect(address, port, rank, world, timeout)
    prefix = f"lit_rlhf/preflight/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    record = {
        "rank": rank,
        "world": world,
        "node": int(env.node_rank()),
        "local": int(env.local_rank()),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    if store.add(f"{prefix}claims/{rank}", 1) > 1:
        raise PreflightError(
            f"preflight: two processes claim rank {rank} of {world} at the rendezvous {where}. "
            "Fix: give each node's launch its own --node-rank (0..N-1) and each srun task its "
            "own SLURM_PROCID"
        )
    store.set(f"{prefix}rank/{rank}", json.dumps(record))
    missing = _wait_for_ranks(store, prefix, world, start + timeout, where)
    if missing:
        ranks = ", ".join(str(r) for r in missing)
        raise PreflightError(
            f"preflight: rank(s) {ranks} of {world} did not arrive within {timeout:g} s at the "
            f"rendezvous {where} (this is rank {rank}). Fix: {_FIX_MISSING}"
        )
    records = [json.loads(store.get(f"{prefix}rank/{r}")) for r in range(world)]
    _check_agreement(records, where)
    ranks_seen = "; ".join(
        f"rank {r['rank']} node {r['node']} local {r['local']} on {r['host']} pid {r['pid']}"
        for r in records
    )
    rank_zero_info(
        f"preflight: {world} of {world} ranks met at {where} in {time.monotonic() - start:.1f} s "
        f"({type(env).__name__}): {ranks_seen}"
    )
    return store


def _connect(address: str, port: int, rank: int, world: int, timeout: float) -> Any:
    """The rendezvous store at ``address:port`` (rank 0 hosts it unless torchrun's agent
    does); an unknown host, a port taken on rank 0 or a host that does not answer within the
    deadline raises :class:`PreflightError`."""
    where = f"{address}:{port}"
    try:
        socket.getaddrinfo(address, port)
    except OSError as err:
        raise PreflightError(
            f"preflight: the rendezvous host {address!r} does not resolve ({err}) on rank "
            f"{rank}. Fix: set MASTER_ADDR (torchrun --master-addr) to node rank 0's host name "
            "or IP address, reachable from every node"
        ) from None
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    hosts = rank == 0 and not agent_store
    try:
        return dist.TCPStore(
            address, port, world_size=None, is_master=hosts,
            timeout=timedelta(seconds=timeout), wait_for_workers=False, multi_tenant=True,
        )  # fmt: skip
    except (RuntimeError, OSError) as err:
        cause = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        if hosts and "in use" in cause.lower():
            raise PreflightError(
                f"preflight: rank 0 of {world} cannot host the rendezvous {where}: the port is in "
                f"use ({cause}). Fix: set MASTER_PORT (torchrun --master-port) to a port free on "
                "node rank 0"
            ) from None
        else:
            fix = (
                "check that MASTER_ADDR and MASTER_PORT name node rank 0's host and a port open "
                "between the nodes (firewall), and that node rank 0's launch is running"
            )
        raise PreflightError(
            f"preflight: rank {rank} of {world} could not reach the rendezvous {where} within "
            f"{timeout:g} s ({cause}). Fix: {fix}"
        ) from None


def _wait_for_ranks(store: Any, prefix: str, world: int, deadline: float, where: str) -> list[int]:
    """The ranks whose records are still missing at ``deadline`` (empty: all arrived)."""
    missing = list(range(world))
    while True:
        try:
            missing = [r for r in missing if not store.check([f"{prefix}rank/{r}"])]
        except (RuntimeError, OSError) as err:  # rank 0 (the store's host) ended
            raise PreflightError(
                f"preflight: the rendezvous {where} closed while ranks {missing} were awaited "
                f"({(str(err).strip().splitlines() or [''])[0][:120]}). Fix: read node rank 0's "
                "log for its error and start every node again"
            ) from None
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(0.1)


def _check_agreement(records: list[dict[str, Any]], where: str) -> None:
    """Every rank's world size is the same."""
    worlds = {r["rank"]: r["world"] for r in records}
    if len(set(worlds.values())) > 1:
        raise PreflightError(
            f"preflight: the ranks at {where} disagree on the world size ({worlds}). Fix: give "
            "every node the same --nnodes / trainer.num_nodes and processes per node "
            "(trainer.devices, --nproc-per-node)"
        )
