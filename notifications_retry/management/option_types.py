"""argparse types shared by the app's commands: a bad value exits 2 with a message naming it."""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Callable


def _number(value: str, cast: Callable[[str], float], expected: str) -> float:
    try:
        return cast(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}") from None


def positive_int(value: str) -> int:
    """A whole number >= 1."""
    number = int(_number(value, int, "a whole number"))
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    return number


def positive_float(value: str) -> float:
    """A number of seconds > 0."""
    number = _number(value, float, "a number of seconds")
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def non_negative_float(value: str) -> float:
    """A number of seconds >= 0."""
    number = _number(value, float, "a number of seconds")
    if not number >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def port(value: str) -> int:
    """A TCP port, 0-65535."""
    number = int(_number(value, int, "a port number"))
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0-65535, got {number}")
    return number


def ip_address(value: str) -> str:
    """An IPv4 or IPv6 address."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an IP address such as 127.0.0.1 or 0.0.0.0, got {value!r}"
        ) from None
