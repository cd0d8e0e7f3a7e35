"""The trainer's --residual-dtype: checked with the other flags (one line, exit status 2), and
a checkpoint of residuals kept in another dtype refused as any misfit (no mpiexec here; the
runs are in tests/test_trainer_sharded.py)."""

import pytest

import main_trainer
from tests.mpirun import FirstOf
from trainer import cli
from trainer.distributed import UsageError
from trainer.sharded import FSDPSync

SPARSE = ["--fsdp", "--method", "spardl"]


def parse(*flags):
    args, _ = cli.parse_settings(list(flags), FirstOf(4))
    return args


def test_the_flag_defaults_to_fp32_and_takes_bf16_in_a_sparse_sharded_run():
    assert parse(*SPARSE).residual_dtype == "fp32"
    assert parse("--fsdp").residual_dtype == "fp32"
    assert parse("--residual-dtype", "fp32").residual_dtype == "fp32"
    assert parse(*SPARSE, "--residual-dtype", "bf16").residual_dtype == "bf16"
    assert parse("--fsdp", "--method", "topk", "--residual-dtype", "bf16").residual_dtype == "bf16"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--method", "spardl"],
            "--residual-dtype bf16 without --fsdp or --hsdp: it sets how a sharded run's",
        ),
        ([], "--residual-dtype bf16 without --fsdp or --hsdp"),
        (["--fsdp"], "--residual-dtype bf16 with a native --fsdp run: FSDP's own reduction "),
        (["--fsdp", "--method", "dense"], "--residual-dtype bf16 with a native --fsdp run"),
        (["--fsdp", "--method", "ddp"], "--fsdp with ddp: a DDP method"),
        (["--fsdp", "--residual-dtype", "fp16"], "invalid choice: 'fp16'"),
    ],
)
def test_what_cannot_combine_with_bf16_residuals_is_one_line(flags, message):
    with pytest.raises(UsageError) as refused:
        parse("--residual-dtype", "bf16", *flags)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_refusal_exits_with_status_2(capsys):
    assert main_trainer.main(["--residual-dtype", "bf16"]) == 2
    assert "--residual-dtype bf16 without --fsdp or --hsdp" in capsys.readouterr().err


def _sharded(residual_dtype, comms=True):
    """An FSDPSync as far as ``state_mismatch`` looks (building one needs a process group)."""
    sync = FSDPSync.__new__(FSDPSync)
    sync.per_host, sync.name, sync.residual_dtype = None, "spardl", residual_dtype
    sync.comms = {"": object()} if comms else {}
    return sync


def _state(**more):
    return {"overlap": True, "fsdp": "fsdp", "method": "spardl", "numel": 10, **more}


def test_a_checkpoint_of_another_residual_dtype_does_not_fit():
    bf16 = _state(residual_dtype="bf16", comms={"": {"residual_dtype": "bf16"}})
    fp32 = _state(residual_dtype="fp32", comms={"": {"method": "spardl"}})
    assert _sharded("bf16").state_mismatch(bf16) is None
    assert _sharded("fp32").state_mismatch(fp32) is None
    assert _sharded("fp32").state_mismatch(bf16) == (
        "residual_dtype bf16 (this run: fp32, --residual-dtype)"
    )
    assert _sharded("bf16").state_mismatch(fp32) == (
        "residual_dtype fp32 (this run: bf16, --residual-dtype)"
    )
    # A state saved before the trainer recorded it: its modules' states say (fp32 by default).
    assert _sharded("fp32").state_mismatch(_state(comms={"": {"method": "spardl"}})) is None
    old_bf16 = _state(comms={"": {"residual_dtype": "bf16"}})
    assert "residual_dtype bf16" in _sharded("fp32").state_mismatch(old_bf16)
