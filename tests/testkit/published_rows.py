"""Published A100 training runs as step-time rows: the layout each paper states, as a
``TrialConfig`` on an explicit shape, the engine that ran it, and the measured seconds per
iteration. Read by ``bench/published_runs.py``, ``bench/published_rank.py`` and
``tests/validation/test_published_runs.py`` (the CSVs under
``tests/validation/data/published-a100``), and NVIDIA's DGX-H100 FP8 runs (``h100_rows``: the
CSVs under ``tests/validation/data/published-h100-fp8``).

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
from autotune.model.engines import EngineProfile
from autotune.model.perf_model import engine_traits
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


def megatron_2021() -> EngineProfile:
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
    """One published run: its layout, the engine, the measured seconds per iteration, and the
    built-in cluster it ran on."""

    table: str
    label: str
    config: TrialConfig
    shape: ModelShape
    engine: EngineProfile
    measured_s: float
    cluster: str = "a100-sxm4-80gb"


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
    "Llama 2 7B": (32, 4096, 32, 32, 11008, 32000),
    "Llama 3.1 405B": (126, 16384, 128, 8, 53248, 128256),
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


# ---- DGX-H100, NVIDIA's NeMo and Megatron-Bridge (FP8) --------------------------------------
H100_DATA = DATA.parent / "published-h100-fp8"
H100_CLUSTER = "h100-sxm"
H100_FITTED = ("nemo-24.07",)
"""The H100 table the H100 cluster is to be fitted on; the others are predicted."""
NEMO_VOCAB = {"gpt3": 51200, "llama2": 32000, "llama3": 128256, "nemotron": 256000}
"""NeMo's ``LLM_VOCAB_SIZE_MAP`` (``nemo/utils/flops_formulas.py``): the padded vocabularies
its FLOPs and its runs use."""
NEMOTRON_SHAPES = {  # layers, hidden, heads, KV heads, MLP width
    "Nemotron-8B": (32, 4096, 32, 32, 16384),
    "Nemotron-22B": (40, 6144, 48, 8, 24576),
    "Nemotron-340B": (96, 18432, 96, 8, 73728),
}
"""NVIDIA/NeMo ``nemo/collections/llm/gpt/model/nemotron.py`` (Nemotron3Config8B,
Nemotron4Config22B, Nemotron4Config340B): LayerNorm, a squared-ReLU MLP of two Linears (h → f →
h), no biases, untied head, RoPE. As a ``gpt`` shape: the same tensors but for GPT's learned
position table (s·h, 0.3% of the 8B's parameters), and the MLP's two GEMMs are the same."""
GPT3_SHAPES = {  # layers, hidden, heads
    "GPT3-5B": (24, 4096, 32),
    "GPT3-20B": (44, 6144, 48),
    "GPT3-175B": (96, 12288, 96),
}
"""NVIDIA/NeMo ``nemo/collections/llm/gpt/model/base.py`` (GPTConfig5B, GPTConfig20B,
GPTConfig175B): a 4h GELU MLP, learned positions, the head tied to the embedding."""
H100_LLAMA = {
    "LLAMA2-7B": "Llama 2 7B",
    "LLAMA2-13B": "Llama 2 13B",
    "LLAMA2-70B": "Llama 2 70B",
    "LLAMA3-8B": "Llama 3.1 8B",
    "LLAMA3_8B": "Llama 3.1 8B",
    "LLAMA3-70B": "Llama 3.1 70B",
    "LLAMA3_70B": "Llama 3.1 70B",
    "LLAMA3.1_405B": "Llama 3.1 405B",
}
"""The tables' Llama names → ``LLAMA_SHAPES`` (Llama 3 and 3.1 share their 8B and 70B shapes)."""


def h100_shape(model: str, seq: int) -> ModelShape:
    """The shape of one of the H100 tables' models at sequence length ``seq``."""
    if model in H100_LLAMA:
        return llama_shape(H100_LLAMA[model], seq)
    if model in GPT3_SHAPES:
        layers, h, heads = GPT3_SHAPES[model]
        return gpt_shape(layers, h, heads, NEMO_VOCAB["gpt3"], seq)
    layers, h, heads, kv, ffn = NEMOTRON_SHAPES[model]
    return ModelShape("gpt", layers, h, heads, kv, ffn, NEMO_VOCAB["nemotron"], seq)


def nemo_config(
    shape: ModelShape,
    *,
    gpus: int,
    batch: int,
    mb: int,
    tp: int,
    pp: int,
    cp: int,
    v: int,
    zero: int = 1,
) -> TrialConfig:
    """A NeMo / Megatron-Bridge run as the tables state it: FP8 linears beside bf16 compute
    (Transformer Engine; ``float8``), the distributed optimizer (NeMo's default; ``zero`` 1) or
    Megatron FSDP (``zero`` 3), sequence parallelism with TP, flash attention, the interleaved
    schedule where a virtual pipeline is stated, no recomputation (none stated)."""
    return TrialConfig(
        workload=WorkloadSpec(
            workload="explicit:nemo", seq_len=shape.max_seq_len, global_batch_size=batch
        ),
        world_size=gpus,
        tp_degree=tp,
        pp_degree=pp,
        cp_degree=cp,
        zero_stage=zero,
        micro_batch_size=mb,
        pp_schedule="interleaved_1f1b" if v > 1 else "1f1b",
        virtual_stages=max(v, 2),
        sequence_parallel=tp > 1,
        attention="sdpa",
        float8=True,
        device="cuda",
        precision="bf16-mixed",
    )


def _int(cell: str, default: int = 1) -> int:
    """A layout cell: blank or ``n/a`` (not stated, or not applicable) reads as ``default``."""
    return default if cell in ("", "n/a") else int(cell)


def _h100_row(table: str, label: str, config: TrialConfig, shape: ModelShape, s: float):
    return TimeRow(table, label, config, shape, engine_traits("megatron"), s, H100_CLUSTER)


def _throughput_row(r: dict, table: str, label: str, **extra) -> TimeRow:
    """A row of NVIDIA's tables that state the layout's columns and tokens/s/GPU:
    iter_s = GBS · seq / (tokens/s/GPU · GPUs)."""
    seq, gpus, batch = int(r["seq_len"]), int(r["num_gpus"]), int(r["global_batch_size"])
    shape = h100_shape(r["model"], seq)
    config = nemo_config(
        shape,
        gpus=gpus,
        batch=batch,
        mb=int(r["micro_batch_size"]),
        tp=int(r["tensor_parallel"]),
        pp=int(r["pipeline_parallel"]),
        cp=int(r["context_parallel"]),
        v=_int(r["virtual_pipeline"]),
        **extra,
    )
    measured = batch * seq / (float(r["tokens_per_sec_per_gpu"]) * gpus)
    return _h100_row(table, f"{label}{r['model']}/{gpus}", config, shape, measured)


def nemo_2407(path: Path = H100_DATA / "nemo_24.07_h100_fp8_pretrain.csv") -> list[TimeRow]:
    """NeMo 24.07's FP8 pre-training table."""
    with open(path, newline="") as f:
        return [_throughput_row(r, "nemo-24.07", "") for r in csv.DictReader(f)]


def bridge_h100(
    path: Path = H100_DATA / "megatron_bridge_perf_summary_h100_dense_llama.csv",
) -> list[TimeRow]:
    """Megatron-Bridge's DGX-H100 dense Llama rows: FSDP > 0 is Megatron FSDP over the data
    parallel ranks (ZeRO-3), 0 or blank the distributed optimizer; iter_s as NeMo's."""
    with open(path, newline="") as f:
        return [
            _throughput_row(
                r, "bridge-h100", f"{r['release']} ", zero=3 if _int(r["fsdp"], 0) > 0 else 1
            )
            for r in csv.DictReader(f)
        ]


def nemo_llama2_flops(batch: int, seq: int, shape: ModelShape) -> float:
    """NeMo's model FLOPs of a Llama 2 step (``nemo/utils/flops_formulas.py`` ``llama2`` as of
    24.07, attention counted whole, not causal): B·s·l·h²·(12 + 12·g/a + 18·f/h + 12·s/h +
    6·V/(l·h)). It reproduces the 24.07 table's printed TFLOP/s from its tokens/s (Llama 2 7B:
    16,934 tokens/s/GPU × 46.1 GFLOP per token = 780 TFLOP/s)."""
    h, layers = shape.hidden_size, shape.num_layers
    per = (
        12
        + 12 * shape.num_kv_heads / shape.num_heads
        + 18 * shape.ffn_hidden_size / h
        + 12 * seq / h
        + 6 * shape.vocab_size / (layers * h)
    )
    return batch * seq * layers * h * h * per


def nemo_long_sequence(
    path: Path = H100_DATA / "nemo_long_sequence_h100_llama2_7b_cp.csv",
) -> list[TimeRow]:
    """NeMo's long-sequence Llama 2 7B rows, the with-CP runs (the only layouts stated):
    iter_s = model FLOPs / (TFLOP/s per GPU · GPUs); micro-batch 1 (not stated)."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            seq, gpus = int(r["seq_len_k"]) * 1024, int(r["num_gpus"])
            batch = int(r["global_batch_size"])
            shape = h100_shape(r["model"], seq)
            config = nemo_config(
                shape,
                gpus=gpus,
                batch=batch,
                mb=1,
                tp=int(r["tensor_parallel"]),
                pp=int(r["pipeline_parallel"]),
                cp=int(r["context_parallel"]),
                v=1,
            )
            x = float(r["with_cp_tflops_per_gpu"]) * 1e12
            measured = nemo_llama2_flops(batch, seq, shape) / (x * gpus)
            label = f"{r['seq_len_k']}K/{gpus} cp{r['context_parallel']}"
            rows.append(_h100_row("nemo-long-seq", label, config, shape, measured))
    return rows


def h100_rows() -> list[TimeRow]:
    """Every row of the three H100 FP8 tables: NeMo 24.07 (fitted), Megatron-Bridge and NeMo's
    long-sequence table (predicted)."""
    return nemo_2407() + bridge_h100() + nemo_long_sequence()
