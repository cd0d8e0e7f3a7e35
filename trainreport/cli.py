"""The command line of ``scripts/report.py``."""

from __future__ import annotations

import argparse
import os
import sys

from trainreport.plots import FIGURES, plot
from trainreport.runs import load_run
from trainreport.settings import label_runs
from trainreport.tables import markdown

__all__ = ["DESCRIPTION", "main"]

DESCRIPTION = """Paper-style tables and plots from the metrics.jsonl of several training runs.

    scripts/report.py runs/vgg16_spardl runs/vgg16_oktopk runs/vgg16_dense --out report/

Each RUN_DIR holds the trainer's metrics.jsonl (one JSON object per epoch). Runs are grouped by
the model, data set, worker count and network their rows record, and labelled by method and by
the settings (density, teams, sag, srs, wire; PowerSGD's rank and start_iter) in which runs of
one method differ, never by folder name: runs that would share a label also get the other
settings their rows record in which they differ (momentum, batch_size, ...), and runs that
record the same settings (repeats such as seeds, which rows do not record) are numbered #1,
#2, ... in the order given. The PyTorch-DDP methods (ddp, ddp_fp16, ddp_bf16, powersgd) are
methods like the others. Within a group:

- time per iteration (the paper's time-breakdown table): training seconds per iteration and
  their split into compute (compute_seconds; in rows of older trainers without it,
  epoch_seconds - sync_seconds), selection, communication and the rest of synchronization
  (packing, accumulation), the synchronization's whole time and the part of it exposed after
  compute (exposed_sync_seconds), the overlap (the share of synchronization hidden behind
  compute: 1 - exposed / sync, 0% without overlap), the rest of the iteration (neither compute
  nor exposed synchronization: loading, the optimizer step), megabytes sent per rank per
  iteration, and the speed-up of the reference method (--reference, default spardl) over every
  run, in total time and in synchronization time;
- accuracy: final and best test accuracy, final train and test loss, epochs, wall time (for
  masked-LM pre-training, BERT, rows record task masked-lm: the accuracy is masked-token
  accuracy on held-out text, the losses the masked-LM loss, plus test perplexity); with
  --target-accuracy A also the epoch and wall time at which each run first reached test
  accuracy A (the paper's time-to-accuracy), and the reference method's speed-up in that time.

Runs of one setup on several networks (scripts/paper_tables.sh) also get a table of time per
iteration by network. Iterations per epoch are epoch_iters when present, else the difference
of the cumulative iters; where the epoch number goes back in a file (a re-run or a resume in
the same directory) only the latest history counts. The Markdown goes to stdout and, with
--out DIR, to DIR/report.md with the figures accuracy_vs_epoch.png, accuracy_vs_time.png,
time_split.png and speedup.png.
"""


def main(argv=None) -> str:
    """Print the report (with ``--out`` also write report.md and the figures); return it."""
    parser = argparse.ArgumentParser(
        prog="report.py",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", help="directories holding metrics.jsonl"
    )
    parser.add_argument(
        "--out", metavar="DIR", help="also write report.md and the figures into DIR"
    )
    parser.add_argument(
        "--reference",
        default="spardl",
        help="method whose speed-up is reported (default: %(default)s)",
    )
    parser.add_argument(
        "--target-accuracy",
        type=float,
        metavar="A",
        help="also report when each run first reached test accuracy A (a fraction "
        "in (0, 1], e.g. 0.9) and the reference's speed-up in that time",
    )
    args = parser.parse_args(argv)
    if args.target_accuracy is not None and not 0.0 < args.target_accuracy <= 1.0:
        parser.error(
            f"--target-accuracy takes a fraction in (0, 1] (test accuracy as logged, "
            f"e.g. 0.9 for 90%), got {args.target_accuracy}"
        )
    if args.out:  # made now, so that a path that cannot be one fails before any work
        try:
            os.makedirs(args.out, exist_ok=True)
        except OSError as error:
            parser.error(f"--out {args.out}: {error.strerror}")
        if not os.access(args.out, os.W_OK):
            parser.error(f"--out {args.out}: not writable")
    try:
        runs = label_runs([load_run(path) for path in args.runs])
    except ValueError as error:
        parser.exit(2, f"report.py: {error}\n")
    if all(run.method != args.reference for run in runs):
        print(
            f"note: no run of --reference {args.reference}, so no speedups; methods here: "
            f"{', '.join(sorted({run.method for run in runs}))}",
            file=sys.stderr,
        )
    text = markdown(runs, args.reference, args.target_accuracy, FIGURES if args.out else ())
    print(text)
    if args.out:
        with open(os.path.join(args.out, "report.md"), "w") as handle:
            handle.write(text)
        plot(runs, args.out, args.reference, args.target_accuracy)
    return text
