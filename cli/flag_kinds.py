"""What a serve flag is (`Flag`) and the on/off kind, shared by the flag tables."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Flag:
    names: tuple[str, ...]
    dest: str
    kind: Callable[[str], Any]
    default: Any
    env: str | None
    help: str
    repeat: bool = False
    """May be given several times; the environment's value comes first."""
    negatable: bool = False
    """An on/off flag on by default: `--no-NAME` turns it off."""


def switch(raw: str) -> bool:
    """An on/off flag's environment value. A flag of this kind takes no value on the
    command line (on when given)."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(raw)
