"""Write PyTorch pipelining's per-rank action orders for the zero-bubble schedules as JSON,
the oracle that ``tests/workloads/test_schedules.py`` checks clustersim's generators against.

PyTorch is not a clustersim dependency: run this with any Python that has ``torch``
installed (CPU build is enough; no process group is created)::

    python experiments/reference/pytorch_pipelining/make_orders.py \
        > tests/workloads/golden/pytorch_zero_bubble_orders.json

Each schedule class computes its whole table in ``_calculate_single_rank_operations(rank)``
from three attributes; the script sets those on an instance built without ``__init__``
(which would need pipeline stages and a process group) and calls the method per rank.  Idle
slots (``None``) are dropped: clustersim's tables hold only the order, and its timing
model derives the idle time.

Each table is a list of strings, one per rank, its actions separated by spaces, in
clustersim's text form ``{rank}{kind}{microbatch}[@c{chunk}]``, with
PyTorch's ``I`` (input-gradient backward) as clustersim's ``B`` and the local chunk taken
from PyTorch's stage index: for ZB-V stage ``rank`` is chunk 0 and stage
``2*pp - 1 - rank`` chunk 1 (the "v" placement); for the interleaved zero-bubble schedule
with one stage per rank there is only chunk 0.
"""

from __future__ import annotations

import json
import sys

import torch
from torch.distributed.pipelining import schedules as S

KIND = {"F": "F", "I": "B", "W": "W", "B": "BW"}


def _orders(cls, pp: int, m: int, local_stages: int) -> list[str]:
    sched = cls.__new__(cls)
    sched.pp_group_size = pp
    sched._n_microbatches = m
    sched.n_local_stages = local_stages
    sched.num_stages = pp * local_stages
    if cls is S.ScheduleInterleavedZeroBubble:
        sched.number_of_rounds = max(1, m // pp)
        sched.microbatches_per_round = m // sched.number_of_rounds
    table = []
    for rank in range(pp):
        row = []
        for a in sched._calculate_single_rank_operations(rank):
            if a is None:
                continue
            stage = a.stage_index
            if cls is S.ScheduleZBVZeroBubble:
                chunk = 0 if stage == rank else 1
                assert stage in (rank, 2 * pp - 1 - rank)
            else:
                chunk = stage // pp
            kind = KIND[str(a.computation_type.value if hasattr(a.computation_type, "value") else a.computation_type)]
            row.append(f"{rank}{kind}{a.microbatch_index}" + (f"@c{chunk}" if chunk else ""))
        table.append(" ".join(row))
    return table


def main() -> None:
    out = {"torch_version": torch.__version__, "source": "torch/distributed/pipelining/schedules.py",
           "zb_v": {}, "zb_interleaved_one_stage": {}}
    for pp in (1, 2, 3, 4, 6, 8):
        for m in sorted({1, pp, 2 * pp - 1, 2 * pp, 2 * pp + 3, 3 * pp + 1, 24}):
            out["zb_v"][f"pp{pp}_m{m}"] = _orders(S.ScheduleZBVZeroBubble, pp, m, 2)
            if m >= pp and m % max(1, m // pp) == 0:
                out["zb_interleaved_one_stage"][f"pp{pp}_m{m}"] = _orders(S.ScheduleInterleavedZeroBubble, pp, m, 1)
    # one table row (a rank's order) per line keeps the file small and diffable
    sys.stdout.write(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
