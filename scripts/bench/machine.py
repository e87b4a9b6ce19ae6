"""What a benchmark ran on: the CPU model and whether it has native bf16 (``avx512_bf16`` /
``amx_bf16`` in /proc/cpuinfo), torch and its threads, the GPU, the float32 and bf16 GEMM rates
at the start and at the end of the run, and the share of the machine's CPU time that other
processes took during it (a disturbed run says so)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
DISTURBED = 0.10  # the other processes' CPU share above which a run is flagged


def cpu(text: str | None = None) -> tuple[str, list[str]]:
    """The CPU model and its native-bf16 flags (empty: bf16 matmuls are emulated) from
    ``text`` (default: /proc/cpuinfo)."""
    path = Path("/proc/cpuinfo")
    if text is None:
        text = path.read_text() if path.exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                  if line.startswith("model name")), "unknown CPU")  # fmt: skip
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])  # fmt: skip
    return model, [f for f in BF16_FLAGS if f in flags]


def gemm_rate(dtype: torch.dtype, device: torch.device, size: int, repeats: int = 5) -> float:
    """Best FLOP/s of a square ``size`` matmul in ``dtype`` on the configured threads."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        torch.mm(a, b)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def gemm_rates(device: torch.device, smoke: bool) -> dict[str, float]:
    size = 256 if smoke else (8192 if device.type == "cuda" else 1024)
    return {name: gemm_rate(dtype, device, size)
            for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}  # fmt: skip


def busy_seconds() -> float:
    """CPU seconds all processes spent busy since boot (/proc/stat; 0 where it is missing)."""
    path = Path("/proc/stat")
    if not path.exists():
        return 0.0
    ticks = [int(x) for x in path.read_text().splitlines()[0].split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    """CPU seconds of this process and its finished children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Machine:
    """Opened at the start of a run (description, GEMM rates, CPU counters), closed at its end."""

    def __init__(self, smoke: bool = False) -> None:
        self.smoke = smoke
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model, bf16 = cpu()
        self.info: dict[str, Any] = {
            "cpu": model, "native_bf16": bf16, "cpus": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name() if self.device.type == "cuda" else None,
        }  # fmt: skip
        self.info["gemm_start"] = gemm_rates(self.device, smoke)
        self.wall, self.busy, self.own = time.perf_counter(), busy_seconds(), own_seconds()

    def close(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.wall
        other = busy_seconds() - self.busy - (own_seconds() - self.own)
        # /proc/stat counts in clock ticks (10 ms): over a short run the difference can round
        # past the machine's capacity, and a share is at most all of it
        share = max(other, 0.0) / (wall * (os.cpu_count() or 1))
        self.info["other_cpu_share"] = min(share, 1.0)
        self.info["gemm_end"] = gemm_rates(self.device, self.smoke)
        return self.info

    def header(self) -> str:
        i = self.info
        where = i["gpu"] or f"{i['cpus']} CPUs"
        return (f"Machine: {i['cpu']}, native bf16: {', '.join(i['native_bf16']) or 'none'}; "
                f"{where}; torch {i['torch']}, {i['threads']} threads.")  # fmt: skip

    def footer(self) -> list[str]:
        i, unit = self.info, 1e12 if self.device.type == "cuda" else 1e9
        name = "TFLOP/s" if unit == 1e12 else "GFLOP/s"
        rates = "; ".join(
            f"{d} {i['gemm_start'][d] / unit:.0f} at the start, {i['gemm_end'][d] / unit:.0f} "
            f"at the end"
            for d in ("fp32", "bf16")
        )
        share = i["other_cpu_share"]
        lines = [f"GEMM rates ({name}): {rates}.", f"Other processes used {share:.0%} of the "
                 "machine's CPU time during the run."]  # fmt: skip
        if share > DISTURBED:
            lines.append("DISTURBED: other processes competed for the CPU; the timings are off.")
        return lines
