"""The shape a new contributor can hold in their head (issue [1/7]): no file under lit_rlhf/ or
callbacks/ over 400 lines, no function over 60 lines, no constructor over 20 arguments; the
scripts outside scripts/repro/ under 3,000 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = sorted([*(ROOT / "lit_rlhf").rglob("*.py"), *(ROOT / "callbacks").glob("*.py")])


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text())
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _arguments(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = function.args
    named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    return len([a for a in named if a.arg not in ("self", "cls")])


def test_no_package_file_over_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n for p in PACKAGE if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, f"split these files: {long}"


def test_no_function_over_60_lines_and_no_constructor_over_20_arguments() -> None:
    problems = []
    for path in PACKAGE:
        for function in _functions(path):
            where = f"{path.relative_to(ROOT)}:{function.lineno} {function.name}"
            length = (function.end_lineno or function.lineno) - function.lineno + 1
            if length > 60:
                problems.append(f"{where}: {length} lines")
            if function.name == "__init__" and _arguments(function) > 20:
                problems.append(f"{where}: {_arguments(function)} arguments")
    assert not problems, "\n".join(problems)


def test_scripts_outside_repro_under_3000_lines() -> None:
    scripts = [p for p in (ROOT / "scripts").rglob("*.py") if "repro" not in p.parts]
    total = sum(len(p.read_text().splitlines()) for p in scripts)
    assert total < 3000, f"scripts outside scripts/repro/: {total} lines"
