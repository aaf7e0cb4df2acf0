"""Hugging Face ``transformers`` causal LMs as workloads: ``--model hf:PATH_OR_ID``.

The model is built from its ``config.json`` alone (``AutoModelForCausalLM.from_config``, random
initialisation, no weights), so a search never downloads or loads a checkpoint. PATH is a folder
holding ``config.json`` or the file itself; an id (``org/name``) is looked up in the local Hugging
Face cache only (``huggingface_hub.try_to_load_from_cache``).

The trained module is :class:`HFStage`, and its forward is the HF model's own: the causal LM's
``forward`` (embeddings with their family's scale or multiplier, positions, the masks of
``transformers.masking_utils`` per layer type, rotary embeddings per layer type, the decoder
layers, the final norm, the head with its soft-capping or logit scaling), so no family needs code
here. The layer stack is found from the config's ``base_model_pp_plan`` (the ModuleList it names;
without a plan, the base model's ModuleList of ``num_hidden_layers`` layers). A pipeline stage is
the same model with the layers of other stages replaced by parameter-free stand-ins: those before
the stage return the hidden states the stage received (passed as ``inputs_embeds``, so whatever
the base model computes from them before its first layer is discarded), those after hand their
input on; the input side (the PP plan's entries before the stack) stays on the first stage, the
output side (after it) and the head on the last. Tied input and output embeddings under a
pipeline are two copies, on the first and the last stage, whose gradients are summed over the two
stages' ranks before each optimizer step (:func:`sum_tied_gradients`), so training equals one
process.

Tensor parallelism maps the config's ``base_model_tp_plan`` styles to torch's ParallelStyles
(:data:`TP_STYLES`); sequence parallelism puts the decoder layer's own norms on sequence shards,
as for the built-in model. Context parallelism replaces the attention function through
transformers' ``AttentionInterface`` (:func:`cp_attention`), sliding windows included.
Activation checkpointing and FSDP units are the decoder layers.

``tests/trial/test_hf.py`` and ``tests/trial/test_hf_families.py`` check that the layouts train
the same losses as the plain HF model in one process.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from autotune.errors import ConfigError
from autotune.hf_config import (
    check_trainable,
    import_transformers,
    layer_stack,
    load_config,
    tp_plan_names,
)
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
    mask of the local queries' global positions against the gathered keys: causal, and within
    the layer's ``sliding_window`` when the attention passes one (a query sees the keys less
    than the window behind it, as ``masking_utils.sliding_window_overlay``)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import eager_attention_forward

    key, value = gather_sequence(key, cp), gather_sequence(value, cp)
    allowed = causal_mask(cp, query.device, window=kwargs.get("sliding_window"))
    additive = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
    additive = additive.masked_fill(~allowed, torch.finfo(query.dtype).min)[None, None]
    inner = ALL_ATTENTION_FUNCTIONS.get_interface(cp_inner, eager_attention_forward)
    return inner(module, query, key, value, additive, **kwargs)


def _register_cp_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(CP_ATTENTION, cp_attention)


# ---- tensor parallelism from base_model_tp_plan ----------------------------------------------
def _replicated_with_grad_allreduce():
    """HF's ``replicated_with_grad_allreduce`` (a norm between a colwise and a rowwise Linear
    over this rank's heads only, e.g. Qwen3's per-head ``q_norm``): the weight replicated and its
    gradient summed over tp. torch's SequenceParallel does exactly that when the input is read as
    sharded along a dimension the norm does not reduce over (dim 0 here): the weight is a
    Replicate DTensor, its gradient a Partial that DTensor all-reduces."""
    from torch.distributed.tensor.parallel import SequenceParallel

    return SequenceParallel(sequence_dim=0, use_local_output=True)


def _styles(sequence_parallel: bool) -> dict:
    """transformers 5's style names (``distributed/tensor_parallel.py``, ALL_PARALLEL_STYLES) →
    torch ParallelStyle factories. Under SP a rowwise output reduce-scatters onto the sequence."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    out = Shard(1) if sequence_parallel else Replicate()
    return {
        "colwise": lambda: ColwiseParallel(),
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise": lambda: RowwiseParallel(output_layouts=out),
        "rowwise_split_input": lambda: RowwiseParallel(
            input_layouts=Replicate(), output_layouts=out
        ),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate(), output_layouts=out),
        "replicated_with_grad_allreduce": _replicated_with_grad_allreduce,
    }


def tp_plan(
    config: Any,
    layer_indices: range,
    *,
    prefix: str = "",
    sequence_parallel: bool = False,
    layer: nn.Module | None = None,
) -> dict | None:
    """torch ParallelStyles for the config's ``base_model_tp_plan``
    (``autotune.hf_config.tp_plan_names``), one per expanded path under ``prefix``.

    With ``sequence_parallel`` (torchtitan's ``apply_tp``), the decoder ``layer``'s norms (its
    children whose class is a norm) run on sequence shards and the parents of the plan's modules
    (``self_attn``, called with ``hidden_states=``; ``mlp``, positionally, as the decoder layers
    of transformers call them) all-gather their sequence-sharded input; None when ``layer`` has
    no norm of its own."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel

    names = tp_plan_names(config, layer_indices, prefix=prefix)
    if names is None:
        return None
    styles = _styles(sequence_parallel)
    plan = {path: styles[style]() for path, style in names.items() if style in styles}
    if not sequence_parallel:
        return plan
    norms = [
        n
        for n, m in (layer.named_children() if layer is not None else ())
        if type(m).__name__.endswith(("RMSNorm", "LayerNorm", "Norm"))
    ]
    if not norms:
        return None
    seq = Shard(1)
    regions = sorted({path.rpartition(".")[0] for path in names})
    layer_paths = sorted({region.rpartition(".")[0] for region in regions})
    # Local outputs: a family whose norm follows attention (Gemma, OLMo 2) adds its output to
    # the residual stream, which is the local shard.
    out: dict = {
        f"{path}.{n}": SequenceParallel(use_local_output=True)
        for path in layer_paths
        for n in norms
    }
    for region in regions:
        out[region] = (
            PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": seq},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            )
            if region.endswith(".self_attn")
            else PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
        )
    out.update(plan)
    return out


# ---- the stage module ------------------------------------------------------------------------
class _Carry:
    """The hidden states a pipeline stage received, while its forward runs."""

    value: torch.Tensor | None = None


class _Received(nn.Module):
    """Stands for a layer of an earlier stage: returns the stage's received hidden states,
    whatever the base model computed before it."""

    def __init__(self, carry: _Carry) -> None:
        super().__init__()
        self.carry = carry

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        return self.carry.value


class _Passed(nn.Module):
    """Stands for a layer of a later stage: hands the hidden states on."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states


class _Dropped(nn.Module):
    """An input-side module of the first stage (GPT-2's position embeddings) on a later stage:
    what it returns is discarded (the received hidden states replace it), so a zero."""

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(())


STAND_INS = (_Received, _Passed)


class HFStage(nn.Module):
    """An HF causal LM (or one pipeline stage of it) whose forward maps a tensor to a tensor:
    token ids → logits for the whole model, ids → hidden states (first stage), hidden → hidden,
    hidden → logits (last stage), each through the HF model's own forward."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.hf = model
        self.config = model.config
        base = model.base_model
        self.stack_name, self.input_side, self.output_side = layer_stack(base, self.config)
        prefix = model.base_model_prefix if base is not model else ""
        self.base_path = f"hf.{prefix}" if prefix else "hf"
        self.first = self.last = True
        self._carry = _Carry()
        self._cp: ContextParallel | None = None
        self._inner_attention: str = self.config._attn_implementation

    @property
    def base(self) -> nn.Module:
        return self.hf.base_model

    @property
    def stack(self) -> nn.ModuleList:
        return getattr(self.base, self.stack_name)

    @property
    def stack_path(self) -> str:
        return f"{self.base_path}.{self.stack_name}"

    @property
    def cp(self) -> ContextParallel | None:
        """The cp group (``context_parallel.apply_cp``); setting one routes every layer's
        attention through :func:`cp_attention`."""
        return self._cp

    @cp.setter
    def cp(self, cp: ContextParallel | None) -> None:
        _register_cp_attention()
        self.config._attn_implementation = CP_ATTENTION if cp is not None else self._inner_attention
        self._cp = cp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kwargs: dict[str, Any] = {"use_cache": False}
        cp = self._cp
        if cp is not None:  # cp_attention builds the mask of the global positions
            kwargs.update(
                position_ids=cp.positions(x.device).unsqueeze(0),
                cp=cp,
                cp_inner=self._inner_attention,
            )
        if self.first:
            kwargs["input_ids"] = x
        else:
            kwargs["inputs_embeds"] = self._carry.value = x
        try:
            if self.last:
                return self.hf(**kwargs).logits
            return self.base(**kwargs).last_hidden_state
        finally:
            self._carry.value = None


def hf_blocks(stage: nn.Module) -> list[tuple[str, nn.Module]]:
    """The stage's own decoder layers, by path (the units of AC, FSDP, compile and SP)."""
    return [
        (f"{stage.stack_path}.{i}", m)
        for i, m in enumerate(stage.stack)
        if not isinstance(m, STAND_INS)
    ]


def split_stage(stage: nn.Module, stage_index: int, num_stages: int) -> nn.Module:
    """Keep one pipeline stage's layers (and the input side / output side and head at the
    ends), in place; layers are split as ``transformer.split_for_pipeline`` splits them."""
    from autotune.shapes import stage_layer_range

    stack = stage.stack
    keep = stage_layer_range(len(stack), stage_index, num_stages)
    for i in range(len(stack)):
        if i < keep.start:
            stack[i] = _Received(stage._carry)
        elif i >= keep.stop:
            stack[i] = _Passed()
    base = stage.base
    tied = bool(getattr(stage.config, "tie_word_embeddings", False))
    stage.first, stage.last = stage_index == 0, stage_index == num_stages - 1
    if tied and (stage.first or stage.last):  # not a submodule: a second path to it
        end = base.get_input_embeddings() if stage.first else stage.hf.get_output_embeddings()
        stage.__dict__["tied_module"] = end
    if not stage.first:
        for name in stage.input_side:
            setattr(base, name, _Dropped())
    if not stage.last:
        for name in stage.output_side:
            setattr(base, name, nn.Identity())
        head = stage.hf.get_output_embeddings()
        for name, child in list(stage.hf.named_children()):
            if child is head:
                setattr(stage.hf, name, None)
    if tied:
        _TIED[stage] = (stage_index, num_stages)
        _install_tied_hook()
    return stage


# ---- tied embeddings across pipeline stages --------------------------------------------------
_TIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Pipeline stages of models with tied embeddings → (stage index, number of stages)."""
_HOOK: list = []
_PAIR_GROUPS: dict[tuple, dist.ProcessGroup] = {}
"""(world group, (first-stage rank, last-stage rank) pairs) → the pairs' groups, made once."""


def _install_tied_hook() -> None:
    if not _HOOK:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        _HOOK.append(register_optimizer_step_pre_hook(_before_optimizer_step))


def _before_optimizer_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Every optimizer's step passes here; one holding a tied stage's parameters sums the
    tied copies' gradients first (:func:`sum_tied_gradients`)."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    stages = [s for s in list(_TIED.keys()) if any(id(p) in held for p in s.parameters())]
    if stages:
        sum_tied_gradients(stages)


def _pair_group(stages: list[nn.Module]) -> dist.ProcessGroup | None:
    """The group of this rank's first-stage and last-stage partner, made on the first step by
    every rank (``new_group`` is collective): ranks holding stage 0 pair with those holding the
    last stage in rank order (pp is the mesh's outermost dimension, so the k-th of each holds
    the same dp, cp and tp coordinates)."""
    for s in stages:
        if hasattr(s, "_tied_group"):
            return s._tied_group
    num_stages = _TIED[stages[0]][1]
    mine = sorted(_TIED[s][0] for s in stages)
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    firsts = [r for r, held in enumerate(every) if 0 in held]
    lasts = [r for r, held in enumerate(every) if num_stages - 1 in held]
    pairs = tuple(zip(firsts, lasts))
    key = (id(dist.group.WORLD), pairs)
    if key not in _PAIR_GROUPS:
        _PAIR_GROUPS[key] = {pair: dist.new_group(list(pair)) for pair in pairs}
    rank = dist.get_rank()
    group = next((g for pair, g in _PAIR_GROUPS[key].items() if rank in pair), None)
    for s in stages:
        s._tied_group = group
    return group


def sum_tied_gradients(stages: list[nn.Module]) -> None:
    """Sum the gradient of the tied embedding's two copies (first stage's input embedding, last
    stage's head) over their two ranks, in place: each copy then steps with the gradient the
    single weight of one process gets. Done once per backward (an optimizer that steps inside
    another, as ZeRO-1's, finds the gradient already summed: its version is recorded)."""
    group = _pair_group(stages)
    for s in stages:
        module = getattr(s, "tied_module", None)
        if module is None or group is None:
            continue
        weight = module.weight
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        grad = weight.grad
        local = grad.to_local() if hasattr(grad, "to_local") else grad
        if getattr(s, "_tied_summed", None) == (id(local), local._version):
            continue
        dist.all_reduce(local, group=group)
        s._tied_summed = (id(local), local._version)


def build_hf(spec: Any, *, attention: str = "sdpa", seed: int = 0) -> Any:
    """The Workload of a spec with ``hf_model``: random init from the config, no weights."""
    from autotune.trial.models.workload import Workload, synthetic_batch

    transformers = import_transformers()
    vocab = spec.resolved_vocab_size
    config = copy.deepcopy(load_config(spec.hf_model))  # the cached one stays unchanged
    # A config that reaches a rank without the CLI's check (``trial --config FILE``): a mixture
    # of experts the cost model prices but the trials do not train fails in one line here.
    check_trainable(config, spec.hf_model)
    config.vocab_size, config.use_cache = vocab, False
    torch.manual_seed(seed)
    try:
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    except ValueError:  # a family without SDPA (Gemma 2: soft-capped attention) runs eager
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
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

    layers = range(num_layers)
    try:
        plan = tp_plan(config, layers, prefix=stage.base_path)
        sp_plan = tp_plan(
            config, layers, prefix=stage.base_path, sequence_parallel=True, layer=stage.stack[0]
        )
    except ConfigError:
        plan = sp_plan = None  # check_layout names the entry when a layout asks for tp > 1
    return Workload(
        model=stage,
        batch=batch,
        tp_plan=plan,
        sp_plan=sp_plan,
        pipeline_split=split_stage,
        blocks=hf_blocks,
        num_heads=config.num_attention_heads,
        num_layers=num_layers,
    )
