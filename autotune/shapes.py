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

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Architecture of one built-in model."""

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

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def num_params(self, vocab_size: int | None = None) -> int:
        """Exact parameter count of the model ``build_model`` creates for this shape."""
        v = vocab_size or self.vocab_size
        h, f = self.hidden_size, self.ffn_hidden_size
        kv = self.num_kv_heads * self.head_dim
        attn = h * h + 2 * h * kv + h * h  # wq, wk, wv, wo (no biases)
        if self.family == "gpt":
            mlp = 2 * h * f
            norms = 2 * 2 * h  # two LayerNorms (weight + bias) per block
            per_layer = attn + mlp + norms
            embed = v * h + self.max_seq_len * h
            final_norm = 2 * h
        else:
            mlp = 3 * h * f
            norms = 2 * h  # two RMSNorms (weight only)
            per_layer = attn + mlp + norms
            embed = v * h
            final_norm = h
        head = 0 if self.tied_embeddings else h * v
        return embed + self.num_layers * per_layer + final_norm + head


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
