"""Hugging Face ``transformers`` causal LMs as workloads: ``--model hf:PATH_OR_ID``.

The model is built from its ``config.json`` alone (``AutoModelForCausalLM.from_config``, random
initialisation, no weights), so a search never downloads or loads a checkpoint. PATH is a folder
holding ``config.json`` or the file itself; an id (``org/name``) is looked up in the local Hugging
Face cache only (``huggingface_hub.try_to_load_from_cache``).

The trained module is :class:`HFStage`: the HF model's own embeddings, decoder layers, final norm
and output head, driven by a forward that follows the HF base model's (positions, the causal
masks of ``transformers.masking_utils``, rotary embeddings computed on every stage that has
layers). A pipeline stage is the same class holding a slice of the layers, keyed by their global
index as in the built-in model (``models/transformer.py``), the embeddings on the first stage and
the final norm and head on the last. Tensor parallelism translates the config's
``base_model_tp_plan`` (``colwise``/``rowwise``) into torch's ParallelStyles; activation
checkpointing and FSDP units are the decoder layers (the class ``_no_split_modules`` names).

Architectures whose base-model forward this reproduces: GPT-2 (``wte``/``wpe``/``h``/``ln_f``)
and the Llama-style decoders (``embed_tokens``/``rotary_emb``/``layers``/``norm``) listed in
``LLAMA_STYLE``. ``tests/test_hf.py`` checks that every valid world-2 layout trains the same
losses as the plain HF model in one process.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autotune.errors import ConfigError, WorkloadError
from autotune.models.shapes import ModelShape

INSTALL_HINT = 'pip install -e ".[hf]"'

LLAMA_STYLE = ("llama", "mistral", "qwen2")
"""Model types whose base model is embed_tokens → layers(rotary, causal mask) → norm, with
nothing else in its forward (no embedding scale, no logit soft-capping)."""
SUPPORTED = ("gpt2", *LLAMA_STYLE)

MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
"""Config keys of mixture-of-experts models: experts have no TP/PP plan here."""


def _transformers():
    try:
        import transformers
    except ImportError:
        raise WorkloadError("Hugging Face models need the transformers library: "
                            f"{INSTALL_HINT}") from None
    # autotune reports problems itself, one line each; transformers' advice on token ids and
    # generation settings is about inference.
    transformers.logging.set_verbosity_error()
    return transformers


# ---- finding and reading config.json ---------------------------------------------------------
def _looks_like_path(ref: str) -> bool:
    return ref.startswith(("/", ".", "~")) or ref.endswith(".json") or Path(ref).exists()


def config_path(ref: str) -> Path:
    """The config.json of a folder, a file, or a model id in the local Hugging Face cache."""
    if not ref:
        raise ConfigError("hf: needs a model folder, its config.json, or a model id "
                          "(e.g. hf:./my-model or hf:meta-llama/Llama-3.1-8B)")
    if _looks_like_path(ref):
        path = Path(ref).expanduser()
        if path.is_dir():
            path = path / "config.json"
            if not path.is_file():
                raise ConfigError(f"'{ref}' has no config.json; give the folder of a Hugging "
                                  "Face model (with its config.json) or the file itself")
        elif not path.is_file():
            raise ConfigError(f"'{ref}' does not exist; give a model folder with config.json, "
                              "the file itself, or a model id in the Hugging Face cache")
        return path
    _transformers()
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(ref, "config.json")
    except Exception as e:  # an invalid repo id raises its own validation error
        raise ConfigError(f"'{ref}' is neither a folder with config.json nor a model id: "
                          f"{e}") from None
    if not isinstance(found, str):
        raise ConfigError(f"model '{ref}' is not in the local Hugging Face cache (autotune "
                          f"never downloads); fetch its config first: hf download {ref} "
                          "config.json")
    return Path(found)


@lru_cache(maxsize=64)
def load_config(ref: str) -> Any:
    """The model's ``PretrainedConfig``, checked to be a decoder-only causal LM autotune runs."""
    path = config_path(ref)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read '{path}' as JSON: {e}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(f"'{path}' has no model_type: it is not a Hugging Face model config")
    transformers = _transformers()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    model_type = data.pop("model_type")
    try:
        config = transformers.AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError) as e:
        raise ConfigError(f"'{path}': transformers does not know model_type "
                          f"'{model_type}' ({e}); upgrade transformers or check the config"
                          ) from None
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING or getattr(
            config, "is_encoder_decoder", False):
        raise ConfigError(f"'{ref}' is a {model_type} config, not a causal language model; "
                          "autotune trains decoder-only causal LMs (AutoModelForCausalLM)")
    check_supported(config, ref)
    return config


def check_supported(config: Any, ref: str) -> None:
    """One line naming the first config option the engine cannot run."""
    for key in MOE_KEYS:
        experts = getattr(config, key, None)
        if isinstance(experts, int) and experts > 1:
            raise ConfigError(f"'{ref}' is a mixture of experts ({key} {experts}): experts "
                              "have no tensor- or pipeline-parallel plan in autotune; use a "
                              "dense model")
    if config.model_type not in SUPPORTED:
        raise ConfigError(f"model_type '{config.model_type}' of '{ref}' is not supported: "
                          f"autotune runs {', '.join(SUPPORTED)}; write a build() workload "
                          "for it (README, 'Your own model')")


# ---- the shape for the memory and performance models -----------------------------------------
@lru_cache(maxsize=64)
def hf_shape(ref: str) -> ModelShape:
    """The architecture of an HF config as a :class:`ModelShape` (the memory and performance
    models' input). GPT-2 maps to the ``gpt`` family (learned positions, LayerNorm, GELU MLP),
    the Llama-style decoders to ``llama`` (RoPE, RMSNorm, SwiGLU). The built-in formulas then
    apply: biases (GPT-2, Qwen2's QKV) are not counted, and a GELU composed of element-wise
    ops (GPT-2's default ``gelu_new``) saves more than the fused one the formula counts."""
    c = load_config(ref)
    heads = c.num_attention_heads
    ffn = getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * c.hidden_size
    return ModelShape(
        family="gpt" if c.model_type == "gpt2" else "llama",
        num_layers=c.num_hidden_layers, hidden_size=c.hidden_size, num_heads=heads,
        num_kv_heads=getattr(c, "num_key_value_heads", None) or heads,
        ffn_hidden_size=ffn, vocab_size=c.vocab_size,
        max_seq_len=c.max_position_embeddings,
        tied_embeddings=bool(getattr(c, "tie_word_embeddings", False)))


# ---- tensor parallelism from base_model_tp_plan ----------------------------------------------
def tp_plan(config: Any, layer_indices: range) -> dict | None:
    """torch ParallelStyles for the config's ``base_model_tp_plan`` (keys relative to the base
    model, ``layers.*.…``), expanded per layer into :class:`HFStage`'s paths."""
    plan = getattr(config, "base_model_tp_plan", None)
    if not plan:
        return None
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    out: dict = {}
    for pattern, style in plan.items():
        if style not in styles:
            raise ConfigError(f"tp plan entry '{pattern}': '{style}' has no torch "
                              f"equivalent in autotune (it runs {', '.join(styles)}); use "
                              "tp_degree 1")
        head, star, tail = pattern.partition(".*.")
        if not star or head not in ("layers", "h"):
            raise ConfigError(f"tp plan entry '{pattern}' is outside the decoder layers; "
                              "use tp_degree 1")
        for i in layer_indices:
            out[f"layers.{i}.{tail}"] = styles[style]()
    return out


# ---- the stage module ------------------------------------------------------------------------
class HFStage(nn.Module):
    """An HF causal LM (or one pipeline stage of it) whose forward maps a tensor to a tensor:
    token ids → logits for the whole model, ids → hidden states (first stage), hidden → hidden,
    hidden → logits (last stage)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.config = model.config
        base = model.base_model
        gpt2 = self.config.model_type == "gpt2"
        self.embed: nn.Module | None = base.wte if gpt2 else base.embed_tokens
        self.pos_embed: nn.Module | None = base.wpe if gpt2 else None
        self.embed_dropout: nn.Module | None = base.drop if gpt2 else None
        self.rotary: nn.Module | None = getattr(base, "rotary_emb", None)
        layers = base.h if gpt2 else base.layers
        self.layers = nn.ModuleDict({str(i): layer for i, layer in enumerate(layers)})
        self.norm: nn.Module | None = base.ln_f if gpt2 else base.norm
        self.lm_head: nn.Module | None = model.get_output_embeddings()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import (
            create_causal_mask,
            create_sliding_window_causal_mask,
        )

        h = self.embed(x) if self.embed is not None else x
        position_ids = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        if self.pos_embed is not None:
            h = h + self.pos_embed(position_ids)
        if self.embed_dropout is not None:
            h = self.embed_dropout(h)
        if self.layers:
            mask_args = dict(config=self.config, inputs_embeds=h, attention_mask=None,
                             cache=None, position_ids=position_ids)
            layer_types = getattr(self.config, "layer_types", None)
            # Mistral (no layer_types) slides every layer's window when it has one.
            default = ("sliding_attention" if self.config.model_type == "mistral"
                       and getattr(self.config, "sliding_window", None) is not None
                       else "full_attention")
            masks = {"full_attention": create_causal_mask(**mask_args)}
            if default == "sliding_attention" or "sliding_attention" in (layer_types or ()):
                masks["sliding_attention"] = create_sliding_window_causal_mask(**mask_args)
            extra = {}
            if self.rotary is not None:
                extra["position_embeddings"] = self.rotary(h, position_ids)
            for key, layer in self.layers.items():
                kind = layer_types[int(key)] if layer_types else default
                out = layer(h, attention_mask=masks[kind], position_ids=position_ids,
                            use_cache=False, **extra)
                h = out[0] if isinstance(out, tuple) else out
        if self.norm is not None:
            h = self.norm(h)
        if self.lm_head is not None:
            h = self.lm_head(h)
        return h


def split_stage(stage: nn.Module, stage_index: int, num_stages: int) -> nn.Module:
    """Keep one pipeline stage's layers (and the embeddings / norm and head at the ends), in
    place; layers are split as ``transformer.split_for_pipeline`` splits them."""
    from autotune.models.transformer import stage_layer_range

    keep = stage_layer_range(len(stage.layers), stage_index, num_stages)
    for key in list(stage.layers.keys()):
        if int(key) not in keep:
            del stage.layers[key]
    if stage_index > 0:
        stage.embed = stage.pos_embed = stage.embed_dropout = None
    if stage_index < num_stages - 1:
        stage.norm = stage.lm_head = None
    return stage


def decoder_layer_class_name(ref: str) -> str:
    """The decoder layer's class (``_no_split_modules``), which FSDP wraps, from the config
    alone."""
    config = load_config(ref)  # imports transformers or says how to install it
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    names = getattr(MODEL_FOR_CAUSAL_LM_MAPPING[type(config)], "_no_split_modules", None)
    return names[0] if names else "DecoderLayer"


def build_hf(spec: Any, *, attention: str = "sdpa", seed: int = 0) -> Any:
    """The Workload of a spec with ``hf_model``: random init from the config, no weights."""
    from autotune.models.workload import Workload, synthetic_batch, transformer_blocks

    transformers = _transformers()
    vocab = spec.resolved_vocab_size
    config = copy.deepcopy(load_config(spec.hf_model))  # the cached one stays unchanged
    config.vocab_size, config.use_cache = vocab, False
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    model = model.float().train()  # fp32, as the built-in model: see parallel/precision.py
    stage = HFStage(model)
    num_layers = config.num_hidden_layers

    def batch(step: int):
        return synthetic_batch(step, seed=seed, batch_size=spec.global_batch_size,
                               seq_len=spec.seq_len, vocab_size=vocab)

    try:
        plan = tp_plan(config, range(num_layers))
    except ConfigError:
        plan = None  # check_layout names the entry when a layout asks for tp_degree > 1
    return Workload(model=stage, batch=batch, tp_plan=plan,
                    pipeline_split=split_stage, blocks=transformer_blocks,
                    num_heads=config.num_attention_heads, num_layers=num_layers)


def check_layout(config: Any, trial: Any) -> None:
    """Rules of HF models on top of ``TrialConfig.validate`` (which checks heads, kv heads and
    layers from the shape): a TP plan must exist, and tied embeddings cannot span stages."""
    ref = trial.workload.hf_model
    if trial.tp_degree > 1:
        if not getattr(config, "base_model_tp_plan", None):
            raise ConfigError(f"'{ref}' ({config.model_type}) has no base_model_tp_plan in its "
                              "config, so it has no tensor parallelism; use tp_degree 1")
        tp_plan(config, range(1))  # raises naming an entry torch's styles cannot express
    if trial.pp_degree > 1 and getattr(config, "tie_word_embeddings", False):
        raise ConfigError(f"'{ref}' ties its input and output embeddings (tie_word_embeddings), "
                          "which pipeline stages would train apart; use pp_degree 1 or set "
                          "tie_word_embeddings false in config.json")
