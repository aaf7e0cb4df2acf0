"""Published peak memory as rows: BigScience's BLOOM-176B layout sweep (A100 80GB,
Megatron-DeepSpeed) and torchtitan's 2024 A100 rows (which state only whether a run fit), each a
``TrialConfig`` on an explicit shape with the engine's memory traits, and their predictions by
``engine_memory.estimate_engine_memory``. Read by ``bench/published_memory.py`` (which prints
the table), ``bench/published_runs.py`` and ``tests/validation/test_published_memory.py``; the
CSVs and their sources are in ``tests/validation/data/published-a100``.

Each row of ``bigscience_tr11_176b_layout_sweep_a100.csv`` (the team's chronicle) is trained as
Megatron-DeepSpeed trained it (``BIGSCIENCE``: ZeRO-1, full activation recomputation per layer,
1F1B, tensor parallelism without sequence parallelism, a vocabulary-parallel loss; fp16 or, from
02-28, DeepSpeed's BF16_Optimizer with fp32 gradient accumulation; the partition
'type:transformer|embedding' where the notes say so). The stated ``max_mem_per_gpu`` is read in
GiB (``STATED_UNIT``). The allocator factor of ``BIGSCIENCE`` is fitted on the even-numbered
rows with a stated figure (``fit_allocator``); the odd-numbered ones are predicted with it.

Each row of ``torchtitan_a100_2024.csv`` (FSDP over 64 A100 80GB) is predicted with
``TORCHTITAN_MULTINODE``, its 'selective layer' as torchtitan's ``layer`` mode (every second
block) and 'selective op' as ``op``; it states only a verdict (OOM or ran).
"""

from __future__ import annotations

import csv
import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path

from autotune.config import GIB, TrialConfig, WorkloadSpec
from autotune.model.engine_memory import (
    BIGSCIENCE,
    TORCHTITAN_MULTINODE,
    engine_layout,
    estimate_engine_memory,
)
from autotune.model.memory import MemoryTraits
from autotune.search.screen import predicted_to_fit
from autotune.shapes import ModelShape

from .published_rows import gpt_shape, llama_shape

DATA = Path(__file__).resolve().parents[1] / "validation" / "data" / "published-a100"
SWEEP = DATA / "bigscience_tr11_176b_layout_sweep_a100.csv"
TORCHTITAN_A100 = DATA / "torchtitan_a100_2024.csv"
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
            shape = gpt_shape(layers, h, heads, BLOOM_VOCAB, seq)
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
            seq = int(r["seq_len"].split()[0])
            batch, gpus = int(r["local_batch_size"]), int(r["num_gpus"])
            shape = llama_shape(r["model"], seq)
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
