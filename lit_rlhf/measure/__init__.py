"""Measurements of a preset's update on this machine, beside the plan's prediction.

``python -m lit_rlhf.measure --config ...`` (:mod:`.update`; its stand-ins in :mod:`.synthetic`)
runs a module's own update on synthetic rollouts and random weights;
``python -m lit_rlhf.measure.push`` (:mod:`.push`, in the vLLM venv) times the vLLM engine's
former per-parameter weight push against the bucketed one, side by side;
``python -m lit_rlhf.measure.asynchrony`` (:mod:`.asynchrony`, in the vLLM venv) trains the same
PPO config synchronously, one-step-off and with partial rollouts against one ``vllm serve``
process and compares the step times and the share of generation hidden. It sits above the
training core (it builds modules and trainers); :mod:`lit_rlhf.plan`, which the training core
imports for its setup check and ``perf/mfu``, stays below it and runs nothing.
"""
