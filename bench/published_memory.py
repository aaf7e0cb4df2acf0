"""Predicted against published peak memory: BigScience's BLOOM-176B layout sweep (A100 80GB,
Megatron-DeepSpeed) and torchtitan's 2024 A100 rows (which state only whether a run fit).

    python bench/published_memory.py [--json] [--fit]

Each row of ``tests/validation/data/published-a100/bigscience_tr11_176b_layout_sweep_a100.csv``
(the team's chronicle, README beside it) becomes a ``TrialConfig`` on an explicit GPT shape (4h
MLP, vocabulary 250,880) trained as Megatron-DeepSpeed trained it (``BIGSCIENCE``:
ZeRO-1, full activation recomputation per layer, 1F1B, tensor parallelism without sequence
parallelism, a vocabulary-parallel loss; fp16 or, from 02-28, DeepSpeed's BF16_Optimizer with
fp32 gradient accumulation; the partition 'type:transformer|embedding' where the notes say so)
and predicted by ``engine_memory.estimate_engine_memory``. Printed per row: the layout, the stated
``max_mem_per_gpu`` (GB as printed, taken as 10⁹ bytes... or GiB: see ``STATED_UNIT``), the
prediction, the error, whether ``autotune rank`` keeps the layout (the peak with the memory
screen's allowances for the engine: ``search.screen.allowance``), and the model's verdict against
80 GB (OOM rows must be predicted not to fit, ok rows to fit). Then the MAPE over rows with a
stated figure, and how many rows ``rank`` keeps.

The allocator factor of ``BIGSCIENCE`` (reserved / allocated and nvidia-smi's context) is
fitted on the even-numbered rows with a stated figure (``fit_allocator``) and the odd-numbered
ones are predicted with it (``--fit`` prints that fit).

Each row of ``torchtitan_a100_2024.csv`` (FSDP over 64 A100 80GB, Llama 2 13B/70B and Llama 3
8B/70B, the local batch and activation checkpointing each states) is predicted with
``TORCHTITAN_MULTINODE`` (eight nodes, so the multi-node launcher's allocator), its 'selective
layer' as torchtitan's default ``layer`` mode (every second block) and 'selective op' as
``op``; the check is the verdict: its two OOM rows must not fit, the others must.

The rows and their predictions are the testing kit's (``tests/testkit/published_memory.py``:
``predict_memory_rows()`` returns both tables' predictions, as ``bench/published_runs.py`` and
the validation suite read them); this script prints them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the checkout and its testing kit (testkit)

from testkit.published_memory import (  # noqa: E402
    MemoryPrediction,
    bigscience_rows,
    fit_allocator,
    mape,
    predict_memory_rows,
)

from autotune.config import GIB  # noqa: E402
from autotune.search.screen import allowance  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--fit",
        action="store_true",
        help="print the allocator factor fitted on the even-numbered rows",
    )
    args = ap.parse_args(argv)
    if args.fit:
        f, c = fit_allocator(bigscience_rows())
        print(f"fragmentation {f:.3f}, context {c:.2f} GiB (even-numbered rows)")
        return 0
    predictions = predict_memory_rows()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "table": p.row.table,
                        "row": p.row.index,
                        "stated_bytes": p.row.stated_bytes,
                        "oom": p.row.oom,
                        "predicted_bytes": p.predicted_bytes,
                        "fits": p.fits,
                        "kept_by_rank": p.kept,
                    }
                    for p in predictions
                ],
                indent=1,
            )
        )
        return 0
    bigscience = [p for p in predictions if p.row.table == "bigscience"]
    print(
        f"{'row':>4} {'h':>6} {'L':>4} {'a':>4} {'dp':>3} {'tp':>3} {'pp':>3} {'mb':>3} "
        f"{'optimizer':<15} {'stated':>7} {'pred':>7} {'err':>7}  rank     verdict"
    )
    for p in bigscience:
        c, s = p.row.config, p.row.shape
        stated = "OOM" if p.row.oom else f"{p.row.stated_bytes / GIB:.0f}"
        err = f"{p.error:+.1%}" if p.error is not None else "-"
        right = p.fits != p.row.oom
        print(
            f"{p.row.index:>4} {s.hidden_size:>6} {s.num_layers:>4} {s.num_heads:>4} "
            f"{c.dp_degree:>3} {c.tp_degree:>3} {c.pp_degree:>3} {c.micro_batch_size:>3} "
            f"{p.row.traits.optimizer:<15} {stated:>7} {p.predicted_bytes / GIB:>7.1f} "
            f"{err:>7}  {'kept' if p.kept else 'dropped':<7}  "
            f"{'fits' if p.fits else 'OOM'}{'' if right else '  WRONG'}"
        )
    stated = [p for p in bigscience if p.error is not None]
    wrong = [p for p in bigscience if p.fits == p.row.oom]
    print(
        f"BigScience: {len(stated)} rows with a stated peak, MAPE {mape(bigscience):.1%} "
        f"(odd-numbered, not fitted: {mape(stated[1::2]):.1%}), worst "
        f"{max(abs(p.error) for p in stated):.1%}; verdicts wrong on {len(wrong)} of "
        f"{len(bigscience)} (OOM rows {sum(p.row.oom for p in bigscience)})"
    )
    print(_rank_summary(bigscience))
    titan = [p for p in predictions if p.row.table == "torchtitan"]
    for p in titan:
        c, s = p.row.config, p.row.shape
        ac = c.activation_checkpointing
        if ac == "selective":
            ac += "/" + p.row.traits.selective_mode
        print(
            f"torchtitan {p.row.index:>2}: L{s.num_layers} h{s.hidden_size} V{s.vocab_size} "
            f"FSDP {c.dp_degree}, local batch {c.micro_batch_size} × seq "
            f"{c.workload.seq_len}, AC {ac}: {'OOM' if p.row.oom else 'ran'}, predicted "
            f"{p.predicted_bytes / GIB:.1f} GiB ({'fits' if p.fits else 'OOM'})"
            f"{'' if p.fits != p.row.oom else '  WRONG'}"
        )
    print(_rank_summary(titan))
    return 0


def _rank_summary(predictions: list[MemoryPrediction]) -> str:
    """How many of a table's rows ``autotune rank`` keeps: the rows that ran, and the OOM ones."""
    ran = [p for p in predictions if not p.row.oom]
    oom = [p for p in predictions if p.row.oom]
    rule = allowance("cuda", predictions[0].row.traits).describe()
    return (
        f"{predictions[0].row.table}: rank's screen ({rule}) keeps {sum(p.kept for p in ran)} of "
        f"the {len(ran)} rows that ran and {sum(p.kept for p in oom)} of the {len(oom)} OOM rows"
    )


if __name__ == "__main__":
    sys.exit(main())
