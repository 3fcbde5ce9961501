"""`podium k8s`: podium's jobs on Kubernetes.

    podium k8s render --config podium.toml [--cluster cluster.toml] [--out k8s/]
    podium k8s watch podium-nightly [--namespace podium] [--api-url URL]

`render` writes the manifests (podium.deployments.k8s): with --out, one file each (the YAML resources, and the
Prefect work pool's base job template in prefect/work-pool.json, a folder `kubectl apply -f` does not read);
without, the Kubernetes resources as one YAML stream on stdout, for `kubectl apply -f -`. A config the pods
could not run with is refused before anything is written.

`watch` follows a RayJob until it is over and exits with the code `podium run` would have (0 done, 1 failed or
timed out, 3 the cluster's head lost or the RayJob deleted before its end, 143 stopped).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import yaml

from podium.cli.errors import CliError
from podium.config import load_config, load_table_file
from podium.deployments.k8s_watch import KubernetesApiError, in_cluster_api, read_rayjob, watch_rayjob
from podium.errors import ConfigError
from podium.settings import PodiumSettings


def add_k8s_parser(sub: Any) -> None:
    """`podium k8s render` and `podium k8s watch`."""
    k8s = sub.add_parser("k8s", help="Kubernetes manifests of podium's jobs (KubeRay, Prefect), and a RayJob's end.",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = k8s.add_subparsers(dest="k8s_command", required=True)
    render = verbs.add_parser("render", help="Write the manifests of a podium config.")
    render.add_argument("--config", help="TOML or JSON podium config (as for `podium run`).")
    render.add_argument("--cluster", help="TOML or JSON cluster settings: image, namespace, servers, Secrets "
                                          "(see the Production profile page; default: every default).")
    render.add_argument("--image", help="Image with podium installed (overrides the cluster settings').")
    render.add_argument("--namespace", help="Namespace of every resource (overrides the cluster settings').")
    render.add_argument("--out", help="Folder to write one file per manifest to (default: the YAML on stdout).")
    render.set_defaults(func=cmd_render)
    watch = verbs.add_parser("watch", help="Follow a RayJob to its end; exit with podium's code for it.")
    watch.add_argument("name", help="The RayJob's name (podium-nightly for the rendered one).")
    watch.add_argument("--namespace", default="podium", help="Its namespace (default: %(default)s).")
    watch.add_argument("--api-url", help="Kubernetes API (default: the pod's service account's, else kubectl "
                                         "proxy's http://127.0.0.1:8001).")
    watch.add_argument("--poll-s", type=float, default=10.0, help="Seconds between reads (default: %(default)s).")
    watch.set_defaults(func=cmd_watch)


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
        resources = [doc for name, docs in manifests.items() if isinstance(docs, list) for doc in docs]
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


def cmd_watch(args: argparse.Namespace) -> int:
    """Follow a RayJob; print each change of its state in podium's terms; exit with the final outcome's code."""
    api_url, token, context = in_cluster_api()
    if args.api_url:
        api_url, context = args.api_url, None
    say = lambda o: print(f"{args.namespace}/{args.name}: {o.prefect_state_name} ({o.phase}): {o.reason}",
                          flush=True)
    try:
        outcome = watch_rayjob(lambda: read_rayjob(api_url, args.namespace, args.name, token, context),
                               poll_s=args.poll_s, on_change=say)
    except KubernetesApiError as exc:
        raise CliError(str(exc)) from None
    assert outcome.exit_code is not None  # a final outcome has one
    return outcome.exit_code
