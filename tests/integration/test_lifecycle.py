"""Seeded sequences of the lifecycle soak (benchmarks/lifecycle.py), in the suite: the operations a team performs
(promote, approve, reject, a timeout, rollback, two serving locations of one model, Ctrl-C, SIGTERM, SIGKILL while
a candidate awaits a decision, the command after it), each a real `podium` process, with the soak's invariants
checked after every step: what serves is what the registry's alias loads, every alias names its location's
current version, nothing staged or pending outlives its command, the history's checkpoints are there, `podium
status` and `podium history` agree, and every exit code says what happened.

Cost: two trainings (the module's pool: two runs of the cheap linear model), shared by both sequences; every
operation of a sequence is a `podium promote`, `approve`, `reject` or `rollback` of them. The soak draws the
operations that train (run, early stop, retention, resume) and the run validated on other data; the suite does
not (`trainings=False`, the small pool).

seed 29: promote, approve, SIGKILL while waiting + `podium approve` of the killed run, the promote after it,
         Ctrl-C while waiting, reject, promote, a second serving location
seed 78: promote twice, SIGTERM while waiting, rollback, a third location asking for the first one's alias
         (refused), approve, reject, a second serving location with its own alias
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks/ is not installed

pytestmark = pytest.mark.integration

SEEDS = [10, 29]
OPS = 6  # 8 in the soak; 6 keeps the module near 3 minutes on 2 cores


@pytest.fixture(scope="module")
def world(tmp_path_factory, prefect_api, shared_ray):
    """The soak's world on the session's Prefect server and Ray head: an MLflow store, the data, and the pool of
    two trained runs every sequence promotes from."""
    from benchmarks.lifecycle import SMALL_POOL, start_world

    world, teardown = start_world(tmp_path_factory.mktemp("lifecycle"), SMALL_POOL, prefect_api,
                                  shared_ray.driver_env())
    try:
        yield world
    finally:
        teardown()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_seeded_sequence_of_a_teams_operations_keeps_what_serves_the_alias_and_the_commands_in_agreement(
        world, seed):
    from benchmarks.lifecycle import Sequence

    sequence = Sequence(world, seed, OPS, trainings=False)
    steps = sequence.run()
    assert len(steps) == OPS and all(step.checked for step in steps)
    violations = [v for step in steps for v in step.violations]
    assert not violations, f"{len(violations)} violation(s) of seed {seed}:\n" + "\n".join(violations)
