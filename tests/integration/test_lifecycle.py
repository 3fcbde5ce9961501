"""Seeded sequences of the lifecycle soak (benchmarks/lifecycle.py), in the suite: the operations a team performs
(promote, approve, reject, a timeout, rollback, two serving locations of one model, Ctrl-C, SIGTERM, SIGKILL while
a candidate awaits a decision, the command after it), each a real `podium` process, with the soak's invariants
checked after every step: what serves is what the registry's alias loads, every alias names its location's
current version, nothing staged or pending outlives its command, the history's checkpoints are there, `podium
status` and `podium history` agree, and every exit code says what happened.

Cost: no training. The module's pool (two runs of the cheap linear model, SMALL_POOL) exists only to be promoted: its
checkpoints are made directly in storage and recorded in the module's MLflow store with podium's own functions,
validated by the real validation function (tests/helpers/checkpoints.py). Both sequences share it; every operation
of a sequence is a `podium promote`, `approve`, `reject` or `rollback` of them (the real process). The soak draws the
operations that train (run, early stop, retention, resume) and the run validated on other data; the suite does
not (`trainings=False`, the small pool).

seed 10: promote, reject (a candidate withdrawn: its version number must not be taken again), a second location
         asking for the first one's alias (refused, exit 2), promote, approve
seed 29: promote, approve, SIGKILL while a candidate waits + `podium approve` of the killed run (non-zero), the
         promote after it (which finishes what the SIGKILL left), Ctrl-C while a candidate waits (exit 130)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks/ is not installed

pytestmark = pytest.mark.integration

SEEDS = [10, 29]
OPS = 5  # 8 in the soak; 5 keeps the module near 3 minutes on 2 cores


@pytest.fixture(scope="module")
def world(tmp_path_factory, prefect_api, shared_ray):
    """The soak's world on the session's Prefect server and Ray head: an MLflow store, the data, and the pool of
    two runs (made, not trained) every sequence promotes from."""
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
