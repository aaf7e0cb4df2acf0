"""What a Hugging Face block saves for backward, by its parts: the extra norms, QK norms, the
attention's head width, unrepeated keys and values, soft-capping and gathered TP outputs.

``memory.layer_activation_bytes`` counts the plain block (two pre-norms, q/k/v/o at the hidden
width with k and v repeated to every head, the MLP's wide tensors) as Korthikanti et al. 2022
do; a shape read from a Hugging Face config (``shapes.HFShape``) may differ from it in the parts
below, and :func:`hf_block_bytes` counts its block beyond the two norms by them. Every term
was counted on the tiny configs of ``tests/testkit/hf_families.py`` with
``torch.autograd.graph.saved_tensors_hooks`` over one block's forward (unique storages, the
parameters excluded), against transformers 5's modeling code:

- **Norms.** Each RMSNorm keeps its fp32 input, the normalised input and its rstd (``x.float()``,
  ``x * torch.rsqrt(...)``); a pre-norm's output is kept by the Linears after it, a post-norm's
  (Gemma's ``post_attention_layernorm``, OLMo 2's) feeds the residual add, which keeps nothing,
  while the Linears then keep the residual stream itself. So every block keeps two Linear
  inputs and, per norm, two fp32 tensors and its statistics: the plain count's two norms, plus
  ``block_norms − 2`` more (Gemma 2 and 3: four).
- **QK norms** (Qwen3 and Gemma 3 per head over head_dim, OLMo 2 over all heads): the same two
  fp32 tensors and statistics on q (heads × head_dim) and on k (kv heads × head_dim). Rotary
  after them keeps only cos and sin (``q * cos`` saves the constant operand).
- **Head width.** q and the attention output are heads × head_dim wide, not hidden (Qwen3 and
  Gemma: head_dim 16 × 4 heads = 64 against hidden 32).
- **Keys and values.** SDPA gets k and v repeated to every head only where it is given a mask:
  transformers' ``sdpa_attention_forward`` passes ``enable_gqa`` when the mask is None (a
  causal layer), and a sliding-window layer shorter than the sequence builds one; eager
  attention (``eager_attention_forward``) always repeats them (``repeat_kv``).
- **Soft-capping** (Gemma 2's ``attn_logit_softcapping``): transformers runs it in eager
  attention only (its SDPA path cannot cap), which keeps ``tanh``'s output besides the softmax
  (heads × s² per micro-batch); under selective recomputation both are recomputed.
- **Gathered TP outputs** (Phi-3's and OLMo 2's plans: ``colwise_gather_output`` on the q/k/v
  or gate_up projections, ``rowwise_split_input`` on the projection after them): every TP rank
  holds the whole region's tensors (all heads, the whole MLP width), and the projection after
  it keeps its shard of the input besides (``bench/hf_memory.py``: Phi-3 at tp 2 was −16%
  without it).
"""

from __future__ import annotations

from autotune.model import moe_memory
from autotune.model.layout_quantities import FP32_BYTES
from autotune.shapes import HFShape, ModelShape


def attention_kernel(shape: ModelShape, attention: str) -> str:
    """The attention kernel the model runs: soft-capped scores run eager (transformers' SDPA
    path has no soft-capping; ``trial/models/hf.py`` ``build_hf`` falls back to eager)."""
    if isinstance(shape, HFShape) and shape.attn_softcap:
        return "eager"
    return attention


def hf_block_bytes(
    shape: HFShape,
    *,
    s: int,
    b: int,
    tp: int,
    e: int,
    cp: int,
    sp: int,
    checkpointing: str,
    attention: str,
    compiled: bool = False,
    ep: int = 0,
) -> int:
    """Bytes one block of an HF ``shape`` saves for backward beyond its two norms' count
    (``memory._norm_bytes``, the rotary cache): the extra norms, QK norms, the attention and the
    MLP, for one micro-batch of ``b`` sequences of ``s`` on one rank (``cp`` shards the
    queries, ``tp`` the heads unless the plan gathers them, ``sp`` the norms), under
    checkpointing 'none' or 'selective' (the attention core recomputed). ``ep`` > 0: a MoE
    layer, its MLP the built-in experts' count (``moe_memory.routed_mlp_bytes``) over the tokens
    entering it: transformers' experts are not counted apart."""
    h = shape.hidden_size
    a, kv, d = shape.num_heads, shape.num_kv_heads, shape.head_dim
    t = s * b // cp  # the rank's queries
    ta = 1 if shape.attention_gathered else tp  # what divides the attention's tensors
    kept = (shape.block_norms - 2) * (2 * FP32_BYTES * t * h + FP32_BYTES * t) // sp
    if shape.qk_norm:
        stats = (a + kv) if shape.qk_norm == "head" else 2
        kept += (2 * FP32_BYTES * t * (a + kv) * d + FP32_BYTES * t * stats) // ta
    kernel = attention_kernel(shape, attention)
    repeated = _repeated_layers(shape, s, kernel)
    # q and the output; k and v of the whole sequence at their own width or repeated to every
    # head, averaged over the layers; a gathered plan's output projection keeps its shard.
    kv_width = (repeated * a + (shape.num_layers - repeated) * kv) * d
    kept += (2 * e * t * a * d + 2 * e * s * b * kv_width // shape.num_layers) // ta
    if shape.attention_gathered and tp > 1:
        kept += e * t * a * d // tp
    if checkpointing == "none":
        if kernel == "sdpa":
            kept += FP32_BYTES * a * t // ta  # log-sum-exp
        else:  # the softmax, soft-capping's tanh, the causal mask
            scores = 2 if shape.attn_softcap else 1
            kept += scores * e * a * t * s // ta + (s // cp) * s
    if ep:
        return kept + moe_memory.routed_mlp_bytes(shape.moe, h, t // sp, e, ep)
    return kept + _mlp_bytes(shape, t, tp, e, compiled)


def _mlp_bytes(shape: HFShape, t: int, tp: int, e: int, compiled: bool) -> int:
    """The MLP's f-wide tensors: gated, the gate's and up projection's outputs, the
    activation's and their product (compiled: the matmul outputs only); plain, the
    activation's input and output. A gathered plan keeps them whole on every TP rank but for
    the down projection's input shard."""
    tf = t * shape.ffn_hidden_size
    wide = (2 if compiled else 4) if shape.gated else (1 if compiled else 2)
    if not shape.mlp_gathered:
        return wide * e * tf // tp
    return (wide - 1) * e * tf + e * tf // tp


def _repeated_layers(shape: HFShape, s: int, kernel: str) -> int:
    """The layers whose attention gets k and v repeated to every head: all under eager, the
    masked ones (a sliding window shorter than the sequence) under SDPA."""
    if kernel == "eager":
        return shape.num_layers
    windows = shape.layer_windows or (0,) * shape.num_layers
    return sum(1 for w in windows if 0 < w < s)
