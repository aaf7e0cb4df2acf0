"""Typed configurations: the single source of truth for what a trial runs.

``WorkloadSpec`` says *what* is trained, ``TrialConfig`` *how*. Both are frozen, keyword-only
dataclasses; every field carries a one-line docstring, which is also the help of the flag that
sets it (``cli/config_flags.py``).
``validate()`` raises :class:`ConfigError` naming the broken rule and the fix; ``to_dict`` /
``from_dict`` round-trip losslessly through JSON and reject unknown keys and wrong types.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from autotune.errors import ConfigError
from autotune.moe import MOE_TINY
from autotune.parallel_dims import ParallelDims
from autotune.shapes import MODEL_SHAPES, ModelShape, model_names

ZeroStage = Literal[0, 1, 2, 3]
ActivationCheckpointing = Literal["none", "selective", "op", "full"]
GIB = 2**30
MIB = 2**20
"""Byte units: memory limits are given in GiB, buckets and reports in MiB."""

PipelineSchedule = Literal["gpipe", "1f1b", "interleaved_1f1b"]

# The knobs' value sets, read once from their Literals (in the Literals' order, which is the
# order the search's grid enumerates them in and so the order Optuna sees them first).
ZERO_STAGES: tuple[int, ...] = typing.get_args(ZeroStage)
CHECKPOINTING_MODES: tuple[str, ...] = typing.get_args(ActivationCheckpointing)
PP_SCHEDULES: tuple[str, ...] = typing.get_args(PipelineSchedule)
OVERLAP_CHOICES = (True, False)
"""``overlap_enabled``'s values, on first."""
AC_ORDER = {mode: i for i, mode in enumerate(CHECKPOINTING_MODES)}
"""Recomputation from none to most (more recomputation: less memory, more compute)."""
Attention = Literal["eager", "sdpa"]
DType = Literal["float32", "bfloat16", "float16"]
BYTES_PER_ELEMENT: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Element size of each dtype, in bytes."""
Precision = Literal["32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true"]
"""Lightning's names. *-mixed: fp32 master parameters and optimizer state, compute (and the
model copy it reads) in bf16/fp16; *-true: everything in that dtype, no master copy."""
Device = Literal["auto", "cpu", "cuda"]

PRECISION_COMPUTE_DTYPE: dict[str, str] = {
    "32-true": "float32",
    "bf16-mixed": "bfloat16",
    "16-mixed": "float16",
    "bf16-true": "bfloat16",
    "16-true": "float16",
}
"""The dtype matrix multiplications run in, per precision."""
MOE_SHAPES: dict[tuple[str, str], ModelShape] = {
    ("moe", "tiny"): ModelShape("llama", 4, 32, 4, 2, 64, 512, 256, moe=MOE_TINY),
}
"""The built-in mixtures of experts: Llama blocks (RMSNorm, RoPE, GQA) whose MLP from
``moe.first_dense_layers`` on is the experts (``autotune/moe.py``). Kept beside
``MODEL_SHAPES``, not in it: the cost model has no expert terms yet."""
BUILTIN_SHAPES = {**MODEL_SHAPES, **MOE_SHAPES}
"""Every built-in model a trial builds, dense and MoE."""


def builtin_model_names() -> list[str]:
    """Every built-in model's name (``model_names()``, then the mixtures of experts'), as the
    unknown-model errors list them."""
    return [*model_names(), *(f"{f}-{s}" for f, s in MOE_SHAPES)]


MIXED_PRECISIONS = ("bf16-mixed", "16-mixed")
MASTER_STEP_CHUNK_NUMEL = 2**24
"""Elements the master-weight AdamW (``trial/parallel/precision.py``) steps in one multi-tensor
pass, unless one tensor is larger: its fp32 gradient buffer, reused for the denominator, is the
step's only temporary (64 MiB). ``model/memory.py`` counts the same buffer."""
DTYPE_PRECISION: dict[str, str] = {
    "float32": "32-true",
    "bfloat16": "bf16-true",
    "float16": "16-true",
}
"""The precision an old config's ``workload.dtype`` meant: the whole model in that dtype."""
DEFAULT_PRECISION = {"cuda": "bf16-mixed", "cpu": "32-true"}
"""The precision of a config that names none, by device: production's mixed precision on GPUs;
float32 on CPUs, whose half-precision speed depends on the instruction set rather than the
layout (on the AVX512 development machine a 1024² bf16 matmul took 0.38× the fp32 time, fp16
68×: emulated), and where fp32 lets every layout match the reference to summation noise."""

# Virtual pipeline stages per rank for the interleaved schedule (Narayanan et al. 2021, §2.2):
# the default of ``virtual_stages``.
INTERLEAVED_STAGES_PER_RANK = 2
STEP_PHASES = ("warmup", "timed", "profiled", "memory")
"""The phases of a trial's steps, in the order it runs them (``TrialConfig.step_schedule``)."""
FLOAT8_PRECISIONS = ("bf16-mixed", "bf16-true")
"""Precisions whose non-linear layers float8 training keeps (torchao's float8 linears run beside
bf16 autocast; Micikevicius et al. 2022, "FP8 Formats for Deep Learning", §4)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkloadSpec:
    """What is trained: a built-in model (family and size) or a user workload, and its batch."""

    family: Literal["gpt", "llama", "moe"] = "gpt"
    """Built-in model family: gpt (GPT-2 style), llama or moe (a mixture of experts)."""
    size: str = "tiny"
    """Built-in model size: tiny, small/medium/large/xl (gpt) or 1b/7b/13b/70b (llama)."""
    seq_len: int = 64
    """Tokens per sequence."""
    global_batch_size: int = 8
    """Sequences per optimizer step, summed over data-parallel ranks and accumulation."""
    vocab_size: int | None = None
    """Vocabulary size; None takes the model's own."""
    dtype: DType | None = None
    """Deprecated, use the trial's precision: float32, bfloat16, float16 mean 32-true,
    bf16-true, 16-true (the whole model in that dtype)."""
    workload: str | None = None
    """A user workload 'pkg.module:build' instead of the built-in model (see docs)."""
    hf_model: str | None = None
    """A Hugging Face causal LM instead of the built-in model: a folder with config.json, the
    file, or a model id in the local Hugging Face cache (built from its config, no weights)."""

    @property
    def name(self) -> str:
        if self.hf_model is not None:
            return f"hf:{self.hf_model}"
        return self.workload or f"{self.family}-{self.size}"

    @property
    def shape(self) -> ModelShape | None:
        """The model's shape (built-in, or read from an HF config), or None for a user
        workload."""
        if self.hf_model is not None:
            from autotune.hf_config import hf_shape

            return hf_shape(self.hf_model)
        if self.workload is not None:
            return None
        return BUILTIN_SHAPES[(self.family, self.size)]

    @property
    def resolved_vocab_size(self) -> int | None:
        if self.vocab_size is not None:
            return self.vocab_size
        shape = self.shape
        return shape.vocab_size if shape else None

    def validate(self) -> None:
        if self.hf_model is not None and self.workload is not None:
            raise ConfigError("give either workload or hf_model, not both")
        if (
            self.workload is None
            and self.hf_model is None
            and (self.family, self.size) not in BUILTIN_SHAPES
        ):
            raise ConfigError(
                f"unknown model '{self.family}-{self.size}': choose one of "
                f"{', '.join(builtin_model_names())}, or give a user workload 'pkg.module:build'"
            )
        if self.workload is not None and ":" not in self.workload:
            raise ConfigError(
                f"workload '{self.workload}' must have the form 'pkg.module:function'"
            )
        _positive("seq_len", self.seq_len)
        _positive("global_batch_size", self.global_batch_size)
        if self.vocab_size is not None:
            _positive("vocab_size", self.vocab_size)
        shape = self.shape
        if shape is not None and self.seq_len > shape.max_seq_len:
            raise ConfigError(
                f"seq_len {self.seq_len} exceeds the context of {self.name} "
                f"({shape.max_seq_len}); lower seq_len"
            )


JOBS = ("workload", "parallelism", "memory", "kernels", "precision", "measurement")
"""What each ``TrialConfig`` field is for, declared on the field (its metadata's ``job``):
what is trained; how the ranks split it (degrees, schedule, ZeRO, the batch split, the
gradient sync); what is traded for memory (checkpointing, offload); which kernels run on which
device; the precision; how the trial is measured (steps, seed). ``fields_of(job)`` lists
them."""


def _job(job: str) -> dict[str, str]:
    if job not in JOBS:  # a declaration below, not user input
        raise ValueError(f"not a field group: {job!r}")
    return {"job": job}


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialConfig:
    """How a workload is trained: parallel layout, batch split and memory/speed knobs."""

    workload: WorkloadSpec = field(default_factory=WorkloadSpec, metadata=_job("workload"))
    """The workload this trial trains."""
    world_size: int = field(default=2, metadata=_job("parallelism"))
    """Number of ranks (one device or CPU process each)."""
    tp_degree: int = field(default=1, metadata=_job("parallelism"))
    """Tensor-parallel degree; divides the attention heads."""
    pp_degree: int = field(default=1, metadata=_job("parallelism"))
    """Pipeline-parallel degree; at most the number of layers."""
    zero_stage: ZeroStage = field(default=0, metadata=_job("parallelism"))
    """ZeRO stage: 0 DDP, 1 sharded optimizer, 2 + sharded grads, 3 + sharded params."""
    micro_batch_size: int = field(default=1, metadata=_job("parallelism"))
    """Sequences per micro-batch on one data-parallel rank."""
    bucket_mb: float = field(default=25.0, metadata=_job("parallelism"))
    """Gradient bucket size in MB (DDP buckets; FSDP wrap granularity)."""
    overlap_enabled: bool = field(default=True, metadata=_job("parallelism"))
    """Overlap communication with computation (DDP hooks / FSDP prefetch)."""
    activation_checkpointing: ActivationCheckpointing = field(
        default="none", metadata=_job("memory")
    )
    """Recompute activations in backward: none, selective (attention core), op (all but every
    second matmul and SDPA: torchtitan's op-level selective) or full (per block)."""
    ac_layers: int | None = field(default=None, metadata=_job("memory"))
    """With full checkpointing: blocks per pipeline stage recomputed (Megatron's
    --recompute-num-layers); None recomputes every block."""
    pp_schedule: PipelineSchedule = field(default="1f1b", metadata=_job("parallelism"))
    """Pipeline schedule when pp_degree > 1: gpipe, 1f1b or interleaved_1f1b."""
    virtual_stages: int = field(default=INTERLEAVED_STAGES_PER_RANK, metadata=_job("parallelism"))
    """Model chunks per pipeline rank under interleaved_1f1b (≥ 2); other schedules run one."""
    sequence_parallel: bool = field(default=False, metadata=_job("parallelism"))
    """With tp_degree > 1: norms and dropout on sequence shards, all-gather / reduce-scatter
    instead of all-reduce (Korthikanti et al. 2022)."""
    cp_degree: int = field(default=1, metadata=_job("parallelism"))
    """Context-parallel degree: ranks splitting each sequence (world = dp × cp × tp × pp)."""
    dp_replicate: int = field(default=1, metadata=_job("parallelism"))
    """HSDP: data-parallel replica groups; ZeRO shards within dp_degree / dp_replicate ranks."""
    ep_degree: int = field(default=1, metadata=_job("parallelism"))
    """Expert-parallel degree (mixtures of experts): ranks the experts are split over, carved
    from dp_shard × cp × tp; divides the number of experts."""
    attention: Attention = field(default="sdpa", metadata=_job("kernels"))
    """Attention implementation: eager (explicit softmax) or sdpa (fused)."""
    compile: bool = field(default=False, metadata=_job("kernels"))
    """torch.compile each transformer block (regional compilation); its time is setup cost."""
    float8: bool = field(default=False, metadata=_job("kernels"))
    """Linear layers in float8 with dynamic scaling (torchao), the rest in bf16; CUDA with
    compute capability ≥ 8.9 only."""
    optimizer_offload_enabled: bool = field(default=False, metadata=_job("memory"))
    """ZeRO-Offload: keep optimizer state and step on the CPU (CUDA, ZeRO-2/3 only)."""
    device: Device = field(default="auto", metadata=_job("kernels"))
    """Device of the ranks: auto (CUDA when visible, else CPU), cpu or cuda."""
    precision: Precision | None = field(default=None, metadata=_job("precision"))
    """32-true, bf16-mixed, 16-mixed (fp32 master weights, half-precision compute), bf16-true or
    16-true; None: bf16-mixed on CUDA, 32-true on CPU (or the workload's old dtype)."""
    num_warmup_steps: int = field(default=2, metadata=_job("measurement"))
    """Training steps run before timing starts."""
    num_timed_steps: int = field(default=5, metadata=_job("measurement"))
    """Training steps whose times give the step time (median of the slowest rank)."""
    num_profiled_steps: int = field(default=2, metadata=_job("measurement"))
    """Steps run under the profiler after the timed ones (timelines); 0 records none."""
    seed: int = field(default=0, metadata=_job("measurement"))
    """Seed of model initialisation and synthetic data."""

    # ---- derived -------------------------------------------------------------------------
    @classmethod
    def fields_of(cls, job: str) -> tuple[str, ...]:
        """The fields declared for ``job`` (one of ``JOBS``), in declaration order."""
        if job not in JOBS:
            raise ConfigError(f"unknown field group {job!r}; choose one of {', '.join(JOBS)}")
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata["job"] == job)

    @property
    def dims(self) -> ParallelDims:
        """The layout's degrees as one object (pp, dp_replicate, dp_shard, cp, tp, ep), their
        mesh order and ``*_enabled`` properties (``parallel_dims.ParallelDims``)."""
        return ParallelDims.of(
            self.world_size,
            tp=self.tp_degree,
            pp=self.pp_degree,
            cp=self.cp_degree,
            dp_replicate=self.dp_replicate,
            ep=self.ep_degree,
        )

    @property
    def dp_degree(self) -> int:
        """Data-parallel degree: world_size / (tp_degree × pp_degree × cp_degree)."""
        return self.world_size // (self.tp_degree * self.pp_degree * self.cp_degree)

    @property
    def dp_shard(self) -> int:
        """Ranks one ZeRO shard group spans: dp_degree / dp_replicate (dp_degree without
        HSDP)."""
        return self.dp_degree // self.dp_replicate

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches per optimizer step on each data-parallel rank (= pipeline microbatches)."""
        return self.workload.global_batch_size // (self.micro_batch_size * self.dp_degree)

    @property
    def tokens_per_step(self) -> int:
        return self.workload.global_batch_size * self.workload.seq_len

    def step_schedule(self) -> tuple[str, ...]:
        """The phase of each step a trial runs, in order: ``num_warmup_steps`` warm-up, then
        ``num_timed_steps`` timed, ``num_profiled_steps`` under the profiler, and one memory
        step (``STEP_PHASES``). The runner, the store and the replays read it from here."""
        counts = (self.num_warmup_steps, self.num_timed_steps, self.num_profiled_steps, 1)
        return tuple(phase for phase, n in zip(STEP_PHASES, counts, strict=True) for _ in range(n))

    @property
    def timed_steps(self) -> range:
        """Indices of the timed steps (whose times give the step time)."""
        return range(self.num_warmup_steps, self.num_warmup_steps + self.num_timed_steps)

    def resolved_precision(self, device_type: str) -> str:
        """The precision this config trains in on ``device_type`` ('cuda' or 'cpu')."""
        if self.precision is not None:
            return self.precision
        if self.workload.dtype is not None:
            return DTYPE_PRECISION[self.workload.dtype]
        return DEFAULT_PRECISION[device_type]

    def with_precision(self, device_type: str) -> TrialConfig:
        """This config with its precision spelled out, as it is run and stored."""
        return dataclasses.replace(self, precision=self.resolved_precision(device_type))

    def compute_dtype(self, device_type: str = "cuda") -> str:
        """The dtype its matrix multiplications run in (its peak FLOP/s)."""
        return PRECISION_COMPUTE_DTYPE[self.resolved_precision(device_type)]

    @property
    def num_pp_stages(self) -> int:
        if self.pp_degree > 1 and self.pp_schedule == "interleaved_1f1b":
            return self.pp_degree * self.virtual_stages
        return self.pp_degree

    # ---- validation ----------------------------------------------------------------------
    def validate(
        self,
        *,
        num_heads: int | None = None,
        num_kv_heads: int | None = None,
        num_layers: int | None = None,
    ) -> None:
        """Raise ConfigError naming the first broken rule and its fix.

        Built-in workloads supply their own shape; a user workload's shape can be passed in.
        """
        self.workload.validate()
        shape = self.workload.shape
        if shape is not None:
            num_heads, num_kv_heads, num_layers = (
                shape.num_heads,
                shape.num_kv_heads,
                shape.num_layers,
            )
        # The degrees' own rules (positive, dividing the world and dp) are ParallelDims'.
        ParallelDims.check(
            self.world_size,
            tp=self.tp_degree,
            pp=self.pp_degree,
            cp=self.cp_degree,
            dp_replicate=self.dp_replicate,
            ep=self.ep_degree,
        )
        _check_experts(self.ep_degree, shape, self.workload.name)
        for name in ("micro_batch_size", "virtual_stages"):
            _positive(name, getattr(self, name))
        _non_negative("num_warmup_steps", self.num_warmup_steps)
        _non_negative("num_profiled_steps", self.num_profiled_steps)
        _positive("num_timed_steps", self.num_timed_steps)
        if self.zero_stage not in ZERO_STAGES:
            raise ConfigError(f"zero_stage must be 0, 1, 2 or 3, not {self.zero_stage!r}")
        self.validate_precision()
        if not self.bucket_mb > 0:
            raise ConfigError(f"bucket_mb must be > 0, not {self.bucket_mb}")
        self._validate_new_knobs(num_layers)
        self._validate_heads(num_heads, num_kv_heads)
        per_dp = self.micro_batch_size * self.dp_degree
        if self.workload.global_batch_size % per_dp:
            raise ConfigError(
                f"global_batch_size {self.workload.global_batch_size} is not divisible by "
                f"micro_batch_size × dp_degree = {self.micro_batch_size} × {self.dp_degree}; "
                f"choose a micro_batch_size dividing "
                f"{max(1, self.workload.global_batch_size // self.dp_degree)} "
                "(micro × accumulation × dp = global batch)"
            )
        if self.pp_degree > 1:
            self._validate_pipeline(num_layers)
        if self.workload.hf_model is not None:
            from autotune.hf_config import check_layout, load_config

            check_layout(load_config(self.workload.hf_model), self)
        self._validate_offload()

    def _validate_heads(self, num_heads: int | None, num_kv_heads: int | None) -> None:
        """tp_degree divides the attention heads and the key/value heads."""
        if num_heads is not None and num_heads % self.tp_degree:
            raise ConfigError(
                f"tp_degree {self.tp_degree} must divide the {num_heads} attention heads of "
                f"{self.workload.name}; choose a tp_degree among {_divisors(num_heads)}"
            )
        if num_kv_heads is not None and num_kv_heads % self.tp_degree:
            raise ConfigError(
                f"tp_degree {self.tp_degree} must divide the {num_kv_heads} key/value heads of "
                f"{self.workload.name}; choose a tp_degree among {_divisors(num_kv_heads)}"
            )

    def _validate_offload(self) -> None:
        """The rules of optimizer_offload_enabled: CUDA, ZeRO-2/3 and dp > 1 (FSDP2's
        CPUOffloadPolicy)."""
        if not self.optimizer_offload_enabled:
            return
        if self.device == "cpu":
            raise ConfigError(
                "optimizer_offload_enabled needs device cuda: on CPU the optimizer state "
                "is already in host memory; set optimizer_offload_enabled to false"
            )
        if self.zero_stage < 2:
            raise ConfigError(
                "optimizer_offload_enabled needs zero_stage 2 or 3 (FSDP2 CPU offload); "
                "raise zero_stage or turn offload off"
            )
        if self.dp_degree == 1:
            raise ConfigError(
                "optimizer_offload_enabled needs dp_degree > 1 (it is FSDP2's "
                "CPUOffloadPolicy, and dp_degree 1 trains without FSDP2); lower tp_degree or "
                "pp_degree, or turn offload off"
            )

    def _validate_new_knobs(self, num_layers: int | None) -> None:
        """The rules of sequence_parallel, cp_degree, dp_replicate, virtual_stages, ac_layers
        and float8 (each alone; combinations the trial engine cannot run are refused where it
        builds them)."""
        if self.sequence_parallel and self.tp_degree == 1:
            raise ConfigError(
                "sequence_parallel shards over the tensor-parallel group: it needs "
                "tp_degree > 1; raise tp_degree or turn sequence_parallel off"
            )
        # What the degrees may combine with (the sequence, FSDP2) is ParallelDims' rule too.
        self.dims.check_combination(seq_len=self.workload.seq_len, zero_stage=self.zero_stage)
        interleaved = self.pp_degree > 1 and self.pp_schedule == "interleaved_1f1b"
        if interleaved and self.virtual_stages < 2:
            raise ConfigError(
                f"schedule interleaved_1f1b needs virtual_stages ≥ 2, not {self.virtual_stages}; "
                "raise it or use 1f1b"
            )
        if not interleaved and self.virtual_stages != INTERLEAVED_STAGES_PER_RANK:
            raise ConfigError(
                f"virtual_stages {self.virtual_stages} applies to pp_schedule interleaved_1f1b "
                f"with pp_degree > 1 only; use that schedule or leave virtual_stages at "
                f"{INTERLEAVED_STAGES_PER_RANK}"
            )
        if self.ac_layers is not None:
            _positive("ac_layers", self.ac_layers)
            if self.activation_checkpointing != "full":
                raise ConfigError(
                    f"ac_layers {self.ac_layers} counts blocks under full checkpointing; set "
                    "activation_checkpointing to full or ac_layers to null"
                )
            if num_layers is not None and self.ac_layers > num_layers:
                raise ConfigError(
                    f"ac_layers {self.ac_layers} exceeds the {num_layers} layers of "
                    f"{self.workload.name}; lower it, or null recomputes every block"
                )
        if self.float8:
            if self.device == "cpu":
                raise ConfigError(
                    "float8 needs a CUDA GPU of compute capability ≥ 8.9 (H100, "
                    "L40S, B200…): CPUs have no float8 matmul; turn float8 off"
                )
            if self.precision is not None and self.precision not in FLOAT8_PRECISIONS:
                raise ConfigError(
                    f"float8 runs its linears beside bf16 compute: it needs precision "
                    f"{' or '.join(FLOAT8_PRECISIONS)}, not {self.precision}"
                )

    def validate_precision(self) -> None:
        if self.precision is not None and self.precision not in PRECISION_COMPUTE_DTYPE:
            raise ConfigError(
                f"unknown precision {self.precision!r}; choose one of "
                f"{', '.join(PRECISION_COMPUTE_DTYPE)}"
            )
        dtype = self.workload.dtype
        if dtype is not None and dtype not in DTYPE_PRECISION:
            raise ConfigError(
                f"unknown dtype {dtype!r}; use precision instead: one of "
                f"{', '.join(PRECISION_COMPUTE_DTYPE)}"
            )
        if (
            dtype is not None
            and self.precision is not None
            and DTYPE_PRECISION[dtype] != self.precision
        ):
            raise ConfigError(
                f"workload dtype {dtype} (the old spelling of precision "
                f"{DTYPE_PRECISION[dtype]}) conflicts with precision {self.precision}; drop "
                "the dtype, which precision replaces"
            )

    def _validate_pipeline(self, num_layers: int | None) -> None:
        stages, micro = self.num_pp_stages, self.grad_accum_steps
        if num_layers is not None and stages > num_layers:
            raise ConfigError(
                f"{stages} pipeline stages (pp_degree {self.pp_degree}, schedule "
                f"{self.pp_schedule}) exceed the {num_layers} layers of {self.workload.name}; "
                f"lower pp_degree or use a non-interleaved schedule"
            )
        if self.pp_schedule == "1f1b" and micro < self.pp_degree:
            raise ConfigError(
                f"schedule 1f1b needs at least pp_degree = {self.pp_degree} microbatches, "
                f"got {micro} (global batch / (micro_batch_size × dp)); lower micro_batch_size "
                "or use gpipe"
            )
        if self.pp_schedule == "interleaved_1f1b":
            rounds = max(1, micro // self.pp_degree)
            if micro % rounds:
                raise ConfigError(
                    f"schedule interleaved_1f1b needs the {micro} microbatches to be a multiple "
                    f"of {rounds} rounds (microbatches // pp_degree); change micro_batch_size"
                )

    # ---- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def resolved(self) -> dict[str, Any]:
        """The config plus its derived quantities, as stored with results."""
        d = self.to_dict()
        d["derived"] = {
            "dp_degree": self.dp_degree,
            "grad_accum_steps": self.grad_accum_steps,
            "tokens_per_step": self.tokens_per_step,
        }
        return d

    @classmethod
    def from_dict(cls, data: Any) -> TrialConfig:
        if not isinstance(data, dict):
            raise ConfigError("a trial config must be a JSON object with the TrialConfig fields")
        data = dict(data)
        if "reproduce" in data and isinstance(data.get("config"), dict):
            data = dict(data["config"])  # a best_config.json export: its config section
        data.pop("derived", None)  # written by resolved(); recomputed, never trusted
        workload = data.pop("workload", {})
        return _build(cls, {**data, "workload": _build(WorkloadSpec, workload, "workload.")}, "")

    @classmethod
    def from_json(cls, text: str) -> TrialConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"config is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
            ) from None
        return cls.from_dict(data)

    @classmethod
    def from_file(cls, path: str | Path) -> TrialConfig:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read config file '{path}': {e.strerror}") from None
        return cls.from_json(text)


# ---- helpers ---------------------------------------------------------------------------
_TRIAL_FIELDS = tuple(f.name for f in dataclasses.fields(TrialConfig))
_trial_values = operator.attrgetter(*_TRIAL_FIELDS)


def with_fields(config: TrialConfig, **changes: Any) -> TrialConfig:
    """``dataclasses.replace(config, **changes)`` in half the time, for ``rank``, which builds
    hundreds of thousands of layouts: the fields are copied into a new instance as the frozen
    dataclass's ``__init__`` sets them (``TrialConfig`` has no ``__post_init__``), without its
    call overhead. A name that is not a field raises ``AttributeError`` (slots). Neither
    validates; ``TrialConfig.validate`` does."""
    new = object.__new__(TrialConfig)
    for name, value in zip(_TRIAL_FIELDS, _trial_values(config)):
        object.__setattr__(new, name, value)
    for name, value in changes.items():
        object.__setattr__(new, name, value)
    return new


def _check_experts(ep: int, shape: ModelShape | None, name: str) -> None:
    """ep splits the experts: the model must have experts, and ep must divide their number."""
    if ep == 1 or shape is None:
        return  # a user workload's experts are its own to check
    if shape.moe is None:
        raise ConfigError(
            f"ep_degree {ep} splits experts, and {name} is a dense model; set ep_degree to 1 "
            "or choose a mixture of experts"
        )
    experts = shape.moe.num_experts
    if experts % ep:
        raise ConfigError(
            f"ep_degree {ep} must divide the {experts} experts of {name}; choose an "
            f"ep_degree among {_divisors(experts)}"
        )


def ep_trial_refusal(config: TrialConfig) -> str | None:
    """The rule the trial runtime's expert parallelism (``trial/parallel/expert.py``) needs
    that ``config`` breaks, in words ("pp_degree 1", …), or None: ep > 1 runs without a
    pipeline or context parallelism, not under ZeRO-1 (which would broadcast one rank's experts
    to all), and with dropless routing. Not a config rule (the cost model prices these
    layouts): the trial refuses them (``expert.check_ep``) and the search space leaves them
    out (``layouts.enumerate_configs``)."""
    if config.ep_degree == 1:
        return None
    spec = config.workload.shape.moe if config.workload.shape is not None else None
    for rule, broken in (
        ("pp_degree 1", config.pp_degree > 1),
        ("cp_degree 1", config.cp_degree > 1),
        (
            "zero_stage 0, 2 or 3 (ZeRO-1 would broadcast one rank's experts to all)",
            config.zero_stage == 1,
        ),
        (
            "dropless routing (capacity_factor unset)",
            spec is not None and spec.capacity_factor is not None,
        ),
    ):
        if broken:
            return rule
    return None


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, not {value!r}")


def _non_negative(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be a non-negative integer, not {value!r}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _build(cls: type, data: Any, prefix: str) -> Any:
    """Construct a dataclass from a dict, rejecting unknown keys and wrongly typed values."""
    if not isinstance(data, dict):
        raise ConfigError(f"'{prefix.rstrip('.') or cls.__name__}' must be a JSON object")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ConfigError(
            f"unknown key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(prefix + k) for k in unknown)} in {cls.__name__}; "
            f"valid keys: {', '.join(sorted(fields))}"
        )
    for key, value in data.items():
        if not _matches(value, hints[key]):
            raise ConfigError(f"'{prefix}{key}' must be {_describe(hints[key])}, not {value!r}")
    # JSON writes 25.0 as 25: store float fields as floats so round-trips compare equal.
    fixed = {
        k: float(v) if hints[k] is float and isinstance(v, int) else v for k, v in data.items()
    }
    return cls(**fixed)


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )
