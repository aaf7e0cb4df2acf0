"""Named shapes of the built-in decoder-only transformer family.

The GPT-2 shapes are those of Radford et al. 2019 ("Language Models are Unsupervised Multitask
Learners", Table 2, with the HuggingFace ``gpt2*`` configs: vocab 50257, context 1024, MLP 4h).
The Llama shapes are those of Touvron et al. 2023 ("Llama 2", Table 1 and the released
``params.json``: SwiGLU MLP, RMSNorm, rotary embeddings, grouped-query attention with 8 KV heads
for 70B). ``llama-1b`` is Llama 3.2 1B's released ``config.json`` (16 layers, hidden 2048, 32
heads with 8 KV heads, MLP 8192, vocabulary 128,256, context 131,072) with an untied output
head, as every built-in model has one: 1.50B parameters (Llama 3.2 1B ties it: 1.24B), the
size the GPU check measures memory on. ``llama-405b`` is Llama 3.1 405B's released
``config.json`` (Meta's model card, meta-llama/Llama-3.1-405B: 126 layers, hidden 16,384, 128
heads with 8 KV heads, MLP 53,248, vocabulary 128,256, context 131,072; Dubey et al. 2024,
Table 3), untied: 405.9B parameters. The ``tiny`` sizes exist so that a trial step takes
milliseconds on one CPU core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import fields as _fields

from autotune.moe import MoESpec

TP_COLUMN = "column"
"""Sharded on dim 0 (its output features) over the TP group: Megatron's ColumnParallelLinear,
DTensor's ``ColwiseParallel`` (``builtin_tp_plan``: wq, wk, wv, w1, w3)."""
TP_ROW = "row"
"""Sharded on dim 1 (its input features): ``RowwiseParallel`` (wo, w2)."""
TP_REPLICATED = "replicated"
"""Whole on every TP rank: norms, learned positions, a row-parallel Linear's bias."""
TP_VOCAB = "vocab"
"""The embedding and the output head: sharded on the vocabulary (dim 0) by the engines that
run a vocabulary-parallel embedding and loss (Megatron's ``VocabParallelEmbedding``,
torchtitan's ``loss_parallel``), whole on every TP rank in autotune's own runtime."""
TP_EXPERT = "ep"
"""A routed experts' stacked weight ``[E, …]``: its dim 0 (the experts) sharded over the
expert-parallel group, whole on every TP rank (torchtitan's ``ExpertParallel``; expert tensor
parallelism removed in its PR #3167). The memory and time models divide it by ep."""


@dataclass(frozen=True, slots=True)
class ParamTensor:
    """One parameter tensor of the model as its module holds it: (dim-0 rows, elements per
    row), and how tensor parallelism shards it (``TP_COLUMN``, ``TP_ROW``, ``TP_REPLICATED``,
    ``TP_VOCAB``)."""

    name: str
    rows: int
    cols: int
    tp: str

    @property
    def numel(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Architecture of one built-in model, made of parts: attention (MHA or GQA, ``head_dim``),
    the MLP (``mlp_kind``), norms (``norm_kind``), the embedding (with learned positions or
    rotary ones) and the head (tied or not). :meth:`block_tensors` and :meth:`root_tensors`
    list its parameters once; the count, the memory models and the step-time model read them
    (``autotune/model/description.py``)."""

    family: str
    """``gpt`` (learned positions, LayerNorm, GELU MLP) or ``llama`` (RoPE, RMSNorm, SwiGLU)."""
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    max_seq_len: int
    tied_embeddings: bool = False
    """The output head shares the input embedding's weight (Hugging Face tie_word_embeddings)."""
    moe: MoESpec | None = None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    attention_bias = False
    """Biases on q, k and v (Qwen2; :class:`DetailedShape`)."""
    linear_bias = False
    """Biases on every Linear of the block (GPT-2's Conv1D; :class:`DetailedShape`)."""

    @property
    def mlp_kind(self) -> str:
        """``gelu`` (two Linears, h → f → h) or ``swiglu`` (w1 and the gate w3, then w2)."""
        return "gelu" if self.family == "gpt" else "swiglu"

    @property
    def norm_kind(self) -> str:
        """``layernorm`` (weight and bias) or ``rmsnorm`` (weight only)."""
        return "layernorm" if self.family == "gpt" else "rmsnorm"

    @property
    def learned_positions(self) -> bool:
        """A (max_seq_len, h) position embedding beside the token embedding (GPT-2), rather
        than rotary embeddings, which hold no parameters."""
        return self.family == "gpt"

    def _norm(self, name: str) -> tuple[ParamTensor, ...]:
        h = self.hidden_size
        weight = ParamTensor(f"{name}.weight", h, 1, TP_REPLICATED)
        if self.norm_kind == "rmsnorm":
            return (weight,)
        return (weight, ParamTensor(f"{name}.bias", h, 1, TP_REPLICATED))

    def _linear(self, name: str, out: int, inp: int, tp: str, bias: bool) -> tuple:
        weight = ParamTensor(f"{name}.weight", out, inp, tp)
        if not bias:
            return (weight,)
        # A column-parallel Linear's bias is sharded with its rows; a row-parallel one's is
        # added after the reduction, whole on every rank.
        return (
            weight,
            ParamTensor(f"{name}.bias", out, 1, TP_COLUMN if tp == TP_COLUMN else TP_REPLICATED),
        )

    def block_tensors(self) -> tuple[ParamTensor, ...]:
        """One transformer block's parameters in module order (``trial/models/transformer.py``:
        the attention norm, wq, wk, wv, wo, the MLP norm, w1, w2 and SwiGLU's gate w3), each
        with its TP sharding (``builtin_tp_plan``: q, k, v, w1, w3 column-wise, wo and w2
        row-wise, norms replicated). A mixture of experts' dense layers; its MoE layers'
        are :meth:`layer_tensors`'."""
        return (*self._attention_tensors(), *self._norm("ffn_norm"), *self._dense_mlp())

    def _attention_tensors(self) -> tuple[ParamTensor, ...]:
        h = self.hidden_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        qkv_bias, bias = self.attention_bias or self.linear_bias, self.linear_bias
        return (
            *self._norm("attention_norm"),
            *self._linear("wq", q, h, TP_COLUMN, qkv_bias),
            *self._linear("wk", kv, h, TP_COLUMN, qkv_bias),
            *self._linear("wv", kv, h, TP_COLUMN, qkv_bias),
            *self._linear("wo", h, q, TP_ROW, bias),
        )

    def _dense_mlp(self) -> tuple[ParamTensor, ...]:
        h, f, bias = self.hidden_size, self.ffn_hidden_size, self.linear_bias
        mlp = [
            *self._linear("w1", f, h, TP_COLUMN, bias),
            *self._linear("w2", h, f, TP_ROW, bias),
        ]
        if self.mlp_kind == "swiglu":
            mlp += self._linear("w3", f, h, TP_COLUMN, bias)
        return tuple(mlp)

    def moe_tensors(self) -> tuple[ParamTensor, ...]:
        """A MoE layer's MLP in module order (``trial/models/moe.py``): the router's gate
        [E, h] (replicated), the routed experts' stacked w1, w2, w3 (``[E, f, h]``, ``[E, h,
        f]``, ``[E, f, h]``: E rows of f·h, sharded over ep) and the shared experts' w1, w2, w3
        (one SwiGLU of width shared·f, TP-sharded as the dense MLP). The balancing bias and
        the token counts are buffers, not parameters. None without experts."""
        if self.moe is None:
            return ()
        h, spec = self.hidden_size, self.moe
        e, f = spec.num_experts, spec.expert_ffn_size
        out = [
            ParamTensor("router.gate.weight", e, h, TP_REPLICATED),
            ParamTensor("experts.w1", e, f * h, TP_EXPERT),
            ParamTensor("experts.w2", e, h * f, TP_EXPERT),
            ParamTensor("experts.w3", e, f * h, TP_EXPERT),
        ]
        if spec.num_shared_experts:
            fs = spec.num_shared_experts * f
            out += [
                ParamTensor("shared_experts.w1.weight", fs, h, TP_COLUMN),
                ParamTensor("shared_experts.w2.weight", h, fs, TP_ROW),
                ParamTensor("shared_experts.w3.weight", fs, h, TP_COLUMN),
            ]
        return tuple(out)

    def layer_tensors(self, layer: int) -> tuple[ParamTensor, ...]:
        """Layer ``layer``'s parameters (global index): :meth:`block_tensors`, with the MLP
        replaced by :meth:`moe_tensors` where the shape's experts are (``MoESpec.is_moe_layer``)."""
        if self.moe is None or not self.moe.is_moe_layer(layer):
            return self.block_tensors()
        return (*self._attention_tensors(), *self._norm("ffn_norm"), *self.moe_tensors())

    def root_tensors(
        self, vocab_size: int | None = None, *, first: bool = True, last: bool = True
    ) -> tuple[ParamTensor, ...]:
        """The parameters outside the blocks: the embeddings (the first pipeline stage's: the
        token embedding, and GPT's learned positions), the final norm and the output head (the
        last stage's; a tied head is the embedding itself, counted once)."""
        v, h = vocab_size or self.vocab_size, self.hidden_size
        out: list[ParamTensor] = []
        if first:
            out.append(ParamTensor("tok_embeddings.weight", v, h, TP_VOCAB))
            if self.learned_positions:
                out.append(ParamTensor("pos_embeddings.weight", self.max_seq_len, h, TP_REPLICATED))
        if last:
            out += self._norm("norm")
            if not (self.tied_embeddings and first):
                out.append(ParamTensor("output.weight", v, h, TP_VOCAB))
        return tuple(out)

    def num_params(self, vocab_size: int | None = None) -> int:
        """Exact parameter count of the model ``build_model`` creates for this shape: its
        blocks' and roots' tensors (:meth:`block_tensors`, :meth:`root_tensors`; a mixture of
        experts' layers by :meth:`layer_tensors`)."""
        roots = sum(t.numel for t in self.root_tensors(vocab_size))
        if self.moe is not None:
            layers = range(self.num_layers)
            return roots + sum(t.numel for i in layers for t in self.layer_tensors(i))
        block = sum(t.numel for t in self.block_tensors())
        return self.num_layers * block + roots


@dataclass(frozen=True, slots=True)
class DetailedShape(ModelShape):
    """A shape whose attention has its own head width or biases (Hugging Face configs: Mistral's
    ``head_dim``, Qwen2's QKV biases, GPT-2's Conv1D biases); the built-in shapes need none."""

    kv_channels: int | None = None
    """Each head's width where it is not hidden_size / num_heads (config ``head_dim``)."""
    attention_bias: bool = False
    linear_bias: bool = False

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_heads


@dataclass(frozen=True, slots=True)
class HFShape(DetailedShape):
    """A Hugging Face causal LM's shape as the built model holds it, where the plain parts do not
    say it: its block's tensors as listed by the meta-device model (fused qkv and gate_up,
    extra norms, QK norms, each with its TP plan's sharding), its roots, and the attention's
    parts that change its cost (QK norms, sliding windows, soft-capping). Read by
    ``hf_config.hf_shape``; no family is named here."""

    block: tuple[ParamTensor, ...] = ()
    """One block's parameters in module order (every block of the model has the same)."""
    first_roots: tuple[ParamTensor, ...] = ()
    """The parameters the first stage holds beside the token embedding (learned positions)."""
    last_roots: tuple[ParamTensor, ...] = ()
    """The final stage's parameters beside the head (the final norm's)."""
    gated: bool = True
    """The MLP multiplies an activated gate into its up projection (SwiGLU, GeGLU)."""
    activation: str = "silu"
    norm_bias: bool = False
    """The block's norms hold a bias (LayerNorm) rather than a weight only (RMSNorm)."""
    block_norms: int = 2
    """Norms over the hidden state per block (Gemma: 4, before and after attention and MLP)."""
    qk_norm: str = ""
    """``head`` (a norm over each head's head_dim on q and k), ``all`` (over all heads' q and
    k), or empty."""
    layer_windows: tuple[int, ...] = ()
    """Each layer's sliding window (keys a query sees), 0 where it attends to every earlier key;
    empty: every layer full."""
    attn_softcap: float = 0.0
    """Attention logits soft-capped as cap·tanh(x / cap) (0: not)."""
    final_softcap: float = 0.0
    """The output logits soft-capped the same way (0: not)."""
    query_scale: float = 0.0
    """The attention scores' scale is 1/√query_scale rather than 1/√head_dim (0: head_dim)."""
    embedding_multiplier: float = 1.0
    attention_gathered: bool = False
    """The TP plan gathers the q/k/v projections' outputs (``colwise_gather_output``): every TP
    rank runs every head, and the output projection takes its shard of the input
    (``rowwise_split_input``), as Phi-3's and OLMo 2's plans do."""
    mlp_gathered: bool = False
    """The same for the MLP's up projections (Phi-3's fused ``gate_up_proj``)."""

    @property
    def mlp_kind(self) -> str:
        return "swiglu" if self.gated else "gelu"

    @property
    def norm_kind(self) -> str:
        return "layernorm" if self.norm_bias else "rmsnorm"

    @property
    def learned_positions(self) -> bool:
        return bool(self.first_roots)

    mla: tuple[int, int, int, int, int] = ()
    """Multi-head latent attention's ranks and head widths (DeepSeek-V2/V3): (q_lora_rank,
    kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim); empty: not MLA. Its
    tensors (q_a/q_b, kv_a with the rope dims, kv_b, their norms) are in ``block``."""
    moe_block: tuple[ParamTensor, ...] = ()
    """A mixture of experts' MoE layers' parameters in module order (its routed experts'
    stacked tensors ``TP_EXPERT``), where ``moe`` is set; ``block`` is then its dense layers'."""
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)
    """The shape's hash, computed once: the memos of ``rank`` key on the shape per layout, and
    hashing every tensor of ``block`` and ``moe_block`` each time cost more than the term."""

    def __hash__(self) -> int:
        if self._hash is None:
            fields = (getattr(self, f.name) for f in _fields(self) if f.compare)
            object.__setattr__(self, "_hash", hash(tuple(fields)))
        return self._hash

    def block_tensors(self) -> tuple[ParamTensor, ...]:
        return self.block

    def layer_tensors(self, layer: int) -> tuple[ParamTensor, ...]:
        if self.moe is None or not self.moe.is_moe_layer(layer):
            return self.block
        return self.moe_block

    def root_tensors(
        self, vocab_size: int | None = None, *, first: bool = True, last: bool = True
    ) -> tuple[ParamTensor, ...]:
        v, h = vocab_size or self.vocab_size, self.hidden_size
        out: list[ParamTensor] = []
        if first:
            out += (ParamTensor("tok_embeddings.weight", v, h, TP_VOCAB), *self.first_roots)
        if last:
            out += self.last_roots
            if not (self.tied_embeddings and first):
                out.append(ParamTensor("output.weight", v, h, TP_VOCAB))
        return tuple(out)


def window_keys(window: int, seq: int) -> int:
    """(query, key) pairs a causal attention over ``seq`` tokens computes where each query sees
    its ``window`` latest keys (itself included; 0: all earlier keys): Σᵢ min(i + 1, w)."""
    w = seq if window <= 0 or window >= seq else window
    return seq * w - w * (w - 1) // 2


def detailed_shape(
    shape: ModelShape, *, head_dim: int | None, attention_bias: bool, linear_bias: bool
) -> ModelShape:
    """``shape`` with the parts a Hugging Face config may add; ``shape`` itself without them,
    so the built-in-like shapes stay plain :class:`ModelShape` objects."""
    if head_dim in (None, shape.head_dim) and not (attention_bias or linear_bias):
        return shape
    fields = {f: getattr(shape, f) for f in ModelShape.__dataclass_fields__}
    kv = None if head_dim == shape.head_dim else head_dim
    return DetailedShape(
        **fields, kv_channels=kv, attention_bias=attention_bias, linear_bias=linear_bias
    )


# fmt: off
MODEL_SHAPES: dict[tuple[str, str], ModelShape] = {
    ("gpt", "tiny"):     ModelShape("gpt", 4, 64, 4, 4, 256, 512, 256),
    ("gpt", "small"):    ModelShape("gpt", 12, 768, 12, 12, 3072, 50257, 1024),
    ("gpt", "medium"):   ModelShape("gpt", 24, 1024, 16, 16, 4096, 50257, 1024),
    ("gpt", "large"):    ModelShape("gpt", 36, 1280, 20, 20, 5120, 50257, 1024),
    ("gpt", "xl"):       ModelShape("gpt", 48, 1600, 25, 25, 6400, 50257, 1024),
    ("llama", "tiny"):   ModelShape("llama", 4, 64, 4, 2, 176, 512, 256),
    ("llama", "1b"):     ModelShape("llama", 16, 2048, 32, 8, 8192, 128256, 131072),
    ("llama", "7b"):     ModelShape("llama", 32, 4096, 32, 32, 11008, 32000, 4096),
    ("llama", "13b"):    ModelShape("llama", 40, 5120, 40, 40, 13824, 32000, 4096),
    ("llama", "70b"):    ModelShape("llama", 80, 8192, 64, 8, 28672, 32000, 4096),
    ("llama", "405b"):   ModelShape("llama", 126, 16384, 128, 8, 53248, 128256, 131072),
}
# fmt: on


def model_names() -> list[str]:
    return [f"{family}-{size}" for family, size in MODEL_SHAPES]


def even_split(n: int, k: int) -> list[int]:
    """``n`` items over ``k`` parts as evenly as possible, earlier parts taking the remainder."""
    base, extra = divmod(n, k)
    return [base + (1 if i < extra else 0) for i in range(k)]


def stage_layer_counts(num_layers: int, num_stages: int) -> list[int]:
    """Transformer layers per pipeline stage, as the trial engine splits them.

    Layers that divide evenly are split evenly. Otherwise the stages split L + 2 units, the
    embedding and the output head (with the loss) each weighing one layer, so the first and last
    stages hold a layer fewer than the rest, as Llama 3 trained 126 layers on 16 stages
    (Dubey et al. 2024, §3.3.2) and torchtitan's ``generate_llm_fqn_per_model_part`` weighs its
    input and output modules; the remainder goes to the earliest middle stages. Where that would
    leave a stage without a layer, earlier stages take the remainder of L alone.
    """
    if num_layers % num_stages == 0 or num_stages < 3:
        return even_split(num_layers, num_stages)
    units, rest = divmod(num_layers + 2, num_stages)
    counts = [units] * num_stages
    for i in range(1, 1 + rest):
        counts[i] += 1
    counts[0] -= 1
    counts[-1] -= 1
    if min(counts) < 1 or rest > num_stages - 2:
        return even_split(num_layers, num_stages)
    return counts


def stage_layer_range(num_layers: int, stage_index: int, num_stages: int) -> range:
    """Global indices of one pipeline stage's layers (:func:`stage_layer_counts`)."""
    counts = stage_layer_counts(num_layers, num_stages)
    start = sum(counts[:stage_index])
    return range(start, start + counts[stage_index])
