"""Predicted against published peak memory: BigScience's BLOOM-176B layout sweep (A100 80GB,
Megatron-DeepSpeed) and torchtitan's 2024 A100 rows (which state only whether a run fit).

    python bench/published_memory.py [--json] [--fit]

Each row of ``tests/data/published-a100/bigscience_tr11_176b_layout_sweep_a100.csv`` (the
team's chronicle, README beside it) becomes a ``TrialConfig`` on an explicit GPT shape (4h
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

``predict_memory_rows()`` returns both tables' predictions; ``bench/published_runs.py`` imports
it.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.config import GIB, TrialConfig, WorkloadSpec  # noqa: E402
from autotune.model.engine_memory import (  # noqa: E402
    BIGSCIENCE,
    TORCHTITAN_MULTINODE,
    engine_layout,
    estimate_engine_memory,
)
from autotune.model.memory import MemoryTraits  # noqa: E402
from autotune.search.screen import allowance, predicted_to_fit  # noqa: E402
from autotune.shapes import ModelShape  # noqa: E402

DATA = ROOT / "tests" / "data" / "published-a100"
SWEEP = DATA / "bigscience_tr11_176b_layout_sweep_a100.csv"
TORCHTITAN_A100 = DATA / "torchtitan_a100_2024.csv"
LLAMA_SHAPES = {  # layers, hidden, heads, KV heads, MLP width, vocabulary (the models' configs)
    "Llama 3.1 8B": (32, 4096, 32, 8, 14336, 128256),
    "Llama 3.1 70B": (80, 8192, 64, 8, 28672, 128256),
    "Llama 2 13B": (40, 5120, 40, 40, 13824, 32000),
    "Llama 2 70B": (80, 8192, 64, 8, 28672, 32000),
}
TORCHTITAN_AC = {
    "no": ("none", "op"),
    "full": ("full", "op"),
    "selective op": ("selective", "op"),
    "selective layer": ("selective", "layer"),
}
"""torchtitan's AC names → (the config's mode, what 'selective' means for the engine)."""
BLOOM_VOCAB = 250_880
"""BLOOM's vocabulary as trained (250,680 tokens padded to 250,880; the sweep writes '250k')."""
A100_BYTES = 80 * GIB
"""A100 80GB: 81,920 MiB as nvidia-smi reports it (the sweep's largest running figure is 80GB)."""
STATED_UNIT = GIB
"""The sweep's 'GB' is nvidia-smi's MiB/1024 (GiB): its largest figure, 80GB, is the card's
81,920 MiB."""


@dataclass(frozen=True, slots=True)
class MemoryRow:
    """One published row: the layout as a config, the engine's traits, what was stated."""

    index: int
    table: str
    config: TrialConfig
    shape: ModelShape
    traits: MemoryTraits
    stated_bytes: int | None
    """The stated peak (None: not stated, or the row ran out of memory)."""
    oom: bool
    limit_bytes: int


@dataclass(frozen=True, slots=True)
class MemoryPrediction:
    row: MemoryRow
    predicted_bytes: int

    @property
    def fits(self) -> bool:
        """The model's verdict: the predicted peak within the card."""
        return self.predicted_bytes <= self.row.limit_bytes

    @property
    def kept(self) -> bool:
        """``autotune rank``'s verdict: the predicted peak with the memory screen's allowances
        for the engine (``search.screen.allowance``: the model margin, and the device's reserve
        and context where the traits do not count them)."""
        return predicted_to_fit(self.predicted_bytes, self.row.limit_bytes, "cuda", self.row.traits)

    @property
    def error(self) -> float | None:
        if self.row.stated_bytes is None:
            return None
        return self.predicted_bytes / self.row.stated_bytes - 1


def bigscience_rows(path: Path = SWEEP) -> list[MemoryRow]:
    """The sweep's rows with a stated memory or an OOM, as configs (rows whose DP·TP·PP is
    not the GPU count, an inconsistency of the source, are left out)."""
    rows = []
    with open(path, newline="") as f:
        for i, r in enumerate(csv.DictReader(f)):
            if r["status"] not in ("ok", "OOM"):
                continue
            dp, tp, pp = (
                int(r[k]) for k in ("data_parallel", "tensor_parallel", "pipeline_parallel")
            )
            if dp * tp * pp != int(r["num_gpus"]):
                continue
            mem = r["max_mem_per_gpu"].removesuffix("GB")
            stated = int(float(mem) * STATED_UNIT) if mem and mem != "OOM" else None
            if stated is None and r["status"] == "ok":
                continue
            h, layers = int(r["hidden_size"]), int(r["num_layers"])
            heads, seq = int(r["attention_heads"]), int(r["seq_len"])
            shape = ModelShape(
                family="gpt",
                num_layers=layers,
                hidden_size=h,
                num_heads=heads,
                num_kv_heads=heads,
                ffn_hidden_size=4 * h,
                vocab_size=BLOOM_VOCAB,
                max_seq_len=seq,
                tied_embeddings=True,
            )
            bf16 = r["precision"].startswith("bf16")
            config = TrialConfig(
                workload=WorkloadSpec(
                    workload="explicit:bigscience",
                    seq_len=seq,
                    global_batch_size=int(r["global_batch_size"]),
                ),
                world_size=dp * tp * pp,
                tp_degree=tp,
                pp_degree=pp,
                zero_stage=int(r["zero_stage"]),
                micro_batch_size=int(r["micro_batch_size"]),
                activation_checkpointing="full",
                pp_schedule="1f1b",
                device="cuda",
                precision="bf16-mixed" if bf16 else "16-mixed",
            )
            optimizer = (
                "deepspeed-bf16"
                if r["precision"].startswith("bf16 (BF16 optimizer")
                else "deepspeed-fp16"
            )
            traits = dataclasses.replace(
                BIGSCIENCE,
                optimizer=optimizer,
                embedding_counts_as_layer="transformer|embed" in r["notes"],
            )
            rows.append(
                MemoryRow(
                    i, "bigscience", config, shape, traits, stated, r["status"] == "OOM", A100_BYTES
                )
            )
    return rows


def torchtitan_rows(path: Path = TORCHTITAN_A100) -> list[MemoryRow]:
    """torchtitan's A100 rows as FSDP configs (no memory stated: OOM or ran)."""
    rows = []
    with open(path, newline="") as f:
        for i, r in enumerate(csv.DictReader(f)):
            layers, h, heads, kv, ffn, vocab = LLAMA_SHAPES[r["model"]]
            seq = int(r["seq_len"].split()[0])
            batch, gpus = int(r["local_batch_size"]), int(r["num_gpus"])
            shape = ModelShape(
                family="llama",
                num_layers=layers,
                hidden_size=h,
                num_heads=heads,
                num_kv_heads=kv,
                ffn_hidden_size=ffn,
                vocab_size=vocab,
                max_seq_len=seq,
            )
            ac, selective = TORCHTITAN_AC[r["activation_checkpointing"]]
            config = TrialConfig(
                workload=WorkloadSpec(
                    workload="explicit:torchtitan", seq_len=seq, global_batch_size=batch * gpus
                ),
                world_size=gpus,
                zero_stage=3,
                micro_batch_size=batch,
                activation_checkpointing=ac,
                device="cuda",
                precision="bf16-mixed",
            )
            traits = dataclasses.replace(TORCHTITAN_MULTINODE, selective_mode=selective)
            rows.append(
                MemoryRow(
                    i, "torchtitan", config, shape, traits, None, r["mfu"] == "OOM", A100_BYTES
                )
            )
    return rows


def predict(rows: list[MemoryRow], traits_override: dict | None = None) -> list[MemoryPrediction]:
    out = []
    for row in rows:
        traits = dataclasses.replace(row.traits, **(traits_override or {}))
        # the layout as the engine runs it (sequence parallelism with TP where it turns it on)
        est = estimate_engine_memory(
            engine_layout(row.config, traits), row.shape, traits, device_type="cuda"
        )
        out.append(MemoryPrediction(row, est.total))
    return out


def predict_memory_rows() -> list[MemoryPrediction]:
    """Every BigScience row with a stated memory or an OOM (the shipped ``BIGSCIENCE``
    traits), then torchtitan's A100 rows (for ``bench/published_runs.py``); each prediction's
    ``row.table`` says which."""
    return predict(bigscience_rows()) + predict(torchtitan_rows())


def fit_allocator(rows: list[MemoryRow]) -> tuple[float, float]:
    """(fragmentation, context GiB): least squares of stated = f · allocated + c over the
    even-numbered rows with a stated peak, allocated predicted with neither."""
    raw = predict(rows, {"fragmentation": 1.0, "context_bytes": 0})
    pairs = [
        (p.predicted_bytes / GIB, p.row.stated_bytes / GIB)
        for p in raw
        if p.row.stated_bytes is not None
    ][::2]
    mx = statistics.fmean(x for x, _ in pairs)
    my = statistics.fmean(y for _, y in pairs)
    f = sum((x - mx) * (y - my) for x, y in pairs) / sum((x - mx) ** 2 for x, _ in pairs)
    return f, my - f * mx


def mape(predictions: list[MemoryPrediction]) -> float:
    errors = [abs(p.error) for p in predictions if p.error is not None]
    return statistics.fmean(errors) if errors else float("nan")


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
