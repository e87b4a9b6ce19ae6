"""Check the package's layers: import-linter's contracts from pyproject.toml.

Command: python scripts/lint_imports.py   (exit 0: every contract kept; 1: the broken contracts
with their import chains, as import-linter prints them)

import-linter (grimp) reads a package from its own folder, and ``lit_rlhf.callbacks`` lives in the
top-level ``callbacks/`` folder (setuptools' package-dir mapping); the link ``lit_rlhf/callbacks ->
../callbacks`` lets a plain ``lint-imports`` in the checkout see it. This script runs the check on
a view of the package in a temporary folder (``lit_rlhf/`` whose entries link to the real files,
``callbacks`` to ``callbacks/``), so that ``--override OLD=NEW`` can put file NEW in the view at
package path OLD (the tests use it to add a deliberate back import without touching the tree).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_view(target: Path, overrides: dict[str, Path]) -> Path:
    """``target/lit_rlhf``: links to ``lit_rlhf/*`` and ``callbacks/`` (as ``callbacks``), with
    each override's file copied over its package path (its folders copied as links)."""
    package = target / "lit_rlhf"
    _link_tree(ROOT / "lit_rlhf", package, overrides, "lit_rlhf")
    _link_tree(ROOT / "callbacks", package / "callbacks", overrides, "lit_rlhf/callbacks")
    for relative in overrides:
        if not (target / relative).exists():
            raise FileNotFoundError(f"--override {relative}: no such file in the package view")
    return target


def _link_tree(source: Path, view: Path, overrides: dict[str, Path], prefix: str) -> None:
    """``view`` mirrors ``source``: folders on the path of an override are real (so one file can
    be swapped), everything else is a symlink."""
    view.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir()):
        if entry.name == "__pycache__" or (prefix == "lit_rlhf" and entry.name == "callbacks"):
            continue  # lit_rlhf/callbacks (a link to callbacks/) is mirrored from callbacks/
        relative = f"{prefix}/{entry.name}"
        if relative in overrides:
            (view / entry.name).write_bytes(overrides[relative].read_bytes())
        elif entry.is_dir() and any(key.startswith(relative + "/") for key in overrides):
            _link_tree(entry, view / entry.name, overrides, relative)
        else:
            (view / entry.name).symlink_to(entry)


def run(overrides: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    """lint-imports on the view, with pyproject.toml's contracts; its output is captured."""
    with tempfile.TemporaryDirectory(prefix="lit-rlhf-layers-") as tmp:
        build_view(Path(tmp), overrides)
        env = {**os.environ, "PYTHONPATH": tmp}
        command = [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; "
            "sys.exit(lint_imports_command())",
            str(ROOT / "pyproject.toml"),
            "--no-cache",
        ]
        return subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="PACKAGE_PATH=FILE",
        help="put FILE at PACKAGE_PATH (e.g. lit_rlhf/callbacks/consistency.py) in the view",
    )
    opts = parser.parse_args()
    overrides = {}
    for item in opts.override:
        relative, _, file = item.partition("=")
        overrides[relative] = Path(file).resolve()
    result = run(overrides)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    sys.exit(result.returncode)


if __name__ == "__main__":
    main()
