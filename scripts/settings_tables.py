"""Write README's settings overview and docs/settings.md from the settings dataclasses.

Command: python scripts/settings_tables.py          (writes both)
         python scripts/settings_tables.py --check  (exit 1 when either differs)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lit_rlhf.modules import (
    CompressorDecoderModule,
    DPOModule,
    GenerativeRewardModule,
    PPOModule,
    RewardModelModule,
    SFTModule,
)
from lit_rlhf.settings import SettingsGroup, group_params
from lit_rlhf.settings.tables import module_defaults, overview, reference, replace_between

ROOT = Path(__file__).resolve().parents[1]
MODULES: dict[str, type] = {
    "PPOModule": PPOModule,
    "GenerativeRewardModule": GenerativeRewardModule,
    "RewardModelModule": RewardModelModule,
    "SFTModule": SFTModule,
    "DPOModule": DPOModule,
    "CompressorDecoderModule": CompressorDecoderModule,
}
HEADER = """# Settings reference

Generated from the settings dataclasses (`lit_rlhf/settings/`) by
`python scripts/settings_tables.py`; a test fails when this page differs from them.

A module takes each group as one constructor argument: in YAML,
`model.init_args.<group>.<field>` (`model: {init_args: {loss: {clip_low: 0.2}}}`); on the command
line `--model.init_args.loss.clip_low=0.2`; from Python
`PPOModule(loss=PolicyLossSettings(clip_low=0.2))` or `loss={"clip_low": 0.2}`. A group checks
its values when it is built, before any model loads. Abbreviated or misspelt fields are refused
with the key named.

## Module defaults that differ from the group's

"""


def groups() -> list[type[SettingsGroup]]:
    """Every group a module takes, in order of first appearance."""
    found: list[type[SettingsGroup]] = []
    for cls in MODULES.values():
        for group in group_params(cls).values():
            if group not in found:
                found.append(group)
    return found


def render() -> dict[Path, str]:
    """{file: its generated text}."""
    readme = ROOT / "README.md"
    page = f"{HEADER}{module_defaults(MODULES)}\n\n## The groups\n\n{reference(groups())}\n"
    return {
        readme: replace_between(readme.read_text(), "settings", overview(groups(), MODULES)),
        ROOT / "docs" / "settings.md": page,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a file differs")
    args = parser.parse_args()
    stale = [p for p, text in render().items() if not p.exists() or p.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} differs from the settings dataclasses")
        return 1 if stale else 0
    for path, text in render().items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
