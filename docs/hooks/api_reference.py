"""MkDocs hook: the API reference of what `podium` exports, from the objects' signatures and docstrings.

A page line `<!-- podium:api NAME -->` becomes the entry for `podium.NAME`: how to import it, its
signature (inspect.signature of the imported object; a Prefect flow's function) and its docstring.
The objects are imported from this checkout, as a user's `from podium import NAME` would find them.
Those whose modules live in the repository's remapped folders (flows/ is installed as podium.flows)
cannot be found by griffe's static analysis from the repository root, so they are rendered here;
PipelineConfig, in podium/, is rendered by mkdocstrings on the page itself.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

import _checkout

LINE = re.compile(r"^<!-- podium:api (\w+) -->$", re.M)
# Where each public name is defined, for a checkout whose podium/__init__.py does not export it yet.
DEFINED_IN = {
    "PipelineConfig": ["podium.config"],
    "train_validate_promote": ["podium.flows.pipeline"],
    "promote_run": ["podium.flows.promote"],
    "load_promoted_model": ["podium.training.promoted"],
    "CheckpointAnnouncer": ["podium.training.raytrain"],
    "PrefectEventSink": ["podium.prefect_events"],
    "validate_checkpoint": ["podium.training.validate"],
}


def on_config(config: Any) -> Any:
    """Read podium from this checkout (sys.path.insert(0, <repo root>) and the package-dir mapping)."""
    _checkout.use_checkout()
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if not LINE.search(markdown):
        return markdown
    _checkout.use_checkout()
    return LINE.sub(lambda m: render(m.group(1)), markdown)


def resolve(name: str) -> Any:
    """`from podium import name`, else the module that defines it."""
    podium = importlib.import_module("podium")
    try:
        return getattr(podium, name)
    except AttributeError:
        pass
    errors = []
    for module in DEFINED_IN.get(name, []):
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            errors.append(f"{module}: {e}")
    raise RuntimeError(f"podium.{name} cannot be imported from this checkout ({'; '.join(errors) or 'unknown name'})")


def signature(name: str, obj: Any, method: bool = False) -> str:
    """`name(params) -> return`, on one line when short; annotations as written in the source."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    params: list[str] = []
    star_done = False
    values = list(sig.parameters.values())
    if method and values and values[0].name in ("self", "cls"):
        values = values[1:]
    for i, p in enumerate(values):
        if p.kind is p.KEYWORD_ONLY and not star_done:
            params.append("*")
            star_done = True
        text = p.name
        if p.kind is p.VAR_POSITIONAL:
            text, star_done = "*" + text, True
        elif p.kind is p.VAR_KEYWORD:
            text = "**" + text
        if p.annotation is not p.empty:
            text += ": " + annotation(p.annotation)
        if p.default is not p.empty:
            text += (" = " if p.annotation is not p.empty else "=") + repr(p.default)
        params.append(text)
        if p.kind is p.POSITIONAL_ONLY and (i + 1 == len(values) or values[i + 1].kind is not p.POSITIONAL_ONLY):
            params.append("/")
    ret = "" if sig.return_annotation is sig.empty else f" -> {annotation(sig.return_annotation)}"
    one_line = f"{name}({', '.join(params)}){ret}"
    if len(one_line) <= 90:
        return one_line
    return f"{name}(\n" + "".join(f"    {p},\n" for p in params) + f"){ret}"


def annotation(a: Any) -> str:
    return a if isinstance(a, str) else inspect.formatannotation(a)


def docstring(obj: Any) -> str:
    return inspect.cleandoc(obj.__doc__) if obj.__doc__ else ""


def render(name: str) -> str:
    obj = resolve(name)
    out = [f"## `podium.{name}` {{ #{name} }}", "", "```python", f"from podium import {name}", "```", ""]
    flow_fn = getattr(obj, "fn", None)
    if flow_fn is not None and type(obj).__name__ == "Flow":  # a Prefect flow: call it like its function
        out += [f"A Prefect flow (flow name `{obj.name}`); calling it runs the flow.", "",
                "```python", signature(name, flow_fn), "```", "", docstring(flow_fn), ""]
        return "\n".join(out)
    if inspect.isclass(obj):
        out += ["```python", "class " + signature(name, obj), "```", "", docstring(obj), ""]
        for attr, member in vars(obj).items():
            if attr.startswith("_") or not inspect.isfunction(member):
                continue
            out += [f"### `{name}.{attr}`", "", "```python", signature(attr, member, method=True), "```", "",
                    docstring(member), ""]
        return "\n".join(out)
    out += ["```python", signature(name, obj), "```", "", docstring(obj), ""]
    return "\n".join(out)
