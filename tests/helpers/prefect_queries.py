"""Reading back what a flow left on the Prefect server (records arrive through batching services)."""

from __future__ import annotations

import time

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter


def flow_run_id(name: str):
    with get_client(sync_client=True) as c:
        runs = c.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
    assert len(runs) == 1, f"expected one flow run named {name!r}, found {len(runs)}"
    return runs[0].id


def task_runs(flow_run_name: str | None, expect_at_least: int, timeout: float = 30.0, run_id=None) -> list:
    """Task runs of the flow run named `flow_run_name` (or with id `run_id`), waiting until at least
    `expect_at_least` are visible and all are final."""
    fid = run_id or flow_run_id(str(flow_run_name))
    deadline = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as c:
            runs, offset = [], 0
            while True:
                page = c.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [fid]}), limit=200, offset=offset)
                runs += page
                offset += len(page)
                if len(page) < 200:
                    break
        if (len(runs) >= expect_at_least and all(r.state and r.state.is_final() for r in runs)) \
                or time.monotonic() > deadline:
            return runs
        time.sleep(0.5)


def checkpoint_events(run_name: str, expect: int, timeout: float = 120.0) -> list:
    """podium.checkpoint.persisted events of a run."""
    deadline = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as c:
            page = c.read_events(filter=EventFilter(
                event=EventNameFilter(name=["podium.checkpoint.persisted"]),
                resource=EventResourceFilter(id_prefix=[f"podium.checkpoint.{run_name}."])), limit=50)
        events = list(page.events)
        if len(events) >= expect or time.monotonic() > deadline:
            return events
        time.sleep(0.5)


def artifact_keys(flow_run_name: str | None, run_id=None) -> set[str]:
    """The artifact keys of the flow run named `flow_run_name` (or with id `run_id`)."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    fid = run_id or flow_run_id(str(flow_run_name))
    with get_client(sync_client=True) as c:
        arts = c.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[fid])))
    return {a.key for a in arts if a.key}


def flow_run_state(name: str | None = None, timeout: float = 120.0, run_id: str | None = None):
    """The final state of the flow run named `name`, or of the one with id `run_id` (waiting for it to be final)."""
    fid = run_id or flow_run_id(str(name))
    deadline = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as c:
            state = c.read_flow_run(fid).state
        if (state and state.is_final()) or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def flow_run_logs(flow_run_id, *, until: tuple[str, ...] = (), timeout_s: float = 60) -> list[str]:
    """The messages of a flow run's log in Prefect, oldest first (the API pages them 200 at a time).

    A flow run's state is final before its process has shipped its last log lines (they go in batches, the
    last at the process's exit): with `until`, read again until every one of those texts is in the log, or
    `timeout_s` has passed (then return what there is, for the caller's assertion to show)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    def read_all(c) -> list[str]:
        messages: list[str] = []
        while True:
            page = c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                               limit=200, offset=len(messages))
            messages += [entry.message for entry in page]
            if len(page) < 200:
                return messages

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as c:
        while True:
            messages = read_all(c)
            text = "\n".join(messages)
            if all(u in text for u in until) or time.monotonic() > deadline:
                return messages
            time.sleep(0.5)
