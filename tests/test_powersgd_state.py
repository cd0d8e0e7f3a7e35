"""trainer.powersgd_state's own copy of PowerSGD's compression rule agrees with torch's hook."""

import itertools

from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

from trainer.powersgd_state import worth_compressing


def test_the_compression_rule_is_torchs():
    sizes = (1, 2, 3, 7, 64, 513)
    for rows, columns, rank, rate in itertools.product(sizes, sizes, (1, 2, 4, 32), (0.5, 1, 2, 8)):
        expected = powerSGD_hook._should_compress(rows, columns, rank, rate)[0]
        assert worth_compressing(rows, columns, rank, rate) == expected, (rows, columns, rank, rate)
