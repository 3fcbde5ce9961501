"""A lifecycle soak: seeded sequences of the operations a team performs over a few weeks, with the promise
podium exists for checked after every step: the model that serves, the model the registry's alias names, and
what `podium status` and `podium history` say are the same model, always.

    python benchmarks/lifecycle.py --sequences 30 --ops 8 --seed 1                      # the soak
    python benchmarks/lifecycle.py --sequences 30 --ops 8 --seed 1 --output BENCHMARKS.md
    python benchmarks/lifecycle.py --sequences 1 --ops 8 --seed 7 --keep                # one sequence, kept

Everything is real, on this machine, under one podium home (a temporary folder): `podium` commands as
subprocesses (each in its own process group, signalled as a terminal or a scheduler would), a `prefect server`
process (an approval pauses its flow run there), MLflow on SQLite and one local Ray head (`ray start --head`,
which the commands join through RAY_ADDRESS instead of each starting a Ray of their own).

Cost. A training is what an operation costs (a Ray Train start is ~20 CPU-s on 2 cores), so the runs that
exist only to be promoted are not trained: a pool of runs is made once, without Ray Train (the linear model of
tests/integration/podium_nightly_code.py, one epoch, each turned by another `angle_deg` so that their quality
differs, and one validated on other data: its checkpoint written to storage and recorded in MLflow with podium's
own functions, validated by the real validation function; tests/helpers/checkpoints.py), and most operations are
`podium promote --run-name <pool run>` against the sequence's own serving locations and its own registered model
(`model` = the sequence's, `experiment` = the pool's, so the run is found). Operations that need a training of their
own (run, early stop, retention, resume) are rare. The pool's run `pool-acc` (made with `metric = accuracy`,
`mode = max` of its own) is only for promote-other-settings; it and ctrl-c-after-switch are drawn where the pool has
it (the soak's, not the suite's SMALL_POOL: the suite's seeded plans stay as they were).

Operations (a sequence's plan is drawn from its seed before it starts; the plan, not the outcomes, is seeded):

  promote      `podium promote --run-name R` (sometimes --always-promote)                       exit 0
  approve      the same with --approval required; once its flow run is paused, `podium approve`  0 and 0
  reject       the same, answered with `podium reject`                                           0 and 0
  timeout      --approval required, --approval-timeout 3: no decision, rejected on timeout       0
  rollback     `podium rollback` (one back, or --to a version of the history)     0; 2 when there is none
  second       promote to the second serving location of the same model, its own alias (canary)    0
  same-alias   promote to a third location with the first one's alias: refused before anything     2
  new-data     promote the pool run validated on other data (the champion is re-scored on it)    0
  ctrl-c       --approval required, SIGINT to the process group while it waits                   130
  ctrl-c-after-switch  promote --always-promote, SIGINT to the process group right after the switch of CURRENT
               (the test-only hook PODIUM_TEST_PAUSE_AT=after-switch holds it there until the signal): the
               promotion stands and the command says so (`late_stop` in its JSON)                  0
               Its run is one that switches: not the champion, its checkpoint not withdrawn (`switch_run`)
  promote-other-settings  `podium promote --run-name pool-acc` with a config that names no metric or mode:
               the run was made with metric accuracy, mode max, and is promoted by them        0, by accuracy
  sigterm      the same with SIGTERM                                                             143
  sigkill      the same with SIGKILL; then `podium approve` of that run (its process is gone)    non-zero;
               the next operation is a promote to the same location (the command after a SIGKILL)
  run          `podium run` of a new run of the sequence's (a training)                          0
  early-stop   `podium run` whose validations stop improving (patience 1)                        0
  retention    `podium run` resuming the sequence's run with `--keep-checkpoints 1` and more epochs 0
  resume       `podium run` of the sequence's run again, with more epochs                        0
  sigterm-after-training  a new `podium run --always-promote` on a local Ray of its own (shut down once training
               is done), SIGTERM to the command at a drawn point of its promotion (the test-only hook
               PODIUM_TEST_PAUSE_AT): before the switch (withdrawn)                              143
               after the switch (the promotion stands, `late_stop` says SIGTERM)                 0

The state contract the invariants check (docs/serving.md; where it leaves a detail open, the reading chosen
here is marked *chosen*):

- Serving layout: `<serving>/CURRENT` names a complete version `versions/vN/MANIFEST.json` (`files`
  {relpath: {sha256, size}}, `content`, `checkpoint`/`source`, `run_name`, `step`, `version_uid`). A version
  number is never reused: a rejected, withdrawn or undecided candidate stays as `versions/vN/DISCARDED.json`
  (no manifest); one being staged or awaiting a decision has `versions/vN/STAGED.json` (pid, host, run_name)
  until it is sealed or discarded. `<serving>/LOCATION.json` is {"id", "registered_model", "alias"}.
- Registry: each promoted version's registered version has tags `podium.version_uid` and
  `podium.serving_version`; the registered model's tag `podium.location.<alias>` = the location's id says which
  location owns the alias. The challenger alias is `challenger` for `champion`, else `<alias>-challenger`,
  and exists only while a command awaits a decision.

Invariants, after every step (every command of the step has ended), each a function named `check_*`; a
violation names the invariant, the step and the seed:

  a  check_served_bytes          the bytes `models:/<name>@<alias>` resolves to are CURRENT's manifest `files`
     check_registry_identity     the version under the alias carries CURRENT's `version_uid` and number
  b  check_aliases               every alias names the version its location's history calls current (and
                                 not one tagged pending, rejected or undecided); no challenger alias is left;
                                 no alias without a location
     check_location_ownership    LOCATION.json and the registry's `podium.location.<alias>` agree, one location
                                 per alias
  c  check_no_pending            no registered version tagged `podium.approval = pending`
     check_no_staged             every versions/vN has MANIFEST.json or DISCARDED.json; no STAGED.json whose
                                 process is gone
     check_no_orphan_pause       *chosen*: no Prefect flow run of the soak's runs stays Paused once its command
                                 has ended (it would await a decision no process can carry out, and make
                                 `podium approve --run-name R` ambiguous). The soak cancels such a flow run
                                 after reporting it, so that one defect does not spill into later sequences
  d  check_checkpoints_present   every version in a location's history has its source checkpoint in storage
  e  check_status_agrees         `podium status --json` names CURRENT's version as the champion
     check_history_agrees        `podium history --json` names CURRENT's version as current
                                 (both read-only: run through the command's entry point in this process,
                                 the command's own code without a Python start at every step)
  f  check_exit_codes            each command's exit code is the one its outcome calls for (table above)
  g  check_version_numbers       version numbers strictly increase across promotions and tombstones; a number
                                 once seen keeps its identity; every registered version made for a location has
                                 its folder there (sealed, or a tombstone)
  h  check_outcome_matches       the command's outcome matches what serves: a `promote` or `run` that exited 0
                                 printed its JSON, and the version its `promoted` names is CURRENT and the one
                                 @alias names (`promoted: null`: CURRENT did not move); one stopped (130, 143)
                                 printed none and CURRENT did not move (stopped before the switch); after a
                                 SIGINT right after the switch, `late_stop` says so; promote-other-settings
                                 promoted by the run's own metric (accuracy)

*Chosen* readings: in the step of a SIGKILL (right after it, and after the `podium approve` that follows),
only a, d, e and the exit codes are checked: a SIGKILL leaves what the next command finishes, and the next step
(a promote to the same location) is checked in full; `podium approve` of a killed run must exit non-zero (1 or
2 both read as "not done"); a rollback with nothing to go back to exits 2 and changes nothing; LOCATION.json's
`id` is compared with the registry tag's `id`, its `uri` with the serving location as given to podium.

It prints the sequences, operations, invariants checked, violations by invariant (with seeds and steps), the
wall time and CPU-seconds (this process, the commands, the Prefect server and the Ray head), and with
`--output` rewrites the `lifecycle` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.chaos import TESTS, Attempt  # chaos puts tests/integration on sys.path (servers, user code)
from benchmarks.workload import load_average, machine_description, markdown_table, update_markdown_section

POOL_EXPERIMENT = "lifecycle-pool"
# the pool: (run name, angle_deg, validation data). The smaller the angle, the better the model.
# SETTINGS: a run made with its own metric and mode (accuracy, max), validated on "val", promoted by
# promote-other-settings with a config that names neither
SETTINGS = "settings"
POOL = [("pool-40", 40.0, "val"), ("pool-25", 25.0, "val"), ("pool-12", 12.0, "val"), ("pool-5", 5.0, "val"),
        ("pool-other", 18.0, "val2"), ("pool-acc", 8.0, SETTINGS)]
SMALL_POOL = POOL[1:2] + POOL[3:4]  # the suite's: two runs
OPS = {"promote": 6, "approve": 4, "reject": 3, "timeout": 1, "rollback": 4, "second": 2, "same-alias": 1,
       "new-data": 1, "ctrl-c": 1, "sigterm": 1, "sigkill": 2, "run": 0.8, "early-stop": 0.3, "retention": 0.8,
       "resume": 0.3, "ctrl-c-after-switch": 1, "promote-other-settings": 1, "sigterm-after-training": 1.5}
TRAININGS = ("run", "early-stop", "retention", "resume", "sigterm-after-training")
WITH_SETTINGS_RUN = ("ctrl-c-after-switch", "promote-other-settings")  # drawn where the pool has pool-acc
AFTER_SWITCH = "SIGINT right after the switch"  # the note of a ctrl-c-after-switch's command
TERM_AFTER_SWITCH = "SIGTERM right after the switch"  # the note of a sigterm-after-training held after its switch
LATE_STOPS = {AFTER_SWITCH: "SIGINT after the switch", TERM_AFTER_SWITCH: "SIGTERM after the switch"}
SIGNALS = {"ctrl-c": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}
EXPECTED_SIGNAL_EXIT = {"ctrl-c": 130, "sigterm": 143}
INVARIANTS = ["served_bytes", "registry_identity", "aliases", "location_ownership", "no_pending", "no_staged",
              "no_orphan_pause", "checkpoints_present", "status_agrees", "history_agrees", "exit_codes",
              "version_numbers", "outcome_matches"]
AFTER_SIGKILL = ("served_bytes", "registry_identity", "checkpoints_present", "status_agrees", "history_agrees")
APPROVAL_WAIT_S = 240
TAG_UID, TAG_NUMBER, TAG_APPROVAL, TAG_SERVED_URI = ("podium.version_uid", "podium.serving_version",
                                                    "podium.approval", "podium.served_uri")


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[lifecycle {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def challenger_of(alias: str) -> str:
    """The alias a candidate of a location with `alias` waits under."""
    return "challenger" if alias == "champion" else f"{alias}-challenger"


# ---------------------------------------------------------------- the plan


@dataclass
class Op:
    """One planned operation: its kind, the location it acts on and the run it names."""

    kind: str
    loc: str = "a"
    run: str = ""
    always: bool = False
    to: str = ""  # rollback: "" one back, "random" a version of the history drawn when it runs
    delay_s: float = 0.0  # signals: how long after the pause the signal comes
    pause: str = ""  # sigterm-after-training: the promotion's point where its SIGTERM lands (before or after the switch)

    def label(self) -> str:
        extra = ((" --always-promote" if self.always else "") + (f" --to {self.to}" if self.to else "")
                 + (f" at {self.pause}" if self.pause else ""))
        return f"{self.kind}[{self.loc}{' ' + self.run if self.run else ''}{extra}]"


def plan_sequence(seed: int, n_ops: int, pool: list[str], other_data: str | None, trainings: bool,
                  other_settings: str | None = None) -> list[Op]:
    """The operations of the sequence of `seed`: a promotion first (a champion to work with), then draws
    weighted by OPS; a SIGKILL is followed by a promote to the same location; at most two trainings, and a
    retention or a resume drawn before the sequence has a run of its own is that run. Without `other_settings`
    (the pool's run made with its own metric and mode) the operations of WITH_SETTINGS_RUN are not drawn."""
    rng = random.Random(seed)
    kinds = [k for k in OPS if (trainings or k not in TRAININGS) and (other_data or k != "new-data")
             and (other_settings or k not in WITH_SETTINGS_RUN)]
    weights = [OPS[k] for k in kinds]
    ops = [Op("promote", "a", rng.choice(pool))]
    second, trained = False, 0
    while len(ops) < n_ops:
        if ops[-1].kind == "sigkill":
            ops.append(Op("promote", ops[-1].loc, rng.choice(pool), always=True))
            continue
        kind = rng.choices(kinds, weights)[0]
        if kind in TRAININGS and trained >= 2 or kind == "sigkill" and len(ops) == n_ops - 1:
            continue  # at most two trainings; a SIGKILL is followed by a command
        if kind in ("retention", "resume") and not trained:
            kind = "run"  # they continue the sequence's own run: train one first
        loc = "b" if second and kind not in ("second", "same-alias") and rng.random() < 0.3 else "a"
        op = Op(kind, loc, rng.choice(pool), always=rng.random() < 0.4)
        if kind == "second":
            second, op.loc = True, "b"
        elif kind == "same-alias":
            op.loc = "c"
        elif kind == "new-data":
            op.run = other_data or ""
        elif kind == "promote-other-settings":
            op.run, op.always = other_settings or "", True
        elif kind == "ctrl-c-after-switch":
            op.always = True  # a switch to land the signal after
        elif kind == "rollback":
            op.run, op.always, op.to = "", False, "random" if rng.random() < 0.3 else ""
        elif kind in SIGNALS:
            op.always, op.delay_s = True, rng.uniform(0.0, 2.0)  # a candidate that waits
        elif kind in TRAININGS:
            trained += 1
            op.run = ""
            if kind == "sigterm-after-training":
                # odd seeds after the switch, even ones before: both, in any run of a few sequences
                op.always, op.pause = True, ("before-switch", "after-switch")[seed % 2]
        ops.append(op)
    return ops


# ---------------------------------------------------------------- the world


@dataclass
class Location:
    """A serving location of the sequence's model, and the config file every command about it reads."""

    key: str
    serving: str
    alias: str
    config: Path
    plain_config: Path  # the same, naming no metric or mode (promote-other-settings: the run's own apply)


@dataclass
class World:
    """The soak's servers, data and pool, shared by its sequences."""

    home: Path
    env: dict[str, str]
    tracking_uri: str
    storage: str
    data: dict[str, str]
    pool: list[str] = field(default_factory=list)
    other_data: str | None = None
    other_settings: str | None = None  # the pool's run made with its own metric and mode (promote-other-settings)
    trainings: int = 0  # Ray Train starts
    command_cpu_s: float = 0.0

    def base_config(self, run: str, model: str, serving: str, alias: str, val: str = "val",
                    angle: float = 10.0, epochs: int = 1) -> dict[str, Any]:
        """A run of the pool's loop and validation (podium_nightly_code), ranked by accuracy."""
        return {"run_name": run, "model": model, "experiment": POOL_EXPERIMENT, "storage": self.storage,
                "serving": serving,
                "data": {"train": self.data["train"], "val": self.data[val], "feature_columns": ["f0", "f1", "f2", "f3"]},
                "training": {"train_loop": "podium_nightly_code:train_func",
                             "train_loop_config": {"epochs": epochs, "angle_deg": angle}},
                "scaling": {"num_workers": 1},
                "validation": {"fn": "podium_nightly_code:validate_fn", "concurrency": 1, "retries": 0},
                "promotion": {"metric": "accuracy", "mode": "max", "verify": "hashes", "alias": alias}}


def start_world(home: Path, pool: list[tuple[str, float, str]], prefect_api: str | None = None,
                ray_env: dict[str, str] | None = None) -> tuple[World, Callable[[], float]]:
    """The Prefect server and the Ray head (those given, else new ones), the MLflow store, the data, and the
    pool made (each run's checkpoint written and recorded as a `podium run` would have: no training). Returns the
    world and its teardown, which stops what was started here, gives this process its environment back and returns
    the servers' CPU-seconds."""
    from helpers.servers import RayHead, free_port
    from podium_nightly_code import write_data

    from podium.services import ensure_prefect_server, prepare_mlflow, stop_prefect_server

    home.mkdir(parents=True, exist_ok=True)
    data = {"train": write_data(str(home / "data" / "train.parquet"), 200, 0.0, seed=1),
            "val": write_data(str(home / "data" / "val.parquet"), 400, 0.05, seed=2),
            "val2": write_data(str(home / "data" / "val2.parquet"), 400, 0.15, seed=3)}
    tracking_uri = f"sqlite:///{home / 'mlflow.db'}"
    prepare_mlflow(tracking_uri)
    api_url = prefect_api or ensure_prefect_server(home / "prefect-home", free_port())
    pythonpath = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": pythonpath}
    env.pop("RAY_ADDRESS", None)
    head = None
    if ray_env is None:
        head = RayHead(home, env, num_cpus=4)
        start_ray_head(head)
        ray_env = head.driver_env()
    env.update({"PODIUM_HOME": str(home / "podium-home"), "MLFLOW_TRACKING_URI": tracking_uri,
                "PREFECT_API_URL": api_url, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", **ray_env})
    # this process reads what the commands read: the flow runs (check_no_orphan_pause), the artifacts
    # (check_served_bytes), and `podium status` and `podium history` run here (check_status_agrees)
    mine = ("PODIUM_HOME", "MLFLOW_TRACKING_URI", "PREFECT_API_URL", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    before = {k: os.environ.get(k) for k in mine}
    os.environ.update({k: env[k] for k in mine})
    world = World(home, env, tracking_uri, str(home / "storage"), data)

    def teardown() -> float:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if prefect_api is not None and head is None:
            return 0.0
        cpu = sum(_process_cpu_s(pid) for pid in head.processes()) if head is not None else 0.0
        with contextlib.suppress(Exception):
            cpu += _process_cpu_s(int(json.loads((home / "prefect-home" / "prefect" / "server.json").read_text())["pid"]))
        if head is not None:
            head.stop()
        if prefect_api is None:
            stop_prefect_server(home / "prefect-home")
        return cpu

    # imported once this process has its Prefect settings (above): it imports Prefect, which reads them once
    from helpers.checkpoints import make_trained_run

    trained_file = home / "pool.json"  # a --workdir whose pool was made by an earlier soak keeps it
    trained = json.loads(trained_file.read_text()) if trained_file.exists() else {}
    try:
        for name, angle, val in pool:
            if name in trained:
                world.pool, world.other_data = trained[name]["pool"], trained[name]["other"]
                world.other_settings = trained[name].get("settings")
                continue
            config = world.base_config(name, POOL_EXPERIMENT, str(home / "pool-serving"), "champion",
                                       "val" if val == SETTINGS else val, angle)
            made = make_trained_run(config, tracking_uri)
            if [r.status for r in made.records] != ["validated"]:
                raise RuntimeError(f"the pool's run {name} was not validated: {made.records}")
            if val == SETTINGS:  # its metric and mode are its own (base_config's): recorded with the run
                world.other_settings = name
            elif val == "val":
                world.pool.append(name)
            else:
                world.other_data = name
            log(f"pool: {name} made (angle {angle:g}, validated on {val})")
            trained[name] = {"pool": world.pool, "other": world.other_data, "settings": world.other_settings}
            trained_file.write_text(json.dumps(trained))
    except BaseException:
        teardown()
        raise
    return world, teardown


def start_ray_head(head: Any) -> None:
    """The tests' Ray head (`ray start --head`); through `python -m` where this interpreter's folder has no `ray`
    script (a virtualenv that reaches its packages through a .pth file)."""
    if (Path(sys.executable).parent / "ray").exists():
        head.start()
        return
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--port", str(head.port),
                    "--num-cpus", str(head.num_cpus), "--include-dashboard", "false", "--disable-usage-stats",
                    "--temp-dir", head.temp], env=head.env, stdout=head.log.open("ab"), stderr=subprocess.STDOUT,
                   check=True, timeout=120)


def write_config(folder: Path, name: str, config: dict[str, Any]) -> str:
    path = folder / "configs" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=1))
    return str(path)


def _process_cpu_s(pid: int) -> float:
    """utime + stime of a live process and of its children it waited for."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    t = os.times()
    return t.children_user + t.children_system


def podium_here(args: list[str]) -> tuple[int, list[str]]:
    """A read-only `podium` command through its entry point in this process (the command's own code, without
    a Python start and its imports at every step): exit code and output lines."""
    import io

    from podium.cli.main import main as podium_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            rc = podium_main(args)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
    return rc, out.getvalue().splitlines()


def run_podium(world: World, args: list[str], timeout_s: float = 900) -> tuple[int, list[str]]:
    """A `podium` command to its end: exit code and output lines."""
    attempt = Attempt(args, world.env)
    return attempt.finish(timeout_s), attempt.lines


# ---------------------------------------------------------------- one sequence


@dataclass
class Command:
    """A command a step ran: what, its exit code, the codes its outcome allows, and a note."""

    args: list[str]
    rc: int
    expected: tuple[int, ...]
    note: str = ""
    output: list[str] = field(default_factory=list)


@dataclass
class Step:
    index: int
    op: Op
    commands: list[Command] = field(default_factory=list)
    note: str = ""
    violations: list[str] = field(default_factory=list)
    checked: int = 0
    wall_s: float = 0.0
    killed: bool = False  # a command of the step was SIGKILLed
    before: dict[str, str | None] = field(default_factory=dict)  # each location's CURRENT as the step began


class Sequence:
    """One seeded sequence: its registered model, its locations, its plan; runs it and checks every step."""

    def __init__(self, world: World, seed: int, n_ops: int, trainings: bool = True):
        self.world, self.seed = world, seed
        self.model = f"lc-{seed}"
        self.folder = world.home / "sequences" / str(seed)
        self.locations = {key: self._location(key, alias) for key, alias in
                          (("a", "champion"), ("b", "canary"), ("c", "champion"))}
        self.plan = plan_sequence(seed, n_ops, world.pool, world.other_data, trainings, world.other_settings)
        self.own_run: str | None = None
        self.own_epochs = 0
        self.seen: dict[str, dict[str, Any]] = {key: {} for key in self.locations}  # location -> vN -> identity
        self.steps: list[Step] = []

    def _location(self, key: str, alias: str) -> Location:
        serving = str(self.folder / f"serving-{key}")
        config = self.world.base_config("unused", self.model, serving, alias)
        plain = json.loads(json.dumps(config))
        for name in ("metric", "mode"):
            plain["promotion"].pop(name)
        return Location(key, serving, alias, Path(write_config(self.folder, f"location-{key}", config)),
                        Path(write_config(self.folder, f"location-{key}-plain", plain)))

    def location_of(self, args: list[str]) -> Location | None:
        """The location a command acts on: its `--serving`, or its config's `serving`."""
        serving = None
        for flag, value in zip(args, args[1:]):
            if flag == "--serving":
                serving = value
            elif flag == "--config":
                serving = json.loads(Path(value).read_text()).get("serving")
        return next((loc for loc in self.locations.values() if loc.serving == serving), None)

    def active(self) -> list[Location]:
        """The locations that exist: a, and b or c once something was written there."""
        return [loc for k, loc in self.locations.items() if k == "a" or os.path.exists(loc.serving)]

    # ---- running

    def run(self) -> list[Step]:
        for i, op in enumerate(self.plan):
            step = Step(i, op)
            step.before = {key: _current_name(loc) if os.path.exists(loc.serving) else None
                           for key, loc in self.locations.items()}
            began = time.monotonic()
            try:
                self.execute(step)
            except Exception as exc:  # the soak goes on; what broke is a finding
                step.violations.append(f"harness: {type(exc).__name__}: {exc}")
            step.wall_s = time.monotonic() - began
            # a SIGKILL leaves what the command after it must finish: its own step is held to what serves
            checked, found = self.check(step, (*AFTER_SIGKILL, "exit_codes") if step.killed else INVARIANTS)
            step.checked += checked
            step.violations += found
            self.steps.append(step)
            codes = ", ".join(f"{c.args[0]}={c.rc}" for c in step.commands)
            log(f"seed {self.seed} step {i} {op.label()}: {codes}{' (' + step.note + ')' if step.note else ''}; "
                f"{step.wall_s:.0f} s; {len(step.violations)} violation(s)"
                + "".join(f"\n    {v}" for v in step.violations))
        return self.steps

    def promote_args(self, op: Op, loc: Location, approval: bool = False, timeout_s: float = APPROVAL_WAIT_S,
                     val: str = "", plain: bool = False) -> list[str]:
        args = ["promote", "--json", "--config", str(loc.plain_config if plain else loc.config), "--run-name", op.run]
        if op.always:
            args.append("--always-promote")
        if approval:
            args += ["--approval", "required", "--approval-timeout", f"{timeout_s:g}"]
        if val:
            args += ["--val-data", val]
        return args

    def command(self, step: Step, args: list[str], expected: tuple[int, ...], note: str = "") -> Command:
        rc, out = run_podium(self.world, args)
        cmd = Command(args, rc, expected, note, out)
        step.commands.append(cmd)
        return cmd

    def execute(self, step: Step) -> None:
        op = step.op
        loc = self.locations[op.loc]
        if op.kind in ("promote", "second"):
            self.command(step, self.promote_args(op, loc), (0,))
        elif op.kind == "same-alias":
            self.command(step, self.promote_args(op, loc), (2,), "a second location with the first one's alias")
        elif op.kind == "new-data":
            self.command(step, self.promote_args(op, loc, val=self.world.data["val2"]), (0,))
        elif op.kind == "timeout":
            self.candidate_run(op, loc)
            self.command(step, self.promote_args(op, loc, approval=True, timeout_s=3), (0,))
        elif op.kind in ("approve", "reject"):
            self.decide(step, op, loc)
        elif op.kind in SIGNALS:
            self.interrupt(step, op, loc)
        elif op.kind == "ctrl-c-after-switch":
            self.after_switch(step, op, loc)
        elif op.kind == "promote-other-settings":
            self.command(step, self.promote_args(op, loc, plain=True), (0,), "the run's own metric and mode")
        elif op.kind == "rollback":
            self.rollback(step, loc)
        elif op.kind == "sigterm-after-training":
            self.sigterm_after_training(step, op, loc)
        elif op.kind in TRAININGS:
            self.train(step, op, loc)
        else:
            raise ValueError(f"unknown operation {op.kind!r}")

    def _awaiting(self, attempt: Attempt, run: str) -> bool:
        """Wait until the command's candidate awaits a decision (its flow run paused in Prefect)."""
        from podium.prefect_api import paused_flow_run

        if not attempt.wait_for("awaiting approval", APPROVAL_WAIT_S):
            return False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and attempt.proc.poll() is None:
            try:
                paused_flow_run(run)
                return True
            except LookupError as exc:
                if "await approval (" in str(exc):  # more than one: the decision command will say so
                    return True
            time.sleep(0.5)
        return False

    def candidate_run(self, op: Op, loc: Location) -> None:
        """A run that is not the location's champion, for an operation that needs a candidate to wait: the
        planned one, else the next of the pool in a seeded order (the state is the seed's too)."""
        from podium.serving.layout import read_current

        current = read_current(loc.serving) if os.path.exists(loc.serving) else None
        champion = current.manifest.get("run_name") if current else None
        if op.run != champion or op.run == self.world.other_data:
            return
        others = [r for r in self.world.pool if r != champion]
        random.Random(self.seed).shuffle(others)
        op.run = others[0] if others else op.run

    def decide(self, step: Step, op: Op, loc: Location) -> None:
        """promote --approval required, answered by `podium approve` / `podium reject` once it waits."""
        self.candidate_run(op, loc)
        args = self.promote_args(op, loc, approval=True)
        attempt = Attempt(args, self.world.env)
        waited = self._awaiting(attempt, op.run)
        if waited:
            verb = op.kind
            answer, out = run_podium(self.world, [verb, "--run-name", op.run, "--reason", f"soak seed {self.seed}",
                                                  "--by", "soak"])
            step.commands.append(Command([verb, "--run-name", op.run], answer, (0,), "", out))
        else:
            step.note = "no candidate waited (the gate refused, or the best is the champion)"
        rc = attempt.finish()
        step.commands.insert(0, Command(args, rc, (0,), "", attempt.lines))

    def interrupt(self, step: Step, op: Op, loc: Location) -> None:
        """A signal to the process group of a command whose candidate awaits a decision."""
        self.candidate_run(op, loc)
        args = self.promote_args(op, loc, approval=True)
        attempt = Attempt(args, self.world.env)
        if not self._awaiting(attempt, op.run):
            step.note = "not injected: no candidate waited"
            step.commands.append(Command(args, attempt.finish(), (0,), "", attempt.lines))
            return
        time.sleep(op.delay_s)
        os.killpg(attempt.proc.pid, SIGNALS[op.kind])
        rc = attempt.finish()
        if op.kind != "sigkill":
            step.commands.append(Command(args, rc, (EXPECTED_SIGNAL_EXIT[op.kind],), "", attempt.lines))
            return
        step.commands.append(Command(args, rc, (rc,), "SIGKILLed while it waited", attempt.lines))
        step.killed = True
        # what a SIGKILL leaves is the next command's to finish; what serves must not have moved
        checked, found = self.check(step, AFTER_SIGKILL, suffix=" (right after the SIGKILL)")
        step.checked += checked
        step.violations += found
        answer, out = run_podium(self.world, ["approve", "--run-name", op.run, "--reason", "its process is gone",
                                              "--by", "soak"])
        step.commands.append(Command(["approve", "--run-name", op.run], answer,
                                     tuple(c for c in range(1, 256) if c != 0), "the run's process was killed", out))

    def switch_run(self, op: Op, loc: Location) -> None:
        """A run whose promotion switches CURRENT, for ctrl-c-after-switch (its signal lands after the switch): not the
        location's champion (found in place, nothing switches) and with its checkpoint not withdrawn (a rollback, of
        any sequence, withdrew it: the pool's runs are shared, and a withdrawn checkpoint is not promoted again). The
        planned one if it is such a run, else the first of the pool in a seeded order; where none is, one that is not
        the champion; where every run is, the planned one."""
        from podium.serving.layout import read_current, withdrawn_checkpoints
        from podium.tracking.records import list_records
        from podium.tracking.runs import find_tracking_run

        current = read_current(loc.serving) if os.path.exists(loc.serving) else None
        champion = current.manifest.get("run_name") if current else None
        withdrawn_here = withdrawn_checkpoints(loc.serving) if current else {}

        def withdrawn(run: str) -> bool:
            try:
                records = list_records(find_tracking_run(self.world.tracking_uri, POOL_EXPERIMENT, run))
            except LookupError:
                return True
            return bool(records) and all(r.withdrawn or r.uri in withdrawn_here for r in records)

        others = [r for r in self.world.pool if r != champion and r != op.run]
        random.Random(self.seed).shuffle(others)
        candidates = ([op.run] if op.run != champion else []) + others
        op.run = next((r for r in candidates if not withdrawn(r)), candidates[0] if candidates else op.run)

    def after_switch(self, step: Step, op: Op, loc: Location) -> None:
        """promote --always-promote held right after its switch of CURRENT (the test-only hook of
        podium.tasks.carry_out.pause_for_tests), then SIGINT to its process group: the promotion stands, exit 0."""
        self.switch_run(op, loc)
        args = self.promote_args(op, loc)
        marker = self.folder / f"paused-{step.index}"
        attempt = Attempt(args, {**self.world.env, "PODIUM_TEST_PAUSE_AT": "after-switch",
                                 "PODIUM_TEST_PAUSE_FILE": str(marker)})
        deadline = time.monotonic() + APPROVAL_WAIT_S
        while not marker.exists() and attempt.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if not marker.exists():  # no switch: the best is the champion already, or the gate refused
            step.note = "not injected: nothing was switched"
            step.commands.append(Command(args, attempt.finish(), (0,), "", attempt.lines))
            return
        os.killpg(attempt.proc.pid, signal.SIGINT)
        step.commands.append(Command(args, attempt.finish(), (0,), AFTER_SWITCH, attempt.lines))

    def rollback(self, step: Step, loc: Location) -> None:
        from podium.errors import HistoryError
        from podium.serving.history import rollback_target
        from podium.serving.layout import read_current, read_lineage

        args = ["rollback", "--json", "--serving", loc.serving, "--model", self.model, "--alias", loc.alias,
                "--reason", f"soak seed {self.seed}"]
        current = read_current(loc.serving) if os.path.exists(loc.serving) else None
        expected: tuple[int, ...] = (2,)
        if current is not None:
            lineage = read_lineage(loc.serving)
            to = None
            if step.op.to:
                to = random.Random(self.seed * 1000 + step.index).choice(list(lineage.champions) or [current.version])
                args += ["--to", to]
            try:
                rollback_target(lineage, current.version, to, loc.serving)
                expected = (0,)
            except HistoryError:
                pass
        self.command(step, args, expected, "nothing to go back to" if expected == (2,) else "")

    def sigterm_after_training(self, step: Step, op: Op, loc: Location) -> None:
        """A new `podium run --always-promote` of the sequence's own on a local Ray of its own (no RAY_ADDRESS: the
        command shuts that Ray down once training is done, podium.training.cluster.release_ray), held at `op.pause`
        of its promotion (the test-only hook of podium.tasks.carry_out.pause_for_tests), then SIGTERM to the command
        alone, as a pod's stop reaches its main process: before the switch it withdraws (143), after it the promotion
        stands (0, `late_stop` in its JSON)."""
        rng = random.Random(self.seed * 1000 + step.index)
        self.own_run, self.own_epochs = f"lc-{self.seed}-{step.index}", 2
        config = self.world.base_config(self.own_run, self.model, loc.serving, loc.alias, "val",
                                        rng.choice([3.0, 8.0, 15.0, 30.0]), self.own_epochs)
        args = ["run", "--json", "--config", write_config(self.folder, self.own_run, config), "--always-promote"]
        marker = self.folder / f"paused-{step.index}"
        local = {k: v for k, v in self.world.env.items() if k != "RAY_ADDRESS"}
        attempt = Attempt(args, {**local, "PODIUM_TEST_PAUSE_AT": op.pause, "PODIUM_TEST_PAUSE_FILE": str(marker)})
        self.world.trainings += 1
        deadline = time.monotonic() + 600
        while not marker.exists() and attempt.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if not marker.exists():  # no promotion reached the point: the gate refused
            step.note = "not injected: the promotion never reached its point"
            step.commands.append(Command(args, attempt.finish(), (0,), "", attempt.lines))
            return
        os.kill(attempt.proc.pid, signal.SIGTERM)
        after = op.pause == "after-switch"
        step.commands.append(Command(args, attempt.finish(), (0,) if after else (EXPECTED_SIGNAL_EXIT["sigterm"],),
                                     TERM_AFTER_SWITCH if after else "SIGTERM before the switch", attempt.lines))

    def train(self, step: Step, op: Op, loc: Location) -> None:
        """A `podium run` of the sequence's own: a new run, an early stop, a resume (with retention)."""
        rng = random.Random(self.seed * 1000 + step.index)
        kind = op.kind
        if kind in ("run", "early-stop") or self.own_run is None:
            self.own_run = f"lc-{self.seed}-{step.index}"
            self.own_epochs = 3 if kind == "early-stop" else 2
            angle = 0.0 if kind == "early-stop" else rng.choice([3.0, 8.0, 15.0, 30.0])
        else:  # resume and retention continue the sequence's run, with more epochs
            self.own_epochs += 1
            angle = json.loads(Path(self.folder / "configs" / f"{self.own_run}.json").read_text())[
                "training"]["train_loop_config"]["angle_deg"]
        config = self.world.base_config(self.own_run, self.model, loc.serving, loc.alias, "val", angle, self.own_epochs)
        if kind == "early-stop":
            config["training"]["early_stop_patience"] = 1
        if kind == "retention":
            config["checkpoints"] = {"keep": 1}
        path = write_config(self.folder, self.own_run, config)
        self.command(step, ["run", "--json", "--config", path], (0,))
        self.world.trainings += 1

    # ---- checking

    def check(self, step: Step, names: tuple[str, ...] | list[str], suffix: str = "") -> tuple[int, list[str]]:
        """Every invariant of `names` on the sequence's state now; (checks made, violations)."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.world.tracking_uri, registry_uri=self.world.tracking_uri)
        ctx = Checking(self, step, client)
        checked, out = 0, []
        for name in names:
            checked += 1
            try:
                found = globals()[f"check_{name}"](ctx)
            except Exception as exc:
                found = [f"could not be checked: {type(exc).__name__}: {exc}"]
            out += [f"[{name}] seed {self.seed} step {step.index} {step.op.label()}{suffix}: {v}" for v in found]
        return checked, out


@dataclass
class Checking:
    """What every check reads: the sequence, the step, an MLflow client."""

    seq: Sequence
    step: Step
    client: Any

    def current(self, loc: Location) -> Any:
        from podium.serving.layout import read_current

        return read_current(loc.serving)

    def versions(self) -> list[Any]:
        from mlflow.exceptions import MlflowException

        try:
            return list(self.client.search_model_versions(f"name = '{self.seq.model}'"))
        except MlflowException:
            return []

    def aliases(self) -> dict[str, str]:
        from mlflow.exceptions import MlflowException

        try:
            rm = self.client.get_registered_model(self.seq.model)
        except MlflowException:
            return {}
        aliases = rm.aliases
        return dict(aliases) if isinstance(aliases, dict) else {a.alias: a.version for a in aliases}

    def by_alias(self, alias: str) -> Any:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_model_version_by_alias(self.seq.model, alias)
        except MlflowException:
            return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _same_version(mv: Any, current: Any) -> bool:
    """Whether a registered version is the serving version `current`: by `version_uid` where both have one (the
    contract); by the served path where neither does (podium before it)."""
    uid, tags = current.manifest.get("version_uid"), mv.tags or {}
    if uid and tags.get(TAG_UID):
        return tags[TAG_UID] == uid
    return tags.get(TAG_SERVED_URI) == current.uri


# ---- a: what serves is what the alias loads

def check_served_bytes(ctx: Checking) -> list[str]:
    out = []
    for loc in ctx.seq.active():
        current = ctx.current(loc)
        if current is None:
            continue
        mv = ctx.by_alias(loc.alias)
        if mv is None:
            out.append(f"{loc.key}: CURRENT is {current.version} but @{loc.alias} names no version")
            continue
        import mlflow.artifacts

        # what models:/<name>@<alias> resolves to: the alias's version, its artifacts
        source = ctx.client.get_model_version_download_uri(ctx.seq.model, mv.version)
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=tmp,
                                                            tracking_uri=ctx.seq.world.tracking_uri))
            got = {str(p.relative_to(root)): _sha256(p) for p in root.rglob("*") if p.is_file()}
        want = {rel: entry["sha256"] for rel, entry in current.manifest.get("files", {}).items()}
        differ = sorted(rel for rel in want if got.get(rel) != want[rel])
        if differ or not want:
            out.append(f"{loc.key}: models:/{ctx.seq.model}@{loc.alias} (version {mv.version}) loads other bytes than "
                       f"CURRENT {current.version} serves: {differ[:3] or 'no files in the manifest'} differ "
                       f"(alias's source {(mv.tags or {}).get(TAG_SERVED_URI)})")
    return out


def check_registry_identity(ctx: Checking) -> list[str]:
    out = []
    for loc in ctx.seq.active():
        current = ctx.current(loc)
        mv = ctx.by_alias(loc.alias) if current is not None else None
        if mv is None:
            continue
        uid, tags = current.manifest.get("version_uid"), mv.tags or {}
        if not uid:
            out.append(f"{loc.key}: {current.version}'s manifest has no version_uid")
        elif tags.get(TAG_UID) != uid:
            out.append(f"{loc.key}: @{loc.alias} = version {mv.version} with {TAG_UID} {tags.get(TAG_UID)!r}, "
                       f"CURRENT {current.version} has {uid}")
        if tags.get(TAG_NUMBER) != current.version:
            out.append(f"{loc.key}: @{loc.alias} = version {mv.version} with {TAG_NUMBER} {tags.get(TAG_NUMBER)!r}, "
                       f"CURRENT is {current.version}")
    return out


# ---- b: every alias is its location's current

def check_aliases(ctx: Checking) -> list[str]:
    out = []
    locations = ctx.seq.active()
    challengers = {challenger_of(loc.alias) for loc in locations} | {"challenger"}
    for alias, version in sorted(ctx.aliases().items()):
        if alias in challengers:
            out.append(f"@{alias} still names version {version} after its command ended")
            continue
        owners = [loc for loc in locations if loc.alias == alias]
        if not owners:
            out.append(f"@{alias} (version {version}) belongs to no serving location")
        mv = ctx.client.get_model_version(ctx.seq.model, version)
        verdict = (mv.tags or {}).get(TAG_APPROVAL)
        if verdict in ("pending", "rejected", "undecided"):
            out.append(f"@{alias} names version {version}, which is {TAG_APPROVAL} = {verdict}")
        for loc in owners:
            current = ctx.current(loc)
            if current is None:
                out.append(f"{loc.key}: @{alias} names version {version}, but nothing is current at {loc.key}")
            elif not _same_version(mv, current):
                out.append(f"{loc.key}: @{alias} names version {version} ({(mv.tags or {}).get(TAG_SERVED_URI)}), "
                           f"not {loc.key}'s current {current.version}")
    return out


def check_location_ownership(ctx: Checking) -> list[str]:
    from mlflow.exceptions import MlflowException

    out = []
    try:
        tags = ctx.client.get_registered_model(ctx.seq.model).tags or {}
    except MlflowException:
        tags = {}
    owners: dict[str, list[str]] = {}
    for loc in ctx.seq.active():
        if ctx.current(loc) is None:
            continue
        doc_path = Path(loc.serving) / "LOCATION.json"
        doc = json.loads(doc_path.read_text()) if doc_path.exists() else None
        if doc is None:
            out.append(f"{loc.key}: no LOCATION.json")
            continue
        owners.setdefault(doc.get("alias"), []).append(loc.key)
        if (doc.get("registered_model"), doc.get("alias")) != (ctx.seq.model, loc.alias):
            out.append(f"{loc.key}: LOCATION.json says {doc.get('registered_model')}@{doc.get('alias')}, "
                       f"the location serves {ctx.seq.model}@{loc.alias}")
        owner = tags.get(f"podium.location.{loc.alias}")
        if owner != doc.get("id"):
            out.append(f"{loc.key}: podium.location.{loc.alias} names location {owner!r}, this one is "
                       f"{doc.get('id')!r}")
    out += [f"@{alias} is the alias of {len(keys)} locations: {keys}" for alias, keys in owners.items() if len(keys) > 1]
    return out


# ---- c: nothing staged or pending outlives its command

def check_no_pending(ctx: Checking) -> list[str]:
    return [f"version {mv.version} ({(mv.tags or {}).get(TAG_SERVED_URI)}) is still {TAG_APPROVAL} = pending"
            for mv in ctx.versions() if (mv.tags or {}).get(TAG_APPROVAL) == "pending"]


def _alive(pid: Any, host: Any) -> bool:
    if host not in (None, socket.gethostname()):
        return True  # another machine's: not this soak's to judge
    try:
        os.kill(int(pid), 0)
        return True
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True


def check_no_staged(ctx: Checking) -> list[str]:
    out = []
    for loc in ctx.seq.active():
        for vdir in sorted((Path(loc.serving) / "versions").glob("v*")):
            names = {p.name for p in vdir.iterdir()}
            if "STAGED.json" in names:
                doc = json.loads((vdir / "STAGED.json").read_text() or "{}")
                if not _alive(doc.get("pid"), doc.get("host")):
                    out.append(f"{loc.key}: {vdir.name}/STAGED.json of pid {doc.get('pid')} ({doc.get('run_name')}), "
                               "whose process is gone")
                continue
            if "MANIFEST.json" not in names and "DISCARDED.json" not in names:
                out.append(f"{loc.key}: {vdir.name} has neither MANIFEST.json nor DISCARDED.json ({sorted(names)})")
    return out


def paused_flow_runs(run_names: list[str]) -> list[Any]:
    """The flow runs of these podium runs that are Paused in Prefect."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    names = [f"{r}-{kind}" for r in run_names for kind in ("run", "promote")]
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=names)), limit=200)
    return [r for r in runs if r.state is not None and r.state.is_paused()]


def cancel_flow_run(flow_run_id: Any, why: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, Cancelled(message=why), force=True)


def check_no_orphan_pause(ctx: Checking) -> list[str]:
    runs = ctx.seq.world.pool + [r for r in (ctx.seq.world.other_data, ctx.seq.own_run) if r]
    out = []
    for fr in paused_flow_runs(runs):
        out.append(f"flow run {fr.name} ({fr.id}) is still Paused awaiting approval; its command has ended")
        cancel_flow_run(fr.id, "lifecycle soak: its command had ended (reported as a violation)")
    return out


# ---- d: what the history needs is there

def check_checkpoints_present(ctx: Checking) -> list[str]:
    from podium.serving.layout import read_history, read_version
    from podium.storage.locations import fsspec_filesystem

    out = []
    for loc in ctx.seq.active():
        for name in dict.fromkeys(str(h.get("version")) for h in read_history(loc.serving)):
            version = read_version(loc.serving, name)
            source = version and (version.manifest.get("checkpoint") or version.manifest.get("source"))
            if not source:
                out.append(f"{loc.key}: history version {name} names no source checkpoint")
                continue
            fs, path = fsspec_filesystem(source)
            if not fs.exists(path):
                out.append(f"{loc.key}: history version {name}'s checkpoint {source} is gone from storage")
    return out


# ---- e: what the commands say

def _current_name(loc: Location) -> str | None:
    from podium.serving.layout import read_pointer

    return (read_pointer(loc.serving) or {}).get("version")


def _json_of(lines: list[str]) -> dict[str, Any] | None:
    for line in reversed(lines):
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                return json.loads(line)
    return None


def check_status_agrees(ctx: Checking) -> list[str]:
    out = []
    for loc in ctx.seq.active():
        want = _current_name(loc)
        rc, lines = podium_here(["status", "--json", "--config", str(loc.config), "--run-name", ctx.seq.world.pool[0]])
        doc = _json_of(lines)
        if rc != 0 or doc is None:
            out.append(f"{loc.key}: podium status exited {rc}: {' / '.join(lines[-2:])}")
            continue
        got = (doc.get("champion") or {}).get("version")
        if got != want:
            out.append(f"{loc.key}: podium status names champion {got}, CURRENT is {want}")
    return out


def check_history_agrees(ctx: Checking) -> list[str]:
    out = []
    for loc in ctx.seq.active():
        want = _current_name(loc)
        rc, lines = podium_here(["history", "--json", "--serving", loc.serving])
        doc = _json_of(lines)
        if rc != 0 or doc is None:
            out.append(f"{loc.key}: podium history exited {rc}: {' / '.join(lines[-2:])}")
        elif doc.get("current") != want:
            out.append(f"{loc.key}: podium history names {doc.get('current')} current, CURRENT is {want}")
    return out


# ---- f: exit codes say what happened

def check_exit_codes(ctx: Checking) -> list[str]:
    out = []
    for c in ctx.step.commands:
        if c.rc not in c.expected:
            want = "non-zero" if len(c.expected) > 2 else " or ".join(map(str, c.expected))
            tail = next((line for line in reversed(c.output) if line.strip()), "")
            out.append(f"podium {' '.join(c.args[:1] + [a for a in c.args[1:] if not a.startswith('/')][:6])} "
                       f"exited {c.rc}, expected {want}{' (' + c.note + ')' if c.note else ''}: {tail[:300]}")
    return out


# ---- g: a version number is never reused

def check_version_numbers(ctx: Checking) -> list[str]:
    from podium.serving.layout import read_history

    out = []
    versions = ctx.versions()
    for loc in ctx.seq.active():
        seen = ctx.seq.seen[loc.key]
        root = Path(loc.serving) / "versions"
        now: dict[str, Any] = {}
        for vdir in sorted(root.glob("v*")) if root.exists() else []:
            now[vdir.name] = ("open", None)  # staged, or left half-way (check_no_staged says which)
            for marker in ("MANIFEST.json", "DISCARDED.json"):
                if (vdir / marker).exists():
                    doc = json.loads((vdir / marker).read_text())
                    now[vdir.name] = (marker, doc.get("version_uid") or (doc.get("source"), doc.get("created_at")))
        for name, ident in seen.items():
            if name not in now:
                out.append(f"{loc.key}: {name} ({ident[0]}) is gone: its number can be taken again")
            elif now[name] != ident and ident[0] != "open":
                out.append(f"{loc.key}: {name} was {ident}, is now {now[name]}: the number was reused")
        fresh = sorted(set(now) - set(seen))
        if seen and fresh and min(fresh) < max(seen):
            out.append(f"{loc.key}: new version(s) {fresh} after {max(seen)}: numbers go backwards")
        seen.update(now)
        promoted = [str(h.get("version")) for h in read_history(loc.serving) if h.get("action", "promote") == "promote"]
        if promoted != sorted(set(promoted)):
            out.append(f"{loc.key}: the history's promotions are not in strictly increasing order: {promoted}")
        prefix = os.path.join(loc.serving, "versions", "")
        for mv in versions:
            served = (mv.tags or {}).get(TAG_SERVED_URI) or ""
            if not served.startswith(prefix):
                continue
            name = served[len(prefix):].split("/", 1)[0]
            if name not in now:
                out.append(f"{loc.key}: registered version {mv.version} ({TAG_APPROVAL} "
                           f"{(mv.tags or {}).get(TAG_APPROVAL)}) was made for {name}, which is not there")
            elif (mv.tags or {}).get(TAG_UID) and isinstance(now[name][1], str) and mv.tags[TAG_UID] != now[name][1]:
                out.append(f"{loc.key}: registered version {mv.version} was made for {name} "
                           f"({mv.tags[TAG_UID]}), which now holds {now[name][1]}")
    return out


# ---- h: what a command says it did is what serves

def check_outcome_matches(ctx: Checking) -> list[str]:
    out = []
    for c in ctx.step.commands:
        loc = ctx.seq.location_of(c.args)
        if c.args[0] not in ("promote", "run") or c.rc not in (0, 130, 143) or loc is None:
            continue
        what = f"{loc.key}: podium {c.args[0]} (exit {c.rc}{', ' + c.note if c.note else ''})"
        doc, now, before = _json_of(c.output), _current_name(loc), ctx.step.before.get(loc.key)
        if c.rc != 0:
            if doc is not None:
                out.append(f"{what} printed a JSON outcome: a stopped command has none")
            if now != before:
                out.append(f"{what} stopped, yet CURRENT moved {before} -> {now}: not stopped before the switch")
            continue
        if doc is None:
            out.append(f"{what} printed no JSON outcome")
            continue
        promoted = doc.get("promoted")
        if promoted:
            mv = ctx.by_alias(loc.alias)
            if promoted.get("version") != now:
                out.append(f"{what} says it promoted {promoted.get('version')}, CURRENT is {now}")
            if mv is None or str(promoted.get("mlflow_version")) != str(mv.version):
                out.append(f"{what} says @{loc.alias} = version {promoted.get('mlflow_version')}, the registry says "
                           f"{mv.version if mv else None}")
        elif now != before:
            out.append(f"{what} says it promoted nothing, yet CURRENT moved {before} -> {now}")
        late = LATE_STOPS.get(c.note)
        if late and not str(doc.get("late_stop") or "").startswith(late):
            out.append(f"{what}: its JSON does not say the {late.split()[0]} came after the switch (late_stop "
                       f"{doc.get('late_stop')!r})")
        if ctx.step.op.kind == "promote-other-settings":  # --always-promote: promoted by the run's own metric, unless
            # it is the champion, or its one checkpoint was withdrawn (a rollback of another sequence: the pool's runs
            # are shared, and a checkpoint rolled back from serving is not promoted again)
            metric, reason = (promoted or {}).get("metric"), str(doc.get("promotion_reason"))
            used = ((doc.get("settings") or {}).get("used") or {}).get("promotion.metric")
            if used != "accuracy":
                out.append(f"{what}: decided with promotion.metric = {used!r}, not the run's own accuracy")
            if promoted and metric != "accuracy" or not promoted and not any(
                    why in reason for why in ("already the champion", "is withdrawn")):
                out.append(f"{what}: not promoted by the run's own metric accuracy ({metric or 'nothing promoted'}: "
                           f"{reason[:200]})")
    return out


# ---------------------------------------------------------------- the soak


def soak(args: argparse.Namespace) -> dict[str, Any]:
    """Make the pool, run every sequence, check every step; the results."""
    home = Path(args.workdir or tempfile.mkdtemp(prefix="podium-lifecycle-"))
    began, cpu0 = time.monotonic(), time.process_time() + _children_cpu_s()
    world, teardown = start_world(home, SMALL_POOL if args.small_pool else POOL)
    pool_s = time.monotonic() - began
    results, servers_cpu = [], 0.0
    try:
        for seed in range(args.seed, args.seed + args.sequences):
            seq = Sequence(world, seed, args.ops, trainings=not args.no_training)
            log(f"seed {seed}: " + ", ".join(op.label() for op in seq.plan))
            steps = seq.run()
            results.append({"seed": seed, "plan": [op.label() for op in seq.plan],
                            "steps": [{"op": s.op.label(), "note": s.note, "wall_s": round(s.wall_s, 1),
                                       "commands": [{"args": c.args, "rc": c.rc, "expected": list(c.expected)[:3]}
                                                    for c in s.commands],
                                       "checked": s.checked, "violations": s.violations} for s in steps]})
            (home / "results.json").write_text(json.dumps({"home": str(home), "sequences": results}, indent=1))
    finally:
        servers_cpu = teardown()
    wall = time.monotonic() - began
    cpu = time.process_time() + _children_cpu_s() - cpu0 + servers_cpu
    out = {"home": str(home), "sequences": results, "wall_s": round(wall, 1), "pool_s": round(pool_s, 1),
           "cpu_s": round(cpu, 1), "trainings": world.trainings}
    (home / "results.json").write_text(json.dumps(out, indent=1))
    if not args.keep and not args.workdir:
        shutil.rmtree(home, ignore_errors=True)
    return out


def violations_of(out: dict[str, Any]) -> list[str]:
    return [v for s in out["sequences"] for step in s["steps"] for v in step["violations"]]


def summarize(args: argparse.Namespace, out: dict[str, Any], loads: list[str]) -> str:
    seqs = out["sequences"]
    steps = [st for s in seqs for st in s["steps"]]
    ops = Counter(st["op"].split("[", 1)[0] for st in steps)
    violations = violations_of(out)
    by = Counter(v.split("]", 1)[0].lstrip("[") for v in violations)
    seeds: dict[str, set[int]] = {}
    for s in seqs:
        for st in s["steps"]:
            for v in st["violations"]:
                seeds.setdefault(v.split("]", 1)[0].lstrip("["), set()).add(s["seed"])
    rows = [[name, str(by.get(name, 0)), ", ".join(map(str, sorted(seeds.get(name, ())))) or "–"]
            for name in [*INVARIANTS, *sorted(set(by) - set(INVARIANTS))]]
    m = machine_description()
    command = (f"python benchmarks/lifecycle.py --sequences {args.sequences} --ops {args.ops} --seed {args.seed}"
               + (" --no-training" if args.no_training else "") + (" --small-pool" if args.small_pool else ""))
    violated = [row for row in rows if row[1] != "0"]
    checked = (f"Invariants checked after every operation: {sum(st['checked'] for st in steps)}, of "
               f"{', '.join(INVARIANTS)}. Violations: {len(violations)}.")
    return "\n\n".join([
        "## Lifecycle soak (`benchmarks/lifecycle.py`)",
        f"`{command}` on {m['cpu']}, {m['cores']} cores ({m['versions']}); load " + "; ".join(loads) + ": "
        f"{len(seqs)} seeded sequences, {len(steps)} operations ("
        + ", ".join(f"{k} {n}" for k, n in sorted(ops.items())) + f"); {out['trainings']} Ray Train starts "
        f"(none for the shared pool of {len(SMALL_POOL if args.small_pool else POOL)} runs, made without training). "
        f"Wall {out['wall_s'] / 60:.1f} min "
        f"(the pool {out['pool_s'] / 60:.1f} min), {out['cpu_s']:.0f} CPU-s (the soak, its commands, the Prefect "
        "server and the Ray head).",
        # a table only of what was violated: the front page stays short (tests/unit/test_docs.py)
        *([markdown_table(["invariant", "violations", "seeds"], violated)] if violated else []),
        checked + "".join(f"\n- {v}" for v in violations[:40])
        + (f"\n- … and {len(violations) - 40} more" if len(violations) > 40 else "")]) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="A lifecycle soak of podium; see the module's docstring.")
    p.add_argument("--sequences", type=int, default=30, help="seeded sequences (default: 30)")
    p.add_argument("--ops", type=int, default=8, help="operations per sequence (default: 8)")
    p.add_argument("--seed", type=int, default=1, help="the first sequence's seed; the others follow (default: 1)")
    p.add_argument("--no-training", action="store_true", help="leave out the operations that train")
    p.add_argument("--small-pool", action="store_true", help="a pool of two runs (no run on other data)")
    p.add_argument("--workdir", default="", help="the soak's folder (default: a new temporary one, removed after)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (its path is printed)")
    p.add_argument("--output", default="", help="markdown file to update (e.g. BENCHMARKS.md; default: none)")
    p.add_argument("--json", default="", help="write every step's result to this file")
    args = p.parse_args(argv)
    loads = [f"before: {load_average()}"]
    out = soak(args)
    loads.append(f"after: {load_average()}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    text = summarize(args, out, loads)
    if args.output:
        update_markdown_section(args.output, "lifecycle", text)
    print(text)
    if args.keep:
        print(f"kept: {out['home']}")
    return 1 if violations_of(out) else 0


if __name__ == "__main__":
    sys.exit(main())
