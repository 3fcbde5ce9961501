"""podium.training.loaders:state_dict, the loader `--model-class` alone uses: a loop's torch.save'd state dict
into the named class (plain torch, no Ray)."""

from __future__ import annotations

import pytest
import torch
from podium_model_classes import NeedsArguments, Net, Wider

from podium.training.export import load_servable
from podium.training.loaders import LoaderError, state_dict


@pytest.fixture
def trained() -> Net:
    torch.manual_seed(3)
    return Net()


def _same(loaded: torch.nn.Module, model: Net) -> bool:
    x = torch.randn(4, 3)
    return torch.equal(loaded(x), model(x)) and not loaded.training


def test_model_pt_is_loaded_into_the_class(tmp_path, trained):
    torch.save(trained.state_dict(), tmp_path / "model.pt")
    torch.save({"not": "this"}, tmp_path / "other.pt")  # model.pt is the documented name: it wins
    assert _same(state_dict(str(tmp_path), Net), trained)


@pytest.mark.parametrize("name", ["weights.pth", "checkpoint.pt"])
def test_the_one_pt_or_pth_file_is_loaded_with_the_state_dict_in_it_or_under_a_key(tmp_path, trained, name):
    # as Ray's guides save it under DDP (`module.` prefixes), beside the optimizer's state
    wrapped = {f"module.{k}": v for k, v in trained.state_dict().items()}
    torch.save({"model_state_dict": wrapped, "optimizer_state_dict": {"lr": 0.1}, "epoch": 3}, tmp_path / name)
    assert _same(state_dict(str(tmp_path), Net), trained)


def test_two_candidate_files_or_none_is_refused_naming_what_is_there(tmp_path, trained):
    torch.save(trained.state_dict(), tmp_path / "a.pt")
    torch.save(trained.state_dict(), tmp_path / "b.pth")
    with pytest.raises(LoaderError, match=r"expected model.pt \(or one \*.pt or \*.pth\), found \['a.pt', 'b.pth'\]"):
        state_dict(str(tmp_path), Net)


def test_a_state_dict_that_does_not_fit_names_the_file_and_the_class(tmp_path, trained):
    torch.save(trained.state_dict(), tmp_path / "model.pt")
    with pytest.raises(LoaderError, match=r"model\.pt: its state dict does not fit promotion.model_class Wider: "
                                          r".*size mismatch for linear.weight"):
        state_dict(str(tmp_path), Wider)


def test_a_class_that_needs_arguments_is_refused_naming_it(tmp_path, trained):
    torch.save(trained.state_dict(), tmp_path / "model.pt")
    with pytest.raises(LoaderError, match="NeedsArguments: cannot be built with no arguments"):
        state_dict(str(tmp_path), NeedsArguments)


def test_a_model_class_without_a_loader_gives_a_servable_module(tmp_path, trained):
    """load_servable, as packaging calls it: the model class alone picks the state-dict loader."""
    torch.save(trained.state_dict(), tmp_path / "model.pt")
    loaded, facts = load_servable(str(tmp_path), None, "podium_model_classes:Net")
    assert _same(loaded, trained) and facts == {"format": "podium.training.loaders:state_dict", "kind": "torch"}
    assert load_servable(str(tmp_path), None, None) == (None, {})  # neither: served as files
