"""Each settings-group field has exactly one reader: it is read as an attribute
(``<group>.<field>`` or ``<group>_settings.<field>``, e.g. ``self.loss.clip_low``,
``settings.update.ppo_epochs``, ``optim.max_grad_norm``) in exactly one place outside the
settings package, or, when no code outside reads it, by a method of its own dataclass that is
not validation (``warmup_steps`` reads ``lr_warmup_ratio``). So a YAML key leads to its one line
of math in two steps: the key names the group class, and ``grep <group>.<field>`` finds the
reader. Fields read in more than
one place are listed in ``EXCEPTIONS`` with the reason."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections import Counter
from pathlib import Path

import lit_rlhf.settings as settings_package
from lit_rlhf.settings import SettingsGroup

ROOT = Path(__file__).resolve().parents[2]
VALIDATION = {"rules", "check", "__post_init__", "refuse", "key", "refuse_unread"}
# (group, field) -> (its reads outside the settings package, why more than one). The counts are
# pinned: a new reader of one of these fails the test until it is listed here with its reason.
_CHECK = "a check across groups or at setup (PPOSettings, the module's setup) and the use"
EXCEPTIONS: dict[tuple[str, str], tuple[int, str]] = {
    ("advantage", "estimator"): (
        6,
        f"{_CHECK}; GRM refuses any but grpo; the critic's kind; the samples a failed reward drops",
    ),
    ("distill", "teacher"): (
        2,
        "the local teacher's load and tokenizer check; the served teacher's model id",
    ),
    ("judge", "critique_template"): (
        2,
        "passed to the judge's reward, checked by reflective inference",
    ),
    ("kl", "coef"): (2, "each RL module seeds its kl_coef attribute (AdaptiveKL rewrites it)"),
    ("kl", "estimator"): (2, "the KL in the reward (experience) and in the loss (update)"),
    ("lora", "quantize"): (2, "the CUDA check at setup and the 4-bit load"),
    ("mismatch", "correction"): (3, _CHECK),
    ("optim", "micro_batch_size"): (
        5,
        "each module cuts its own micro-batches (SFT, RM, DPO, compressor, the RL core)",
    ),
    ("precision", "dtype"): (8, "each module's trainable-precision check at setup and its load"),
    ("precision", "reference_dtype"): (5, "checked where a module has no reference, and loaded"),
    ("precision", "gradient_checkpointing"): (
        2,
        "the shared policy load and the reward model's own (a sequence-classification network)",
    ),
    ("rollout", "samples_per_prompt"): (
        4,
        f"{_CHECK}; update.global_mini_batch_size in sequences per process",
    ),
    ("rollout", "max_staleness"): (4, _CHECK),
    ("rollout", "dynamic_sampling"): (3, _CHECK),
    ("rollout", "overlong_filter"): (2, _CHECK),
    ("rollout", "overlong_buffer"): (2, _CHECK),
    ("update", "ppo_epochs"): (4, f"{_CHECK}; the passes that perf/mfu counts"),
    ("update", "mini_batch_size"): (3, _CHECK),
    ("update", "seed"): (2, "the mini-batch shuffle and the judge's inference sampling"),
}


def _groups() -> list[type[SettingsGroup]]:
    found = []
    for name in settings_package.__all__:
        value = getattr(settings_package, name)
        if isinstance(value, type) and issubclass(value, SettingsGroup) and value.GROUP:
            found.append(value)
    return found


def _fields() -> dict[str, set[str]]:
    """{group key: its fields} (two groups may share a key: DPO's and PPO's ``loss``)."""
    fields: dict[str, set[str]] = {}
    for group in _groups():
        fields.setdefault(group.GROUP, set()).update(f.name for f in dataclasses.fields(group))
    return fields


def _container(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def outside_reads() -> Counter[tuple[str, str]]:
    fields = _fields()
    counts: Counter[tuple[str, str]] = Counter()
    files = [p for p in (ROOT / "lit_rlhf").rglob("*.py") if "settings" not in p.parts]
    files += sorted((ROOT / "callbacks").glob("*.py"))
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)):
                continue
            group = _container(node.value)
            group = group.removesuffix("_settings") if group else None  # self.eval_settings
            if group in fields and node.attr in fields[group]:
                counts[(group, node.attr)] += 1
    return counts


def _self_read(node: ast.AST, names: set[str]) -> bool:
    return (
        isinstance(node, ast.Attribute) and _container(node.value) == "self" and node.attr in names
    )


def inside_reads() -> set[tuple[str, str]]:
    """(group, field) read as ``self.<field>`` by a non-validation method of its dataclass."""
    found = set()
    for group in _groups():
        names = {f.name for f in dataclasses.fields(group)}
        source = ast.parse(Path(inspect.getfile(group)).read_text())
        for cls in (n for n in source.body if isinstance(n, ast.ClassDef)):
            if cls.name != group.__name__:
                continue
            for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                if method.name in VALIDATION or method.name.startswith("_check"):
                    continue
                for node in ast.walk(method):
                    if _self_read(node, names):
                        found.add((group.GROUP, node.attr))  # type: ignore[attr-defined]
    return found


def test_every_field_has_exactly_one_reader() -> None:
    outside, inside = outside_reads(), inside_reads()
    problems = []
    for group in _groups():
        for spec in dataclasses.fields(group):
            key = (group.GROUP, spec.name)
            count = outside[key]
            if key in EXCEPTIONS:
                if count != EXCEPTIONS[key][0]:
                    listed, why = EXCEPTIONS[key]
                    problems.append(f"{group.GROUP}.{spec.name}: {count} reads, {listed} listed")
                    problems.append(f"  (listed because: {why})")
                continue
            if count > 1:
                problems.append(f"{group.GROUP}.{spec.name}: read in {count} places")
            elif count == 0 and key not in inside:
                problems.append(f"{group.GROUP}.{spec.name}: never read (would do nothing)")
    assert not problems, "\n".join(problems)


def test_the_issue_examples_lead_to_one_reader() -> None:
    outside, inside = outside_reads(), inside_reads()
    assert outside[("loss", "clip_low")] == 1
    assert outside[("env", "max_turns")] == 1
    assert outside[("optim", "lr_warmup_ratio")] == 0 and ("optim", "lr_warmup_ratio") in inside
