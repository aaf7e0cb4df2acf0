"""Published A100 training runs as step-time rows: the layout each paper states, as a
``TrialConfig`` on an explicit shape, the engine that ran it, and the measured seconds per
iteration. Read by ``bench/published_runs.py``, ``bench/published_rank.py`` and
``tests/validation/test_published_runs.py`` (the CSVs under
``tests/validation/data/published-a100``).

Sources and conversions (``tests/validation/data/published-a100/README.md``):

- **SC21 Table 1** (Narayanan et al. 2021): iter_s = F / (X · GPUs), F = 96·B·s·l·h²·(1 + s/6h
  + V/16lh) (eq. 3), X the printed TFLOP/s per GPU. The paper prints no micro-batch or
  interleaving; the repository's reproduction script does (NVIDIA/Megatron-LM
  ``examples/sc21/run_table_1.sh``: MBS 16/16/16/8/4/2/2/1/1/1 and
  ``--num-layers-per-virtual-pipeline-stage`` 5/5/3/1 for 76B/145B/310B/530B; 39B and 1T
  not interleaved; ``--recompute-method uniform``: full recomputation).
- **SC21 Table 2**: the same F. PTD rows: model parallel 96 = TP 8 × PP 12 (175B), 280 = TP 8 ×
  PP 35 (530B), micro-batch 1, not interleaved (not stated). ZeRO-3 rows: DeepSpeed ZeRO-3, DP =
  GPUs, the printed micro-batch, no communication overlap (DeepSpeed's ``overlap_comm`` default,
  false; the paper does not say).
- **Korthikanti et al. 2022 Tables 3/5**: the printed iteration time.
- **torchtitan 2024** (A100 rows): iter_s = local_batch · seq / wps.
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from autotune.config import TrialConfig, WorkloadSpec
from autotune.model.perf_model import EngineTraits, engine_traits
from autotune.shapes import ModelShape

DATA = Path(__file__).resolve().parents[1] / "validation" / "data" / "published-a100"
SC21_VOCAB = 51_200
SC21_MICRO_BATCH = {
    1.7: 16,
    3.6: 16,
    7.5: 16,
    18.4: 8,
    39.1: 4,
    76.1: 2,
    145.6: 2,
    310.1: 1,
    529.6: 1,
    1008.0: 1,
}
"""``examples/sc21/run_table_1.sh`` of NVIDIA/Megatron-LM: MBS per model size."""
SC21_LAYERS_PER_VIRTUAL = {76.1: 5, 145.6: 5, 310.1: 3, 529.6: 1}
"""The same script's ``--num-layers-per-virtual-pipeline-stage`` (others: not interleaved)."""
SC21_PTD_LAYOUT = {96: (8, 12), 280: (8, 35)}
"""SC21 Table 2's model-parallel size as TP × PP (TP 8 inside the DGX, §5.5)."""


def megatron_2021() -> EngineTraits:
    """Megatron-LM as SC21 and Korthikanti et al. ran it: no TP-comm overlap (Transformer
    Engine's userbuffers came later), the gradient all-reduce after the pipeline flush (text of
    Korthikanti et al. §6.3: "no gradient all-reduce overlap"), fp32 gradient all-reduce
    in fp16 (``--accumulate-allreduce-grads-in-fp32`` off), sequence parallelism only where a row
    says so; the fused masked softmax of the scores rather than flash attention is the rows'
    ``attention="eager"``."""
    return dataclasses.replace(
        engine_traits("megatron"),
        name="megatron-2021",
        tp_comm_overlap=0.0,
        grad_reduce_overlap=False,
        param_gather_overlap=False,
        distributed_optimizer=False,
        fp32_grad_reduce=False,
        sequence_parallel=False,
    )


@dataclass(frozen=True, slots=True)
class TimeRow:
    """One published run: its layout, the engine, the measured seconds per iteration."""

    table: str
    label: str
    config: TrialConfig
    shape: ModelShape
    engine: EngineTraits
    measured_s: float


def gpt_shape(layers: int, h: int, heads: int, vocab: int, seq: int) -> ModelShape:
    """The published GPTs: multi-head attention, a 4h MLP, tied embeddings."""
    return ModelShape(
        family="gpt",
        num_layers=layers,
        hidden_size=h,
        num_heads=heads,
        num_kv_heads=heads,
        ffn_hidden_size=4 * h,
        vocab_size=vocab,
        max_seq_len=seq,
        tied_embeddings=True,
    )


def _config(
    shape: ModelShape,
    *,
    gpus: int,
    batch: int,
    tp: int,
    pp: int,
    mb: int,
    v: int,
    ac: str,
    zero: int = 0,
    sp: bool = False,
    attention: str = "eager",
    name: str = "explicit:published",
) -> TrialConfig:
    schedule = "interleaved_1f1b" if v > 1 else "1f1b"
    return TrialConfig(
        workload=WorkloadSpec(workload=name, seq_len=shape.max_seq_len, global_batch_size=batch),
        world_size=gpus,
        tp_degree=tp,
        pp_degree=pp,
        zero_stage=zero,
        micro_batch_size=mb,
        activation_checkpointing=ac,
        pp_schedule=schedule,
        virtual_stages=max(v, 2),
        sequence_parallel=sp and tp > 1,
        attention=attention,
        device="cuda",
        precision="16-mixed",
    )


def sc21_flops(batch: int, seq: int, layers: int, h: int, vocab: int) -> float:
    """SC21 eq. 3: F = 96·B·s·l·h²·(1 + s/6h + V/16lh)."""
    return 96 * batch * seq * layers * h * h * (1 + seq / (6 * h) + vocab / (16 * layers * h))


def sc21_table1(path: Path = DATA / "megatron_sc21_table1.csv") -> list[TimeRow]:
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            size = float(r["params_billion"])
            layers, h = int(r["num_layers"]), int(r["hidden_size"])
            heads = int(r["attention_heads"])
            seq, gpus, batch = int(r["seq_len"]), int(r["num_gpus"]), int(r["global_batch_size"])
            tp, pp = int(r["tensor_parallel"]), int(r["pipeline_parallel"])
            per_virtual = SC21_LAYERS_PER_VIRTUAL.get(size)
            v = layers // pp // per_virtual if per_virtual else 1
            shape = gpt_shape(layers, h, heads, SC21_VOCAB, seq)
            config = _config(
                shape,
                gpus=gpus,
                batch=batch,
                tp=tp,
                pp=pp,
                mb=SC21_MICRO_BATCH[size],
                v=v,
                ac="full",
            )
            x = float(r["achieved_teraflops_per_gpu"]) * 1e12
            measured = sc21_flops(batch, seq, layers, h, SC21_VOCAB) / (x * gpus)
            rows.append(
                TimeRow(
                    "sc21-t1",
                    f"{r['params_billion']}B/{gpus}",
                    config,
                    shape,
                    megatron_2021(),
                    measured,
                )
            )
    return rows


def sc21_table2(path: Path = DATA / "megatron_sc21_table2_zero3_vs_ptdp.csv") -> list[TimeRow]:
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            layers, h = int(r["num_layers"]), int(r["hidden_size"])
            heads = int(r["attention_heads"])
            seq, gpus = int(r["seq_len"]), int(r["num_gpus"])
            batch = int(r["global_batch_size"].rstrip("*"))
            shape = gpt_shape(layers, h, heads, SC21_VOCAB, seq)
            mb = int(r["micro_batch_size"])
            if r["scheme"].startswith("ZeRO"):
                config = dataclasses.replace(
                    _config(
                        shape, gpus=gpus, batch=batch, tp=1, pp=1, mb=mb, v=1, ac="full", zero=3
                    ),
                    overlap_enabled=False,
                )
                engine = engine_traits("deepspeed")
            else:
                tp, pp = SC21_PTD_LAYOUT[int(r["model_parallel_size"])]
                config = _config(shape, gpus=gpus, batch=batch, tp=tp, pp=pp, mb=mb, v=1, ac="full")
                engine = megatron_2021()
            x = float(r["achieved_teraflops_per_gpu"]) * 1e12
            measured = sc21_flops(batch, seq, layers, h, SC21_VOCAB) / (x * gpus)
            label = f"{r['params_billion']}B/{gpus} {'Z3' if config.zero_stage else 'PTD'}"
            rows.append(TimeRow("sc21-t2", label, config, shape, engine, measured))
    return rows


def korthikanti(path: Path = DATA / "korthikanti2022_tables3_5_end_to_end.csv") -> list[TimeRow]:
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if not r["iteration_time_s"] or r["activation_recompute"] not in ("full", "selective"):
                continue
            layers, h = int(r["num_layers"]), int(r["hidden_size"])
            heads = int(r["attention_heads"])
            seq, gpus, batch = int(r["seq_len"]), int(r["num_gpus"]), int(r["global_batch_size"])
            tp, pp = int(r["tensor_parallel"]), int(r["pipeline_parallel"])
            v = int(r["interleaved_stages"] or 1)
            shape = gpt_shape(layers, h, heads, SC21_VOCAB, seq)
            config = _config(
                shape,
                gpus=gpus,
                batch=batch,
                tp=tp,
                pp=pp,
                mb=int(r["micro_batch_size"]),
                v=v,
                ac=r["activation_recompute"],
                sp=r["sequence_parallel"] == "yes",
            )
            label = f"{r['model'].split()[0]}/{gpus} {r['activation_recompute']}"
            rows.append(
                TimeRow(
                    "korthikanti",
                    label,
                    config,
                    shape,
                    megatron_2021(),
                    float(r["iteration_time_s"]),
                )
            )
    return rows


LLAMA_SHAPES = {  # layers, hidden, heads, KV heads, MLP width, vocabulary (the models' configs)
    "Llama 3.1 8B": (32, 4096, 32, 8, 14336, 128256),
    "Llama 3.1 70B": (80, 8192, 64, 8, 28672, 128256),
    "Llama 2 13B": (40, 5120, 40, 40, 13824, 32000),
    "Llama 2 70B": (80, 8192, 64, 8, 28672, 32000),
}


def llama_shape(model: str, seq: int) -> ModelShape:
    """One of torchtitan's ``LLAMA_SHAPES`` at sequence length ``seq``."""
    layers, h, heads, kv, ffn, vocab = LLAMA_SHAPES[model]
    return ModelShape(
        family="llama",
        num_layers=layers,
        hidden_size=h,
        num_heads=heads,
        num_kv_heads=kv,
        ffn_hidden_size=ffn,
        vocab_size=vocab,
        max_seq_len=seq,
    )


TORCHTITAN_AC = {
    "no": "none",
    "full": "full",
    "selective op": "selective",
    "selective layer": "full",
}
"""torchtitan's AC names → the config's mode: ``selective`` ``op`` is the torchtitan engine's
selective; ``layer`` checkpoints every ``selective_ac_option``-th block (2 in its configs),
full AC on half the layers (``ac_layers`` = L/2)."""


def torchtitan(path: Path = DATA / "torchtitan_a100_2024.csv") -> list[TimeRow]:
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["wps_tokens_per_sec_per_gpu"] in ("", "OOM"):
                continue
            seq = int(r["seq_len"].split()[0])
            mb, gpus = int(r["local_batch_size"]), int(r["num_gpus"])
            shape = llama_shape(r["model"], seq)
            config = TrialConfig(
                workload=WorkloadSpec(
                    workload="explicit:torchtitan", seq_len=seq, global_batch_size=mb * gpus
                ),
                world_size=gpus,
                zero_stage=3,
                micro_batch_size=mb,
                activation_checkpointing=TORCHTITAN_AC[r["activation_checkpointing"]],
                ac_layers=shape.num_layers // 2
                if r["activation_checkpointing"] == "selective layer"
                else None,
                attention="sdpa",
                device="cuda",
                precision="bf16-mixed",
            )
            label = f"{r['model']} {r['activation_checkpointing']} b{mb}"
            rows.append(
                TimeRow(
                    "torchtitan",
                    label,
                    config,
                    shape,
                    engine_traits("torchtitan"),
                    mb * seq / float(r["wps_tokens_per_sec_per_gpu"]),
                )
            )
    return rows


def all_rows() -> list[TimeRow]:
    return sc21_table1() + sc21_table2() + korthikanti() + torchtitan()
