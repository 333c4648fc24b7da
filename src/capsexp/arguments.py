"""Arguments checked against the type hints of what they are passed to.

A constructor declares what each argument allows once, in its signature (``batch_size: PositiveInt``,
``stereo: Literal["both", "left", "split"]``); pydantic checks values against it in strict mode (no
string-to-number or bool-to-int conversion): :func:`argument_problems` for the composed config
(:mod:`capsexp.run.config_check`), :func:`checked` when a class is built from Python. A hint pydantic
cannot read (a class of another library, a name imported for type checkers only) is not checked.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, TypeVar

from annotated_types import Ge, Gt, Interval
from pydantic import ConfigDict, TypeAdapter, ValidationError

PositiveInt = Annotated[int, Gt(0)]
NonNegativeInt = Annotated[int, Ge(0)]
PositiveFloat = Annotated[float, Gt(0)]
NonNegativeFloat = Annotated[float, Ge(0)]
UnitInterval = Annotated[float, Interval(ge=0, le=1)]
PositiveFraction = Annotated[float, Interval(gt=0, le=1)]  # a margin, a decay rate

Checked = TypeVar("Checked", bound=Callable)
_HYDRA_KEYS = ("_target_", "_partial_", "_convert_", "_recursive_", "_args_")


def shown(value: Any) -> str:
    """A value as a user types it on the command line; an object as its class's name."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(shown(v) for v in value) + "]"
    # A built object (a net, an options object) by its class: its repr can be long, or fail half-built.
    return str(value) if type(value).__module__ in ("builtins", "pathlib") else type(value).__name__


@functools.cache
def parameter_hints(function: Callable) -> tuple[dict[str, Any], bool]:
    """``{name: type hint or Any}`` of a callable's keyword parameters, and whether it takes ``**kwargs``."""
    function = inspect.unwrap(function.__init__ if inspect.isclass(function) else function)
    parameters = inspect.signature(function).parameters.values()
    try:
        hints = typing.get_type_hints(function, include_extras=True)
    except Exception:  # a hint naming what only type checkers import: none checked
        hints = {}
    named = {p.name: hints.get(p.name, Any) for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    named.pop("self", None)
    return named, any(p.kind is p.VAR_KEYWORD for p in parameters)


@functools.cache
def _adapter(hint: Any) -> TypeAdapter | None:
    try:
        return TypeAdapter(hint, config=ConfigDict(strict=True, arbitrary_types_allowed=True))
    except Exception:  # no schema for this hint (a dataclass: checked by isinstance)
        return None


def _plain(value: Any) -> Any:
    """OmegaConf's containers (``instantiate`` without ``_convert_``) as lists and dicts."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, Mapping) and not isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def value_problem(hint: Any, value: Any) -> str | None:
    """``must be ...`` when ``value`` does not fit ``hint``, else None."""
    if inspect.isclass(hint) and dataclasses.is_dataclass(hint):  # an options object, built already
        return None if isinstance(value, hint) else f"must be an instance of {hint.__name__}"
    try:
        adapter = None if hint is Any else _adapter(hint)
    except TypeError:  # an unhashable hint
        adapter = _adapter.__wrapped__(hint)
    if adapter is None:
        return None
    value = _plain(value)
    try:
        adapter.validate_python(value)
    except ValidationError as error:
        # YAML and Hydra give lists where a hint may say tuple (Adam's betas): the same items fit.
        if isinstance(value, list) and value_problem(hint, tuple(value)) is None:
            return None
        requirements = list(dict.fromkeys(_requirement(e) for e in error.errors()))
        if all(requirement.startswith("be ") for requirement in requirements):  # a union: "be a or b"
            requirements = [requirements[0]] + [requirement[3:] for requirement in requirements[1:]]
        return "must " + " or ".join(requirements)
    return None


def _requirement(error: Any) -> str:
    """pydantic's "Input should be greater than 0" as "be greater than 0", naming a list's bad item."""
    message = re.sub(r"^\w+ should ", "", error["msg"]).replace(" after validation", "").replace("None", "null")
    items = [f"item {part}" for part in error["loc"] if isinstance(part, int)]
    return message + (f" ({', '.join(items)})" if items else "")


def argument_problems(target: Callable, arguments: Mapping[str, Any], prefix: str = "") -> list[str]:
    """``<prefix><name>=<value>: must be ...`` for each argument whose value the hint of ``target``
    does not allow, ``<prefix><name>: ... takes no such argument`` for each it does not take."""
    named, takes_any = parameter_hints(target)
    problems = []
    for name, value in arguments.items():
        if name in named:
            if problem := value_problem(named[name], value):
                problems.append(f"{prefix}{name}={shown(value)}: {problem}")
        elif not takes_any and name not in _HYDRA_KEYS:
            problems.append(
                f"{prefix}{name}: {target.__qualname__} takes no such argument; it takes {', '.join(named)}"
            )
    return problems


def checked(target: Checked) -> Checked:
    """Check the arguments of a function, or of a class's constructor, against its hints at every call:
    a ``ValueError`` naming each bad argument and what it allows."""
    function = target.__init__ if inspect.isclass(target) else target
    signature = inspect.signature(function)

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        named = parameter_hints(function)[0]
        given = {name: value for name, value in signature.bind(*args, **kwargs).arguments.items() if name in named}
        if problems := argument_problems(function, given):
            raise ValueError(f"{target.__name__}: " + "; ".join(problems))
        return function(*args, **kwargs)

    if inspect.isclass(target):
        target.__init__ = wrapper
        return target
    return wrapper  # type: ignore[return-value]
