"""`podium lineage` and what `podium status` says about data and origins: lineage, both ways; and what the
commands that read a serving location say where nothing was promoted there (`nothing_promoted`).

- From a serving version (`podium lineage v000002`): its checkpoint, MLflow run and LoggedModel, the
  Prefect flow run, deployment and schedule, the code version, the datasets (by digest), and the numbers
  its promotion compared: all from its manifest.
- From a dataset digest (`podium lineage 3f2a91c0`, 8 characters or more): every MLflow run that used it
  (training, validation, or evaluation: a champion re-scored on it) and every champion of the serving
  location trained or validated on it.

Reads only: MLflow (run search) and the serving location (history and manifests).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from typing import Any

from podium.cli.errors import CliError
from podium.cli.options import config_default, option_help
from podium.cli.output import approval_text
from podium.config import default_serving
from podium.core.comparison import comparison_from_dict
from podium.core.numbers import format_number
from podium.core.policy import check_from_dict
from podium.serving.history import lineage_of, parse_switch
from podium.settings import PodiumSettings
from podium.tracking.client import TAG_REASON, store_exists

# Imports inside functions are on purpose (start-up): `podium lineage --help` answers at once.

DIGEST_RE = re.compile(r"^[0-9a-f]{8,64}$")


def version_lines(version: str, manifest: dict[str, Any], current: bool) -> list[str]:
    """A serving version's lineage in words, from its manifest."""
    lin = manifest.get("lineage") or {}
    ml, tags = lin.get("mlflow") or {}, lin.get("tags") or {}
    lines = [f"{version}{' (current)' if current else ''}: step {manifest.get('step')} of run {manifest.get('run_name')}, "
             f"{manifest.get('metric')} = {format_number(manifest.get('value'))}",
             f"  checkpoint: {manifest.get('source')}",
             f"  MLflow:     run {manifest.get('mlflow_run_id')}, LoggedModel {manifest.get('model_id')}"
             + (f", experiment {ml['experiment_id']} at {ml.get('tracking_uri')}" if ml.get("experiment_id") else "")]
    if tags.get("podium.prefect.flow_run_id"):
        lines.append(f"  Prefect:    flow run {tags.get('podium.prefect.flow_run_name')} "
                     f"({tags['podium.prefect.flow_run_id']}) {tags.get('podium.prefect.flow_run_url', '')}".rstrip())
    if tags.get("podium.prefect.deployment"):
        lines.append(f"              deployment {tags['podium.prefect.deployment']}, started by "
                     f"{tags.get('podium.prefect.started_by', '?')}"
                     + (f", schedule {tags['podium.prefect.schedule']}" if tags.get("podium.prefect.schedule") else ""))
    if tags.get("mlflow.source.git.commit"):
        lines.append(f"  code:       {tags.get('podium.code.package')} at git commit {tags['mlflow.source.git.commit']}"
                     + (" (uncommitted changes)" if tags.get("podium.code.git_dirty") == "true" else ""))
    for role, d in (manifest.get("datasets") or {}).items():
        lines.append(f"  {role + ' data:':<11} {d.get('uri', '?')} digest {d.get('digest')}"
                     + (f" ({d['rows']} rows)" if "rows" in d else ""))
    if manifest.get("comparison"):
        lines.append("  promoted:   " + comparison_from_dict(manifest["comparison"]).describe())
    if manifest.get("checks"):
        lines.append("  checks:     " + "; ".join(check_from_dict(c).describe() for c in manifest["checks"]))
    if manifest.get("approval"):
        lines.append("  approval:   " + approval_text(manifest["approval"]))
    if not lin and not manifest.get("datasets"):
        lines.append("  (promoted before podium recorded lineage: only the run and checkpoint are known)")
    return lines


def champions(serving: str) -> list[tuple[str, dict[str, Any], bool]]:
    """Every version promoted at the serving location, oldest first: (version, manifest, is current)."""
    from podium.serving import layout

    current = (layout.read_pointer(serving) or {}).get("version")
    out = []
    for name in lineage_of(parse_switch(doc) for doc in layout.read_history(serving)).champions:
        version = layout.read_version(serving, name)
        if version is not None:
            out.append((name, version.manifest, name == current))
    return out


def digest_report(tracking_uri: str, serving: str, digest: str) -> dict[str, Any]:
    """Runs and champions that used the dataset whose digest starts with `digest`."""
    from podium.tracking.datasets import runs_using

    runs = runs_using(tracking_uri, digest)
    used = []
    for name, manifest, current in champions(serving):
        comparison = manifest.get("comparison") or {}
        roles = [role for role, d in (manifest.get("datasets") or {}).items() if str(d.get("digest", "")).startswith(digest)]
        if roles:
            used.append({"version": name, "current": current, "roles": roles, "run_name": manifest.get("run_name"),
                         "metric": manifest.get("metric"), "value": manifest.get("value"),
                         "compared_with": (comparison.get("champion") or {}).get("who")})
    return {"digest": digest, "runs": runs, "champions": used, "serving": serving}


def digest_lines(report: dict[str, Any]) -> list[str]:
    """`digest_report` in words."""
    lines = [f"dataset digest {report['digest']}:", "  runs that used it:" if report["runs"] else "  no MLflow run used it"]
    for r in report["runs"]:
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime((r["start_time"] or 0) / 1000))
        roles = ", ".join(f"{u['context']} ({u['name']}, {u['digest']})" for u in r["uses"])
        extra = f": re-scored {r['rescore_of']} {r['metrics']}" if r["rescore_of"] else ""
        lines.append(f"    {r['run_name']:<28} {roles}{extra}  [run {r['run_id']}, {r['experiment']}, {when} UTC]")
    lines.append(f"  champions at {report['serving']} trained or validated on it:" if report["champions"]
                 else f"  no champion at {report['serving']} was trained or validated on it")
    for c in report["champions"]:
        lines.append(f"    {c['version']}{' (current)' if c['current'] else ''}: {' and '.join(c['roles'])} data of run "
                     f"{c['run_name']}, {c['metric']} = {c['value']}"
                     + (f" (compared with {c['compared_with']} on it)" if c["compared_with"] else ""))
    return lines


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add this command's parser and handler."""
    lineage = sub.add_parser("lineage", help="Where a served version came from, or which runs and champions used a "
                                             "dataset (by digest).",
                             description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lineage.add_argument("what", help="A serving version (v000002) or a dataset digest (its first 8+ characters).")
    lineage.add_argument("--serving", help="Serving location (default: .podium/serving/<model>).")
    lineage.add_argument("--model", default=config_default("model"),
                         help=option_help("model", "The model whose serving location to read."))
    lineage.add_argument("--json", action="store_true", help="Print the answer as JSON.")
    lineage.set_defaults(func=cmd_lineage)


def cmd_lineage(args: argparse.Namespace) -> int:
    """`podium lineage vN | DIGEST`: where a served model came from, or who used a dataset."""
    from podium.serving.layout import VERSION_RE, read_pointer, read_version

    settings = PodiumSettings()
    serving = serving_location(args, settings)
    what = args.what.strip().lower()
    if VERSION_RE.match(what):
        version = read_version(serving, what)
        if version is None and read_pointer(serving) is None:
            raise CliError(nothing_promoted(serving, args, settings, f"so no version {what} there"))
        if version is None:
            raise CliError(f"{serving}: version {what!r} does not exist or is incomplete")
        current = (read_pointer(serving) or {}).get("version") == what
        if args.json:
            print(json.dumps({"version": what, "current": current, **version.manifest}))
        else:
            print("\n".join(version_lines(what, version.manifest, current)))
        return 0
    if not DIGEST_RE.match(what):
        raise CliError(f"lineage {args.what!r}: expected a serving version like 'v000002' or a dataset digest "
                       "(8 to 64 hexadecimal characters)")

    tracking_uri = settings.resolved_tracking_uri()
    if not store_exists(tracking_uri):  # MLflow's client would create an empty store: a read must not
        raise CliError(f"no MLflow store at {tracking_uri}: no run here used a dataset (podium's home is "
                       f"{settings.home_dir}: run podium from the project folder, set PODIUM_HOME to its .podium "
                       "folder, or MLFLOW_TRACKING_URI to read another store)")
    report = digest_report(tracking_uri, serving, what)
    print(json.dumps(report) if args.json else "\n".join(digest_lines(report)))
    return 0


def serving_location(args: argparse.Namespace, settings: PodiumSettings) -> str:
    """The serving location a reading command (`history`, `lineage`, `rollback`) is about: --serving, else the
    model's under podium's home; refused (StorageError) where a file stands where its folder would be."""
    from podium.storage.preflight import check_folder

    serving = args.serving or default_serving(settings, getattr(args, "model", None))
    check_folder(serving, "--serving" if args.serving else "the serving location")
    return serving


def location_exists(serving: str) -> bool:
    """Whether the serving location is there at all (a folder, or objects under its prefix); True when the store
    cannot tell (a read of it then says what is wrong)."""
    from podium.storage.locations import fsspec_filesystem, normalize_location

    try:
        fs, root = fsspec_filesystem(normalize_location(serving))
        return bool(fs.exists(root))
    except (OSError, ValueError, ImportError):
        return True


def nothing_promoted(serving: str, args: argparse.Namespace, settings: PodiumSettings, then: str = "") -> str:
    """The sentence for a serving location where nothing was promoted, read by `history`, `lineage` or `rollback`:
    where podium looked (the location, and for a model's default one, podium's home and where that came from) and
    how to point it at another (the project folder, PODIUM_HOME, --model, --serving); `then`: what that means for
    the command ("nothing to roll back")."""
    missing = "" if location_exists(serving) else "no such location; "
    then = f", {then}" if then else ""
    if getattr(args, "serving", None):
        return (f"nothing has been promoted to {serving!r}{f' ({missing[:-2]})' if missing else ''}{then}: give "
                "--serving the serving location a `podium run` promoted to (its summary names it)")
    home = settings.home_dir
    origin = "PODIUM_HOME" if os.environ.get("PODIUM_HOME") else "PODIUM_HOME is not set: ./.podium of this folder"
    models = home / "serving"
    others = sorted(p.name for p in models.iterdir() if (p / "CURRENT").is_file()) if models.is_dir() else []
    hint = f"; this home serves model(s) {', '.join(others)} (--model NAME)" if others else ""
    return (f"nothing has been promoted to {serving!r} ({missing}the serving location of model "
            f"{getattr(args, 'model', None)!r} in podium's home {home}, {origin}){then}{hint}. Run podium from the "
            "project folder, set PODIUM_HOME to its .podium folder, or give --serving LOCATION")


def status_report(tracking: Any, serving: str, tags: dict[str, str]) -> tuple[list[str], dict[str, Any]]:
    """What `podium status` adds: the run's data and lineage, the last promotion's comparison, the
    champion's lineage; `tags` are the run's (`podium.tracking.runs.run_tags`). Returns (lines, JSON keys)."""
    from podium.serving.layout import read_current
    from podium.tracking.datasets import TAG_COMPARISON, lineage_tags

    lineage = lineage_tags(tags)
    lines = []
    for role in ("train", "val"):
        if f"podium.data.{role}.digest" in lineage:
            lines.append(f"{role} data: {lineage.get(f'podium.data.{role}.uri')} digest {lineage[f'podium.data.{role}.digest']}")
    if lineage.get("podium.prefect.flow_run_url"):
        lines.append(f"flow run: {lineage['podium.prefect.flow_run_url']}"
                     + (f" (deployment {lineage['podium.prefect.deployment']})" if "podium.prefect.deployment" in lineage
                        else ""))
    if lineage.get("mlflow.source.git.commit"):
        lines.append(f"code: {lineage.get('podium.code.package')} at git commit {lineage['mlflow.source.git.commit']}")
    last = json.loads(tags[TAG_COMPARISON]) if TAG_COMPARISON in tags else None
    if last and last["reason"] != tags.get(TAG_REASON):  # `podium status` says that reason already ("why:")
        lines.append(f"last promotion decision: {'promoted' if last['promote'] else 'not promoted'}: {last['reason']}")
    current = read_current(serving)
    if current is not None:
        lines += version_lines(current.version, current.manifest, True)
    return lines, {"lineage": lineage, "last_decision": last,
                   "champion_lineage": ({k: current.manifest.get(k) for k in ("datasets", "lineage", "comparison")}
                                        if current else None)}


def location_names(serving: str, registered_model: str | None, alias: str | None, model: str) -> tuple[str, str]:
    """The registered model and alias a command acts on at `serving`: the location's own (its LOCATION.json), or
    those given, or the model's name and `champion` before its first promotion. Given ones that differ from the
    location's are refused (ServingError): they would move another location's alias."""
    from podium.serving.location import check_belongs, read_location

    location = read_location(serving)
    if location is None:
        return registered_model or model, alias or "champion"
    check_belongs(location, registered_model or location.registered_model, alias or location.alias)
    return location.registered_model, location.alias
