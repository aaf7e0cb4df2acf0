"""One description of a model's cost: its parameter tensors as a rank holds them, and what a
block keeps for backward under each activation-checkpointing mode.

The tensors themselves are listed once, by the shape (``ModelShape.block_tensors`` and
``root_tensors``: each tensor's rows, columns and how tensor parallelism shards it). Here they
are cut to one TP rank (:func:`local_block`, :func:`local_roots`); the parameter count
(``ModelShape.num_params``), autotune's memory model (``memory``), the engines' memory model
(``engine_memory``) and the step-time model (:func:`block_params`, :func:`stage_params`) read
them, and none of them lists a tensor of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from autotune.shapes import TP_COLUMN, TP_ROW, TP_VOCAB, ModelShape, ParamTensor, window_keys


@dataclass(frozen=True, slots=True)
class LocalTensors:
    """Parameter tensors as (dim-0 rows, elements per row), local to one TP rank."""

    shapes: tuple[tuple[int, int], ...]

    @property
    def numel(self) -> int:
        return sum(r * c for r, c in self.shapes)

    def fsdp_shard_numel(self, n: int) -> int:
        """Elements of the largest FSDP2 shard over n ranks: each tensor's dim 0 is split into
        n chunks padded to ⌈rows/n⌉ rows, and rank 0 holds a full chunk of each."""
        return sum(-(-r // n) * c for r, c in self.shapes)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def local_shape(tensor: ParamTensor, tp: int, vocab_shards: int) -> tuple[int, int]:
    """(rows, columns) of ``tensor`` on one rank of a TP group of ``tp``: column-parallel rows
    and row-parallel columns ÷ tp (rounded up: ``torch.chunk``'s largest piece), the
    vocabulary's rows ÷ ``vocab_shards`` (tp where the engine shards the vocabulary, else 1),
    replicated tensors whole."""
    if tensor.tp == TP_COLUMN:
        return _ceil(tensor.rows, tp), tensor.cols
    if tensor.tp == TP_ROW:
        return tensor.rows, _ceil(tensor.cols, tp)
    if tensor.tp == TP_VOCAB:
        return _ceil(tensor.rows, vocab_shards), tensor.cols
    return tensor.rows, tensor.cols


@lru_cache(maxsize=4096)
def local_block(shape: ModelShape, tp: int) -> LocalTensors:
    """One transformer block's parameters on one TP rank, in module order."""
    return LocalTensors(tuple(local_shape(t, tp, 1) for t in shape.block_tensors()))


def local_roots(shape: ModelShape, vocab: int, first: bool, last: bool) -> LocalTensors:
    """The parameters outside the blocks that a stage holds (the embeddings on the first, the
    final norm and head on the last), with ``vocab`` rows of vocabulary: the whole vocabulary,
    or one TP rank's share where the engine shards it (``engine_memory``)."""
    return LocalTensors(
        tuple(local_shape(t, 1, 1) for t in shape.root_tensors(vocab, first=first, last=last))
    )


def embedding_tensors(shape: ModelShape, first: bool) -> int:
    """How many of a stage's root tensors come before its blocks in model order: the token
    embedding and, with learned positions, the position embedding (first stage only)."""
    if not first:
        return 0
    return 2 if shape.learned_positions else 1


def block_params(shape: ModelShape, tp: int = 1) -> int:
    """Parameters of one transformer block on one TP rank (``tp`` 1: the whole block)."""
    return local_block(shape, tp).numel


def stage_params(
    shape: ModelShape,
    num_layers: int,
    *,
    first: bool,
    last: bool,
    tp: int = 1,
    vocab_shards: int = 1,
    vocab: int | None = None,
) -> int:
    """Parameters one rank of a pipeline stage holds: ``num_layers`` blocks on one TP rank of
    ``tp``, the embeddings if ``first``, the final norm and head if ``last`` (a tied head counted
    once, with the embedding), the vocabulary's rows ÷ ``vocab_shards`` (tp for an engine with
    a vocabulary-parallel embedding and loss, else 1). ``vocab`` None: the shape's."""
    roots = sum(
        r * c
        for t in shape.root_tensors(vocab, first=first, last=last)
        for r, c in (local_shape(t, tp, vocab_shards),)
    )
    return num_layers * block_params(shape, tp) + roots


def part_block_bytes(layers: int, ac_layers: int | None, none: int, full: int) -> int:
    """A part's blocks' saved bytes per micro-batch, in autotune's runtime and every engine's:
    with ``ac_layers`` set (Megatron's --recompute-num-layers), that many blocks under full
    recomputation (``full`` bytes each) and the rest keeping everything (``none``); otherwise
    every block ``full`` (the mode's own bytes)."""
    if ac_layers is None:
        return layers * full
    k = min(ac_layers, layers)
    return k * full + (layers - k) * none


def attention_width(shape: ModelShape) -> float:
    """The query's width, heads × head_dim: what Q·Kᵀ and softmax·V multiply over (the hidden
    size only where head_dim is hidden / heads). Under multi-head latent attention (``mla``:
    DeepSeek-V2/V3) Q·Kᵀ runs over qk_nope + qk_rope per head and softmax·V over v_head_dim
    (transformers' ``DeepseekV3Attention``), so the width is heads × their mean: 160 per head
    for DeepSeek-V3, where the config's head_dim (qk_rope, 64) would count 2.5× too little."""
    mla = getattr(shape, "mla", ())
    if mla:
        _, _, nope, rope, v = mla
        return shape.num_heads * (nope + rope + v) / 2
    return shape.num_heads * shape.head_dim


def _windows(shape: ModelShape) -> tuple[int, ...]:
    return getattr(shape, "layer_windows", ()) or ()


def attention_keys(shape: ModelShape, seq: int) -> float:
    """(query, key) pairs per sequence that one layer's attention scores, averaged over the
    layers, as the whole s × s square (what an eager or unmasked kernel computes, causal or
    not): s² for a full layer; for a sliding-window layer twice the pairs its window leaves
    (``shapes.window_keys``), so that the causal halving the time model applies leaves those
    pairs. Full layers only: exactly s²."""
    windows = _windows(shape)
    if not any(0 < w < seq for w in windows):
        return seq * seq
    pairs = [2 * window_keys(w, seq) if 0 < w < seq else seq * seq for w in windows]
    return sum(pairs) / len(pairs)


def window_share(shape: ModelShape, seq: int) -> float:
    """The share of a full layer's attention pairs the model's layers score, averaged
    (:func:`attention_keys` over s²): 1 without sliding windows shorter than ``seq``."""
    if seq <= 0 or not any(0 < w < seq for w in _windows(shape)):
        return 1
    return attention_keys(shape, seq) / (seq * seq)
