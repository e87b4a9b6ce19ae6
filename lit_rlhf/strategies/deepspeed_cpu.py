"""DeepSpeed ZeRO-2/3 on CPU processes (gloo): how CI tests the DeepSpeed code paths without a GPU.

Lightning's :class:`~lightning.pytorch.strategies.DeepSpeedStrategy` refuses every accelerator but
CUDA, although DeepSpeed itself runs on CPU (its CPU accelerator, with gloo). This subclass removes
only Lightning's CUDA assumptions, so that sharded initialisation, the ZeRO optimizer wrappers,
DeepSpeed's gradient clipping and its checkpoint directories all run in the CPU test suite exactly
as they do on GPUs. It is a correctness tool, not a fast way to train.

YAML (a trainer fragment, see ``configs/trainer/cpu_deepspeed_zero2.yaml``)::

    trainer:
      accelerator: cpu
      devices: 2
      strategy:
        class_path: lit_rlhf.strategies.CPUDeepSpeedStrategy
        init_args: {stage: 2}
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import DDPStrategy
from typing_extensions import override

from lit_rlhf.strategies.deepspeed import DeepSpeedStrategy


class CPUDeepSpeedStrategy(DeepSpeedStrategy):
    """lit-rlhf's :class:`~lit_rlhf.strategies.DeepSpeedStrategy` (Lightning's, with checkpoint
    folders free of frozen models) on ``accelerator="cpu"``; takes all of its arguments.

    Departures from the parent, each for one CUDA-only assumption:

    - ``setup_environment`` skips the "only supported on CUDA GPUs" check;
    - ``root_device`` is ``cpu:<local rank>``: DeepSpeed reads the device index as the local rank
      (``argparse.Namespace(device_rank=root_device.index)``), and plain ``cpu`` has none;
    - ``setup_distributed`` skips Lightning's check that device indices equal local ranks (every
      CPU process sees the same ``cpu`` device) and initialises DeepSpeed's backend with gloo.

    Args:
        build_shm_op: let DeepSpeed compile its shared-memory collective op with g++ on first use
            (about 25 s per fresh environment; it only speeds up CPU all-reduce). Off by default:
            gloo's own collectives serve.
        **kwargs: :class:`~lit_rlhf.strategies.DeepSpeedStrategy`'s, by name (``stage``,
            ``config``, offload settings, ...).
    """

    strategy_name = "deepspeed_cpu"

    def __init__(self, *, build_shm_op: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.build_shm_op = build_shm_op

    @property
    @override
    def root_device(self) -> torch.device:
        return torch.device("cpu", self.local_rank)

    @override
    def setup_environment(self) -> None:
        # DDPStrategy's version (set up the device, then ``setup_distributed``) without
        # DeepSpeedStrategy's CUDA-only check in front of it.
        DDPStrategy.setup_environment(self)

    @override
    def setup_distributed(self) -> None:
        reset_seed()
        self.set_world_ranks()
        if not self.build_shm_op:
            _skip_shm_op_build()
        self._init_deepspeed_distributed()


def _skip_shm_op_build() -> None:
    """Make DeepSpeed's torch backend start without compiling its shared-memory op.

    The function lives in module ``deepspeed.comm.torch``; ``import deepspeed.comm.torch`` would
    bind the name ``torch`` of package ``deepspeed.comm`` (that package re-exports PyTorch), hence
    importlib. The backend falls back to torch.distributed collectives when the op is None.
    """
    module: Any = importlib.import_module("deepspeed.comm.torch")
    module.build_shm_op = lambda: None
