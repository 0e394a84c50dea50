"""How numbers read in the report and on the terminal: a dash where there is none."""

from __future__ import annotations

from ray_layout.report.summary import ArmOutcome, finite, is_measured


def show_ms(x: float | None) -> str:
    return "—" if not finite(x) else f"{x:,.1f}"


def show_gib(x: float | None) -> str:
    return "—" if not finite(x) else f"{x:,.1f}"


def show_signed_pct(x: float | None) -> str:
    return "—" if not finite(x) else f"{x:+.1%}"


def show_pct(x: float | None) -> str:
    return "—" if not finite(x) else f"{x:.1%}"


def show_times(x: float | None) -> str:
    return "—" if not finite(x) else f"{x:.2f}×"


def show_value(x: str | float | None) -> str:
    """A setting as prose: ``None`` is "not given", booleans yes/no, numbers with separators."""
    if x is None:
        return "not given"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    return str(x)


def show_measured(arm: ArmOutcome) -> str:
    """The measured mean and half its CI's width."""
    if not is_measured(arm):
        return "—"
    if arm.ci_ms is None:
        return show_ms(arm.measured_ms)
    return f"{show_ms(arm.measured_ms)} ± {abs(arm.ci_ms[1] - arm.ci_ms[0]) / 2:,.1f}"
