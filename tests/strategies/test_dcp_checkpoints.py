"""The pieces of FSDP2's resharding, atomic checkpoints tested in one process (the 2-process runs
are in tests/distributed/test_fsdp2_checkpoints.py): the folder swap, the CLI's refusals of
half a checkpoint, and the train loader position mapped to another world size."""

from __future__ import annotations

import pytest
import torch
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from torchdata.stateful_dataloader import StatefulDataLoader

from lit_rlhf.cli.checkpoints import CheckpointError, read_hparams
from lit_rlhf.data.epoch_sampler import EpochShuffleSampler
from lit_rlhf.strategies.folders import replace_path
from lit_rlhf.training.loader_position import rescaled_position


def test_a_finished_folder_replaces_the_checkpoint_and_the_old_one_is_removed(tmp_path):
    target, staging = tmp_path / "last.ckpt", tmp_path / ".last.ckpt.partial"
    target.mkdir()
    (target / "old").write_text("old")
    staging.mkdir()
    (staging / "new").write_text("new")
    replace_path(staging, target)
    assert [p.name for p in target.iterdir()] == ["new"] and not staging.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    # over a checkpoint file (a run that switched strategies) and onto nothing
    (tmp_path / "a.ckpt").write_text("file")
    for name in ("a.ckpt", "b.ckpt"):
        staging.mkdir()
        (staging / "new").write_text("new")
        replace_path(staging, tmp_path / name)
        assert (tmp_path / name / "new").read_text() == "new"


def test_half_a_distributed_checkpoint_is_refused_naming_what_it_lacks(tmp_path):
    folder = tmp_path / "last.ckpt"
    folder.mkdir()
    torch.save({"hyper_parameters": {"lr": 1.0}}, folder / "meta.pt")
    with pytest.raises(CheckpointError, match=r"without \.metadata, \*\.distcp shards"):
        read_hparams(str(folder))
    (folder / ".metadata").write_bytes(b"x")
    (folder / "__0_0.distcp").write_bytes(b"x")
    assert read_hparams(str(folder)) == {"lr": 1.0}


def test_a_missing_checkpoint_names_what_a_killed_save_left_beside_it(tmp_path):
    (tmp_path / ".last.ckpt.old").mkdir()
    with pytest.raises(CheckpointError, match=r"\.last\.ckpt\.old: the previous checkpoint"):
        read_hparams(str(tmp_path / "last.ckpt"))


def _loader(world: int, rank: int, global_batch: int) -> StatefulDataLoader:
    # as Lightning builds a multi-process train loader: the epoch-seeded order dealt to ranks
    sampler = DistributedSamplerWrapper(
        EpochShuffleSampler(32, seed=0), num_replicas=world, rank=rank, shuffle=False
    )
    sampler.set_epoch(1)
    return StatefulDataLoader(list(range(32)), batch_size=global_batch // world, sampler=sampler)


@pytest.mark.parametrize(("saved", "now"), [(2, 1), (2, 4), (4, 2)])
def test_a_mid_epoch_position_goes_on_with_the_next_unseen_rows_at_another_world_size(saved, now):
    order = [row for batch in _loader(1, 0, 4) for row in batch.tolist()]
    written = _loader(saved, 0, 4)
    batches = iter(written)
    for _ in range(3):  # 3 global batches of 4 rows: 12 rows seen
        next(batches)
    state = rescaled_position(written.state_dict(), saved, now)
    resumed = []
    for rank in range(now):
        loader = _loader(now, rank, 4)
        loader.load_state_dict(state)
        resumed += next(iter(loader)).tolist()
    assert sorted(resumed) == sorted(order[12:16])
    # without the rescaling the same rows would not come next
    plain = _loader(now, 0, 4)
    plain.load_state_dict(written.state_dict())
    assert set(next(iter(plain)).tolist()) - set(order[12:16])


def test_a_position_that_cannot_be_mapped_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match="num_workers: 0"):
        rescaled_position({"_snapshot": {}}, 2, 1)
    with pytest.raises(ValueError, match="does not split evenly over 4"):
        rescaled_position({"_sampler_iter_state": {"samples_yielded": 3}}, 2, 4)
