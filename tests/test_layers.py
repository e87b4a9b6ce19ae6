"""The package's layers (issue [3/5]): import-linter's contracts in pyproject.toml hold, and a
deliberate back import breaks them with the import chain printed. The check runs on a view of
the package (``scripts/lint_imports.py``) because ``lit_rlhf.callbacks`` lives in ``callbacks/``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
lint = load_script("lint_imports")


def test_every_layer_contract_is_kept() -> None:
    result = lint.run({})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
    # the view includes lit_rlhf.callbacks (from callbacks/), or its contracts would be empty
    assert "callbacks import no module KEPT" in result.stdout


@pytest.mark.parametrize(
    ("package_path", "back_import", "contract", "chain"),
    [
        (
            "lit_rlhf/callbacks/adaptive_kl.py",
            # under TYPE_CHECKING: a type-only import counts as well
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from lit_rlhf.modules.ppo import PPOModule\n",
            "callbacks import no module BROKEN",
            "lit_rlhf.callbacks.adaptive_kl -> lit_rlhf.modules.ppo",
        ),
        (
            "lit_rlhf/strategies/shutdown.py",
            "import lit_rlhf.training.rng\n",
            "strategies do not reach up into the training core BROKEN",
            "lit_rlhf.strategies.shutdown -> lit_rlhf.training.rng",
        ),
        (
            "lit_rlhf/cli/app.py",
            # a verb importing the dispatcher that imports it: a cycle
            "import lit_rlhf.cli.dispatch\n",
            "cli: the dispatcher over its verbs over the shared pieces BROKEN",
            "lit_rlhf.cli.app -> lit_rlhf.cli.dispatch",
        ),
        (
            "lit_rlhf/plan/flops.py",
            # the plan is imported by the training core (setup check, perf/mfu): below it
            "import lit_rlhf.training.rng\n",
            "floors: one direction of use BROKEN",
            "lit_rlhf.plan.flops -> lit_rlhf.training.rng",
        ),
    ],
    ids=[
        "module-from-callbacks",
        "training-from-strategies",
        "dispatcher-from-a-verb",
        "training-from-the-plan",
    ],
)
def test_a_back_import_breaks_its_contract_with_the_chain(
    tmp_path, package_path, back_import, contract, chain
) -> None:
    original = (ROOT / package_path.replace("lit_rlhf/callbacks", "callbacks")).read_text()
    changed = tmp_path / Path(package_path).name
    changed.write_text(original + "\n" + back_import)
    result = lint.run({package_path: changed})
    assert result.returncode == 1, result.stdout
    assert contract in result.stdout
    assert chain in result.stdout, result.stdout[-3000:]
