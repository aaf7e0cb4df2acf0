"""Reading a Hugging Face model's ``config.json`` for ``--model hf:PATH_OR_ID``.

What the driver needs of an HF model before anything is built: its ``PretrainedConfig`` (checked
to be a decoder-only causal LM that the engine runs), its :class:`ModelShape` for the memory and
performance models, the tensor-parallel plan its ``base_model_tp_plan`` gives (as names), the
rules a layout must keep, and its decoder layer's class name. PATH is a folder holding
``config.json`` or the file itself; an id (``org/name``) is looked up in the local Hugging Face
cache only (``huggingface_hub.try_to_load_from_cache``). ``transformers`` is imported only when a
config is read, and torch only when its shape is read: :func:`meta_parts` builds the model on
the meta device (no memory, no kernels) to read its tensors, the one torch import the arithmetic
models reach (allowed by name in pyproject.toml's contracts). Building the model to train is
``autotune.trial.models.hf``.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError, WorkloadError
from autotune.moe import MoESpec
from autotune.shapes import (
    TP_COLUMN,
    TP_EXPERT,
    TP_REPLICATED,
    TP_ROW,
    HFShape,
    ModelShape,
    ParamTensor,
    detailed_shape,
)

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
"""Config keys of mixture-of-experts models."""

PRICED_MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss")
"""The mixtures of experts the cost model describes (``estimate``, ``rank``): transformers'
model types whose MoE layers it reads as ``moe_parts`` does (a router, stacked experts,
shared experts, leading dense layers). Another MoE is refused when its config is read."""

TRAINABLE_MOE_TYPES: tuple[str, ...] = ()
"""The mixtures of experts the trial runtime trains (``check_trainable``): none yet."""


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


def moe_experts(config: Any) -> tuple[str, int] | None:
    """(the config key, routed experts) of a mixture of experts; None for a dense model."""
    for key in MOE_KEYS:
        experts = getattr(config, key, None)
        if isinstance(experts, int) and experts > 1:
            return key, experts
    return None


def check_supported(config: Any, ref: str) -> None:
    """One line naming the first config option the cost model cannot describe: a mixture of
    experts outside ``PRICED_MOE_TYPES``, state-space or hybrid layers, layer types other than
    attention. Any other causal LM is read by its config; what the trials cannot train yet is
    ``check_trainable``'s."""
    moe = moe_experts(config)
    if moe is not None and config.model_type not in PRICED_MOE_TYPES:
        raise ConfigError(
            f"'{ref}' is a mixture of experts ({config.model_type}, {moe[0]} {moe[1]}) the cost "
            f"model does not describe; it describes {', '.join(PRICED_MOE_TYPES)}"
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


def check_trainable(config: Any, ref: str) -> None:
    """The trial runtime's refusal: a mixture of experts outside ``TRAINABLE_MOE_TYPES`` is
    priced by ``estimate`` and ``rank`` but not trained (its experts have no tensor- or
    pipeline-parallel plan in autotune's trials)."""
    moe = moe_experts(config)
    if moe is not None and config.model_type not in TRAINABLE_MOE_TYPES:
        raise ConfigError(
            f"'{ref}' is a mixture of experts ({moe[0]} {moe[1]}): experts have no tensor- or "
            "pipeline-parallel plan in autotune's trials; price it with 'autotune estimate' or "
            "'autotune rank', or train a dense model"
        )


# ---- the shape for the memory and performance models -----------------------------------------
@lru_cache(maxsize=64)
def hf_shape(ref: str) -> ModelShape:
    """The architecture of an HF causal LM as a :class:`ModelShape` (the memory and performance
    models' input), read from its config and from the model transformers builds from it on the
    meta device (:func:`meta_parts`): one block's parameter tensors with their TP plan's
    sharding, the roots, the attention's geometry and parts. Where the plain parts say it all
    (learned positions with LayerNorm and a GELU MLP, as GPT-2; RoPE with RMSNorm and a gated
    MLP, as Llama), the shape is the plain one (``shapes.detailed_shape``); otherwise an
    :class:`HFShape` carrying the rest. A GELU composed of element-wise ops (GPT-2's default
    ``gelu_new``) saves more than the fused one the activation formula counts."""
    c = load_config(ref)
    parts = meta_parts(c)
    heads = c.num_attention_heads
    ffn = getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * c.hidden_size
    # The MLP's width as the model builds it, where the config's names another (a GPT-2 config
    # given an intermediate_size it does not read).
    ffn = parts.pop("ffn") or ffn
    shape = ModelShape(
        family="gpt" if parts["first_roots"] else "llama",
        num_layers=c.num_hidden_layers,
        hidden_size=c.hidden_size,
        num_heads=heads,
        num_kv_heads=parts.pop("kv_heads") or getattr(c, "num_key_value_heads", None) or heads,
        ffn_hidden_size=ffn,
        vocab_size=c.vocab_size,
        max_seq_len=c.max_position_embeddings,
        tied_embeddings=parts.pop("tied"),
        moe=parts.pop("moe", None),
    )
    plain = detailed_shape(
        shape,
        head_dim=getattr(c, "head_dim", None),
        attention_bias=parts.pop("attention_bias"),
        linear_bias=parts.pop("linear_bias"),
    )
    full = HFShape(
        **{f: getattr(shape, f) for f in ModelShape.__dataclass_fields__},
        kv_channels=getattr(c, "head_dim", None) or shape.head_dim,
        **parts,
        **attention_parts(c),
        **mla_parts(c),
    )
    return plain if full.moe is None and _plain_says_it(plain, full) else full


def _plain_says_it(plain: ModelShape, full: HFShape) -> bool:
    """Whether the plain shape describes the model as its HF parts do: the same tensors' count,
    two norms per block, no QK norm, window or soft-capping, and the plain family's MLP and
    norm (gated with RMSNorm, or GELU with LayerNorm and learned positions)."""
    same_params = plain.num_params() == full.num_params() and sum(
        t.numel for t in plain.block_tensors()
    ) == sum(t.numel for t in full.block_tensors())
    return (
        same_params
        and full.block_norms == 2
        and not (full.qk_norm or any(full.layer_windows) or full.attn_softcap)
        and not full.final_softcap
        and not (full.attention_gathered or full.mlp_gathered)
        and plain.mlp_kind == full.mlp_kind
        and plain.norm_kind == full.norm_kind
    )


def attention_parts(c: Any) -> dict[str, Any]:
    """The config's attention parts that change the cost: each layer's sliding window (from
    ``layer_types`` and ``sliding_window``, or ``sliding_window`` on every layer where the family
    has no layer types; a window of the whole context is none), soft-capping, the scores' scale
    (``query_pre_attn_scalar``), the embedding multiplier and the MLP's activation."""
    window = getattr(c, "sliding_window", None) or 0
    if not getattr(c, "use_sliding_window", True) or window >= c.max_position_embeddings:
        window = 0
    types = getattr(c, "layer_types", None) or ["sliding_attention"] * c.num_hidden_layers
    windows = tuple(window if t == "sliding_attention" else 0 for t in types)
    act = (
        getattr(c, "hidden_activation", None)
        or getattr(c, "hidden_act", None)
        or getattr(c, "activation_function", None)
        or "silu"
    )
    return dict(
        layer_windows=windows if any(windows) else (),
        attn_softcap=float(getattr(c, "attn_logit_softcapping", None) or 0.0),
        final_softcap=float(getattr(c, "final_logit_softcapping", None) or 0.0),
        query_scale=float(getattr(c, "query_pre_attn_scalar", None) or 0.0),
        embedding_multiplier=float(getattr(c, "embedding_multiplier", None) or 1.0),
        activation=str(act),
    )


def _tp_kind(plan: dict[str, str], module: str, leaf: str) -> str:
    """How the TP plan shards one block tensor (``module``'s ``leaf`` parameter): colwise styles
    on dim 0 with their biases, rowwise ones on dim 1 (their bias whole), the rest replicated."""
    style = next((v for k, v in plan.items() if k.partition(".*.")[2] == module), "")
    if style.startswith("colwise"):
        return TP_COLUMN
    if style.startswith("rowwise"):
        return TP_ROW if leaf == "weight" else TP_REPLICATED
    return TP_REPLICATED


def _block_tensors(c: Any, block: Any) -> tuple[tuple[ParamTensor, ...], dict[str, Any]]:
    """One block's tensors as (rows, columns) with their sharding, and what its norms say: how
    many over the hidden state, whether they hold biases, the QK norms' reach; its biases."""
    plan = getattr(c, "base_model_tp_plan", None) or {}
    tensors, norms, qk, biased, weights = [], [], [], set(), set()
    attn = next((n for n, m in block.named_children() if hasattr(m, "head_dim")), None)
    gathered = set(_styled(plan, "colwise_gather_output"))
    for name, p in block.named_parameters():
        module, _, leaf = name.rpartition(".")
        if p.dim() == 3:  # routed experts' stacked [E, …] weights (base_model_ep_plan)
            tensors.append(ParamTensor(name, p.shape[0], p.numel() // p.shape[0], TP_EXPERT))
            continue
        rows, cols = (tuple(p.shape) + (1,))[:2]
        tensors.append(ParamTensor(name, rows, cols, _tp_kind(plan, module, leaf)))
        if p.dim() == 2:
            weights.add(module)
        elif leaf == "bias":
            biased.add(module)
        elif "." in module:
            qk.append(rows)
        else:
            norms.append(module)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return tuple(tensors), dict(
        block_norms=len(norms),
        norm_bias=any(n in biased for n in norms),
        qk_norm=("head" if min(qk) == head_dim else "all") if qk else "",
        linear_bias=bool(weights) and weights <= biased,
        attention_bias=bool(biased & weights),
        attention_gathered=any(m.split(".")[0] == attn for m in gathered),
        mlp_gathered=any(m.split(".")[0] != attn for m in gathered),
    )


def _styled(plan: dict[str, str], style: str) -> list[str]:
    """The block modules (``self_attn.qkv_proj``) the TP plan gives ``style``."""
    return [k.partition(".*.")[2] for k, v in plan.items() if v == style]


def _mlp(c: Any, block: Any) -> dict[str, int]:
    """The MLP's kind and width and the attention's key/value heads, as the built block holds
    them: the attention is the block's child that has a ``head_dim`` (as transformers'
    attention modules do), its matrices 2·h·(q + kv) elements; the MLP's matrices are the
    block's other ones, gated where they hold three times the smallest one's elements (gate, up
    and down, or a fused gate_up and down), its width the smallest one's elements over h. A
    config may name sizes its family does not read (GPT-2 given num_key_value_heads)."""
    h, heads = c.hidden_size, c.num_attention_heads
    attn = next((m for m in block.children() if hasattr(m, "head_dim")), None)
    head_dim = getattr(attn, "head_dim", None) or getattr(c, "head_dim", None) or h // heads
    inside = {id(p) for p in attn.parameters()} if attn is not None else set()
    mats = [(p.numel(), id(p) in inside) for p in block.parameters() if p.dim() == 2]
    mlp = [n for n, a in mats if not a]
    attn_elements = sum(n for n, a in mats if a)
    kv_heads = (attn_elements // (2 * h) - heads * head_dim) // head_dim if attn else 0
    if not mlp:
        return dict(gated=True, ffn=0, kv_heads=kv_heads)
    return dict(gated=sum(mlp) >= 2.5 * min(mlp), ffn=min(mlp) // h, kv_heads=kv_heads)


def layer_stack(base: Any, config: Any) -> tuple[str, list[str], list[str]]:
    """The base model's layer-stack attribute and its children with parameters before it (the
    input side) and after it (the output side): from ``base_model_pp_plan`` where the config
    has one, else the ModuleList of ``num_hidden_layers`` modules and the registration order.
    The trials split and wrap this stack, and the shape (:func:`meta_parts`) reads its blocks."""
    from torch import nn  # the module classes only; pyproject.toml's contracts name this import

    plan = list(getattr(config, "base_model_pp_plan", None) or ())
    children = dict(base.named_children())
    stacks = [n for n in (plan or children) if isinstance(children.get(n), nn.ModuleList)] or [
        n
        for n, m in children.items()
        if isinstance(m, nn.ModuleList) and len(m) == config.num_hidden_layers
    ]
    if len(stacks) != 1:
        raise ConfigError(
            f"{config.model_type}: no single stack of decoder layers found in its base model "
            f"(base_model_pp_plan {plan or 'absent'}); write a build() workload for it"
        )
    stack = stacks[0]
    order = plan or list(children)
    at = order.index(stack)
    has_params = [
        n for n in order if n in children and next(children[n].parameters(), None) is not None
    ]
    return (
        stack,
        [n for n in has_params if order.index(n) < at],
        [n for n in has_params if order.index(n) > at],
    )


def meta_parts(c: Any) -> dict[str, Any]:
    """The model transformers builds from config ``c`` on the meta device (no memory), read as
    the shape's parts: the layer stack (the ModuleList of ``num_hidden_layers`` blocks), its
    first block's tensors and norms, the roots beside the token embedding and the head (learned
    positions before the blocks, the final norms after them), tied embeddings, a gated MLP
    (three h×f matrices' worth, rather than two)."""
    transformers = import_transformers()
    import torch  # the meta device only; pyproject.toml's contracts name this import

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(c)
    stack = getattr(model.base_model, layer_stack(model.base_model, c)[0])
    moe = moe_parts(c, stack)
    block, parts = _block_tensors(c, stack[0])
    inside = {id(p) for p in stack.parameters()}
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    first, last = [], []
    for name, p in model.named_parameters():
        if id(p) in inside or p is embed or p is head:
            continue
        rows, cols = (tuple(p.shape) + (1,))[:2]
        tensor = ParamTensor(name, rows, cols, TP_REPLICATED)
        (first if p.dim() == 2 else last).append(tensor)
    return dict(
        block=block,
        first_roots=tuple(first),
        last_roots=tuple(last),
        tied=head is embed,
        **_mlp(c, stack[0]),
        **parts,
        **moe,
    )


MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
"""Multi-head latent attention's sizes in a config (DeepSeek-V2/V3's)."""


def mla_parts(c: Any) -> dict[str, Any]:
    """MLA's ranks and head widths (:data:`MLA_KEYS`, a missing q_lora_rank 0: q projected at
    full rank, as DeepSeek-V2-Lite) where the config has a ``kv_lora_rank``; else none."""
    if not getattr(c, "kv_lora_rank", None):
        return {}
    return {"mla": tuple(int(getattr(c, k, None) or 0) for k in MLA_KEYS)}


def _has_experts(block: Any) -> bool:
    return any(p.dim() == 3 for p in block.parameters())


def moe_parts(c: Any, stack: Any) -> dict[str, Any]:
    """A mixture of experts' parts, read from its config and its built layer stack: the MoE
    layers' tensors (the first layer holding stacked experts; every later layer must hold them
    too, as DeepSeek-V3's ``first_k_dense_replace`` and Qwen3-MoE's defaults build) and its
    ``MoESpec``: routed experts (``n_routed_experts``, ``num_experts``, ``num_local_experts``),
    ``num_experts_per_tok``, ``moe_intermediate_size``, ``n_shared_experts``, the leading
    dense layers. Empty for a dense model."""
    sparse = [i for i, b in enumerate(stack) if _has_experts(b)]
    if not sparse:
        return {}
    first = sparse[0]
    if sparse != list(range(first, len(stack))):
        raise ConfigError(
            f"{c.model_type}: dense layers between its MoE layers "
            f"(MoE at {sparse[:8]}…); the cost model describes leading dense layers only"
        )
    experts = next(getattr(c, k) for k in MOE_KEYS if isinstance(getattr(c, k, None), int))
    spec = MoESpec(
        num_experts=experts,
        top_k=c.num_experts_per_tok,
        expert_ffn_size=getattr(c, "moe_intermediate_size", None) or c.intermediate_size,
        num_shared_experts=getattr(c, "n_shared_experts", None) or 0,
        first_dense_layers=first,
    )
    blocks = _block_tensors(c, stack[first])[0]
    return {"moe": spec, "moe_block": blocks}


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
    expresses. A mixture of experts the trials do not train (``check_trainable``) is priced
    as the engines shard it (Megatron's TP of its attention and shared experts), whatever
    styles its plan names for transformers' own kernels (DeepSeek-V3's ``mla_kv_a_proj``)."""
    ref = trial.workload.hf_model
    untrained_moe = moe_experts(config) is not None and config.model_type not in TRAINABLE_MOE_TYPES
    if trial.tp_degree > 1 and not untrained_moe:
        if not getattr(config, "base_model_tp_plan", None):
            raise ConfigError(
                f"'{ref}' ({config.model_type}) has no base_model_tp_plan in its "
                "config, so it has no tensor parallelism; use tp_degree 1"
            )
        tp_plan_names(config, range(1))  # raises naming an entry torch cannot express
