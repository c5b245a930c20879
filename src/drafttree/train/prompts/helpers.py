"""Plain text helpers of the template language (see :mod:`.engine`): people, money, numbers, times, amounts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Person:
    name: str
    he: str
    him: str
    his: str

    @property
    def He(self) -> str:  # noqa: N802 - reads naturally in templates
        return self.he.capitalize()

    @property
    def His(self) -> str:  # noqa: N802
        return self.his.capitalize()


PERSON_FIELDS = frozenset({"name", "he", "him", "his", "He", "His"})


def money(x: float) -> str:
    x = round(x + 1e-9, 2)
    return f"${int(x):,}" if x == int(x) else f"${x:,.2f}"


def num(x: float) -> str:
    x = round(x + 1e-9, 2)
    return f"{int(x):,}" if x == int(x) else f"{x:g}"


def clock(minutes: int) -> str:
    h, m = divmod(minutes % (24 * 60), 60)
    return f"{(h % 12) or 12}:{m:02d} {'a.m.' if h < 12 else 'p.m.'}"


def amount(q: float, unit: str, name: str) -> str:
    """``1.5, "cups", "flour"`` -> ``"1 1/2 cups of flour"``."""
    if q == int(q):
        qs = str(int(q))
    else:
        whole, frac = int(q), q - int(q)
        fs = {0.25: "1/4", 0.5: "1/2", 0.75: "3/4"}.get(round(frac, 2), f"{frac:g}")
        qs = f"{whole} {fs}" if whole else fs
    if name.endswith("s") and q == 1 and not unit:
        name = name[:-1]
    return f"{qs} {unit} of {name}" if unit else f"{qs} {name}"
