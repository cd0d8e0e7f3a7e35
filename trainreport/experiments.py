"""Tables and curves of the experiments in ``scripts/experiments/`` (docs/EXPERIMENTS.md).

Every training run of those scripts lives in ``OUT/RATE/LABEL`` (time to accuracy, residual
ablation) or ``OUT/sweep/dDENSITY_MODE`` (density sweep), holding the trainer's
``metrics.jsonl`` and a ``run.json`` that says how the run was started and ended (``status``
124: stopped at the time cap). The benchmark's and simulator's JSON of the scaling experiment
are in ``OUT/scaling``. ``python -m trainreport.experiments KIND OUT`` prints one table.

Time to accuracy counts training time only (the rows' ``epoch_seconds``), not the test
evaluations, whose number differs between runs (capped runs evaluate more often).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys

from trainreport.runs import load_run

__all__ = [
    "ORDER",
    "DESCRIPTIONS",
    "CAPPED",
    "Trial",
    "rates",
    "tta_table",
    "seeds_table",
    "curves_table",
    "residuals_table",
    "sweep_table",
    "scaling_table",
    "plot_curves",
    "main",
]

#: DiLoCo rows with other outer settings (``--outer-overlap``, ``--outer-momentum``,
#: ``--outer-lr``): the label's suffix and what it adds to the row's description.
_VARIANTS = {
    "_m05": "outer momentum 0.5",
    "_overlap": "overlapped",
    "_overlap_m05": "overlapped, outer momentum 0.5",
    "_overlap_lr035": "overlapped, outer learning rate 0.35",
}
#: Method labels of the time-to-accuracy runs, in table order.
ORDER = (
    "dense",
    "ddp",
    "ddp_fp16",
    "ddp_bf16",
    "powersgd",
    "topk",
    "oktopk",
    "zen",
    "spardl",
    "spardl_fp16",
    "spardl_mc",
    "spardl_fp16_mc",
    "spardl_local",
    *(f"diloco_{outer}_h{h}" for h in (10, 50) for outer in ("dense", "spardl", "topk")),
    *(f"diloco_spardl_h10{variant}" for variant in _VARIANTS),
    "diloco_dense_h10_m05",
)
#: What each label ran, for the table.
DESCRIPTIONS = {
    "dense": "dense: MPI all-reduce in overlapped buckets (ours)",
    "ddp": "DDP's overlapped all-reduce",
    "ddp_fp16": "DDP + fp16_compress_hook",
    "ddp_bf16": "DDP + bf16_compress_hook",
    "powersgd": "DDP + PowerSGD (rank 4)",
    "topk": "TopkA",
    "oktopk": "Ok-Topk",
    "zen": "ZEN",
    "spardl": "SparDL",
    "spardl_fp16": "SparDL, fp16 wire",
    "spardl_mc": "SparDL, momentum correction 0.9",
    "spardl_fp16_mc": "SparDL, fp16 wire, momentum correction 0.9",
    "spardl_local": "SparDL, local residuals",
    **{
        f"diloco_{outer}_h{h}": f"DiLoCo, H = {h}, {name} outer synchronization"
        for h in (10, 50)
        for outer, name in (("dense", "dense"), ("spardl", "SparDL's"), ("topk", "TopkA's"))
    },
    **{
        f"diloco_spardl_h10{variant}": f"DiLoCo, H = 10, SparDL's outer synchronization, {what}"
        for variant, what in _VARIANTS.items()
    },
    "diloco_dense_h10_m05": "DiLoCo, H = 10, dense outer synchronization, outer momentum 0.5",
}
#: The exit status of ``timeout``: the run was stopped at its time cap.
CAPPED = 124


class Trial:
    """One training run of an experiment: its rows (possibly none) and how it ended."""

    def __init__(self, path: str):
        """Read ``path``'s ``run.json`` and ``metrics.jsonl`` (either may be missing)."""
        self.path = path
        self.label = os.path.basename(path.rstrip("/"))
        self.info = {}
        info_file = os.path.join(path, "run.json")
        if os.path.isfile(info_file):
            with open(info_file) as stream:
                self.info = json.load(stream)
        self.rows = []
        if os.path.isfile(os.path.join(path, "metrics.jsonl")):
            with contextlib.redirect_stderr(io.StringIO()):  # notes on stopped runs: see status
                try:
                    self.rows = load_run(path).rows
                except ValueError:
                    self.rows = []

    @property
    def iterations(self) -> int:
        """Training iterations logged."""
        return self.rows[-1]["iters"] if self.rows else 0

    @property
    def train_seconds(self) -> float:
        """Training seconds logged (evaluations left out)."""
        return sum(row["epoch_seconds"] for row in self.rows)

    def curve(self) -> list:
        """``(iterations, training seconds, test acc, test loss, train loss)`` per logged epoch."""
        points, seconds = [], 0.0
        for row in self.rows:
            seconds += row["epoch_seconds"]
            points.append(
                (
                    row["iters"],
                    seconds,
                    row.get("test_acc"),
                    row.get("test_loss"),
                    row.get("train_loss"),
                )
            )
        return points

    def time_to(self, target: float):
        """``(iterations, training seconds)`` at the first evaluation with accuracy >= target."""
        for iters, seconds, acc, _, _ in self.curve():
            if acc is not None and acc >= target:
                return iters, seconds
        return None

    def per_iteration(self, key: str):
        """Mean per iteration of a per-epoch sum ``key``; ``None`` without rows.

        ``key``: ``epoch_seconds``, ``bytes_sent_per_rank`` ...
        """
        if not self.rows:
            return None
        return sum(row.get(key, 0.0) for row in self.rows) / max(self.iterations, 1)

    def ending(self) -> str:
        """How the run ended: ``done``, ``capped at N s``, ``exit status N`` or ``not run``."""
        status = self.info.get("status")
        if status is None:
            return "not run"
        if status == CAPPED:
            return f"capped at {self.info.get('cap_seconds', 0):.0f} s"
        return "done" if status == 0 else f"exit status {status}"


def _number(value, digits: int = 1, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _trials(folder: str) -> list:
    """The trials under ``folder``, in :data:`ORDER` and then by name."""
    if not os.path.isdir(folder):
        return []
    names = [n for n in os.listdir(folder) if os.path.isdir(os.path.join(folder, n))]
    rank = {name: number for number, name in enumerate(ORDER)}
    names.sort(key=lambda n: (rank.get(n, len(ORDER)), n))
    return [Trial(os.path.join(folder, name)) for name in names]


def rates(out: str) -> list:
    """The network folders of ``out`` holding training runs, fastest first (``1gbit`` ...)."""
    skip = {"sweep", "scaling", "seeds"}
    names = [n for n in os.listdir(out) if os.path.isdir(os.path.join(out, n)) and n not in skip]
    return sorted(names, key=_bits_per_second, reverse=True)


def _bits_per_second(name: str) -> float:
    """``100mbit`` -> 1e8; names that are no tc rate sort last."""
    match = re.fullmatch(r"([0-9.]+)([kmgt]?)bit", name.lower())
    if not match:
        return -1.0
    return float(match.group(1)) * 1000 ** " kmgt".index(match.group(2) or " ")


def tta_table(out: str, targets) -> str:
    """Experiment a: per rate, every method's time to each target, final accuracy and traffic.

    ``targets``: test accuracies (a float or a list of them).
    """
    targets = [targets] if isinstance(targets, float) else list(targets)
    lines = []
    for rate in rates(out):
        trials = [t for t in _trials(os.path.join(out, rate)) if t.label != "spardl_local"]
        reach = "".join(f" train s to {t:g} (iterations) |" for t in targets)
        lines += [
            f"### {rate}\n",
            "| method | iterations | ms/iter | sync exposed ms/iter | MB/iter/rank |"
            f"{reach} final test acc | final test loss | run |",
            "|---|---:|---:|---:|---:|" + "---:|" * len(targets) + "---:|---:|---|",
        ]
        for trial in trials:
            cells = []
            for target in targets:
                reached = trial.time_to(target)
                cells.append(
                    "no evaluation logged"
                    if not trial.rows
                    else f"not reached in {trial.train_seconds:.0f} s"
                    if reached is None
                    else f"{reached[1]:.1f} ({reached[0]})"
                )
            last = trial.rows[-1] if trial.rows else {}
            lines.append(
                f"| {DESCRIPTIONS.get(trial.label, trial.label)} | {trial.iterations} | "
                f"{_number(trial.per_iteration('epoch_seconds'), 0, 1e3)}"
                f" | {_number(_exposed(trial), 0, 1e3)} | "
                f"{_number(trial.per_iteration('bytes_sent_per_rank'), 3, 1e-6)} | "
                + " | ".join(cells)
                + f" | {_number(last.get('test_acc'), 2, 100)}% | "
                f"{_number(last.get('test_loss'), 3)} | {trial.ending()} |"
            )
        lines.append("")
    return "\n".join(lines)


def _spread(values: list, digits: int = 1, scale: float = 1.0) -> str:
    """``mean (min-max)`` of ``values``; ``-`` for none."""
    if not values:
        return "-"
    low, mean, high = (
        _number(value, digits, scale)
        for value in (min(values), sum(values) / len(values), max(values))
    )
    return f"{mean} ({low}-{high})"


def seeds_table(out: str, targets) -> str:
    """Time to accuracy over seeds: per rate and method, runs in ``OUT/RATE/LABEL/seedN``.

    Per target: how many seeds reached it, and the mean (min-max) of their training seconds and
    iterations; then the mean (min-max) of the final test accuracy, ms and MB per iteration.
    """
    targets = [targets] if isinstance(targets, float) else list(targets)
    lines = []
    for rate in rates(out):
        reach = "".join(
            f" reached {t:g} | train s to {t:g} | iterations to {t:g} |" for t in targets
        )
        lines += [
            f"### {rate}\n",
            f"| method | seeds | iterations | ms/iter | MB/iter/rank |{reach} final test acc % |",
            "|---|---:|---:|---:|---:|" + "---:|---:|---:|" * len(targets) + "---:|",
        ]
        for group in _trials(os.path.join(out, rate)):
            trials = [t for t in _trials(group.path) if t.label.startswith("seed") and t.rows]
            if not trials:
                continue
            cells = []
            for target in targets:
                reached = [t.time_to(target) for t in trials]
                reached = [r for r in reached if r is not None]
                cells += [
                    f"{len(reached)}/{len(trials)}",
                    _spread([r[1] for r in reached]),
                    _spread([r[0] for r in reached], 0),
                ]
            lines.append(
                f"| {DESCRIPTIONS.get(group.label, group.label)} | {len(trials)} | "
                f"{_spread([t.iterations for t in trials], 0)} | "
                f"{_spread([t.per_iteration('epoch_seconds') for t in trials], 0, 1e3)} | "
                f"{_spread([t.per_iteration('bytes_sent_per_rank') for t in trials], 3, 1e-6)} | "
                + " | ".join(cells)
                + f" | {_spread([t.rows[-1]['test_acc'] for t in trials], 2, 100)} |"
            )
        lines.append("")
    return "\n".join(lines)


def _exposed(trial: Trial):
    if not trial.rows:
        return None
    key = "exposed_sync_seconds" if "exposed_sync_seconds" in trial.rows[0] else "sync_seconds"
    return trial.per_iteration(key)


def curves_table(trials: list) -> str:
    """Side by side, per evaluation: test accuracy, test loss and train loss of each trial."""
    points = {t.label: {p[0]: p for p in t.curve()} for t in trials}
    iterations = sorted({i for curve in points.values() for i in curve})
    header = "| iteration | " + " | ".join(
        f"{t.label} test acc | {t.label} test loss | {t.label} train loss" for t in trials
    )
    lines = [header + " |", "|---:|" + "---:|" * (3 * len(trials))]
    for i in iterations:
        cells = []
        for t in trials:
            p = points[t.label].get(i)
            cells += (
                ["-"] * 3
                if p is None
                else [f"{_number(p[2], 2, 100)}%", _number(p[3], 3), _number(p[4], 3)]
            )
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def residuals_table(out: str, rate: str) -> str:
    """Experiment b: SparDL's curves with global and with local residuals at ``rate``."""
    trials = [Trial(os.path.join(out, rate, n)) for n in ("spardl", "spardl_local")]
    summary = [
        "| residuals | iterations | ms/iter | final test acc | final test loss | run |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, trial in zip(("global", "local"), trials):
        last = trial.rows[-1] if trial.rows else {}
        summary.append(
            f"| {name} | {trial.iterations} | "
            f"{_number(trial.per_iteration('epoch_seconds'), 0, 1e3)} | "
            f"{_number(last.get('test_acc'), 2, 100)}% | {_number(last.get('test_loss'), 3)} | "
            f"{trial.ending()} |"
        )
    return "\n".join(summary) + "\n\n" + curves_table(trials)


def sweep_table(out: str) -> str:
    """Experiment c: per density and residual mode, time per iteration, traffic and accuracy."""
    folder = os.path.join(out, "sweep")
    trials = []
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        density, _, mode = name[1:].partition("_")
        with contextlib.suppress(ValueError):
            trials.append((float(density), mode, Trial(os.path.join(folder, name))))
    trials.sort(key=lambda item: (item[0], item[1]))
    lines = [
        "| density | residuals | iterations | ms/iter | sync exposed ms/iter | MB/iter/rank | "
        "test acc | test loss | train loss | run |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for density, mode, trial in trials:
        last = trial.rows[-1] if trial.rows else {}
        lines.append(
            f"| {density:g} | {mode} | {trial.iterations} | "
            f"{_number(trial.per_iteration('epoch_seconds'), 0, 1e3)} | "
            f"{_number(_exposed(trial), 0, 1e3)} | "
            f"{_number(trial.per_iteration('bytes_sent_per_rank'), 3, 1e-6)}"
            f" | {_number(last.get('test_acc'), 2, 100)}% | {_number(last.get('test_loss'), 3)} | "
            f"{_number(last.get('train_loss'), 3)} | {trial.ending()} |"
        )
    return "\n".join(lines) + "\n"


def scaling_table(out: str) -> str:
    """Experiment d: measured and predicted ms per synchronization of each method at each P."""
    folder = os.path.join(out, "scaling")
    measured = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.startswith("bench_p") and name.endswith(".json"):
            with open(os.path.join(folder, name)) as stream:
                measured += [r for r in json.load(stream) if r["method"] not in ("floor",)]
    predicted = {}
    sim_file = os.path.join(folder, "sim.json")
    if os.path.isfile(sim_file):
        with open(sim_file) as stream:
            for row in json.load(stream):
                predicted[(row["label"], row["workers"])] = row["predicted_ms"]
    rows = [r for r in measured if not r["label"].startswith("floor")]
    rows.sort(key=lambda r: (r["workers"], r["label"]))
    spardl = {r["workers"]: r["median_ms"] for r in rows if r["label"] == "spardl"}
    lines = [
        "| P | method | measured ms | predicted ms | error | MB/rank | x SparDL |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        guess = predicted.get((r["label"], r["workers"]))
        error = None if guess is None else 100 * (guess - r["median_ms"]) / r["median_ms"]
        base = spardl.get(r["workers"])
        lines.append(
            f"| {r['workers']} | {r['label']} | {r['median_ms']:.1f} | {_number(guess)} | "
            f"{'-' if error is None else f'{error:+.0f}%'} | "
            f"{r['bytes_per_rank'] / 1e6:.3f} | "
            f"{_number(r['median_ms'] / base if base else None, 2)} |"
        )
    return "\n".join(lines) + "\n"


def plot_curves(groups: dict, path: str) -> str:
    """Plot test accuracy against training seconds and train loss against iterations.

    ``groups`` maps a panel title to its trials; one row of two panels per group. Returns
    ``path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 3.6 * len(groups)), squeeze=False)
    for (title, trials), (left, right) in zip(groups.items(), axes):
        for trial in trials:
            curve = [p for p in trial.curve() if p[2] is not None]
            if not curve:
                continue
            name = DESCRIPTIONS.get(trial.label, trial.label)
            left.plot(
                [p[1] for p in curve],
                [100 * p[2] for p in curve],
                marker="o",
                markersize=3,
                label=name,
            )
            right.plot(
                [p[0] for p in curve], [p[4] for p in curve], marker="o", markersize=3, label=name
            )
        left.set(title=f"{title}: test accuracy", xlabel="training seconds", ylabel="%")
        right.set(title=f"{title}: train loss", xlabel="iterations", ylabel="loss")
        left.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main(argv=None) -> str:
    """Print one experiment's table (``--out FILE``: also write it there); return it."""
    parser = argparse.ArgumentParser(prog="python -m trainreport.experiments", description=__doc__)
    parser.add_argument("kind", choices=("tta", "seeds", "residuals", "sweep", "scaling"))
    parser.add_argument("root", metavar="OUT", help="the experiment scripts' output folder")
    parser.add_argument(
        "--target",
        default="0.7,0.75",
        help="tta, seeds: test accuracy targets, comma-separated (default: %(default)s)",
    )
    parser.add_argument("--rate", default="1gbit", help="residuals: the network folder")
    parser.add_argument("--out", metavar="FILE", help="also write the Markdown here")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG curves")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.root):
        parser.exit(2, f"experiments: {args.root}: no such folder\n")
    if args.kind in ("tta", "seeds"):
        try:
            targets = [float(t) for t in args.target.split(",")]
        except ValueError:
            parser.exit(2, f"experiments: --target {args.target}: not comma-separated numbers\n")
    if args.kind == "seeds":
        text, groups, figure = seeds_table(args.root, targets), {}, None
    elif args.kind == "tta":
        text = tta_table(args.root, targets)
        groups = {r: _trials(os.path.join(args.root, r)) for r in rates(args.root)}
        figure = os.path.join(args.root, "tta_curves.png")
    elif args.kind == "residuals":
        text = residuals_table(args.root, args.rate)
        groups = {
            args.rate: [
                Trial(os.path.join(args.root, args.rate, n)) for n in ("spardl", "spardl_local")
            ]
        }
        figure = os.path.join(args.root, "residuals.png")
    elif args.kind == "sweep":
        text, groups, figure = sweep_table(args.root), {}, None
    else:
        text, groups, figure = scaling_table(args.root), {}, None
    print(text)
    if args.out:
        with open(args.out, "w") as stream:
            stream.write(text)
    if figure and groups and not args.no_plot:
        plot_curves(groups, figure)
    return text


if __name__ == "__main__":
    sys.exit(main() and 0)
