"""The MLflow client podium uses: retry settings, outages named, where a run is recorded.

Workers use `MlflowClient` with explicit ids only: the fluent API would silently create runs.

A tracking server that stops answering is ridden out by MLflow's own HTTP retries, with
podium's settings (`HTTP_RETRY_DEFAULTS`); a call that still fails raises
`TrackingUnavailable`, which names the server and what was being recorded.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from podium.errors import TrackingUnavailable
from podium.outages import is_unreachable

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

# MLflow's import takes about a second: this package loads it when it first talks to a store, so that a
# run can start training first and open its MLflow run while training goes on (podium.flows.pipeline)

TAG_RUN = "podium.run_name"


TAG_CHECKPOINT = "podium.checkpoint"


TAG_URI = "podium.checkpoint_uri"


TAG_STEP = "podium.step"


TAG_STATUS = "podium.status"


TAG_FAILURE = "podium.failure"
TAG_NOTE = "podium.note"


TAG_VALIDATED_AT = "podium.validated_at"


TAG_SERVED_URI = "podium.served_uri"


# podium's own copy of a checkpoint's metrics, JSON with NaN and infinities kept: MLflow's SQL stores
# read a LoggedModel's NaN metric back as 0.0 and an infinite one as +-1.8e308, so podium decides from this
TAG_METRICS = "podium.metrics"


TAG_WITHDRAWN = "podium.withdrawn"  # on a LoggedModel and a model version: why it was rolled back


# a run's params cannot change (MLflow refuses): a resumed run's effective value of a changed setting
# is the run tag `podium.config.<param>`
TAG_CONFIG_PREFIX = "podium.config."


# the run's outcome, for the runs table: "promoted step 376 as v000001" or "not promoted: ..."
TAG_OUTCOME = "podium.outcome"


TAG_REASON = "podium.promotion_reason"


TAG_FLOW_RUN = "podium.prefect_flow_run_id"


# on a LoggedModel whose checkpoint files were deleted from storage (checkpoints.keep): why; record and verdict stay
TAG_DELETED = "podium.deleted"


# a run whose training podium stopped early: "step 12: 3 validation(s) in a row ... did not improve ..."
TAG_STOPPED_EARLY = "podium.stopped_early"


# MLflow 3 opens an experiment in its GenAI (traces) views unless it says it is model training
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


# A runs-table view of the experiment (MLflow's shared views: the state lives in an experiment tag,
# the link names it): the outcome of each run as a column, next to its logged models
RUNS_VIEW = "podium"
RUNS_VIEW_TAG = f"mlflow.sharedViewState.{RUNS_VIEW}"
RUNS_VIEW_STATE = {"selectedColumns": ["attributes.`Models`", f"tags.`{TAG_OUTCOME}`"],
                   # the outcome right after the pinned name and date, wide enough to read whole
                   "columnOrder": [f"tags.`{TAG_OUTCOME}`"], "columnWidths": {f"tags.`{TAG_OUTCOME}`": 560},
                   "orderByKey": "attributes.start_time", "orderByAsc": False}


# the experiment and run pages of the MLflow UI show a global mode (GenAI or model training) that
# the URL's workflowType parameter sets (in MLflow 3.17 it wins over the experiment's kind)
_ML_VIEW = "?workflowType=machine_learning"


MAX_TAG = 4000


# MLflow's HTTP client retries refused connections, timeouts and 5xx answers, waiting
# factor * 2**(k-1) s before the k-th retry (none before the first), each attempt limited to
# the timeout. MLflow's defaults (7 retries, factor 2, 120 s) keep one write waiting over 4
# minutes on a server that refuses connections and about 20 minutes on one that hangs.
# podium's: attempts at 0, 0, 4, 12, 28 and 60 s (plus up to 1 s of jitter per wait), so a
# restart or network blip of up to about a minute is ridden out by every write, and a server
# that stays down fails the write after about 1 minute (connections refused) or 3 minutes
# (connections accepted but never answered: 6 attempts x 20 s + the waits). 20 s per attempt
# is far above what podium's small requests take, and a hang shorter than that costs no
# retry at all. Variables already set in the environment win.
HTTP_RETRY_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "5",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "2",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}


def apply_http_retry_defaults() -> None:
    """Set podium's MLflow HTTP retry settings in this process, unless the environment has its own.

    MLflow reads them on every request, so this takes effect for clients already made."""
    for name, value in HTTP_RETRY_DEFAULTS.items():
        os.environ.setdefault(name, value)




_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")



def _short_reason(exc: BaseException) -> str:
    """The cause at the bottom of MLflow's nested transport error, in a few words."""
    text = str(getattr(exc, "message", exc))
    if m := _ERRNO.search(text):
        return m.group(1).strip()  # "Connection refused", "Name or service not known"
    if m := re.search(r"read timeout=([\d.]+)", text):
        return f"no answer within {m.group(1)} s"
    if m := re.search(r"too many (\d+) error responses", text):
        return f"answered {m.group(1)} every time"
    return text[:200]


@contextlib.contextmanager
def reaching_tracking(tracking_uri: str, action: str) -> Iterator[None]:
    """Turn a tracking server that could not be reached into `TrackingUnavailable`, naming it."""
    start = time.monotonic()
    try:
        yield
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        raise TrackingUnavailable(tracking_uri, action, _short_reason(exc), time.monotonic() - start) from exc


_F = TypeVar("_F", bound=Callable[..., Any])


def answer_cut_short(exc: BaseException) -> bool:
    """An answer whose body stopped coming: a read timeout while it was read (a server that froze mid-answer), or
    the connection closed before its Content-Length was read ("Connection broken: IncompleteRead": a server, or
    its worker, that ended mid-answer, as a gunicorn worker does when it is killed after a freeze). `requests`
    reads the body after urllib3's Retry has handed the response back, so MLflow's HTTP retries never see
    either. A failure urllib3 itself retried until it gave up says "Max retries exceeded" instead."""
    text = str(getattr(exc, "message", exc))
    return (is_unreachable(exc) and ("Read timed out" in text or "Connection broken" in text)
            and "Max retries exceeded" not in text)


def _retry_schedule() -> list[float]:
    """The waits before each retry of a call whose answer was cut short: MLflow's own schedule
    (MLFLOW_HTTP_REQUEST_MAX_RETRIES retries, the k-th after BACKOFF_FACTOR × 2^(k-1) s)."""
    retries = int(os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES", HTTP_RETRY_DEFAULTS["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]))
    factor = int(os.environ.get("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
                                  HTTP_RETRY_DEFAULTS["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"]))
    return [factor * 2 ** k for k in range(max(retries, 0))]


def tracking_call(action: str) -> Callable[[_F], _F]:
    """Decorate a function whose first argument is a TrackingRun or a tracking URI (see reaching_tracking).

    The function is called again, on MLflow's retry schedule, when an answer was cut short mid-body (which
    MLflow's own retries do not cover): podium's tracking functions are idempotent (a resumed run calls them
    again too)."""
    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def call(target: Any, *args: Any, **kwargs: Any) -> Any:
            uri = target.tracking_uri if isinstance(target, TrackingRun) else str(target)
            with reaching_tracking(uri, action):
                waits: list[float] | None = None  # read on the first answer cut short
                while True:
                    try:
                        return fn(target, *args, **kwargs)
                    except Exception as exc:
                        if not answer_cut_short(exc):
                            raise
                        waits = _retry_schedule() if waits is None else waits
                        if not waits:
                            raise
                        time.sleep(waits.pop(0))
        return call  # type: ignore[return-value]
    return wrap


def tracking_client(tracking_uri: str) -> MlflowClient:
    """An MlflowClient for this tracking URI (and the same registry), with podium's retry settings."""
    from mlflow.tracking import MlflowClient

    apply_http_retry_defaults()
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


@dataclass(frozen=True)
class TrackingRun:
    """Where a podium run is recorded: passed between tasks instead of a client."""

    tracking_uri: str
    experiment_id: str
    run_id: str
    run_name: str

    def client(self) -> MlflowClient:
        """A client bound to this tracking URI (and the same registry)."""
        return tracking_client(self.tracking_uri)

    def run_url(self, ui: str) -> str:
        """Link to the run in an MLflow UI at base URL `ui`."""
        return f"{ui.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}{_ML_VIEW}"

    def models_url(self, ui: str) -> str:
        """Link to the experiment's models: one LoggedModel per checkpoint."""
        return f"{ui.rstrip('/')}/#/experiments/{self.experiment_id}/models{_ML_VIEW}"

    def logged_model_url(self, ui: str, model_id: str) -> str:
        """Link to one checkpoint's LoggedModel: its metrics, params and status."""
        return f"{ui.rstrip('/')}/#/experiments/{self.experiment_id}/models/{quote(model_id)}{_ML_VIEW}"

    def chart_url(self, ui: str, metric: str) -> str:
        """Link to the run's chart of `metric` per checkpoint (an artifact): every value, the champion marked."""
        return (f"{ui.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}/artifacts/podium/"
                f"{quote(metric)}_per_checkpoint.png{_ML_VIEW}")

    def registry_url(self, ui: str, registered_model: str) -> str:
        """Link to a registered model: its versions, and which one the alias names."""
        return f"{ui.rstrip('/')}/#/models/{quote(registered_model)}{_ML_VIEW}"

    def experiment_url(self, ui: str) -> str:
        """Link to the experiment's runs, in the model-training view, each with its outcome (RUNS_VIEW)."""
        return (f"{ui.rstrip('/')}/#/experiments/{self.experiment_id}/runs{_ML_VIEW}"
                f"&viewStateShareKey={RUNS_VIEW}")


def store_exists(tracking_uri: str) -> bool:
    """Whether the tracking store is there to read: a SQLite file or a local folder that exists; a server
    is assumed to be. A read-only command checks this first: MLflow's client creates a missing store."""
    if tracking_uri.startswith("sqlite:///"):
        return os.path.exists(tracking_uri.removeprefix("sqlite:///"))
    if tracking_uri.startswith("file://") or "://" not in tracking_uri:
        return os.path.exists(tracking_uri.removeprefix("file://"))
    return True


def resolve_tracking_uri(tracking_uri: str | None) -> str:
    """The given tracking URI, else MLFLOW_TRACKING_URI, else podium's embedded SQLite store."""
    # local: pydantic-settings reads the environment only when no URI is given
    from podium.settings import PodiumSettings

    return tracking_uri or PodiumSettings().resolved_tracking_uri()
