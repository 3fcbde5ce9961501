"""Calling a validation function the way Ray's documentation writes it, as a Ray task of its own.

The convention (`validation_arguments`), stated once and checked before training:

- the checkpoint is the first argument, positionally (as Ray passes it);
- a parameter named like one of the user's keyword arguments (`validation.kwargs`, overridden by
  the report's `ValidationTaskConfig.fn_kwargs`, as Ray merges them) gets that value;
- `config`, when the user's arguments have no such key, gets them all as one dict (the guide's
  `validate_fn(checkpoint, config)`);
- a parameter named like one of podium's facts (`val_data`, `label_column`, `feature_columns`,
  `torch_threads`, `run_name`, `step`, `per_row`) gets podium's value (`per_row` is True when a promotion
  asks for per-row values, returned under `podium.core.events.PER_ROW_KEY`, for `promotion.confidence`);
- `**kwargs` gets all of the user's arguments, and never podium's facts.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from podium.core.events import ValidationResult, read_validation_result
from podium.core.failures import user_frames
from podium.errors import PodiumError
from podium.imports import resolve_callable

if TYPE_CHECKING:
    import ray

logger = logging.getLogger(__name__)

CONFIG = "config"
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _after_checkpoint(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    params = list(inspect.signature(fn).parameters.values())
    return params[1:] if params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD) \
        else params


def validation_arguments(fn: Callable[..., Any], facts: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments `fn(checkpoint, **kwargs)` is called with (the module's convention)."""
    params = _after_checkpoint(fn)
    out: dict[str, Any] = {}
    if any(p.kind is p.VAR_KEYWORD for p in params):
        out.update(user)
    for p in params:
        if p.kind not in _NAMED:
            continue
        if p.name in user:
            out[p.name] = user[p.name]
        elif p.name == CONFIG:
            out[p.name] = dict(user)
        elif p.name in facts:
            out[p.name] = facts[p.name]
    return out


def signature_problem(fn: Callable[..., Any]) -> str | None:
    """Why `fn` can never be called as `fn(checkpoint, **kwargs)`, or None."""
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD,
                                            params[0].VAR_POSITIONAL):
        return "it must take the checkpoint as its first positional argument"
    required_positional = [p.name for p in params[1:] if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if required_positional:
        return f"its positional-only parameters {required_positional} cannot be passed by name"
    return None


def missing_arguments(fn: Callable[..., Any], available: Iterable[str]) -> list[str]:
    """Required parameters of `fn` (after the checkpoint) that no argument named in `available` fills."""
    names = {*available, CONFIG}
    return [p.name for p in _after_checkpoint(fn)
            if p.kind in _NAMED and p.default is p.empty and p.name not in names]


def may_send_report_kwargs(train_loop: Callable[..., Any]) -> bool:
    """Whether the loop's module can send per-report kwargs (`ValidationTaskConfig(fn_kwargs=...)`).

    Read from its source: a loop that never names them cannot send them. A module whose source
    cannot be read is given the benefit of the doubt."""
    module = inspect.getmodule(train_loop)
    try:
        source = inspect.getsource(module) if module else inspect.getsource(train_loop)
    except (OSError, TypeError):
        return True
    return "ValidationTaskConfig" in source or "fn_kwargs" in source


def call_validation(fn_path: str, checkpoint_uri: str, facts: dict[str, Any],
                    user: dict[str, Any]) -> ValidationResult:
    """Import the validation function, call it on the checkpoint, check it returned a dict; its values
    come back as they are (a value that is not a number is described, for the verdict to name)."""
    from podium.training.raytrain import checkpoint_at  # in the Ray task: Ray is loaded

    fn = resolve_callable(fn_path, "validation.fn")
    result = fn(checkpoint_at(checkpoint_uri), **validation_arguments(fn, facts, user))
    if not isinstance(result, dict):
        raise TypeError(f"validation function {fn_path} returned {type(result).__name__}, expected a dict")
    return read_validation_result({str(k): v for k, v in result.items()})


def call_validation_started(fn_path: str, checkpoint_uri: str, facts: dict[str, Any],
                            user: dict[str, Any]) -> Iterator[ValidationResult | None]:
    """`call_validation` as a Ray generator task: it yields None once it has started, then its result, so
    that a timeout counts the validation's own time, not its wait for a worker process to start (seconds
    on a busy machine) or for CPUs to free up."""
    yield None
    yield call_validation(fn_path, checkpoint_uri, facts, user)


def keep_arguments(user: dict[str, Any]) -> ray.ObjectRef:
    """Put a report's validation arguments in Ray's object store, owned by this (driver) process, so
    that they outlive the training run that sent them and are serialised once for every attempt."""
    import ray

    return ray.put(user)


class ValidationStopped(PodiumError, RuntimeError):
    """A validation cancelled because the run is stopping (not a verdict: the checkpoint stays pending)."""


# validations running as Ray tasks in this process (ref -> checkpoint), for a clean stop to cancel
_IN_FLIGHT: dict[Any, str] = {}
_STOPPED: set[Any] = set()
_IN_FLIGHT_LOCK = threading.Lock()
_STOPPING = threading.Event()  # the run is stopping: no validation starts any more


def accept_validations() -> None:
    """A new run in this process: validations start again (after an earlier run's stop)."""
    _STOPPING.clear()


def refuse_new_validations() -> None:
    """The run is stopping: from now on a validation (a retry included) raises ValidationStopped at once."""
    _STOPPING.set()


def cancel_validations() -> int:
    """Cancel every validation running from this process (the run is stopping); each raises
    ValidationStopped in the thread that waits for it. Returns how many were cancelled."""
    import ray

    with _IN_FLIGHT_LOCK:
        refs = list(_IN_FLIGHT)
        _STOPPED.update(refs)
    for ref in refs:
        try:
            ray.cancel(ref, force=True)
        except Exception:  # already finished, or Ray is going away
            logger.debug("could not cancel %s", ref, exc_info=True)
    return len(refs)


def validate_remote(
    fn_path: str,
    checkpoint_uri: str,
    facts: dict[str, Any],
    user: dict[str, Any] | ray.ObjectRef,
    *,
    num_cpus: float,
    num_gpus: float,
    resources: dict[str, float],
    timeout_s: float,
) -> ValidationResult:
    """Run the validation function as a Ray task with its own resource request; cancel it on timeout.

    `user` may be an ObjectRef (see keep_arguments): Ray resolves it in the task."""
    import ray  # the calling convention above is read before training, without Ray

    # local, with Ray: the calling convention is read before training, without Ray
    from podium.training.cluster import VALIDATION_RUNTIME_ENV

    task = ray.remote(call_validation_started).options(
        num_cpus=num_cpus, num_gpus=num_gpus, resources=resources or None, max_retries=0,
        runtime_env=VALIDATION_RUNTIME_ENV,
        name=f"podium-validate:{os.path.basename(checkpoint_uri)}",
    )
    if _STOPPING.is_set():
        raise ValidationStopped(f"validation of {checkpoint_uri} not started: the run is stopping")
    ref: Any = task.remote(fn_path, checkpoint_uri, facts, user)  # an ObjectRefGenerator: Ray's stubs say ObjectRef
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT[ref] = checkpoint_uri
    try:
        ray.get(next(ref))  # it started: the timeout counts from here
        done, _ = ray.wait([ref], timeout=timeout_s)
        if not done:
            ray.cancel(ref, force=True)
            raise TimeoutError(f"validation of {checkpoint_uri} took longer than {timeout_s:g} s")
        result: ValidationResult = ray.get(next(ref))
        return result
    except (ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError, ray.exceptions.RayTaskError) as exc:
        if ref in _STOPPED:
            raise ValidationStopped(f"validation of {checkpoint_uri} stopped: the run is stopping") from None
        if isinstance(exc, ray.exceptions.RayTaskError):
            # re-raise the user's own exception as they raised it, not Ray's wrapper, with their frames as
            # text for the terminal (the wrapper's message is Ray's whole remote trace)
            cause = getattr(exc, "cause", None)
            if not isinstance(cause, Exception):
                raise exc.as_instanceof_cause() from None
            with contextlib.suppress(AttributeError, TypeError):
                # Ray 2.60's error class keeps the remote trace as its message only (no `traceback_str`)
                cause.podium_traceback = user_frames(  # type: ignore[attr-defined]
                    str(getattr(exc, "traceback_str", None) or exc))
            raise cause from None
        raise
    finally:
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT.pop(ref, None)
            _STOPPED.discard(ref)
