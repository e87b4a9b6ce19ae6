"""The reuse examples (``examples/reuse/*.py``, docs/reuse.md) pass from a fresh virtual
environment outside the repository.

Once per session: the wheel is built from this checkout's package sources (offline: setuptools
from this environment, no build isolation), installed with ``--no-deps`` into a new venv, and
that venv's ``lit_rlhf`` is checked to be the wheel's (``lit_rlhf.callbacks`` included: the
package maps it to the top-level ``callbacks/`` folder). Then every example is copied into a
folder outside the repository and run there with the venv's python: exit code 0 and its
``<name> OK:`` line. Every name an example imports from ``lit_rlhf.<package>`` must be in that
package's ``__all__`` (the declared public API).

The new venv sees this environment's packages (torch, Lightning, ...) through a ``.pth`` file
written after the wheel is installed (``--system-site-packages`` alone reaches only the base
interpreter's packages when this environment is itself a venv), so nothing is downloaded; the
``.pth`` lists plain paths, so this environment's editable install of lit-rlhf is not loaded.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples" / "reuse").glob("*.py"))

# run in the venv: where lit_rlhf comes from, and the examples' lit_rlhf imports against __all__
CHECK = """
import ast, importlib, pathlib, sys
import lit_rlhf, lit_rlhf.callbacks
print(lit_rlhf.__file__)
print(lit_rlhf.callbacks.__file__)
for path in sorted(pathlib.Path(".").glob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lit_rlhf"):
            public = getattr(importlib.import_module(node.module), "__all__", ())
            for alias in node.names:
                if alias.name not in public:
                    sys.exit(f"{path}: {alias.name} is not in {node.module}.__all__")
"""


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{cmd} failed ({done.returncode})\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )
    return done.stdout


def _package_sources(dest: Path) -> Path:
    """pyproject.toml, the readme and every package folder, copied to ``dest`` (a build in the
    checkout itself would write build/ there and could pack stale build/lib files)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    setup = config["tool"]["setuptools"]
    mapped = setup.get("package-dir", {})
    tops = {mapped.get(p, p.replace(".", "/")).split("/")[0] for p in setup["packages"]}
    dest.mkdir()
    for name in ("pyproject.toml", config["project"]["readme"]):
        shutil.copy2(ROOT / name, dest / name)
    for top in sorted(tops):
        shutil.copytree(ROOT / top, dest / top, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """(the venv's python, a folder outside the repository holding the examples, the env)."""
    tmp = tmp_path_factory.mktemp("reuse")
    assert ROOT not in tmp.parents
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    # offline, a fresh builtin-model cache, one thread (the tiny models run fastest on one,
    # and it keeps them fast next to other CPU work)
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONNOUSERSITE="1",
        LIT_RLHF_CACHE=str(tmp / "cache"), OMP_NUM_THREADS="1",
    )  # fmt: skip
    src = _package_sources(tmp / "src")
    wheels = tmp / "wheels"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    _run([*pip_wheel, "--no-index", "-w", str(wheels), str(src)], tmp, env, 300)
    (wheel,) = wheels.glob("lit_rlhf-*.whl")

    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], tmp, env, 300)
    python = venv / "bin" / "python"
    pip = [str(venv / "bin" / "pip"), "install", "--no-deps", "--force-reinstall", "--no-index"]
    _run([*pip, str(wheel)], tmp, env, 300)
    # only now this environment's packages: pip above saw no other lit-rlhf to replace
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                   tmp, env, 60).strip()  # fmt: skip
    (Path(purelib) / "_reuse_test_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    run_dir = tmp / "run"
    run_dir.mkdir()
    for example in EXAMPLES:
        shutil.copy2(example, run_dir / example.name)
    origin = _run([str(python), "-c", CHECK], run_dir, env, 120).split()
    for path in origin[:2]:  # lit_rlhf and lit_rlhf.callbacks both from the installed wheel
        assert Path(path).resolve().is_relative_to(venv.resolve()), origin
    return python, run_dir, env


def test_examples_exist():
    names = {p.stem for p in EXAMPLES}
    assert {"gradient_surgery", "trust_region_entropy", "consistency_reward",
            "reflective_inference", "own_module"} <= names, names  # fmt: skip


@pytest.mark.parametrize("example", [p.name for p in EXAMPLES])
def test_reuse_example_runs_from_the_wheel(fresh_env, example: str) -> None:
    python, run_dir, env = fresh_env
    out = _run([str(python), example], run_dir, env, 300)
    assert f"{Path(example).stem} OK:" in out, out
