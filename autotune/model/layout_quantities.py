"""The quantities of a layout that the memory and step-time models both derive, defined once.

:class:`LayoutQuantities` is what a :class:`TrialConfig` and a :class:`ModelShape` give before
any formula of either model runs: element sizes, the tokens of one micro-batch on a rank, what
sequence parallelism divides by, the micro-batches of a step, the pipeline's chunks and their
layers, whether FSDP2 shards. ``memory._Stage`` (every memory category of a pipeline rank),
``engine_memory`` (another engine's memory) and ``perf_model._Step`` (every term of a step)
read them from here instead of re-deriving them; what only one model needs stays in it.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Generic, TypeVar

from autotune.config import (
    BYTES_PER_ELEMENT,
    MIXED_PRECISIONS,
    PRECISION_COMPUTE_DTYPE,
    TrialConfig,
)
from autotune.knobs import memo_ignores
from autotune.shapes import ModelShape, stage_layer_counts

FP32_BYTES = BYTES_PER_ELEMENT["float32"]

RUN_FIELDS = memo_ignores("stage")
"""``TrialConfig`` fields that say how a trial is run and measured, which neither model reads
(those declared for the measurement, ``TrialConfig.fields_of("measurement")``)."""
DATA_PARALLEL_SHARDING_FIELDS = memo_ignores("activations") - RUN_FIELDS
"""``TrialConfig`` fields that choose how the data-parallel ranks shard and synchronise model
states: they change neither a block's saved activations nor a layer's compute or TP
collectives (the dp degree itself follows from the fields that stay: world, tp, pp, cp)."""

# The memos' ignore sets, each derived from the knobs' declarations (``knobs.Knob.blind``):
SHARDED_STAGE_IGNORE = memo_ignores("sharded_stage")
"""What ``memory``'s rank estimate does not read at ZeRO-2/3 (its ``_SHARDED_BLIND``)."""
ACTIVATIONS_IGNORE = memo_ignores("activations")
"""What ``memory``'s held activations do not read (its ``ACTIVATIONS_IGNORE``)."""
ENGINE_MEMORY_IGNORE = memo_ignores("engine_memory")
"""What ``engine_memory``'s estimate does not read (its ``ENGINE_MEMORY_IGNORE``)."""
STEP_LAYER_IGNORE = memo_ignores("step_layer")
"""What ``perf_model``'s per-layer cost does not read (its ``SHARDING_BLIND``)."""

T = TypeVar("T")


@cache
def _field_getter(ignoring: frozenset[str]) -> Callable[[TrialConfig], tuple]:
    names = [f.name for f in dataclasses.fields(TrialConfig)]
    unknown = ignoring - set(names)
    if unknown:
        raise ValueError(f"not TrialConfig fields: {sorted(unknown)}")
    return operator.attrgetter(*(n for n in names if n not in ignoring))


def fields_key(config: TrialConfig, ignoring: frozenset[str]) -> tuple:
    """``config``'s field values but those in ``ignoring``, as a hashable tuple: the key of a
    term that reads none of them. A field added to ``TrialConfig`` is in every key until it is
    named here, so a memo can never confuse two layouts that differ in it."""
    return _field_getter(ignoring)(config)


class BoundedMemo(Generic[T]):
    """A memo of results by hashable key, emptied once it holds ``size`` of them: ``rank``
    scores hundreds of thousands of layouts that share a few thousand per-layer terms."""

    def __init__(self, size: int = 1 << 16) -> None:
        self.size = size
        self._values: dict[Hashable, T] = {}

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        value = self._values.get(key)
        if value is None:
            if len(self._values) >= self.size:
                self._values.clear()
            value = self._values[key] = compute()
        return value

    def __contains__(self, key: Hashable) -> bool:
        return key in self._values

    def clear(self) -> None:
        self._values.clear()


@dataclass(frozen=True, slots=True)
class StateBytes:
    """Bytes per parameter element of each model state, for one precision and mechanism."""

    parameter: int
    """The model's parameters at rest (FSDP2: its shards)."""
    gradient: int
    master: int
    """The optimizer's fp32 master copy (0: none, or the parameters are the master)."""
    moment: int
    """Each of AdamW's two moments."""
    compute: int
    """Activations, and parameters and gradients FSDP2 gathers for compute."""


@lru_cache(maxsize=64)
def state_bytes(precision: str, *, fsdp: bool) -> StateBytes:
    """Element sizes of ``precision`` (``parallel/precision.py``); ``fsdp``: ZeRO-2/3 over
    more than one rank, where FSDP2's MixedPrecisionPolicy keeps fp32 shards."""
    compute = BYTES_PER_ELEMENT[PRECISION_COMPUTE_DTYPE[precision]]
    if precision not in MIXED_PRECISIONS:
        return StateBytes(compute, compute, 0, compute, compute)
    if fsdp:
        return StateBytes(FP32_BYTES, FP32_BYTES, 0, FP32_BYTES, compute)
    return StateBytes(compute, compute, FP32_BYTES, FP32_BYTES, compute)


def is_interleaved(config: TrialConfig) -> bool:
    """Whether ``config`` runs the interleaved 1F1B schedule: a pipeline (pp > 1) whose ranks
    each hold ``virtual_stages`` model chunks (Narayanan et al. 2021 §2.2)."""
    return config.pp_degree > 1 and config.pp_schedule == "interleaved_1f1b"


def fsdp_shards(config: TrialConfig) -> bool:
    """Whether FSDP2 shards the parameters at rest: ZeRO-2/3 over more than one of the ranks
    that hold the same parameters, dp × cp (``parallel/zero.py``: ``apply_zero`` wraps nothing
    when that mesh is one rank; context-parallel ranks share the shards), whose mixed precision
    keeps fp32 shards (:func:`state_bytes`)."""
    return config.dims.dp_cp_enabled and config.zero_stage >= 2


@lru_cache(maxsize=4096)
def pipeline_chunk_layers(
    num_layers: int, pp: int, chunks_per_rank: int
) -> tuple[tuple[int, ...], ...]:
    """Per pipeline rank, the layers of each model chunk it holds: the L layers over pp·v
    stages by ``shapes.stage_layer_counts`` (earlier stages take the remainder), stage i on
    rank i mod pp (Narayanan et al. 2021 §2.2: rank r holds stages r, r + pp, …)."""
    stages = pp * chunks_per_rank
    counts = stage_layer_counts(num_layers, stages)
    return tuple(tuple(counts[i] for i in range(rank, stages, pp)) for rank in range(pp))


@dataclass(frozen=True, slots=True)
class LayoutQuantities:
    """What a layout's memory and step time both derive from its config and model shape."""

    precision: str
    """The precision it trains in (``TrialConfig.resolved_precision`` on its device)."""
    state_bytes: StateBytes
    """Bytes per element of each model state in that precision and mechanism
    (:func:`state_bytes`; FSDP2's fp32 shards when :attr:`fsdp`)."""
    fsdp: bool
    """FSDP2 shards the parameters at rest (:func:`fsdp_shards`: ZeRO-2/3, dp × cp > 1)."""
    vocab: int
    """Vocabulary size: the workload's ``vocab_size``, else the shape's (an explicit shape
    brings its own)."""
    hidden_size: int
    """The model's hidden size h."""
    microbatch_tokens: int
    """Tokens of one micro-batch on a rank: b·s, ÷ cp under context parallelism (each cp rank
    holds s/cp of every sequence; ``TrialConfig.validate`` asks s divisible by 2·cp)."""
    sequence_shards: int
    """What sequence parallelism divides the tensors outside the TP region by (norms, dropout,
    the residual stream between blocks): tp under SP, else 1 (Korthikanti et al. 2022
    §4.2.2)."""
    num_microbatches: int
    """Micro-batches per optimizer step on each data-parallel rank: the accumulation steps, and
    the pipeline's m (``TrialConfig.grad_accum_steps``)."""
    interleaved: bool
    """The interleaved 1F1B schedule (:func:`is_interleaved`)."""
    chunks_per_rank: int
    """Model chunks (virtual stages) per pipeline rank, v: ``virtual_stages`` when
    :attr:`interleaved`, else 1."""
    chunk_layers: tuple[tuple[int, ...], ...]
    """Per pipeline rank, the layers of each of its chunks (:func:`pipeline_chunk_layers`)."""

    @classmethod
    def of(cls, config: TrialConfig, shape: ModelShape, precision: str) -> LayoutQuantities:
        """The quantities of ``config`` on ``shape``, trained in ``precision`` (resolved for
        the device: ``config.resolved_precision(device_type)``)."""
        tp, fsdp, interleaved = config.tp_degree, fsdp_shards(config), is_interleaved(config)
        chunks_per_rank = config.virtual_stages if interleaved else 1
        return cls(
            precision=precision,
            state_bytes=state_bytes(precision, fsdp=fsdp),
            fsdp=fsdp,
            vocab=config.workload.vocab_size or shape.vocab_size,
            hidden_size=shape.hidden_size,
            microbatch_tokens=config.workload.seq_len * config.micro_batch_size // config.cp_degree,
            sequence_shards=tp if config.sequence_parallel else 1,
            num_microbatches=config.grad_accum_steps,
            interleaved=interleaved,
            chunks_per_rank=chunks_per_rank,
            chunk_layers=pipeline_chunk_layers(shape.num_layers, config.pp_degree, chunks_per_rank),
        )

    @property
    def elem_bytes(self) -> int:
        """Bytes per element of the compute dtype (``PRECISION_COMPUTE_DTYPE``): activations,
        the matmuls' operands, what FSDP2 gathers."""
        return self.state_bytes.compute

    @property
    def activation_elems(self) -> int:
        """Elements of one micro-batch's b·s·h activation on a rank (its tokens × h)."""
        return self.microbatch_tokens * self.hidden_size

    @property
    def stream_elems(self) -> int:
        """Elements of one micro-batch's residual stream on a rank: the b·s·h activation, ÷ tp
        under sequence parallelism (what a pipeline stage sends and receives)."""
        return self.activation_elems // self.sequence_shards
