"""Run under ``mpiexec -n 2``: main_trainer.main on each command line of a JSON list, in one job.

Every rank captures what each call prints; rank 0 writes, per command line, the exit status
and the output of both ranks (rank order) as JSON to the second argument. Starting one job for
all the bad command lines, instead of one each, saves a torch import per line.
"""

import contextlib
import io
import json
import sys

from mpi4py import MPI

import main_trainer

comm = MPI.COMM_WORLD
with open(sys.argv[1]) as stream:
    cases = json.load(stream)
results = []
for flags in cases:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main_trainer.main(flags)
    mine = {"status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}
    everyone = comm.gather(mine, root=0)
    if comm.Get_rank() == 0:
        results.append(
            {
                "statuses": [r["status"] for r in everyone],
                "stdout": "".join(r["stdout"] for r in everyone),
                "stderr": "".join(r["stderr"] for r in everyone),
            }
        )
if comm.Get_rank() == 0:
    with open(sys.argv[2], "w") as stream:
        json.dump(results, stream)
