"""Under DDP / DeepSpeed Lightning wraps the training loader's ``EpochShuffleSampler`` in its
``DistributedSamplerWrapper`` and calls ``set_epoch`` on the wrapper each epoch; the wrapper
must pass the epoch on, or every epoch repeats epoch 0's order (Lightning before 2.6.1, PR
21456; pyproject's floor is 2.6.1). Issue 36, N11."""

from __future__ import annotations

from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

from lit_rlhf.data.epoch_sampler import EpochShuffleSampler


def _order(sampler: DistributedSamplerWrapper, epoch: int) -> list[int]:
    sampler.set_epoch(epoch)  # what Lightning's fit loop calls at each epoch's start
    return list(sampler)


def test_each_rank_sees_a_new_order_every_epoch_through_lightnings_wrapper():
    ranks = [
        DistributedSamplerWrapper(
            EpochShuffleSampler(32, seed=7), num_replicas=2, rank=rank, shuffle=False
        )
        for rank in (0, 1)
    ]
    for epoch in (0, 1, 2):
        parts = [_order(sampler, epoch) for sampler in ranks]
        # the two ranks split that epoch's permutation of all rows
        assert sorted(parts[0] + parts[1]) == list(range(32))
    first, second = _order(ranks[0], 0), _order(ranks[0], 1)
    assert first != second, "set_epoch did not reach EpochShuffleSampler: every epoch repeats"
    assert _order(ranks[0], 0) == first  # the order is a function of (seed, epoch)
    expected = list(EpochShuffleSampler(32, seed=7, epoch=1))[0::2]  # rank 0: every 2nd row
    assert second == expected
