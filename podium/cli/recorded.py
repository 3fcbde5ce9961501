"""`podium promote` of a run on the run's own settings: the configuration the run recorded in MLflow when it opened
(its params, `podium.tracking.runs.open_tracking_run`), under what the command itself states (the keys of its
`--config` file, its flags).

The run's settings decide and build its promotion: the metric and its direction, the policy (min_delta,
thresholds, guards, confidence, rescore, verify, approval, rollout, shadow, allow_files), what builds the served
model (model_loader, model_class), and what a re-score runs (validation.*, data.*, the run's code and storage).
The command keeps its own: which run (run_name, model, experiment), where it serves and under which names
(serving, promotion.registered_model, promotion.alias), and whether it forces (promotion.always).

A run whose params do not say how it was configured (a run from before podium recorded them, or one podium did
not make) is promoted on the command's settings, as before, and the command says so in one line.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import time
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from podium.cli.errors import Refused, ServerUnreachable
from podium.cli.options import OPTIONS, flag_overrides
from podium.config import PipelineConfig, field_default, load_config, load_config_file, merge
from podium.core.redaction import HIDDEN, SECRET_KEY
from podium.errors import ConfigError, ServiceError, TrackingUnavailable
from podium.services import check_mlflow
from podium.settings import PodiumSettings
from podium.tracking.client import apply_http_retry_defaults, store_exists
from podium.tracking.runs import find_tracking_run, latest_run_name, recorded_params

# the command's own: which run, where it serves and under which names, whether it forces
COMMAND_OWN = ("run_name", "model", "experiment", "serving", "promotion.registered_model", "promotion.alias",
               "promotion.always")
# what only training reads: a promotion has no use for it (and its free-form values are the lossiest to read back)
TRAINING_ONLY = ("training.train_loop_config", "training.loop_datasets")
# tables a command's setting replaces whole: the run's thresholds are not kept beside the ones the command names
WHOLE = ("promotion.thresholds", "promotion.guards", "validation.kwargs", "validation.resources")
# settings that say one thing together (how the champion is loaded: a loader, a class, or both): a command that
# names one of a group replaces the run's whole group, so that a run recorded with a class can be promoted with a
# loader instead
TOGETHER = (("promotion.model_loader", "promotion.model_class"),)
# what decides and builds the promotion, as the command reports it (the line and --json's `settings`)
SHOWN = ("promotion.metric", "promotion.mode", "promotion.min_delta", "promotion.thresholds", "promotion.guards",
         "promotion.confidence", "promotion.model_loader", "promotion.model_class", "promotion.allow_files",
         "promotion.approval", "promotion.rollout", "promotion.verify", "promotion.rescore", "validation.fn",
         "data.val")
# a setting the line names only when it is not its default, in these words
WORDS = {"promotion.min_delta": "min_delta", "promotion.thresholds": "thresholds", "promotion.guards": "guards",
         "promotion.confidence": "confidence", "promotion.model_loader": "model loader",
         "promotion.model_class": "model class", "promotion.allow_files": "allow_files",
         "promotion.approval": "approval", "promotion.rollout": "rollout", "promotion.verify": "verify",
         "promotion.rescore": "rescore", "validation.fn": "validation"}
UNREADABLE = object()  # a recorded value that cannot be read back (redacted, or not of its field's type)
logger = logging.getLogger(__name__)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _allows_none(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation)


def typed_value(text: str, annotation: Any) -> Any:
    """A param's text read back as its field's type ('0.01' -> 0.01, 'True' -> True, '["a"]' -> ['a'], 'None' ->
    None where the field allows it), or UNREADABLE."""
    if text == "None" and _allows_none(annotation):
        return None
    adapter: TypeAdapter[Any] = TypeAdapter(annotation)
    try:
        return adapter.validate_python(text, strict=False)  # numbers, booleans, strings, literals
    except ValidationError:
        pass
    try:
        return adapter.validate_json(text)  # lists, recorded as JSON
    except ValidationError:
        return UNREADABLE


def loose_value(text: str) -> Any:
    """A free-form value (validation.kwargs) read back: True, False, None, a number or a JSON list as such, else
    the text. Lossy where the recorded text cannot tell: a string "1" comes back as the number 1."""
    if text in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[text]
    try:
        return json.loads(text)
    except ValueError:
        return text


def _read_table(path: str, annotation: Any, params: Mapping[str, str], unreadable: list[str]) -> dict[str, Any]:
    """A dict field (`path`) from its flattened keys `path.<key>[.<sub>...]`."""
    value_type = (typing.get_args(annotation) or (str, Any))[-1]
    entry_model = _model_of(value_type)
    table: dict[str, Any] = {}
    for key, text in sorted(params.items()):
        if not key.startswith(f"{path}."):
            continue
        rest = key[len(path) + 1:]
        if text == HIDDEN and SECRET_KEY.search(key):  # redacted when recorded: not readable back
            unreadable.append(key)
            continue
        if entry_model is not None:  # thresholds, guards: <metric>.<bound>, the metric's name may hold dots
            entry, _, bound = rest.rpartition(".")
            info = entry_model.model_fields.get(bound)
            value = typed_value(text, info.annotation) if info is not None and entry else UNREADABLE
            if value is UNREADABLE:
                unreadable.append(key)
            elif value is not None:  # an unset bound (min, max) is recorded as None
                table.setdefault(entry, {})[bound] = value
            continue
        *parents, leaf = rest.split(".")
        node = table
        for part in parents:
            node = node.setdefault(part, {})
        value = loose_value(text) if value_type is Any else typed_value(text, value_type)
        if value is UNREADABLE:
            unreadable.append(key)
        else:
            node[leaf] = value
    return table


def _read(model: type[BaseModel], prefix: str, params: Mapping[str, str], unreadable: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        if path in COMMAND_OWN or path in TRAINING_ONLY:
            continue
        section = _model_of(info.annotation)
        if section is not None:
            inner = _read(section, f"{path}.", params, unreadable)
            if inner:
                out[name] = inner
        elif typing.get_origin(info.annotation) is dict:
            table = _read_table(path, info.annotation, params, unreadable)
            if table:  # an empty table is recorded as nothing: its default, empty
                out[name] = table
        elif path in params:
            text = params[path]
            value = UNREADABLE if text == HIDDEN and SECRET_KEY.search(path) else typed_value(text, info.annotation)
            if value is UNREADABLE:
                unreadable.append(path)
            else:
                out[name] = value
    return out


def read_recorded(params: Mapping[str, str]) -> tuple[dict[str, Any] | None, list[str]]:
    """The nested settings a run's params record (typed by the configuration's fields), without the command's own
    (COMMAND_OWN) and training's (TRAINING_ONLY); and the keys that could not be read back (left to the command).
    None: the params do not say how the run was configured (no promotion.metric: not a run podium recorded)."""
    if "promotion.metric" not in params:
        return None, []
    unreadable: list[str] = []
    return _read(PipelineConfig, "", params, unreadable), unreadable


def _get(tree: Mapping[str, Any], path: str) -> Any:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return UNREADABLE
        node = node[part]
    return node


def _drop(tree: dict[str, Any], path: str) -> None:
    *parents, leaf = path.split(".")
    node: Any = tree
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(leaf, None)


def leaves(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every setting of a nested tree by its dotted path; a table of WHOLE is one setting."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and path not in WHOLE:
            out.update(leaves(value, f"{path}."))
        else:
            out[path] = value
    return out


def merge_settings(recorded: Mapping[str, Any], explicit: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings a promotion of the run uses: the run's `recorded` ones, with the command's `explicit` ones (its
    --config file's keys and its flags, nested) laid over them; a table of WHOLE the command names replaces the
    run's. Returns (the merged tree, path -> the run's value for each setting the command changed)."""
    base = copy.deepcopy(dict(recorded))
    for path in WHOLE:
        if _get(explicit, path) is not UNREADABLE:
            _drop(base, path)
    mine, theirs = leaves(explicit), leaves(recorded)
    changed = {path: theirs[path] for path, value in mine.items() if path in theirs and theirs[path] != value}
    for group in TOGETHER:
        if any(path in mine for path in group):
            for path in group:
                if path not in mine:
                    _drop(base, path)
                    if theirs.get(path) is not None:
                        changed[path] = theirs[path]
    return merge(base, dict(explicit)), changed


def _shown(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else repr(value)


@dataclass(frozen=True)
class RunSettings:
    """Which settings a promotion of `run` used: the run's (`from_run`) or, not recorded, the command's; the
    decisive ones' values (`used`), and those the command changed (path -> the run's value, the value used, the
    flag or file that said it)."""

    run: str
    from_run: bool
    used: dict[str, Any]
    overridden: dict[str, dict[str, Any]] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)
    why_not: str = ""  # why the run's settings were not used

    def line(self) -> str:
        """What the command says about it, in one line."""
        metric = f"metric {self.used['promotion.metric']} ({self.used['promotion.mode']})"
        named = [f"{WORDS[p]} {_shown(v) if isinstance(v, (dict, list, bool)) else v}"
                 for p, v in self.used.items() if p in WORDS and v not in (None, {}, [], False, field_default(p))]
        said = ", ".join([metric, *named])
        if not self.from_run:
            return f"run {self.run}: {self.why_not}: promoting with this command's settings: {said}"
        line = f"using run {self.run}'s settings: {said}"
        if self.overridden:
            line += "; overridden here: " + ", ".join(
                f"{p} = {_shown(o['used'])} ({o['by']}; the run's: {_shown(o['run'])})" for p, o in self.overridden.items())
        if self.unreadable:
            line += f"; not readable from its record, this command's used: {', '.join(self.unreadable)}"
        return line

    def to_dict(self) -> dict[str, Any]:
        """`--json`'s `settings` block."""
        return {"run": self.run, "from_run": self.from_run, "used": self.used, "overridden": self.overridden,
                "unreadable": self.unreadable, "why_not": self.why_not or None, "said": self.line()}


def _used(config: PipelineConfig) -> dict[str, Any]:
    tree = config.model_dump(mode="json")
    used = {path: _get(tree, path) for path in SHOWN}
    for path in ("promotion.thresholds", "promotion.guards"):  # each entry's bounds as given: no unset ones
        used[path] = {k: {b: v for b, v in bounds.items() if v is not None} for k, bounds in used[path].items()}
    return used


def _said_by(args: argparse.Namespace, path: str) -> str:
    """The flag that set `path` on this command line, else its --config file."""
    for flag, option_path, _, _ in OPTIONS:
        if option_path == path and getattr(args, flag[2:].replace("-", "_"), None) is not None:
            return flag
    for group in TOGETHER:  # dropped with its group, which a partner's flag replaced
        for other in group:
            partner = next((f for f, option_path, _, _ in OPTIONS if option_path == other != path
                            and getattr(args, f[2:].replace("-", "_"), None) is not None), None)
            if path in group and partner:
                return partner
    return f"--config {args.config}"


def explicit_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What the command line states: its --config file's keys, then its flags (nested; nothing it left out)."""
    return merge(load_config_file(args.config) if args.config else {}, flag_overrides(args))


def with_run_settings(args: argparse.Namespace, config: PipelineConfig, settings: PodiumSettings,
                      recorded: Mapping[str, str]) -> tuple[PipelineConfig, RunSettings]:
    """`config` (the command's) rebuilt on the run's `recorded` params, and what it used. A run whose params say
    nothing of its configuration, or whose record no longer makes a valid configuration, keeps the command's
    settings, and the report says why."""
    def command_own(why: str, unreadable: list[str] | None = None) -> tuple[PipelineConfig, RunSettings]:
        return config, RunSettings(config.run_name, False, _used(config), unreadable=unreadable or [], why_not=why)

    tree, unreadable = read_recorded(recorded)
    if tree is None:
        return command_own("its settings are not recorded in MLflow (a run from before podium recorded them, or one "
                           "podium did not make)")
    explicit = explicit_settings(args)
    merged, changed = merge_settings(tree, explicit)
    promotion = merged.get("promotion")
    if isinstance(promotion, dict) and promotion.get("rollout") != "shadow" \
            and "shadow" not in (explicit.get("promotion") or {}):
        promotion.pop("shadow", None)  # the record holds every table: shadow limits no rollout here asks for are inert
    try:
        used = load_config(None, {**merged, "run_name": config.run_name}, settings)
    except ConfigError as exc:
        first = str(exc).splitlines()[-1].strip()
        return command_own(f"its recorded settings do not make a valid configuration now ({first})", unreadable)
    final = used.model_dump(mode="json")
    overridden = {path: {"run": run_value, "used": _get(final, path), "by": _said_by(args, path)}
                  for path, run_value in changed.items()}
    return used, RunSettings(used.run_name, True, _used(used), overridden, unreadable)


def promote_settings(args: argparse.Namespace, config: PipelineConfig,
                     settings: PodiumSettings) -> tuple[PipelineConfig, tuple[float, float] | None]:
    """`podium promote`'s configuration: the run's own settings under the command's (`with_run_settings`), read
    from the run's MLflow record before anything starts; the line saying which were used goes to the progress
    lines, and `--json`'s `settings` (args.run_settings). Without --run-name, the model's latest run (as `podium
    status` shows it) is the run.

    Also returns when the tracking URI was checked (`check_mlflow`: time.monotonic() at its start and end), so that
    the command does not check it again; None where there was no store to check (then the command checks it)."""
    tracking_uri = settings.resolved_tracking_uri()
    recorded: dict[str, str] | None = None
    checked: tuple[float, float] | None = None
    if store_exists(tracking_uri):  # MLflow's client would create an empty store: nothing has run here
        apply_http_retry_defaults()  # before the first MLflow request
        began = time.monotonic()
        try:  # a server that does not answer as the command starts is a refusal (exit 2), as for `podium run`
            check_mlflow(tracking_uri)
        except ServiceError as exc:
            raise Refused(str(exc)) from None
        checked = (began, time.monotonic())
        try:
            if "run_name" not in config.model_fields_set:
                latest = latest_run_name(tracking_uri, config.experiment)
                config = config.model_copy(update={"run_name": latest}) if latest else config
            if "run_name" in config.model_fields_set:
                recorded = recorded_params(find_tracking_run(tracking_uri, config.experiment, config.run_name))
        except LookupError:
            recorded = None  # no such run: the promotion refuses it, naming what it searched
        except TrackingUnavailable as exc:
            raise ServerUnreachable(f"{exc}: run {config.run_name!r}'s settings could not be read; nothing was "
                                    "promoted") from None
    if recorded is None:
        return config, checked  # no such run: the promotion refuses it, naming what it searched
    config, report = with_run_settings(args, config, settings, recorded)
    args.run_settings = report.to_dict()
    logging.getLogger("podium.progress").info("%s", report.line())
    return config, checked
