"""The one reader of command-line overrides: ``key=value`` as Hydra's grammar writes it, with every prefix
Hydra allows (``+key=value`` adds a key, ``++key=value`` adds or overrides it, ``~key`` or ``~key=value``
deletes it), and a value written so that Hydra reads it back as the text meant.

Every module that reads an override's key or value reads it here: a run's resume command, a sweep's jobs,
a page's configuration labels and the HParams tab then agree on what ``++seed=3`` or ``~callbacks.x`` says.
Hydra's flags (``-m``, ``--cfg job``, ``-cn name``) are no overrides.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

# Hydra's prefixes, longest first: a key is what follows the one an override starts with.
PREFIXES = ("++", "+", "~")

# Characters an override value may hold unquoted: others (``,`` a sweep, ``=``, brackets, quotes,
# ``$``, whitespace) make Hydra's grammar read more than a string, and ``~`` it refuses (a home folder
# as a shell leaves it unexpanded, ``images=~/photos`` quoted or in zsh).
_PLAIN_VALUE = re.compile(r"[\w./:@%+-]*")


def is_override(argument: str) -> bool:
    """Whether ``argument`` is an override (``key=value``, with any prefix, or ``~key``), not a flag of
    Hydra's (``-m``, ``--cfg``) or a flag's value (``job`` after ``--cfg``)."""
    return not argument.startswith("-") and ("=" in argument or argument.startswith("~"))


def prefix(argument: str) -> str:
    """The override's prefix: ``++``, ``+``, ``~`` or ``""``."""
    return next((p for p in PREFIXES if argument.startswith(p)), "")


def key(argument: str) -> str:
    """The key of an override, without its prefix (``model/net`` of ``+model/net=capsnet``)."""
    return argument.split("=", 1)[0].removeprefix(prefix(argument))


def left_side(argument: str) -> str:
    """What an override sets, as written: its prefix and key (``+arm/routing`` of ``+arm/routing=a,b``)."""
    return argument.split("=", 1)[0]


def written(argument: str) -> str | None:
    """The override's value as written (quotes and escapes kept); None for ``~key`` without one."""
    return argument.split("=", 1)[1] if "=" in argument else None


def value(argument: str) -> str:
    """The value of ``key=value`` as Hydra reads it: quotes removed and escapes undone; text Hydra cannot
    parse, a sweep, or a value that is not a string (``null``), as written."""
    text = written(argument) or ""
    override = parsed(argument)
    if override is None or override.is_sweep_override():
        return text
    read = override.value()
    return read if isinstance(read, str) else text


def is_sweep(argument: str) -> bool:
    """Whether the override sweeps (``seed=1,2,3``, ``range(3)``, ``choice(a,b)``) as Hydra reads it."""
    override = parsed(argument)
    return override is not None and override.is_sweep_override()


def of_key(arguments: Iterable[str], name: str) -> list[str]:
    """The overrides of ``arguments`` whose key is ``name``, whatever their prefix, in their order."""
    return [argument for argument in arguments if is_override(argument) and key(argument) == name]


def values_of(arguments: Iterable[str], name: str) -> list[str]:
    """The values written for the key ``name`` (the last is the one Hydra uses); none given: ``[]``."""
    return [text for argument in of_key(arguments, name) if (text := written(argument)) is not None]


def without(arguments: Iterable[str], *names: str) -> list[str]:
    """``arguments`` without the overrides of the keys ``names`` (flags and other overrides kept)."""
    return [argument for argument in arguments if not (is_override(argument) and key(argument) in names)]


def with_value(argument: str, text: str) -> str:
    """The override ``argument`` with the value ``text`` (written as given), prefix and key kept."""
    return f"{argument.split('=', 1)[0]}={text}"


def hydra_value(text: object) -> str:
    r"""``text`` as an override value Hydra reads back as that string: quoted where it holds more than
    plain characters (a job folder's name holds ``=`` and ``,``: ``model=capsnet,seed=1``). In quotes,
    a quote and the backslashes before it, or before the end, are escaped; ``${`` is escaped as ``\${``."""
    text = str(text)
    if _PLAIN_VALUE.fullmatch(text):
        return text
    quoted = re.sub(r"(\\*)('|$)", lambda m: m[1] * 2 + ("\\'" if m[2] else ""), text)
    return "'" + quoted.replace("${", "\\${") + "'"


def is_quoted(text: str) -> bool:
    """Whether a written value is in quotes."""
    return len(text) >= 2 and text[0] == text[-1] and text[0] in "'\""


@functools.cache
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def parsed(argument: str):
    """Hydra's own reading of the override ``argument`` (None where its grammar refuses it)."""
    from hydra.errors import HydraException

    try:
        return _parser().parse_override(argument)
    except HydraException:
        return None
