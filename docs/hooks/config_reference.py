"""MkDocs hook: the configuration reference, generated from podium's pydantic models at build time.

A page holding the line `<!-- podium:config-reference -->` gets, in its place, one table per model
(PipelineConfig and each nested model): every field's name as a config file writes it, its type and
constraints, its default and its description. The models in podium/config.py are the one source:
nothing here is copied from them.
"""

from __future__ import annotations

import html
import types
import typing
from typing import Any

import _checkout
import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

MARKER = "<!-- podium:config-reference -->"


def on_config(config: Any) -> Any:
    """Read podium from this checkout (sys.path.insert(0, <repo root>) and the package-dir mapping)."""
    _checkout.use_checkout()
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace the marker with the generated reference."""
    if MARKER not in markdown:
        return markdown
    _checkout.use_checkout()
    from podium.config import PipelineConfig

    return markdown.replace(MARKER, render(PipelineConfig))


def text(s: str) -> str:
    """Plain text for a markdown table cell: no HTML, no emphasis, no cell breaks."""
    return html.escape(s, quote=False).replace("*", r"\*").replace("|", r"\|").replace("\n", " ")


def code(s: str) -> str:
    """A code span inside a table cell (the tables extension leaves pipes inside backticks alone)."""
    return "`" + s + "`"


def type_name(tp: Any) -> str:
    """A readable annotation: `int | None`, `list[str]`, `"min" | "max"`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a).replace("'", '"') for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]"
    if tp is type(None):
        return "None"
    if tp is typing.Any:
        return "Any"
    return getattr(tp, "__name__", str(tp))


def constraints(info: FieldInfo) -> str:
    """The field's bounds, as pydantic checks them."""
    out = []
    for m in info.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(m, attr, None)
            if isinstance(m, (annotated_types.Ge, annotated_types.Gt, annotated_types.Le, annotated_types.Lt,
                              annotated_types.Interval)) and value is not None:
                out.append(f"{sign} {value}")
        if isinstance(m, annotated_types.MinLen):
            out.append(f"at least {m.min_length} character{'s' if m.min_length != 1 else ''}")
    return ", ".join(out)


def default_of(info: FieldInfo) -> Any:
    if info.default_factory is not None:
        return info.default_factory()  # type: ignore[call-arg]
    return None if info.default is PydanticUndefined else info.default


def default_text(value: Any) -> str:
    if isinstance(value, BaseModel):
        return "(table below)"
    if isinstance(value, str):
        return code('"' + value + '"')
    if isinstance(value, bool):
        return code("true" if value else "false")
    if value is None:
        return "none"
    return code(repr(value))


def nested_model(tp: Any) -> type[BaseModel] | None:
    """The model of a table (`ShadowConfig`), or of a table that is off unless given (`WatchConfig | None`)."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(args) == 1 and type(None) in typing.get_args(tp):
        tp = args[0]
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def keyed_model(tp: Any) -> type[BaseModel] | None:
    """The model of a table of tables keyed by name (`dict[str, ThresholdConfig]`), or None."""
    args = typing.get_args(tp)
    return nested_model(args[1]) if typing.get_origin(tp) is dict and len(args) == 2 else None


def anchor(section: str) -> str:
    return "config-" + ("".join(c if c.isalnum() else "-" for c in section).strip("-") or "top-level")


def render(root: type[BaseModel]) -> str:
    """One table per model, the top level first, then each nested model in field order."""
    sections: list[tuple[str, type[BaseModel]]] = [("", root)]
    for name, info in root.model_fields.items():
        sub = nested_model(info.annotation)
        if sub is not None:
            sections.append((name, sub))
            # a table of tables keyed by a name of yours (promotion.thresholds.<metric>), or a table inside the
            # section (promotion.shadow): its table after its section
            sections += [(f"{name}.{inner}.<metric>", keyed)
                         for inner, field in sub.model_fields.items() if (keyed := keyed_model(field.annotation))]
            sections += [(f"{name}.{inner}", inside)
                         for inner, field in sub.model_fields.items() if (inside := nested_model(field.annotation))]
    parts = []
    for section, model in sections:
        title = f"`[{section}]`: {model.__name__}" if section else f"Top level: {model.__name__}"
        parts.append(f"### {title} {{ #{anchor(section)} }}\n")
        doc = (model.__doc__ or "").strip()
        if doc:
            parts.append(text(" ".join(doc.split())) + "\n")
        parts.append("| field | type | default | description |\n|---|---|---|---|")
        for name, info in model.model_fields.items():
            sub = nested_model(info.annotation)
            key = f"{section}.{name}" if section else name
            keyed = keyed_model(info.annotation)
            if keyed is not None:
                parts.append(f"| {code(key)} | table of tables | none | {text(info.description or '')} Each: "
                             f"[`[{key}.<metric>]`](#{anchor(key + '.<metric>')}). |")
                continue
            if sub is not None:
                parts.append(f"| {code(key)} | table | [`[{key}]`](#{anchor(key)}) | {text(sub.__doc__ or '')} |")
                continue
            kind = code(type_name(info.annotation))
            bounds = constraints(info)
            if bounds:
                kind += " " + text(bounds)
            parts.append(f"| {code(key)} | {kind} | {default_text(default_of(info))} | "
                         f"{text(info.description or '')} |")
        parts.append("")
    return "\n".join(parts)
