"""Reading a Hugging Face model's ``config.json`` for ``--model hf:PATH_OR_ID``, without torch.

What the driver needs of an HF model before anything is built: its ``PretrainedConfig`` (checked
to be a decoder-only causal LM that the engine runs), its :class:`ModelShape` for the memory and
performance models, the tensor-parallel plan its ``base_model_tp_plan`` gives (as names), the
rules a layout must keep, and its decoder layer's class name. PATH is a folder holding
``config.json`` or the file itself; an id (``org/name``) is looked up in the local Hugging Face
cache only (``huggingface_hub.try_to_load_from_cache``). ``transformers`` is imported only when a
config is read; building the model is ``autotune.trial.models.hf``.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError, WorkloadError
from autotune.shapes import ModelShape, detailed_shape

INSTALL_HINT = 'pip install -e ".[hf]"'

ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")
"""The ``layer_types`` the engine and the cost model describe: attention decoder layers."""

STATE_SPACE_KEYS = (
    "state_size",
    "ssm_state_size",
    "mamba_d_state",
    "mamba_expand",
    "hybrid_override_pattern",
    "layers_block_type",
    "attn_layer_indices",
)
"""Config keys of state-space and hybrid (attention + state-space) models."""

MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
"""Config keys of mixture-of-experts models: experts have no TP/PP plan here."""


def import_transformers():
    """The transformers module, or a WorkloadError naming the install step; its logging quieted."""
    try:
        import transformers
    except ImportError:
        raise WorkloadError(
            f"Hugging Face models need the transformers library: {INSTALL_HINT}"
        ) from None
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
        raise ConfigError(
            "hf: needs a model folder, its config.json, or a model id "
            "(e.g. hf:./my-model or hf:meta-llama/Llama-3.1-8B)"
        )
    if _looks_like_path(ref):
        path = Path(ref).expanduser()
        if path.is_dir():
            path = path / "config.json"
            if not path.is_file():
                raise ConfigError(
                    f"'{ref}' has no config.json; give the folder of a Hugging "
                    "Face model (with its config.json) or the file itself"
                )
        elif not path.is_file():
            raise ConfigError(
                f"'{ref}' does not exist; give a model folder with config.json, "
                "the file itself, or a model id in the Hugging Face cache"
            )
        return path
    import_transformers()
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(ref, "config.json")
    except Exception as e:  # an invalid repo id raises its own validation error
        raise ConfigError(
            f"'{ref}' is neither a folder with config.json nor a model id: {e}"
        ) from None
    if not isinstance(found, str):
        raise ConfigError(
            f"model '{ref}' is not in the local Hugging Face cache (autotune "
            f"never downloads); fetch its config first: hf download {ref} "
            "config.json"
        )
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
    transformers = import_transformers()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    model_type = data.pop("model_type")
    try:
        config = transformers.AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError) as e:
        raise ConfigError(
            f"'{path}': transformers does not know model_type "
            f"'{model_type}' ({e}); upgrade transformers or check the config"
        ) from None
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING or getattr(
        config, "is_encoder_decoder", False
    ):
        raise ConfigError(
            f"'{ref}' is a {model_type} config, not a causal language model; "
            "autotune trains decoder-only causal LMs (AutoModelForCausalLM)"
        )
    check_supported(config, ref)
    return config


def check_supported(config: Any, ref: str) -> None:
    """One line naming the first config option the engine cannot run: experts, state-space or
    hybrid layers, layer types other than attention. Any other causal LM runs by its config."""
    for key in MOE_KEYS:
        experts = getattr(config, key, None)
        if isinstance(experts, int) and experts > 1:
            raise ConfigError(
                f"'{ref}' is a mixture of experts ({key} {experts}): experts "
                "have no tensor- or pipeline-parallel plan in autotune; use a "
                "dense model"
            )
    for key in STATE_SPACE_KEYS:
        if getattr(config, key, None) is not None:
            raise ConfigError(
                f"'{ref}' ({config.model_type}) has state-space or hybrid layers ({key}): the "
                "cost model describes attention decoder layers only; use an attention model"
            )
    layer_types = getattr(config, "layer_types", None) or ()
    other = sorted({t for t in layer_types if t not in ATTENTION_LAYER_TYPES})
    if other:
        raise ConfigError(
            f"'{ref}' ({config.model_type}) has {', '.join(other)} layers: the cost model "
            f"describes {' and '.join(ATTENTION_LAYER_TYPES)} layers only; use an attention model"
        )


# ---- the shape for the memory and performance models -----------------------------------------
@lru_cache(maxsize=64)
def hf_shape(ref: str) -> ModelShape:
    """The architecture of an HF config as a :class:`ModelShape` (the memory and performance
    models' input). GPT-2 maps to the ``gpt`` family (learned positions, LayerNorm, GELU MLP),
    the Llama-style decoders to ``llama`` (RoPE, RMSNorm, SwiGLU), with the config's
    ``head_dim`` and biases (GPT-2's, Qwen2's QKV: ``shapes.detailed_shape``). A GELU composed
    of element-wise ops (GPT-2's default ``gelu_new``) saves more than the fused one the
    activation formula counts."""
    c = load_config(ref)
    heads = c.num_attention_heads
    ffn = getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * c.hidden_size
    shape = ModelShape(
        family="gpt" if c.model_type == "gpt2" else "llama",
        num_layers=c.num_hidden_layers,
        hidden_size=c.hidden_size,
        num_heads=heads,
        num_kv_heads=getattr(c, "num_key_value_heads", None) or heads,
        ffn_hidden_size=ffn,
        vocab_size=c.vocab_size,
        max_seq_len=c.max_position_embeddings,
        tied_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
    )
    return detailed_shape(
        shape,
        head_dim=getattr(c, "head_dim", None),
        attention_bias=c.model_type == "qwen2",
        linear_bias=c.model_type == "gpt2",
    )


# ---- tensor parallelism from base_model_tp_plan ----------------------------------------------
TP_STYLES = (
    "colwise",
    "rowwise",
    "colwise_gather_output",
    "colwise_rep",
    "rowwise_split_input",
    "rowwise_rep",
    "replicated_with_grad_allreduce",
    "replicate",
)
"""The ``base_model_tp_plan`` styles of transformers 5 the engine runs
(``autotune.trial.models.hf`` maps each to torch's ParallelStyles; ``replicate`` is nothing)."""

OUTSIDE_LAYERS = ("embedding_rowwise", "embedding_colwise", "replicate")
"""Styles of plan entries outside the decoder layers (the embeddings), which stay replicated
as the output head does."""


def tp_plan_names(config: Any, layer_indices: range, *, prefix: str = "") -> dict[str, str] | None:
    """The config's ``base_model_tp_plan`` (keys relative to the base model, ``layers.*.…``)
    expanded per layer into paths under ``prefix`` (the stage module's path of the base model),
    as style names; None without a plan. Entries outside the layers (the embeddings) are left
    out: they stay replicated."""
    plan = getattr(config, "base_model_tp_plan", None)
    if not plan:
        return None
    out: dict[str, str] = {}
    for pattern, style in plan.items():
        head, star, tail = pattern.partition(".*.")
        if not star and style in OUTSIDE_LAYERS:
            continue
        if style not in TP_STYLES:
            raise ConfigError(
                f"tp plan entry '{pattern}': '{style}' has no torch "
                f"equivalent in autotune (it runs {', '.join(TP_STYLES)}); use "
                "tp_degree 1"
            )
        if not star or "*" in tail:
            raise ConfigError(
                f"tp plan entry '{pattern}' is outside the decoder layers; use tp_degree 1"
            )
        stack = f"{prefix}.{head}" if prefix else head
        for i in layer_indices:
            out[f"{stack}.{i}.{tail}"] = style
    return out


def decoder_layer_class_name(ref: str) -> str:
    """The decoder layer's class (``_no_split_modules``), which FSDP wraps, from the config
    alone."""
    config = load_config(ref)  # imports transformers or says how to install it
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    names = getattr(MODEL_FOR_CAUSAL_LM_MAPPING[type(config)], "_no_split_modules", None)
    return names[0] if names else "DecoderLayer"


def check_layout(config: Any, trial: Any) -> None:
    """Rules of HF models on top of ``TrialConfig.validate`` (which checks heads, kv heads and
    layers from the shape): tensor parallelism needs a TP plan whose every style torch
    expresses."""
    ref = trial.workload.hf_model
    if trial.tp_degree > 1:
        if not getattr(config, "base_model_tp_plan", None):
            raise ConfigError(
                f"'{ref}' ({config.model_type}) has no base_model_tp_plan in its "
                "config, so it has no tensor parallelism; use tp_degree 1"
            )
        tp_plan_names(config, range(1))  # raises naming an entry torch cannot express
