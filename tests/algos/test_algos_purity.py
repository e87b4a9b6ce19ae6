"""lit_rlhf.algos is pure torch math: importing it must not pull in Lightning or transformers."""

import ast
import subprocess
import sys
from pathlib import Path

import lit_rlhf.algos

ALLOWED_ROOTS = {
    "__future__",
    "collections",
    "dataclasses",
    "fractions",
    "math",
    "re",
    "typing",
    "torch",
    "lit_rlhf",
}


def test_import_pulls_in_neither_lightning_nor_transformers():
    probe = (
        "import sys, lit_rlhf.algos\n"
        "heavy = {'lightning', 'pytorch_lightning', 'lightning_fabric', 'transformers'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout


def test_sources_import_only_torch_and_the_standard_library_basics():
    package_dir = Path(lit_rlhf.algos.__file__).parent
    for source in package_dir.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
                if (
                    node.module
                    and node.module.startswith("lit_rlhf")
                    and not (node.module.startswith("lit_rlhf.algos"))
                ):
                    raise AssertionError(f"{source.name} imports {node.module}")
            else:
                continue
            assert roots <= ALLOWED_ROOTS, f"{source.name} imports {roots - ALLOWED_ROOTS}"
