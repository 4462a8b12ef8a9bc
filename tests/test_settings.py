"""The settings checks (fpo_utils/settings.py): one-line ValueErrors naming the flag."""

from dataclasses import dataclass
from typing import Literal, Optional

import pytest

from fpo_utils.settings import check_at_least, check_divisible, check_finite, check_literals, literal_choices, subset


@dataclass
class Toy:
    mode: Literal["a", "b"] = "a"
    target: Optional[Literal["x", "y"]] = None
    scale: float = 1.0
    batch_size: int = 8
    group_size: int = 4


def test_literal_choices():
    assert literal_choices(Literal["a", "b"]) == ("a", "b")
    assert literal_choices(Optional[Literal["x"]]) == ("x", None)
    assert literal_choices(int) is None


@pytest.mark.parametrize(
    "check, message",
    [
        (lambda: check_literals(Toy(mode="c")), "--mode 'c' is not one of a, b"),
        (lambda: check_literals(Toy(target="z")), "--target 'z' is not one of x, y"),
        (lambda: check_finite(Toy(scale=float("nan")), ["scale"]), "--scale is nan; a finite number is required"),
        (lambda: check_at_least(Toy(batch_size=0), ["group_size", "batch_size"], 1), "--batch-size 0 must be >= 1"),
        (
            lambda: check_divisible(Toy(batch_size=6), ["batch_size"], by="group_size"),
            "--batch-size 6 is not divisible by --group-size 4",
        ),
    ],
)
def test_bad_values_raise_one_line_errors(check, message):
    with pytest.raises(ValueError) as err:
        check()
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_good_values_pass_and_subset_picks_fields():
    args = Toy(target="y")
    check_literals(args)
    check_finite(args, ["scale"])
    check_at_least(args, ["batch_size", "group_size"], 1)
    check_divisible(args, ["batch_size"], by="group_size")
    assert subset(args, "mode", "scale") == {"mode": "a", "scale": 1.0}
