"""`podium k8s`: podium's jobs on Kubernetes.

    podium k8s render --config podium.toml [--cluster cluster.toml] [--out k8s/]
    podium k8s submit --manifest /etc/podium/rayjob.json --config /etc/podium/podium.json [--namespace podium]
    podium k8s watch podium-fraud-nightly-20260101-0200 --config podium.toml [--namespace podium] [--api-url URL]
    podium k8s ray-head


`render` writes the manifests (podium.deployments.k8s): with --out, one file each (the YAML resources, and the
Prefect work pool's base job template in prefect/work-pool.json, a folder `kubectl apply -f` does not read);
without, the Kubernetes resources as one YAML stream on stdout, for `kubectl apply -f -`. A config the pods
could not run with is refused before anything is written.

`submit` is the nightly CronJob's command: it makes tonight's RayJob of the rendered one (its name the template's
generateName with the date and minute), follows it as `watch` does, and deletes the finished nights beyond --keep.

`watch` follows a RayJob until it is over, records its end as the state of the nightly's Prefect flow run (on
PREFECT_API_URL; the run named by --config or --run-name), and exits with the code `podium run` would have (0 done,
1 failed or timed out, 2 refused by KubeRay's validation, 3 the cluster's head lost or the RayJob deleted before its
end, 143 stopped).

`ray-head` is the command of the rendered RayJob's head container, not one to type: it runs the `ray start` KubeRay
generated (KUBERAY_GEN_RAY_START_CMD) and, when the pod is stopped (SIGTERM), stops the night's running jobs first,
so that `podium run` gets the SIGTERM and ends the night as podium's stop does, then Ray (podium.deployments.k8s_node).
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from podium import prefect_api
from podium.cli import signals
from podium.cli.errors import CliError
from podium.config import load_config, load_table_file
from podium.core.rayjob import RayJobOutcome, observe_rayjob
from podium.deployments.k8s_node import run_head
from podium.deployments.k8s_watch import (
    KubernetesApiError,
    Recorded,
    create_rayjob,
    in_cluster_api,
    night_name,
    prune_rayjobs,
    read_rayjob,
    record_rayjob_end,
    watch_rayjob,
)
from podium.errors import ConfigError
from podium.settings import PodiumSettings


def add_k8s_parser(sub: Any) -> None:
    """`podium k8s render`, `submit`, `watch` and `ray-head`."""
    k8s = sub.add_parser("k8s", help="Kubernetes manifests of podium's jobs (KubeRay, Prefect), and a RayJob's end.",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = k8s.add_subparsers(dest="k8s_command", required=True)
    render = verbs.add_parser("render", help="Write the manifests of a podium config.")
    render.add_argument("--config", help="TOML or JSON podium config (as for `podium run`).")
    render.add_argument("--cluster", help="TOML or JSON cluster settings: image, namespace, servers, Secrets "
                                          "(see the Production profile page; default: every default).")
    render.add_argument("--image", help="podium's image in a registry, best by digest: registry/repository@sha256:"
                                        "<digest> (overrides the cluster settings').")
    render.add_argument("--namespace", help="Namespace of every resource (overrides the cluster settings').")
    render.add_argument("--out", help="Folder to write one file per manifest to (default: the YAML on stdout).")
    render.set_defaults(func=cmd_render)
    submit = verbs.add_parser("submit", help="Make tonight's RayJob of the rendered one, follow it to its end, "
                                             "prune old nights; exit with podium's code for it.")
    submit.add_argument("--manifest", required=True, help="The RayJob to make (the ConfigMap's rayjob.json).")
    submit.add_argument("--keep", type=int, default=7, help="Finished nights kept (default: %(default)s).")
    watch = verbs.add_parser("watch", help="Follow a RayJob to its end; exit with podium's code for it.")
    watch.add_argument("name", help="The RayJob's name (a night's: podium-<model>-nightly-<date>-<time>).")
    for verb in (submit, watch):
        verb.add_argument("--namespace", default="podium", help="Its namespace (default: %(default)s).")
        verb.add_argument("--api-url", help="Kubernetes API (default: the pod's service account's, else kubectl "
                                            "proxy's http://127.0.0.1:8001).")
        verb.add_argument("--poll-s", type=float, default=10.0, help="Seconds between reads (default: %(default)s).")
        named = verb.add_mutually_exclusive_group()
        named.add_argument("--config", help="The podium config the manifests were rendered from (or the "
                                            "ConfigMap's podium.json): its nightly run's flow run gets the RayJob's end.")
        named.add_argument("--run-name", help="The RayJob's run name instead (as the ConfigMap has it: "
                                              "nightly-{date}).")
    submit.set_defaults(func=cmd_submit)
    watch.set_defaults(func=cmd_watch)
    head = verbs.add_parser("ray-head", help="The RayJob head container's command: KubeRay's `ray start`, and a pod's "
                                             "stop passed to the night's jobs before Ray stops.")
    head.set_defaults(func=cmd_ray_head)


def to_yaml(docs: list[dict[str, Any]]) -> str:
    """Kubernetes resources as a YAML stream; text of several lines (the ConfigMap's config) as a literal block."""
    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    return yaml.dump_all(docs, Dumper=Dumper, sort_keys=False)


def cmd_render(args: argparse.Namespace) -> int:
    """Render the manifests; refuse (exit 2) a config or cluster settings the pods could not run with."""
    from podium.deployments.k8s import home_of, load_cluster_settings, render

    try:
        table = load_table_file(args.cluster, "--cluster") if args.cluster else {}
        table.update({k: v for k, v in (("image", args.image), ("namespace", args.namespace)) if v})
        cluster = load_cluster_settings(table)
        # the config's default locations are filled from the pods' home (on the shared volume), not this machine's
        config = load_config(args.config, {}, PodiumSettings(home=Path(home_of(cluster))))
        manifests = render(config, cluster)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if not args.out:
        # the stream for `kubectl apply -f -`: what a folder of its own holds (the on-demand RayJob) is not in it
        resources = [doc for name, docs in manifests.items() if isinstance(docs, list) and "/" not in name
                     for doc in docs]
        print(to_yaml(resources), end="")
        return 0
    os.makedirs(args.out, exist_ok=True)
    for name, body in manifests.items():
        path = Path(args.out) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = to_yaml(body) if isinstance(body, list) else json.dumps(body, indent=2) + "\n"
        path.write_text(text)
        print(path)
    return 0


def nightly_run_name(args: argparse.Namespace) -> str | None:
    """The run name of the RayJob's `podium run` ({date} unfilled), from --run-name or --config; None: neither."""
    from podium.deployments.k8s import home_of, load_cluster_settings, nightly_config

    if args.run_name:
        return str(args.run_name)
    if not args.config:
        return None
    try:
        home = Path(home_of(load_cluster_settings({})))
        return nightly_config(load_config(args.config, {}, PodiumSettings(home=home))).run_name
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def api_of(args: argparse.Namespace) -> tuple[str, str | None, Any]:
    """(API URL, token, TLS context): the pod's service account's, or --api-url's."""
    api_url, token, context = in_cluster_api()
    if args.api_url:
        api_url, context = args.api_url, None
    return api_url, token, context


def cmd_submit(args: argparse.Namespace) -> int:
    """Make tonight's RayJob (or find it, made by this night's earlier try), follow it, record its end, prune the
    finished nights beyond --keep; exit with the end's code."""
    if args.keep < 1:
        raise CliError(f"--keep {args.keep}: expected at least 1 (the night just ended is kept)")
    try:
        template = json.loads(Path(args.manifest).read_text())
    except (OSError, ValueError) as exc:
        raise CliError(f"--manifest {args.manifest}: expected the rendered RayJob as JSON ({exc})") from None
    if template.get("kind") != "RayJob":
        raise CliError(f"--manifest {args.manifest} holds a {template.get('kind')!r}: expected the rendered RayJob")
    signals.stop_before_the_run()  # a pod's stop (SIGTERM) ends the command, 143; the RayJob goes on
    api_url, token, context = api_of(args)
    args.name = night_name(template, datetime.now(timezone.utc))
    try:
        made = create_rayjob(api_url, args.namespace, template, args.name, token, context)
    except KubernetesApiError as exc:
        raise CliError(str(exc)) from None
    print(f"{args.namespace}/{args.name}: {'made' if made else 'made already, followed'}", flush=True)
    code = cmd_watch(args)
    prefix = str(template["metadata"]["generateName"])
    try:
        pruned = prune_rayjobs(api_url, args.namespace, prefix, args.keep, token, context)
    except KubernetesApiError as exc:
        print(f"{args.namespace}/{args.name}: old nights not pruned: {exc}", flush=True)
    else:
        if pruned:
            print(f"{args.namespace}/{args.name}: pruned {', '.join(pruned)}", flush=True)
    return code


def cmd_watch(args: argparse.Namespace) -> int:
    """Follow a RayJob; print each change of its state in podium's terms; record its end on the nightly's flow
    run; exit with the final outcome's code."""
    prefect_api.bound_client_settings(os.environ)  # before Prefect is imported
    # a SIGTERM (the pod's stop) or Ctrl-C ends the watch at once, 143 / 130, with nothing recorded: the RayJob goes
    # on, and a watch started again follows it to its end
    signals.stop_before_the_run()
    run_name = nightly_run_name(args)  # a config that does not load is refused before the watch
    api_url, token, context = api_of(args)
    rayjob = f"{args.namespace}/{args.name}"
    say = lambda o: print(f"{rayjob}: {o.prefect_state_name} ({o.phase}): {o.reason}", flush=True)
    last: list[dict[str, Any] | None] = [None]

    def read() -> dict[str, Any] | None:
        resource = read_rayjob(api_url, args.namespace, args.name, token, context)
        if resource is not None:
            last[0] = resource
        return resource

    try:
        # the final outcome is said once recorded: the flow run's own end may change it (a RayJob cleaned up)
        outcome = watch_rayjob(read, poll_s=args.poll_s, on_change=lambda o: None if o.final else say(o))
    except KubernetesApiError as exc:
        raise CliError(str(exc)) from None
    recorded = record_end(outcome, rayjob, run_name, observe_rayjob(last[0]).start_time)
    say(recorded.outcome)
    print(f"{rayjob}: {recorded.line}", flush=True)
    assert recorded.outcome.exit_code is not None  # a final outcome has one
    return recorded.outcome.exit_code


def record_end(outcome: RayJobOutcome, rayjob: str, run_name: str | None, started: datetime | None) -> Recorded:
    """The RayJob's end recorded on its flow run where podium knows the run and the Prefect server."""
    if run_name is None:
        return Recorded(outcome, "not recorded in Prefect: give --config (or --run-name) to name the run")
    if prefect_api.link().api_url is None:
        return Recorded(outcome, "not recorded in Prefect: PREFECT_API_URL is not set")
    return record_rayjob_end(outcome, rayjob, run_name, started)


def cmd_ray_head(args: argparse.Namespace) -> int:
    """Run the RayJob's Ray head; on SIGTERM stop its jobs (their drivers get SIGTERM), then Ray; exit 143."""
    return run_head()
