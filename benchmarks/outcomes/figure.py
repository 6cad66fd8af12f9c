"""``outcomes.png``: per-arm bars of the headline figures and, per arm, a GPU-temperature heat
map over time (first seed; GPUs in node order)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.outcomes import sim

BARS = (
    ("gpu_minutes_over_max_temp", "GPU-min ≥ maxTemp"),
    ("throttled_gpu_minutes", "throttled GPU-min"),
    ("energy_kwh", "energy (kWh)"),
    ("unallocated_pct", "unallocated GPU %"),
)


def draw(arms: dict[str, Any], runs: list[dict[str, sim.Tally]], path: Path) -> None:
    """Write the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(arms)
    cols = max(len(BARS), len(names))
    fig, axes = plt.subplots(2, cols, figsize=(3.6 * cols, 8), layout="constrained")
    for ax, (key, label) in zip(axes[0], BARS, strict=False):
        ax.bar(names, [arms[n][key] for n in names], color="tab:blue")
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=45, labelsize=8)
    for ax in axes[0][len(BARS) :]:
        ax.axis("off")
    first = runs[0]
    for ax, name in zip(axes[1], names, strict=False):
        heat = np.array(first[name].heat).T  # (GPUs, minutes)
        im = ax.imshow(heat, aspect="auto", cmap="inferno", vmin=20, vmax=95, origin="lower")
        ax.set_title(f"{name}\nGPU °C", fontsize=9)
        ax.set_xlabel("minute after warm-up", fontsize=8)
        ax.set_ylabel("GPU (node order)", fontsize=8)
    fig.colorbar(im, ax=list(axes[1]), shrink=0.8, label="°C")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
