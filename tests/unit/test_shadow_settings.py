"""Shadow limits that nothing asks for (`[promotion.shadow]` without `rollout = "shadow"`) are refused, naming the
field, the value and what is expected, instead of being ignored by the run."""

from __future__ import annotations

import pytest

from podium.cli.main import build_parser
from podium.cli.options import config_from_args
from podium.errors import ConfigError
from podium.settings import PodiumSettings


def config_for(argv: list[str], tmp_path):
    return config_from_args(build_parser().parse_args(argv), PodiumSettings(home=tmp_path / "home"))


EXPECTED = ("promotion.shadow = {...}: the shadow stage's limits have no effect with promotion.rollout = 'direct': "
            "expected promotion.rollout = \"shadow\" (--rollout shadow) to shadow candidates, or no promotion.shadow")


@pytest.mark.parametrize("toml, flags", [('[promotion]\nrollout = "direct"\n[promotion.shadow]\nrequests = 50\n', []),
                                         ("[promotion.shadow]\nrequests = 50\n", []),
                                         ("", ["--shadow-requests", "50"]),
                                         ('[promotion]\nmetric = "val_loss"\n', ["--shadow-duration", "3"])])
def test_shadow_limits_without_a_shadow_rollout_are_refused(tmp_path, toml, flags):
    (tmp_path / "run.toml").write_text(toml)
    with pytest.raises(ConfigError) as refused:  # the command's table says exit 2 (podium.cli.errors)
        config_for(["run", "--config", str(tmp_path / "run.toml"), *flags], tmp_path)
    assert str(refused.value) == f"invalid configuration:\n  {EXPECTED}"


def test_shadow_limits_with_a_shadow_rollout_or_a_flag_that_overrides_it_are_taken(tmp_path):
    (tmp_path / "run.toml").write_text('[promotion]\nrollout = "shadow"\n[promotion.shadow]\nrequests = 50\n')
    config = config_for(["run", "--config", str(tmp_path / "run.toml")], tmp_path)
    assert (config.promotion.rollout, config.promotion.shadow.requests) == ("shadow", 50)
    # the file asks for a shadow; this one run goes direct on purpose
    config = config_for(["run", "--config", str(tmp_path / "run.toml"), "--rollout", "direct"], tmp_path)
    assert config.promotion.rollout == "direct"
    (tmp_path / "plain.toml").write_text("[promotion.shadow]\nrequests = 50\n")
    config = config_for(["run", "--config", str(tmp_path / "plain.toml"), "--rollout", "shadow"], tmp_path)
    assert (config.promotion.rollout, config.promotion.shadow.requests) == ("shadow", 50)
