"""The one check of an option that takes one of a few names (a wire format, a layout...).

It imports nothing of the project, so that every package may use it.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["check_choice"]


def check_choice(name: str, value, valid: Iterable[str], what: str = "invalid") -> str:
    """Return ``value`` if it is one of the names ``valid``.

    Args:
        name: the option's name, as the message shows it (``wire``).
        value: the value given.
        valid: the valid names, in the order the message lists them.
        what: what the message says ``value`` is: ``"invalid"`` (default) or, say,
            ``"not a wire format"``.

    Raises:
        ValueError: ``value`` is no name of ``valid``: ``"{name}={value!r} is {what}; valid:
            a, b"``.
    """
    valid = tuple(valid)
    if not isinstance(value, str) or value not in valid:
        raise ValueError(f"{name}={value!r} is {what}; valid: {', '.join(valid)}")
    return value
