"""Helpers for a trainer's settings dataclass (`Args`): checks that end as one-line ValueErrors naming
the command-line flag, and keyword subsets of the settings for the objects a run builds."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, Dict, Iterable, Literal, Optional, get_args, get_origin, get_type_hints


def flag(name: str) -> str:
    """The command-line spelling of a field: batch_size -> --batch-size."""
    return "--" + name.replace("_", "-")


def literal_choices(tp) -> Optional[tuple]:
    """The values a `Literal[...]` type allows (with None for an `Optional[Literal[...]]`); None otherwise."""
    if get_origin(tp) is Literal:
        return get_args(tp)
    lits = [a for a in get_args(tp) if get_origin(a) is Literal]
    return get_args(lits[0]) + (None,) if lits else None


def check_literals(args: Any) -> None:
    """Every `Literal` field of the dataclass instance `args` holds one of its choices."""
    hints = get_type_hints(type(args))
    for f in fields(args):
        allowed = literal_choices(hints[f.name])
        value = getattr(args, f.name)
        if allowed is not None and value not in allowed:
            choices = ", ".join(str(a) for a in allowed if a is not None)
            raise ValueError(f"{flag(f.name)} {value!r} is not one of {choices}")


def check_finite(args: Any, names: Iterable[str]) -> None:
    """The fields `names` are finite numbers."""
    for name in names:
        value = getattr(args, name)
        if not math.isfinite(value):
            raise ValueError(f"{flag(name)} is {value}; a finite number is required")


def check_at_least(args: Any, names: Iterable[str], low: int) -> None:
    """The fields `names` are >= low."""
    for name in names:
        value = getattr(args, name)
        if value < low:
            raise ValueError(f"{flag(name)} {value} must be >= {low}")


def check_divisible(args: Any, names: Iterable[str], by: str) -> None:
    """The fields `names` are multiples of the field `by`."""
    for name in names:
        value, divisor = getattr(args, name), getattr(args, by)
        if value % divisor:
            raise ValueError(f"{flag(name)} {value} is not divisible by {flag(by)} {divisor}")


def subset(args: Any, *names: str) -> Dict[str, Any]:
    """The fields `names` of `args` as keyword arguments."""
    return {name: getattr(args, name) for name in names}
