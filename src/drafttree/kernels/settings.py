"""Sizes read from the environment, with one line on stderr (and the default) for a value that is not a number."""

from __future__ import annotations

import os
import sys


def megabytes(variable: str, default: float) -> int:
    """Bytes of ``$variable`` megabytes (``default`` when it is unset or not a number; below 0 reads as 0)."""
    env = os.environ.get(variable, "").strip()
    try:
        mb = float(env) if env else default
    except ValueError:
        print(f"drafttree: {variable} must be a number of MB, not {env!r}; using {default}", file=sys.stderr)
        mb = default
    return int(max(0.0, mb) * (1 << 20))
