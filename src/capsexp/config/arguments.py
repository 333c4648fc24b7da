"""Arguments checked by pydantic (strict: no string-to-number or bool-to-int) against the type hints of
what receives them, e.g. ``batch_size: PositiveInt``: :func:`argument_problems` for the composed config,
:func:`checked` when a class is built from Python. A hint pydantic cannot read is not checked."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, TypeVar

from annotated_types import Interval
from pydantic import ConfigDict, InstanceOf, TypeAdapter, ValidationError

# Constructors take pydantic's PositiveInt, NonNegativeFloat, ... and these two.
UnitInterval = Annotated[float, Interval(ge=0, le=1)]
PositiveFraction = Annotated[float, Interval(gt=0, le=1)]  # a margin, a decay rate

Checked = TypeVar("Checked", bound=Callable)
_HYDRA_KEYS = ("_target_", "_partial_", "_convert_", "_recursive_", "_args_")


def shown(value: Any) -> str:
    """A value as a user types it on the command line; a built object by its class's name."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(shown(v) for v in value) + "]"
    return str(value) if type(value).__module__ in ("builtins", "pathlib") else type(value).__name__


def _adapter(hint: Any) -> TypeAdapter | None:
    if inspect.isclass(hint) and dataclasses.is_dataclass(hint):  # an options object: built already
        return TypeAdapter(InstanceOf[hint])
    try:
        return None if hint is Any else TypeAdapter(hint, config=ConfigDict(strict=True, arbitrary_types_allowed=True))
    except Exception:  # no schema for this hint
        return None


@functools.cache
def _parameters(target: Callable) -> tuple[dict[str, TypeAdapter | None], bool]:
    """``{keyword parameter: its hint's adapter}`` of a callable, and whether it takes ``**kwargs``."""
    function = inspect.unwrap(target.__init__ if inspect.isclass(target) else target)
    parameters = [p for p in inspect.signature(function).parameters.values() if p.name != "self"]
    try:
        hints = typing.get_type_hints(function, include_extras=True)
    except Exception:  # a hint naming what only type checkers import: none checked
        hints = {}
    keywords = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    adapters = {p.name: _adapter(hints.get(p.name, Any)) for p in parameters if p.kind in keywords}
    return adapters, any(p.kind is p.VAR_KEYWORD for p in parameters)


def _plain(value: Any) -> Any:
    """OmegaConf's containers (``hydra.utils.instantiate`` without ``_convert_``) as lists and dicts."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, list, tuple)):
        return [_plain(item) for item in value]
    return {k: _plain(v) for k, v in value.items()} if isinstance(value, Mapping) else value


def _value_problem(adapter: TypeAdapter | None, value: Any) -> str | None:
    """``must be ...`` when ``value`` does not fit, else None. YAML gives lists where a hint may say
    tuple (Adam's betas): a list whose items fit as a tuple fits."""
    if adapter is None:  # a hint pydantic cannot read: not checked
        return None
    value = _plain(value)
    try:
        adapter.validate_python(value)
    except ValidationError as error:
        if isinstance(value, list) and _value_problem(adapter, tuple(value)) is None:
            return None
        requirements = []  # "Input should be greater than 0" -> "be greater than 0 (item 1)"
        for e in error.errors():
            items = ", ".join(f"item {part}" for part in e["loc"] if isinstance(part, int))
            text = re.sub(r"^\w+ should ", "", e["msg"]).replace(" after validation", "").replace("None", "null")
            requirements.append(text + (f" ({items})" if items else ""))
        requirements = list(dict.fromkeys(requirements))  # a union's: "be a or b"
        return "must " + " or ".join(r[3:] if i and r.startswith("be ") else r for i, r in enumerate(requirements))
    return None


def argument_problems(target: Callable, arguments: Mapping[str, Any], prefix: str = "") -> list[str]:
    """``<prefix><name>=<value>: must be ...`` for each argument the hints of ``target`` do not allow,
    ``<prefix><name>: ... takes no such argument`` for each it does not take."""
    adapters, takes_any = _parameters(target)
    problems = []
    for name, value in arguments.items():
        if name in adapters and (problem := _value_problem(adapters[name], value)):
            problems.append(f"{prefix}{name}={shown(value)}: {problem}")
        elif name not in adapters and not takes_any and name not in _HYDRA_KEYS:
            problems.append(
                f"{prefix}{name}: {target.__qualname__} takes no such argument; it takes {', '.join(adapters)}"
            )
    return problems


def checked(target: Checked) -> Checked:
    """Check the arguments of a function or a class's constructor against its hints at every call:
    a ``ValueError`` naming each bad argument and what it allows."""
    function = target.__init__ if inspect.isclass(target) else target
    signature = inspect.signature(function)

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = {k: v for k, v in signature.bind(*args, **kwargs).arguments.items() if k in _parameters(function)[0]}
        if problems := argument_problems(function, given):
            raise ValueError(f"{target.__name__}: " + "; ".join(problems))
        return function(*args, **kwargs)

    if inspect.isclass(target):
        target.__init__ = wrapper
        return target
    return wrapper  # type: ignore[return-value]
