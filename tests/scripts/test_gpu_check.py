"""scripts/gpu_check.sh: its windows measure every PPO / GRM GPU preset exactly once, with the
preset's DeepSpeed fragment, and its step timeouts fit one 8-minute command. The script runs with
``PYTHON=echo``, so each step prints the command it would run."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def rl_gpu_presets() -> dict[str, str | None]:
    """{preset: the DeepSpeed fragment its header composes, or None}."""
    found: dict[str, str | None] = {}
    for path in sorted((ROOT / "configs").glob("*/*.yaml")):
        text = path.read_text()
        config = yaml.safe_load(text) or {}
        module = str((config.get("model") or {}).get("class_path", ""))
        on_gpu = (config.get("trainer") or {}).get("accelerator") == "gpu"
        if on_gpu and module.rsplit(".", 1)[-1] in ("PPOModule", "GenerativeRewardModule"):
            fragment = re.search(r"configs/trainer/deepspeed_zero\d\.yaml", text)
            found[str(path.relative_to(ROOT))] = fragment.group(0) if fragment else None
    return found


def measured(window: int, tmp_path: Path) -> list[list[str]]:
    env = {**os.environ, "PYTHON": "echo", "WINDOW": str(window), "OUT": str(tmp_path)}
    out = subprocess.run(["bash", str(SCRIPT), "2"], env=env, capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return [line.split() for line in out.stdout.splitlines() if "lit_rlhf.measure" in line]


def test_the_windows_measure_every_rl_gpu_preset_once(tmp_path: Path) -> None:
    presets = rl_gpu_presets()
    assert len(presets) >= 12
    seen: list[str] = []
    for window in (1, 2, 3):
        commands = measured(window, tmp_path)
        assert 1 <= len(commands) <= 4, window  # 4 slots of 60 s
        for words in commands:
            configs = [words[i + 1] for i, w in enumerate(words) if w == "--config"]
            seen.append(configs[0])
            assert configs[1:] == ([presets[configs[0]]] if presets[configs[0]] else [])
            out = words[words.index("--out") + 1]
            assert Path(out).parent == tmp_path and out.endswith(".json")
    assert sorted(seen) == sorted(presets)  # each exactly once


def test_the_timeouts_fit_one_eight_minute_command() -> None:
    text = SCRIPT.read_text()
    timeouts = [int(t) for t in re.findall(r"\btimeout (\d+) ", text)]
    measure = int(re.search(r"timeout (\d+) \$PY -m lit_rlhf.measure", text).group(1))
    # each step once, the measure step once per preset of the largest window
    total = sum(timeouts) - measure + 4 * measure
    assert total <= 8 * 60, total
    assert f"timeouts: {' + '.join(['40', '4 x 60', '120', '80'])} = {total} s" in text
