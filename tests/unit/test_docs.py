"""The docs stay a guide: short front pages, and code that imports only podium's public API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import podium

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("name, most", [("README.md", 300), ("BENCHMARKS.md", 250)])
def test_the_front_pages_stay_short(name, most):
    lines = (REPO / name).read_text().count("\n")
    assert lines <= most, f"{name} has {lines} lines; at most {most}: move the rest to the docs site"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_docs_import_only_the_public_api(page):
    """`from podium.x import ...` in a guide would make an internal module public."""
    text = page.read_text()
    internal = re.findall(r"^\s*(?:from podium\.[\w.]+ import .*|import podium\.[\w.]+.*)$", text, re.M)
    assert not internal, f"{page.name} imports internals: {internal}"
    for names in re.findall(r"^\s*from podium import ([^#\n]+)", text, re.M):
        unknown = {n.strip(" ()").split(" as ")[0] for n in names.split(",")} - set(podium.__all__) - {""}
        assert not unknown, f"{page.name} imports {sorted(unknown)}, which podium does not export"


def test_the_own_loop_guides_complete_example_validates_and_loads_a_checkpoint(tmp_path):
    """The complete example of docs/bring-your-own-loop.md, as written: a checkpoint of its `Net`'s state dict,
    saved as its loop saves one, is loaded by its `load_model` and by podium's loader for `--model-class` alike,
    and scored by its validation function, through a Ray Train Checkpoint (no training: the integration test
    test_a_repository_with_its_own_training_and_tasks_packages runs its loop)."""
    import importlib.util

    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray.train
    import torch

    guide = (REPO / "docs" / "bring-your-own-loop.md").read_text()
    match = re.search(r"```python\n(# mypkg/train\.py\n.*?)```", guide, re.S)
    assert match, "bring-your-own-loop.md has no complete example (a python block starting `# mypkg/train.py`)"
    (tmp_path / "train.py").write_text(match.group(1))
    spec = importlib.util.spec_from_file_location("guide_example_train", tmp_path / "train.py")
    example = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(example)  # type: ignore[union-attr]

    from podium.training.loaders import state_dict

    columns = [f"f{i}" for i in range(16)]  # the demo data's 16 features, as the example's Net expects
    pq.write_table(pa.table({**{c: [float(i), 1.0, 0.0, 2.0] for i, c in enumerate(columns)}, "label": [0, 1, 3, 2]}),
                   tmp_path / "val.parquet")
    torch.manual_seed(1)
    model = example.Net()
    (tmp_path / "ckpt").mkdir()
    torch.save(model.state_dict(), tmp_path / "ckpt" / "model.pt")  # as the example's loop saves it
    x = torch.randn(3, 16)
    for loaded in (example.load_model(str(tmp_path / "ckpt")), state_dict(str(tmp_path / "ckpt"), example.Net)):
        assert torch.equal(loaded(x), model(x)) and not loaded.training
    metrics = example.validate_fn(ray.train.Checkpoint.from_directory(str(tmp_path / "ckpt")),
                                  val_data=str(tmp_path / "val.parquet"), feature_columns=columns,
                                  label_column="label")
    assert set(metrics) == {"accuracy"} and 0.0 <= metrics["accuracy"] <= 1.0
