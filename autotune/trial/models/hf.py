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
``base_model_tp_plan`` (``colwise``/``rowwise``) into torch's ParallelStyles (with sequence
parallelism, the decoder layer's norms on sequence shards, as for the built-in model); activation
checkpointing and FSDP units are the decoder layers (the class ``_no_split_modules`` names).

Architectures whose base-model forward this reproduces: GPT-2 (``wte``/``wpe``/``h``/``ln_f``)
and the Llama-style decoders (``embed_tokens``/``rotary_emb``/``layers``/``norm``) listed in
``LLAMA_STYLE``. ``tests/test_hf.py`` checks that every valid world-2 layout trains the same
losses as the plain HF model in one process.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from autotune.errors import ConfigError
from autotune.hf_config import import_transformers, load_config, tp_plan_names
from autotune.trial.models.context_parallel import ContextParallel, causal_mask, gather_sequence

CP_ATTENTION = "autotune_cp"
"""The name context-parallel attention is registered under in transformers'
``AttentionInterface``; it wraps the model's own implementation (sdpa or eager)."""


def cp_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    cp: ContextParallel,
    cp_inner: str,
    **kwargs: Any,
):
    """An ``AttentionInterface`` function: all-gather K/V (kv heads, before the inner function
    repeats them for GQA) over the cp group, then the inner implementation with the additive
    causal mask of the local queries' global positions against the gathered keys."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import eager_attention_forward

    key, value = gather_sequence(key, cp), gather_sequence(value, cp)
    allowed = causal_mask(cp, query.device)
    additive = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
    additive = additive.masked_fill(~allowed, torch.finfo(query.dtype).min)[None, None]
    inner = ALL_ATTENTION_FUNCTIONS.get_interface(cp_inner, eager_attention_forward)
    return inner(module, query, key, value, additive, **kwargs)


def _register_cp_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(CP_ATTENTION, cp_attention)


# ---- tensor parallelism from base_model_tp_plan ----------------------------------------------
def tp_plan(
    config: Any,
    layer_indices: range,
    *,
    sequence_parallel: bool = False,
    layer: nn.Module | None = None,
) -> dict | None:
    """torch ParallelStyles for the config's ``base_model_tp_plan``
    (``autotune.hf_config.tp_plan_names``), one per expanded path of :class:`HFStage`.

    With ``sequence_parallel`` (``workload.plan_styles``), the decoder ``layer``'s norms (its
    children whose class is a LayerNorm/RMSNorm) run on sequence shards and the parents of the
    plan's Linears (``self_attn``, called with ``hidden_states=``; ``mlp``, positionally, as
    the Llama-style decoder layers call them) are the TP regions; None when ``layer`` has no
    norm of its own."""
    from autotune.trial.models.workload import plan_styles

    names = tp_plan_names(config, layer_indices)
    if names is None:
        return None
    if not sequence_parallel:
        return plan_styles(names)
    norms = [
        n
        for n, m in (layer.named_children() if layer is not None else ())
        if type(m).__name__.endswith(("RMSNorm", "LayerNorm"))
    ]
    if not norms:
        return None
    regions = {path.rpartition(".")[0] for path in names}
    return plan_styles(
        names,
        sequence_parallel=True,
        norms=tuple(f"layers.{i}.{n}" for i in layer_indices for n in norms),
        regions={r: "hidden_states" if r.endswith(".self_attn") else None for r in regions},
    )


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
        self._cp: ContextParallel | None = None
        self._inner_attention: str = self.config._attn_implementation

    @property
    def cp(self) -> ContextParallel | None:
        """The cp group (``context_parallel.apply_cp``); setting one routes every layer's
        attention through :func:`cp_attention`."""
        return self._cp

    @cp.setter
    def cp(self, cp: ContextParallel | None) -> None:
        if cp is not None and "sliding_attention" in _attention_kinds(self.config):
            raise ConfigError(
                f"{self.config.model_type}: context parallelism runs full causal "
                "attention only (no sliding windows); use cp_degree 1"
            )
        _register_cp_attention()
        self.config._attn_implementation = (
            CP_ATTENTION if cp is not None else (self._inner_attention)
        )
        self._cp = cp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import (
            create_causal_mask,
            create_sliding_window_causal_mask,
        )

        h = self.embed(x) if self.embed is not None else x
        cp = self._cp
        position_ids = (
            cp.positions(h.device) if cp is not None else torch.arange(h.shape[1], device=h.device)
        ).unsqueeze(0)
        if self.pos_embed is not None:
            h = h + self.pos_embed(position_ids)
        if self.embed_dropout is not None:
            h = self.embed_dropout(h)
        if self.layers:
            mask_args = dict(
                config=self.config,
                inputs_embeds=h,
                attention_mask=None,
                cache=None,
                position_ids=position_ids,
            )
            layer_types = getattr(self.config, "layer_types", None)
            default = _default_attention(self.config)
            extra: dict[str, Any] = {}
            if cp is not None:  # cp_attention builds the mask of the global positions
                masks = {"full_attention": None}
                extra.update(cp=cp, cp_inner=self._inner_attention)
            else:
                masks = {"full_attention": create_causal_mask(**mask_args)}
            if cp is None and "sliding_attention" in _attention_kinds(self.config):
                masks["sliding_attention"] = create_sliding_window_causal_mask(**mask_args)
            if self.rotary is not None:
                extra["position_embeddings"] = self.rotary(h, position_ids)
            for key, layer in self.layers.items():
                kind = layer_types[int(key)] if layer_types else default
                out = layer(
                    h,
                    attention_mask=masks[kind],
                    position_ids=position_ids,
                    use_cache=False,
                    **extra,
                )
                h = out[0] if isinstance(out, tuple) else out
        if self.norm is not None:
            h = self.norm(h)
        if self.lm_head is not None:
            h = self.lm_head(h)
        return h


def _default_attention(config: Any) -> str:
    """The attention of a layer the config's ``layer_types`` does not name: Mistral (no
    layer_types) slides every layer's window when it has one."""
    return (
        "sliding_attention"
        if config.model_type == "mistral" and getattr(config, "sliding_window", None) is not None
        else "full_attention"
    )


def _attention_kinds(config: Any) -> set[str]:
    layer_types = getattr(config, "layer_types", None)
    return set(layer_types) if layer_types else {_default_attention(config)}


def split_stage(stage: nn.Module, stage_index: int, num_stages: int) -> nn.Module:
    """Keep one pipeline stage's layers (and the embeddings / norm and head at the ends), in
    place; layers are split as ``transformer.split_for_pipeline`` splits them."""
    from autotune.shapes import stage_layer_range

    keep = stage_layer_range(len(stage.layers), stage_index, num_stages)
    for key in list(stage.layers.keys()):
        if int(key) not in keep:
            del stage.layers[key]
    if stage_index > 0:
        stage.embed = stage.pos_embed = stage.embed_dropout = None
    if stage_index < num_stages - 1:
        stage.norm = stage.lm_head = None
    return stage


def build_hf(spec: Any, *, attention: str = "sdpa", seed: int = 0) -> Any:
    """The Workload of a spec with ``hf_model``: random init from the config, no weights."""
    from autotune.trial.models.workload import Workload, synthetic_batch, transformer_blocks

    transformers = import_transformers()
    vocab = spec.resolved_vocab_size
    config = copy.deepcopy(load_config(spec.hf_model))  # the cached one stays unchanged
    config.vocab_size, config.use_cache = vocab, False
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    model = model.float().train()  # fp32, as the built-in model: see parallel/precision.py
    stage = HFStage(model)
    num_layers = config.num_hidden_layers

    def batch(step: int):
        return synthetic_batch(
            step,
            seed=seed,
            batch_size=spec.global_batch_size,
            seq_len=spec.seq_len,
            vocab_size=vocab,
        )

    try:
        plan = tp_plan(config, range(num_layers))
        sp_plan = tp_plan(
            config,
            range(num_layers),
            sequence_parallel=True,
            layer=next(iter(stage.layers.values()), None),
        )
    except ConfigError:
        plan = sp_plan = None  # check_layout names the entry when a layout asks for tp > 1
    return Workload(
        model=stage,
        batch=batch,
        tp_plan=plan,
        sp_plan=sp_plan,
        pipeline_split=split_stage,
        blocks=transformer_blocks,
        num_heads=config.num_attention_heads,
        num_layers=num_layers,
    )
