"""Training data through Ray Data: the Parquet datasets handed to the TorchTrainer, and their arithmetic.

The trainer gets `datasets={"train": ...}`; each worker iterates its own shard
(`ray.train.get_dataset_shard("train")`), so every row is read once per epoch in all, not once per
worker, and a worker holds a few chunks of rows, not the table.

Tested with ray 2.60. podium reads Parquet with Ray Data's V1 datasource: the default V2 datasource
starts 32 footer-reading actors for every execution, i.e. every epoch (measured at 4-5 s per epoch on
2 cores, and 7-28 s to the first batch under Ray Train); V1 reads the footers once, when the dataset
is made. Nothing here imports torch (the tasks layer builds the datasets).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from podium.storage.locations import arrow_filesystem

if TYPE_CHECKING:
    import ray.data
    import ray.train

logger = logging.getLogger(__name__)

TRAIN, VAL = "train", "val"
SHUFFLES = ("none", "local", "global")
CACHES = ("never", "auto", "always")
CACHE_SHARE = 0.25  # cache="auto": data decoded up to this share of the object store is kept there


@contextlib.contextmanager
def podium_data_context(data_cpus: float | None = None) -> Iterator[None]:
    """Ray Data settings for podium's datasets in this process, restored afterwards: the V1 Parquet
    datasource, no progress bars (they would print on podium's terminal), and at most `data_cpus`.

    Ray Train copies this context when `fit()` starts, so wrap `fit()` in it as well."""
    from ray.data import DataContext, ExecutionResources

    ctx = DataContext.get_current()
    saved = (ctx.use_datasource_v2, ctx.enable_progress_bars, ctx.execution_options.resource_limits)
    ctx.use_datasource_v2, ctx.enable_progress_bars = False, False
    if data_cpus is not None:
        ctx.execution_options.resource_limits = ExecutionResources(cpu=data_cpus)
    try:
        yield
    finally:
        ctx.use_datasource_v2, ctx.enable_progress_bars, ctx.execution_options.resource_limits = saved


def read_parquet_dataset(uri: str, columns: list[str] | None = None, *, read_cpus: float = 1.0,
                         shuffle_files_seed: int | None = None) -> ray.data.Dataset:
    """A lazy Ray Dataset of the Parquet file or folder at `uri` (local or s3://, through the same pyarrow
    filesystem and S3 settings as podium's checkpoints); only `columns` are read, if given.

    With `shuffle_files_seed`, the files are read in a new order each epoch (each execution)."""
    import ray.data
    from ray.data import FileShuffleConfig

    fs, path = arrow_filesystem(uri)
    shuffle = (FileShuffleConfig(seed=shuffle_files_seed, reseed_after_execution=True)
               if shuffle_files_seed is not None else None)
    with podium_data_context():
        ds = ray.data.read_parquet(path, filesystem=fs, num_cpus=read_cpus, shuffle=shuffle)
    return ds.select_columns(columns) if columns else ds


def read_cpus(data_cpus: float) -> float:
    """CPUs one read task asks for: 1, or all of a smaller data budget (a task larger than the budget
    would never be scheduled)."""
    return min(1.0, data_cpus)


def decoded_bytes(uri: str, columns: list[str]) -> int:
    """Bytes that `columns` of the Parquet data at `uri` take decoded, from the files' footers (no rows read,
    several footers at once): rows x width for a fixed-width column, the size of its pages before
    compression for others."""
    # local: pyarrow's dataset module loads only when footers are read
    from podium.training.data import map_fragments, open_dataset

    dataset = open_dataset(uri)
    width = {name: _fixed_width(dataset.schema.field(name).type) for name in columns}

    def of_file(fragment: Any) -> int:
        meta, total = fragment.metadata, 0  # a Parquet fragment: the footer, one read
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                name = group.column(c).path_in_schema
                if name in width:
                    total += (width[name] * group.num_rows) or group.column(c).total_uncompressed_size
        return total

    return sum(map_fragments(of_file, list(dataset.get_fragments())))


def _fixed_width(t: Any) -> int:
    """Bytes per value of a fixed-width Arrow type (a boolean counts 1), 0 for others."""
    try:
        return max(1, t.bit_width // 8)
    except ValueError:  # variable width: strings, lists, ...
        return 0


def caches(cache: str, uri: str, columns: list[str], store_bytes: float | None = None) -> bool:
    """Whether the training data is kept in the object store (`cache`: never, auto or always). "auto":
    when it takes, decoded, at most CACHE_SHARE of the object store (`store_bytes`, by default this Ray
    cluster's); where either cannot be known, it is not kept (a warning says why)."""
    if cache not in CACHES:
        raise ValueError(f"training.cache = {cache!r}: expected one of {list(CACHES)}")
    if cache != "auto":
        return cache == "always"
    try:
        if store_bytes is None:
            import ray

            store_bytes = float(ray.cluster_resources().get("object_store_memory", 0.0))
        return decoded_bytes(uri, columns) <= CACHE_SHARE * store_bytes
    except Exception as exc:  # Ray not started, footers unreadable: read each epoch, as with "never"
        logger.warning("training.cache = auto: the data is read each epoch (its size or the object store's is "
                       "unknown: %s)", exc)
        return False


def builtin_datasets(loop_config: dict[str, Any], data_cpus: float) -> dict[str, ray.data.Dataset]:
    """The built-in loop's dataset: `train`, its feature and label columns, shuffled per `shuffle`.

    Data that `caches` is read once, here (`Dataset.materialize()`, as Ray Train's guides advise for data
    that fits in the object store): the epochs then read the blocks from the object store, and a `local`
    shuffle takes them in a new order each epoch. That read happens in this process, before training: a
    failure there is not one of Ray Train's worker failures (`scaling.max_failures`), and a `global`
    shuffle makes a second copy each epoch beside the cached one. Other data is read anew each epoch,
    streaming."""
    from ray.data import RandomSeedConfig

    shuffle = loop_config.get("shuffle", "local")
    if shuffle not in SHUFFLES:
        raise ValueError(f"training.shuffle = {shuffle!r}: expected one of {list(SHUFFLES)}")
    uri, seed = loop_config["train_data"], int(loop_config["seed"])
    columns = [*loop_config["feature_columns"], loop_config["label_column"]]
    if caches(loop_config.get("cache", "never"), uri, columns):
        with podium_data_context(data_cpus):
            ds = read_parquet_dataset(uri, columns, read_cpus=read_cpus(data_cpus)).materialize()
        if shuffle == "local":
            ds = ds.randomize_block_order(seed=RandomSeedConfig(seed=seed, reseed_after_execution=True))
    else:
        ds = read_parquet_dataset(uri, columns, read_cpus=read_cpus(data_cpus),
                                  shuffle_files_seed=seed if shuffle == "local" else None)
    if shuffle == "global":
        ds = ds.random_shuffle()  # no seed: a new order every epoch (every execution)
    return {TRAIN: ds}


def user_datasets(train_uri: str, val_uri: str, data_cpus: float) -> dict[str, ray.data.Dataset]:
    """Every column of `--train-data` and `--val-data` as Ray Datasets, for a user's loop that asked."""
    cpus = read_cpus(data_cpus)
    return {TRAIN: read_parquet_dataset(train_uri, read_cpus=cpus), VAL: read_parquet_dataset(val_uri, read_cpus=cpus)}


def dataset_config(data_cpus: float) -> ray.train.DataConfig:
    """Ray Train's DataConfig: every dataset split across the workers, Ray Data limited to `data_cpus`.

    The limit keeps ingest off the CPUs that validation tasks need: Ray Data only sees what Ray Train
    reserved, not podium's validations, and would otherwise take every CPU left."""
    import ray.train
    from ray.data import ExecutionOptions, ExecutionResources

    return ray.train.DataConfig(execution_options=ExecutionOptions(resource_limits=ExecutionResources(cpu=data_cpus)))


def steps_per_epoch(rows: int, world_size: int, batch_size: int) -> int:
    """Optimizer steps each worker takes per epoch. Ray Train splits with `equal=True`: every worker
    gets rows // world_size rows (the remainder, fewer than world_size rows, is left out that epoch)."""
    return -(-(rows // world_size) // batch_size)


def chunk_rows(batch_size: int, window_rows: int) -> int:
    """Rows a worker takes from Ray Data at once: a whole number of batches, at least `window_rows`.

    Taking a chunk costs ~0.4 ms here whatever its size; per 128-row batch that was +20% epoch time."""
    return batch_size * max(1, -(-window_rows // batch_size))


__all__ = ["TRAIN", "VAL", "SHUFFLES", "CACHES", "decoded_bytes", "caches", "podium_data_context",
           "read_parquet_dataset", "builtin_datasets", "user_datasets", "dataset_config", "steps_per_epoch",
           "chunk_rows", "read_cpus"]
