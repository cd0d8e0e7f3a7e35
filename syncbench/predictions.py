"""The simulator's predictions as text tables, crossover sentences and charts."""

from __future__ import annotations

__all__ = ["format_tables", "crossovers", "plot"]


def format_tables(rows: list, key: str, title: str, models: dict) -> str:
    """The predicted tables, one per network.

    Each holds ``key`` (ms) per method (columns) and P (rows), and the fastest method; ``models``
    maps each network's name to its description (``Network.describe``).
    """
    out = []
    for network in dict.fromkeys(r["network"] for r in rows):
        subset = [r for r in rows if r["network"] == network]
        labels = list(dict.fromkeys(r["label"] for r in subset))
        widths = {label: max(11, 2 + len(label)) for label in labels}
        first = subset[0]
        out.append(
            f"\n{network} ({models[network]}): {title}, n={first['model_numel']:,}, "
            f"density {first['density']}"
        )
        header = (
            f"{'P':>5}" + "".join(f"{label:>{widths[label]}}" for label in labels) + "   fastest"
        )
        out += [header, "-" * len(header)]
        for workers in sorted({r["workers"] for r in subset}):
            cells = {r["label"]: r[key] for r in subset if r["workers"] == workers}
            line = f"{workers:>5}" + "".join(
                f"{cells[label]:>{widths[label]}.2f}"
                if label in cells
                else f"{'-':>{widths[label]}}"
                for label in labels
            )
            out.append(line + f"   {_fastest(cells)}")
    return "\n".join(out)


def _fastest(cells: dict) -> str:
    """The label of the smallest value, or ``tie: a, b`` where several share it exactly."""
    best = min(cells.values())
    fastest = [label for label, value in cells.items() if value == best]
    return fastest[0] if len(fastest) == 1 else "tie: " + ", ".join(fastest)


def crossovers(rows: list, reference: str = "spardl") -> list:
    """Sentences saying where the row labelled ``reference`` wins.

    Per network and other method at the reference's wire format, at which P it is faster or
    slower (other option sets of its own method, such as team counts, and rows of other wire
    formats are skipped).
    """
    method_of = {r["label"]: r["method"] for r in rows}
    wire_of = {r["label"]: r.get("wire", "fp32") for r in rows}
    lines = []
    for network in dict.fromkeys(r["network"] for r in rows):
        times = {
            (r["label"], r["workers"]): r["predicted_ms"] for r in rows if r["network"] == network
        }
        for label in dict.fromkeys(name for name, _ in times):
            common = sorted(p for name, p in times if name == label and (reference, p) in times)
            if (
                method_of[label] == method_of.get(reference)
                or wire_of[label] != wire_of.get(reference)
                or not common
            ):
                continue
            faster = [p for p in common if times[(reference, p)] < times[(label, p)]]
            tied = [p for p in common if times[(reference, p)] == times[(label, p)]]
            slower = [p for p in common if p not in faster and p not in tied]
            switches = [
                f"{a}->{b}" for a, b in zip(common, common[1:]) if (a in faster) != (b in faster)
            ]
            lines.append(
                f"{network}: {reference} vs {label}: faster at P={faster or 'none'}, "
                f"slower at P={slower or 'none'}"
                + (f", tied at P={tied}" if tied else "")
                + (f"; crossover between P {', '.join(switches)}" if switches else "")
            )
    return lines


def plot(rows: list, sweep: list, path: str) -> None:
    """Predicted time against P per method, and spardl's against team count d, per network."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    networks = list(dict.fromkeys(r["network"] for r in rows + sweep))
    charts = bool(rows) + bool(sweep)
    fig, axes = plt.subplots(
        charts, len(networks), figsize=(6 * len(networks), 4.5 * charts), squeeze=False
    )
    for column, network in enumerate(networks):
        if rows:
            axis = axes[0][column]
            subset = [r for r in rows if r["network"] == network]
            for label in dict.fromkeys(r["label"] for r in subset):
                points = sorted(
                    (r["workers"], r["predicted_ms"]) for r in subset if r["label"] == label
                )
                axis.plot(*zip(*points), marker="o", label=label)
            axis.set(
                xscale="log",
                yscale="log",
                xlabel="workers P",
                ylabel="predicted ms per call",
                title=network,
            )
            _label_ticks(axis, sorted({r["workers"] for r in subset}))
            axis.legend(fontsize=8)
        if sweep:
            axis = axes[-1][column]
            subset = [r for r in sweep if r["network"] == network]
            for workers, wire in sorted({(r["workers"], r.get("wire", "fp32")) for r in subset}):
                points = sorted(
                    (r["teams"], r["predicted_ms"])
                    for r in subset
                    if r["workers"] == workers and r.get("wire", "fp32") == wire
                )
                name = f"P={workers}" + ("" if wire == "fp32" else f", {wire}")
                axis.plot(*zip(*points), marker="o", label=name)
            axis.set(
                xscale="log",
                xlabel="teams d",
                ylabel="predicted ms per call",
                title=f"spardl vs teams ({network})",
            )
            _label_ticks(axis, sorted({r["teams"] for r in subset}))
            axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _label_ticks(axis, values: list) -> None:
    """Ticks of a log-scale x axis at exactly ``values``, written as plain numbers."""
    axis.set_xticks(values, [str(v) for v in values])
    axis.set_xticks([], minor=True)
