"""What the registry says about serving, through the real `podium` process: `@champion`'s files are the bytes CURRENT
serves, for every promotion of a checkpoint; a candidate approved but never served does not say `approved`.

No training: the runs' checkpoints are made directly in storage and recorded in the test's MLflow store with
podium's own functions (tests/helpers/checkpoints.py), as test_promotion_policy's are; their model loader
(podium_nightly_code:load_linear) makes each promotion build an MLflow model (an MLmodel with its own model_uuid and
creation time), so two builds of one checkpoint are different bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from helpers.checkpoints import make_trained_run
from helpers.commands import awaiting_approval, podium
from podium_nightly_code import FEATURES, write_data

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
META = "registered_model_meta"  # the file MLflow writes beside a registered model it downloads (name, version)


@pytest.fixture
def env(prefect_api, tmp_path, tracking_uri) -> dict[str, str]:
    """The test's Prefect server and MLflow store; the nightly model's code importable (its loader); no Ray: a
    promotion checked by hashes starts none."""
    write_data(str(tmp_path / "train.parquet"), 100, 0.0, seed=1)
    write_data(str(tmp_path / "val.parquet"), 200, 0.1, seed=2)
    return {**os.environ, "PODIUM_HOME": str(tmp_path / "home"), "PREFECT_API_URL": prefect_api,
            "MLFLOW_TRACKING_URI": tracking_uri,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}


def _config(env: dict[str, str], tmp_path: Path, name: str, model: str, serving: str,
            promotion: dict[str, Any]) -> Path:
    """The config of run `name` at one serving location; the run's checkpoint made and recorded the first time."""
    config = {"run_name": name, "model": model, "storage": str(tmp_path / "storage"),
              "serving": str(tmp_path / serving),
              "data": {"train": str(tmp_path / "train.parquet"), "val": str(tmp_path / "val.parquet"),
                       "feature_columns": list(FEATURES)},
              "training": {"train_loop": "podium_nightly_code:train_func",
                           "train_loop_config": {"epochs": 1, "angle_deg": 10.0}},
              "scaling": {"num_workers": 1},
              "validation": {"fn": "podium_nightly_code:validate_fn", "concurrency": 1},
              "promotion": {"metric": "accuracy", "mode": "max", "verify": "hashes",
                            "model_loader": "podium_nightly_code:load_linear", **promotion}}
    path = tmp_path / f"{name}-{serving}.json"
    path.write_text(json.dumps(config))
    made = tmp_path / f"{name}.made"
    if not made.exists():  # each run's checkpoint made once, whatever location it is promoted to
        run = make_trained_run(config, env["MLFLOW_TRACKING_URI"])
        assert [r.status for r in run.records] == ["validated"], run.records
        made.write_text(run.records[0].model_id or "")
    return path


def _promote(env: dict[str, str], config: Path, *flags: str) -> dict[str, Any]:
    return json.loads(podium(["promote", "--json", "--config", str(config), *flags], env).stdout.strip().splitlines()[-1])


def _hashes(folder: str) -> dict[str, str]:
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            out[os.path.relpath(path, folder)] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return out


def _served(serving: Path) -> dict[str, Any]:
    """The manifest of the version CURRENT names."""
    current = json.loads((serving / "CURRENT").read_text())["version"]
    return json.loads((serving / "versions" / current / "MANIFEST.json").read_text())


def _registered_files(tmp_path: Path, name: str, alias: str) -> dict[str, str]:
    import mlflow

    into = tempfile.mkdtemp(prefix=f"download-{alias}-", dir=tmp_path)
    got = mlflow.artifacts.download_artifacts(f"models:/{name}@{alias}", dst_path=into)
    files = _hashes(got)
    files.pop(META, None)
    return files


def test_a_checkpoint_promoted_twice_registers_the_bytes_each_location_serves(env, tmp_path, monkeypatch):
    """One checkpoint promoted to two serving locations of one model (each its own alias): each registered version
    downloads as exactly the files its location serves (every sha256 its MANIFEST.json lists, nothing else), the
    first one unchanged by the second promotion, both linked to the checkpoint's one LoggedModel."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    first = _promote(env, _config(env, tmp_path, "twice", "files", "serving-a", {"alias": "champion"}))
    assert first["promoted"]["served_as"] == "mlflow-model", first
    before = _registered_files(tmp_path, "files", "champion")
    second = _promote(env, _config(env, tmp_path, "twice", "files", "serving-b", {"alias": "canary"}))
    assert second["promoted"]["step"] == first["promoted"]["step"]

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    champion = client.get_model_version_by_alias("files", "champion")
    canary = client.get_model_version_by_alias("files", "canary")
    # one checkpoint, one LoggedModel: it lists both versions (MLflow's link; a SQL store keeps no model_id on a
    # version), each registered from files of its own inside it
    model = client.get_logged_model((tmp_path / "twice.made").read_text())
    assert json.loads(model.tags["mlflow.modelVersions"]) == [{"name": "files", "version": str(champion.version)},
                                                               {"name": "files", "version": str(canary.version)}]
    root = model.artifact_location.removeprefix("file://").rstrip("/")
    assert champion.source != canary.source and {champion.source.startswith(root + "/served/"),
                                                 canary.source.startswith(root + "/served/")} == {True}
    for alias, serving in (("champion", "serving-a"), ("canary", "serving-b")):
        manifest = _served(tmp_path / serving)
        served = {rel: f["sha256"] for rel, f in manifest["files"].items()}
        assert "MLmodel" in served
        assert _registered_files(tmp_path, "files", alias) == served, f"@{alias}'s files are not what {serving} serves"
    assert _registered_files(tmp_path, "files", "champion") == before, "the second promotion rewrote the first's files"
    # the LoggedModel's own model (models:/<model_id>) is the first build, logged once
    assert (Path(root) / "MLmodel").read_bytes() == (tmp_path / "serving-a" / "versions" / first["promoted"]["version"]
                                                   / "model" / "MLmodel").read_bytes()


def test_an_approved_candidate_whose_champion_changed_is_tagged_discarded_not_approved(env, tmp_path):
    """`podium promote` with approval required waits; meanwhile another run is promoted there; `podium approve` then
    promotes nothing, and the candidate's registered version says it was discarded (what was decided, and why), not
    `approved`, with neither alias on it."""
    from mlflow.tracking import MlflowClient

    waits = _config(env, tmp_path, "waits", "decided", "serving", {"approval": "required"})
    other = _config(env, tmp_path, "other", "decided", "serving", {})
    proc = subprocess.Popen([sys.executable, "-m", "podium.cli", "promote", "--json", "--config", str(waits)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        awaiting_approval(proc, "waits")
        _promote(env, other)  # the champion changes while the candidate waits
        podium(["approve", "--run-name", "waits", "--reason", "looks right", "--by", "ana"], env)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out[-2000:]}\n{err[-4000:]}"
    result = json.loads(out.strip().splitlines()[-1])
    assert result["promoted"] is None and "the champion changed while it waited" in result["promotion_reason"]

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    [candidate] = [v for v in client.search_model_versions("name = 'decided'") if "of run waits," in v.description]
    tags = candidate.tags
    assert tags["podium.approval"] == "discarded", tags
    assert tags["podium.approval.decided"] == "approved" and tags["podium.approval.by"].startswith("ana")
    assert "the champion changed while it waited" in tags["podium.discarded"]
    assert not candidate.aliases, candidate.aliases
    assert "awaiting approval" not in candidate.description and "discarded" in candidate.description
    assert client.get_model_version_by_alias("decided", "champion").version != candidate.version
