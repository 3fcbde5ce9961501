"""`podium approve` / `podium reject`: answer the run awaiting approval.

Imports inside functions are on purpose (start-up): a command loads only the libraries it uses; each is listed with
its measured cost in tests/unit/test_layers.py.
"""

from __future__ import annotations

import argparse
import os
import socket

from podium.cli.errors import CliError, RunFailed, ServerUnreachable
from podium.core.approval import signed_by_command
from podium.errors import NotAnswered, ServiceError
from podium.prefect_api import crash_flow_run, flow_run_parameters, paused_flow_run, resume_with_input
from podium.services import running_prefect_server
from podium.settings import PodiumSettings, current_user


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add this command's parser and handler."""
    for verb, what in (("approve", "becomes the champion"), ("reject", "is not promoted")):
        decide = sub.add_parser(verb, help=f"{verb.capitalize()} the candidate a run awaits approval for: it {what}.",
                                description=f"Answer a run waiting with promotion.approval = 'required' (its Prefect "
                                            f"flow run is paused): its candidate {what}. Who, when and why are kept "
                                            "in the serving history, the manifest and the registered version's tags.")
        decide.add_argument("--run-name", required=True, help="The run awaiting approval.")
        decide.add_argument("--reason", required=True, help="Why, in words.")
        decide.add_argument("--by", help="Who decides (default: user@host).")
        decide.set_defaults(func=lambda a, v=verb: cmd_decide(a, approve=v == "approve"))


def cmd_decide(args: argparse.Namespace, approve: bool) -> int:
    """`podium approve` / `podium reject`: answer the run awaiting approval (its flow run is paused) through the
    Prefect API: this home's server, or PREFECT_API_URL."""
    settings = PodiumSettings()
    try:
        api_url = settings.prefect_api_url or running_prefect_server(settings.home_dir)
    except ServiceError as exc:
        raise ServerUnreachable(str(exc)) from None
    if api_url is None:
        raise CliError(f"no Prefect server is running for {settings.home_dir} (and PREFECT_API_URL is not set), so no "
                       f"run there awaits approval: run `podium {'approve' if approve else 'reject'}` from the "
                       "project folder of the run, or set PREFECT_API_URL to the server it reports to")
    os.environ["PREFECT_API_URL"] = api_url  # before Prefect's client loads

    flow_run_id = paused_flow_run(args.run_name)  # NotFound: none awaits (podium.cli.errors' table says exit 2)
    verb = "approve" if approve else "reject"
    gone = _awaiting_process_gone(flow_run_id, args.run_name, settings)
    if gone:
        raise RunFailed(gone)
    by = signed_by_command(args.by or f"{current_user()}@{socket.gethostname()}", verb)
    try:
        resume_with_input(flow_run_id, {"decision": verb, "reason": args.reason, "by": by})
    except NotAnswered as exc:  # the run's name with it: Prefect's sentence names a flow run id
        raise CliError(f"run {args.run_name!r} could not be answered: {exc}") from None
    print(f"run {args.run_name}: {verb.rstrip('e')}ed by {by}: {args.reason}; the run goes on (flow run {flow_run_id})")
    return 0


def _awaiting_process_gone(flow_run_id: str, run_name: str, settings: PodiumSettings) -> str | None:
    """Why the paused flow run of `run_name` can no longer act on a decision (the command that awaits it is gone:
    killed, or its machine restarted), after withdrawing its candidate and ending the flow run Crashed; None when
    its process still runs, or runs on another host (which this one cannot see)."""
    from podium.serving.staged import staged_versions
    from podium.tasks.promote import finish_cut_short, promotion_lock

    parameters = flow_run_parameters(flow_run_id)
    config = parameters.get("config") or {}
    serving = config.get("serving")
    promotion = config.get("promotion") or {}
    if not serving:
        return None
    mine = [s for s in staged_versions(serving) if s.mark.get("run_name") == run_name]
    if any(s.alive is not False for s in mine):
        return None
    tracking_uri = parameters.get("tracking_uri") or settings.resolved_tracking_uri()
    name = promotion.get("registered_model") or config.get("model") or "podium"
    alias = promotion.get("alias") or "champion"
    with promotion_lock(serving):
        withdrawn = finish_cut_short(serving, tracking_uri, name, alias, claim=False, alias_too=False)
    what = f"its candidate {', '.join(withdrawn)} was withdrawn" if withdrawn else "no candidate of it is staged"
    message = (f"run {run_name!r} awaits approval in Prefect, but the command that waits for it is gone (killed, or "
               f"its machine restarted): {what}, nothing was promoted; `podium promote --run-name {run_name}` asks "
               "again")
    crash_flow_run(flow_run_id, message)
    return message
