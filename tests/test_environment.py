"""Thread and MPICH yield defaults, chosen from the launcher's environment before MPI starts."""

import json
import os
import subprocess

import pytest

from allreducers.transports.environment import (
    YIELD,
    apply_launch_defaults,
    cluster_topology,
    launch_defaults,
    local_ranks,
)
from tests.mpirun import ROOT, command


@pytest.mark.parametrize(
    "environ,ranks",
    [
        ({}, 1),
        ({"PMI_SIZE": "8"}, 8),
        ({"PMI_SIZE": "8", "MPI_LOCALNRANKS": "4"}, 4),
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "3", "PMI_SIZE": "6"}, 3),
        ({"SLURM_NTASKS_PER_NODE": "4(x2)"}, 4),
        ({"MPI_LOCALNRANKS": "", "PMI_SIZE": "2"}, 2),
    ],
)
def test_ranks_on_this_host_come_from_the_launcher(environ, ranks):
    assert local_ranks(environ) == ranks


def test_defaults_share_the_cores_and_yield_only_when_oversubscribed():
    assert launch_defaults(cores=8, ranks=2) == {"OMP_NUM_THREADS": "4"}
    assert launch_defaults(cores=2, ranks=2) == {"OMP_NUM_THREADS": "1"}
    assert launch_defaults(cores=2, ranks=4) == {"OMP_NUM_THREADS": "1", **YIELD}


def test_the_users_settings_win():
    environ = {
        "MPI_LOCALNRANKS": str(len(os.sched_getaffinity(0)) + 1),
        "OMP_NUM_THREADS": "3",
        "MPIR_CVAR_POLLS_BEFORE_YIELD": "1000",
    }
    assert apply_launch_defaults(environ) == {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
    assert environ["OMP_NUM_THREADS"] == "3" and environ["MPIR_CVAR_POLLS_BEFORE_YIELD"] == "1000"


def test_too_late_once_mpi_started():
    from mpi4py import MPI

    assert MPI.Is_initialized()
    with pytest.raises(RuntimeError, match="before MPI starts"):
        apply_launch_defaults()  # this process's environment: nothing is changed


@pytest.mark.mpi
def test_the_trainer_sets_them_before_mpi_starts(tmp_path):
    """Twice as many ranks as cores, started with none of the variables set: one thread each,
    and MPICH told to yield (each rank writes what it saw to a file of its own)."""
    probe = (
        "import os, runpy, sys\n"
        "sys.argv = ['main_trainer.py', '--help']\n"
        "try:\n"
        "    runpy.run_path('main_trainer.py', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "import torch\n"
        f"with open(os.path.join({str(tmp_path)!r}, os.environ['PMI_RANK']), 'w') as seen:\n"
        "    polls = os.environ.get('MPIR_CVAR_POLLS_BEFORE_YIELD')\n"
        "    seen.write(f\"{os.environ['OMP_NUM_THREADS']} {polls} {torch.get_num_threads()}\")\n"
    )
    environ = {
        key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", *YIELD)
    }
    ranks = 2 * len(os.sched_getaffinity(0))
    result = subprocess.run(
        command(ranks, "-c", probe),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(environ, PYTHONPATH=ROOT),
    )
    assert result.returncode == 0, result.stderr
    assert [(tmp_path / str(rank)).read_text() for rank in range(ranks)] == ["1 1 1"] * ranks


def test_the_cluster_topology_is_read_from_spardl_cluster_and_checked():
    described = {"hosts": 4, "ranks_per_host": 2, "rates": ["1gbit"] * 4, "delay": None}
    assert cluster_topology({}) is None
    assert cluster_topology({"SPARDL_CLUSTER": json.dumps(described)}) == described
    for bad in ("not json", "[2, 2]", '{"ranks_per_host": 2}'):
        with pytest.raises(ValueError, match="SPARDL_CLUSTER=.* is not a JSON object with a"):
            cluster_topology({"SPARDL_CLUSTER": bad})
