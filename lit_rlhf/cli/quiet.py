"""Third-party messages that ``lit-rlhf`` leaves out of a run's output, and why each.

Each one is printed on every run by a dependency, says nothing the user can act on, and hides
the lines that matter (a refused setting, a progress line). Everything else is left as it is:
a warning lit-rlhf does not name here still prints.

- DeepSpeed's "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to
  detect it." on every import on a machine without CUDA: ``DS_ACCELERATOR=cpu`` is set there
  (what DeepSpeed would choose itself) unless the environment sets it.
- Lightning's "Tip: ... try installing litlogger / litmodels" advertisements.
- torch's FutureWarning "``isinstance(treespec, LeafSpec)`` is deprecated", raised inside
  Lightning's own batch-size helper; and torchdata's "'set_vital' is deprecated", raised inside
  ``StatefulDataLoader`` (lit-rlhf's resumable loaders) by its own call into torch.
"""

from __future__ import annotations

import logging
import os
import warnings

_WARNINGS = (
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    (r"'set_vital' is deprecated", UserWarning),
)
_ADVERTS = ("💡 Tip: For seamless",)


class _DropAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_ADVERTS)


def quiet_third_party() -> None:
    """Silence the messages listed in this module (idempotent; call before the imports that
    print them)."""
    if "DS_ACCELERATOR" not in os.environ and not _has_cuda():
        os.environ["DS_ACCELERATOR"] = "cpu"
    for message, category in _WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropAdverts) for f in logger.filters):
            logger.addFilter(_DropAdverts())


def _has_cuda() -> bool:
    """Whether a CUDA device may be present, without importing torch: a visible NVIDIA driver
    (``/proc/driver/nvidia``) not hidden by ``CUDA_VISIBLE_DEVICES``."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return os.path.exists("/proc/driver/nvidia") or os.path.exists("/dev/nvidiactl")
