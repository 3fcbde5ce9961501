"""DCP checkpoints consolidated in one process (podium.training.sharded), saved here with no process group; the
2-worker FSDP case runs through the `podium` command in tests/integration/test_sharded.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from podium.training.loaders import sharded
from podium.training.sharded import ShardedCheckpointError, is_sharded, load_sharded


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))

    def forward(self, x):
        return self.net(x)


class Wider(Small):
    def __init__(self):
        super().__init__()
        self.net[2] = nn.Linear(5, 4)


@pytest.fixture
def saved(tmp_path):
    """A DCP folder of Small's weights and its Adam state, as `dcp.save({"model": ..., "optimizer": ...})` writes."""
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    dcp.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, checkpoint_id=str(tmp_path / "ckpt"),
             no_dist=True)
    return str(tmp_path / "ckpt"), model


def test_a_dcp_folder_consolidates_into_the_class_in_eval_mode(saved):
    folder, model = saved
    assert is_sharded(folder)
    loaded = sharded(folder, model_class=Small)
    assert isinstance(loaded, Small) and not loaded.training
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_a_class_the_state_does_not_fit_is_named(saved):
    with pytest.raises(ShardedCheckpointError, match=r"its state does not fit Wider: .*size mismatch"):
        load_sharded(saved[0], Wider)


def test_not_a_module_class_and_not_a_dcp_folder_are_refused(saved, tmp_path):
    with pytest.raises(ShardedCheckpointError, match="expected a torch.nn.Module class that takes no arguments"):
        load_sharded(saved[0], dict)
    (tmp_path / "plain").mkdir()
    torch.save(Small().state_dict(), tmp_path / "plain" / "model.pt")
    with pytest.raises(ShardedCheckpointError, match=r"expected a torch.distributed.checkpoint folder .*model\.pt"):
        load_sharded(str(tmp_path / "plain"), Small)
