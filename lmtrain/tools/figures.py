"""What every figure of the tools shares: matplotlib on the Agg backend, plain tick labels, saving."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plain_number(value: float, _position: Any = None) -> str:
    """A tick label without powers of ten: 849, 1,000, 88.5, 0.35."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def plain_log_ticks(ax: Any) -> None:
    """Plain labels (849, not 8.49×10²) on a log y axis, about five of them over the drawn range: 1, 2, 5 x 10^k
    over a decade or more, evenly spaced round numbers over less, so every part of the axis is labelled."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullLocator

    low, high = ax.get_ylim()
    if ax.get_yscale() != "log" or low <= 0:
        return
    if high / low >= 10:
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(plain_number))
    else:
        ticks = [t for t in MaxNLocator(nbins=5).tick_values(low, high) if low <= t <= high]
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        # as many decimals as the spacing needs: 87.75, 87.80, not 87.8 twice
        step = min((b - a for a, b in zip(ticks, ticks[1:], strict=False)), default=1.0)
        decimals = max(0, -math.floor(math.log10(step))) if step > 0 else 0
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.{decimals}f}"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylim(low, high)


def single_points_ticks(ax: Any, xs: list[float]) -> None:
    """Where every line of ``ax`` is one point (a short sweep's single validations): ticks at those x values only,
    not a span of 96-104 around one point."""
    from matplotlib.ticker import FixedLocator, FuncFormatter

    ax.xaxis.set_major_locator(FixedLocator(sorted(set(xs))))
    ax.xaxis.set_major_formatter(FuncFormatter(plain_number))


def save_figure(fig: Any, path: str | Path, plt: Any) -> Path:
    """Lay out, write (creating the folder) and close ``fig``."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120, bbox_inches="tight")  # with a legend placed outside the axes
    plt.close(fig)
    return out
