"""The memory, batch and FLOPs plan of a run, from its config, before anything loads.

- :mod:`.architectures`: the models' architectures (a table citing each config.json,
  ``builtin:`` specifications, local folders); :mod:`.params`: parameter counts on the meta
  device.
- :mod:`.memory`: per-GPU items by phase, model states by strategy (DeepSpeed's estimators);
  :mod:`.activations`: one micro-batch's activations and logits; :mod:`.flops`: step FLOPs.
- :mod:`.report`: :func:`plan_from_config` and the table; :mod:`.check`: the same plan in a
  module's ``setup`` (refuse / warn); ``lit-rlhf plan`` prints it.
"""
