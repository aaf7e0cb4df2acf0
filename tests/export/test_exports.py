"""The exports of the newer knobs (sequence and context parallelism, HSDP, virtual stages,
compile, float8), read back by their targets' own loaders:

- ``megatron_args.txt`` builds Megatron-Core's ``TransformerConfig`` and
  ``DistributedDataParallelConfig`` (their own validation runs on construction), each flag given
  to the field of its name as Megatron-LM's ``core_transformer_config_from_args`` does; the
  ``megatron-core`` wheel has no ``megatron/training/arguments.py`` to parse the command line
  itself, so the flags that only the training script reads are listed here by name;
- ``torchtitan_config.py`` loads through torchtitan's ConfigManager, and torchtitan's own
  pipeline split of its settings gives the stages (and their layers) the trial ran;
- ``accelerate_config.yaml`` goes through Accelerate's launcher into its ParallelismConfig.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
from export_loaders import accelerate_parallelism_config, load_torchtitan_module

from autotune.config import TrialConfig, WorkloadSpec
from autotune.export.ds_config import check_batch_identity, ds_config
from autotune.export.megatron import megatron_text
from autotune.export.trainers import accelerate_yaml, torchtitan_module, torchtitan_settings
from autotune.shapes import stage_layer_counts

# world 32 = tp 2 × pp 2 × cp 2 × dp 4 (HSDP: 2 replica groups of 2 shards), interleaved over 6
# stages of Llama 1B's 16 layers (uneven: torchtitan and the trial weigh the embedding and head
# as a layer each: 2, 3, 3, 3, 3, 2).
LLAMA = WorkloadSpec(family="llama", size="1b", seq_len=64, global_batch_size=8)
EVERY_KNOB = TrialConfig(
    workload=LLAMA,
    world_size=32,
    tp_degree=2,
    pp_degree=2,
    cp_degree=2,
    zero_stage=3,
    dp_replicate=2,
    sequence_parallel=True,
    pp_schedule="interleaved_1f1b",
    virtual_stages=3,
    compile=True,
    activation_checkpointing="full",
    ac_layers=1,
    device="cuda",
    precision="bf16-mixed",
)
FLOAT8 = dataclasses.replace(EVERY_KNOB, float8=True, compile=False, ac_layers=None)
# torchtitan recomputes every block or none (ac_layers is refused); op-level AC is its SelectiveAC
TITAN = dataclasses.replace(EVERY_KNOB, activation_checkpointing="op", ac_layers=None)

# Flags Megatron-LM's training script reads itself (megatron/training/arguments.py), not copied
# into a Megatron-Core config field of the same name.
TRAINING_SCRIPT_FLAGS = {
    "micro_batch_size",
    "global_batch_size",
    "seq_length",
    "max_position_embeddings",
    "position_embedding_type",
    "swiglu",
    "group_query_attention",
    "use_megatron_fsdp",
    "num_virtual_stages_per_pipeline_rank",
}
# Flags whose argparse dest is not the flag's name (arguments.py: dest='fp8').
DEST = {"fp8_format": "fp8"}


def _megatron_namespace(text: str) -> dict:
    """The argparse namespace of the file's flags: store_true flags True, others their value."""
    args: dict = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        flag, *values = shlex.split(line)
        name = flag.removeprefix("--").replace("-", "_")
        args[DEST.get(name, name)] = (values[0] if len(values) == 1 else values) if values else True
    return args


def _megatron_configs(config: TrialConfig):
    """Megatron-Core's configs from the file, the way pretrain_gpt.py fills them."""
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    args = _megatron_namespace(megatron_text(config))
    ints = {k: int(v) for k, v in args.items() if isinstance(v, str) and v.isdigit()}
    args.update(ints)
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    ddp_fields = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    unknown = set(args) - fields - ddp_fields - TRAINING_SCRIPT_FLAGS
    assert not unknown, unknown
    core = {k: v for k, v in args.items() if k in fields}
    # validate_args: the virtual stages, the dtypes and SwiGLU as the training script sets them
    # (a single --cp-comm-type stays a string: every layer shares it)
    core["virtual_pipeline_model_parallel_size"] = args.get("num_virtual_stages_per_pipeline_rank")
    core["gated_linear_unit"] = args.get("swiglu", False)
    if args.get("bf16"):
        core["params_dtype"] = core["pipeline_dtype"] = torch.bfloat16
    return (
        TransformerConfig(**core),
        DistributedDataParallelConfig(**{k: v for k, v in args.items() if k in ddp_fields}),
        args,
    )


def test_megatron_args_build_megatron_cores_configs():
    pytest.importorskip("megatron.core")
    c = EVERY_KNOB
    tc, ddp, args = _megatron_configs(c)
    assert (
        tc.tensor_model_parallel_size,
        tc.pipeline_model_parallel_size,
        tc.context_parallel_size,
    ) == (2, 2, 2)
    assert tc.virtual_pipeline_model_parallel_size == 3 and tc.sequence_parallel
    assert tc.cp_comm_type == "allgather"
    assert (tc.recompute_granularity, tc.recompute_method, tc.recompute_num_layers) == (
        "full",
        "block",
        1,
    )
    assert tc.bf16 and not tc.fp8
    assert (tc.num_layers, tc.hidden_size, tc.num_attention_heads, tc.num_query_groups) == (
        16,
        2048,
        32,
        8,
    )
    assert ddp.data_parallel_sharding_strategy == "optim_grads_params"
    assert ddp.num_distributed_optimizer_instances == 2 and ddp.overlap_grad_reduce
    assert args["micro_batch_size"] == c.micro_batch_size
    assert args["global_batch_size"] == c.workload.global_batch_size
    text = megatron_text(c)
    assert "What Megatron cannot express" in text and "compile" in text
    assert "first\n#" not in text and "decoder-first-pipeline-num-layers" in text  # uneven split


@pytest.mark.parametrize(
    "mode,ac_layers,expected",
    [
        ("full", None, ("full", "uniform", 1)),
        ("full", 3, ("full", "block", 3)),
        ("selective", None, ("selective", None, None)),
        ("none", None, (None, None, None)),
        ("op", None, (None, None, None)),
    ],
)
def test_megatron_recompute_and_zero1(mode, ac_layers, expected):
    """Megatron's block method recomputes the first n layers of each stage (TransformerBlock.
    _checkpointed_forward), as ac_layers does; uniform with 1 layer a unit is every block; op
    has no Megatron granularity: no flag, named among what Megatron cannot express."""
    pytest.importorskip("megatron.core")
    config = dataclasses.replace(
        EVERY_KNOB,
        activation_checkpointing=mode,
        ac_layers=ac_layers,
        zero_stage=1,
        dp_replicate=1,
        sequence_parallel=False,
    )
    tc, ddp, args = _megatron_configs(config)
    assert (tc.recompute_granularity, tc.recompute_method, tc.recompute_num_layers) == expected
    cannot = [line for line in megatron_text(config).splitlines() if line.startswith("#")]
    assert any("'op'" in line and "--recompute-granularity full" in line for line in cannot) == (
        mode == "op"
    )
    assert ddp.use_distributed_optimizer and ddp.overlap_param_gather
    assert not tc.sequence_parallel and "use_megatron_fsdp" not in args


def test_megatron_float8_is_fp8_hybrid_tensorwise():
    pytest.importorskip("megatron.core")
    tc, _, _ = _megatron_configs(FLOAT8)
    assert tc.fp8 == "hybrid" and tc.fp8_recipe == "tensorwise"


def _load_torchtitan(folder: Path, config: TrialConfig):
    (folder / "torchtitan_config.py").write_text(torchtitan_module(config))
    return load_torchtitan_module(folder)


@pytest.mark.parametrize("virtual_stages", [2, 3])  # 4 stages of 4 layers; 6 uneven ones
def test_torchtitan_config_loads_with_the_new_knobs_and_splits_as_the_trial(
    tmp_path, virtual_stages
):
    pytest.importorskip("torchtitan")
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part,
        _get_pipeline_metadata,
    )

    c = dataclasses.replace(TITAN, virtual_stages=virtual_stages)
    num_layers = c.workload.shape.num_layers
    titan = _load_torchtitan(tmp_path, c)
    p = titan.parallelism
    assert p.enable_sequence_parallel and p.context_parallel_degree == 2
    assert (p.data_parallel_replicate_degree, p.data_parallel_shard_degree) == (2, 2)
    assert titan.compile.enable and titan.compile.components == ["model"]
    dims = ParallelDims(dp_replicate=2, dp_shard=2, cp=2, tp=2, pp=2, ep=1, world_size=32)
    stages, layers, first, last = _get_pipeline_metadata(
        dims, p, SimpleNamespace(layers=range(num_layers))
    )
    assert stages == c.num_pp_stages == 2 * virtual_stages
    parts = _generate_llm_fqn_per_model_part(stages, layers, first, last)
    counts = [sum(name.startswith("layers.") for name in part) for part in parts]
    assert counts == stage_layer_counts(num_layers, stages)


@pytest.mark.parametrize(
    "mode,policy",
    [("none", None), ("full", "FullAC"), ("op", "SelectiveAC"), ("selective", "SelectiveAC")],
)
def test_torchtitan_activation_checkpointing(tmp_path, mode, policy):
    """op is torchtitan's SelectiveAC (its op-level policy, ``mode = "selective",
    selective_ac_option = "op"`` up to 0.2); selective, which torchtitan lacks, is written as
    the same and named among what torchtitan cannot express."""
    pytest.importorskip("torchtitan")
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    c = dataclasses.replace(TITAN, activation_checkpointing=mode)
    settings, notes = torchtitan_settings(c)
    assert settings["activation_checkpoint"] == policy
    ac = _load_torchtitan(tmp_path, c).activation_checkpoint
    expected = {None: type(None), "FullAC": FullAC.Config, "SelectiveAC": SelectiveAC.Config}
    assert type(ac) is expected[policy]
    assert any(n.startswith("selective:") for n in notes) == (mode == "selective")


def test_torchtitan_writes_ac_layers_as_full_ac_with_a_note():
    """torchtitan has no count of recomputed blocks (0.2's selective_ac_option '<n>' meant every
    n-th block, not the first n of each stage): the export recomputes every block (FullAC,
    never more memory than measured) and its notes name the difference and the way out."""
    settings, notes = torchtitan_settings(EVERY_KNOB)
    assert settings["activation_checkpoint"] == "FullAC"
    assert any(n.startswith("ac_layers 1:") and "megatron_args.txt" in n for n in notes)


def test_torchtitan_float8_reaches_torchtitans_converter(tmp_path):
    """On a CPU the converter refuses (no float8 matmul, or torchao absent): the key is wired to
    torchtitan's Float8LinearConverter, which is what a GPU run would build."""
    pytest.importorskip("torchtitan")
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU the converter accepts; the refusal is what a CPU can check")
    with pytest.raises((ImportError, ValueError), match="torchao|float8"):
        _load_torchtitan(tmp_path, FLOAT8)


def test_accelerate_config_expresses_hsdp_cp_and_compile(tmp_path):
    pytest.importorskip("accelerate")
    from accelerate.commands.launch import (
        _validate_launch_command,
        launch_command_parser,
    )
    from accelerate.utils.launch import prepare_multi_gpu_env

    c = dataclasses.replace(
        EVERY_KNOB,
        pp_degree=1,
        world_size=16,
        pp_schedule="1f1b",
        virtual_stages=TrialConfig().virtual_stages,
    )
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(accelerate_yaml(c, "LlamaDecoderLayer"))
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = _validate_launch_command(args)
    assert args.num_processes == 16 and args.use_fsdp
    env = prepare_multi_gpu_env(args)
    assert env["ACCELERATE_DYNAMO_BACKEND"] == "INDUCTOR"
    assert env["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] == "True"
    pc = accelerate_parallelism_config(env)
    assert (pc.dp_replicate_size, pc.dp_shard_size, pc.tp_size, pc.cp_size) == (2, 2, 2, 2)
    assert pc.total_size == 16
    assert "sequence parallelism" in path.read_text()  # what Accelerate cannot express


def test_ds_config_states_what_deepspeed_cannot_express():
    ds = ds_config(EVERY_KNOB)
    check_batch_identity(ds, EVERY_KNOB.dp_degree)
    notes = " ".join(ds["autotune_notes"])
    for words in (
        "Ulysses",
        "context parallelism cp 2",
        "HSDP",
        "virtual stages",
        "engine.compile()",
    ):
        assert words in notes
    assert "float8" in " ".join(ds_config(FLOAT8)["autotune_notes"])
    assert "op-level" in " ".join(ds_config(TITAN)["autotune_notes"])
    assert "op-level" not in notes
    assert "autotune_notes" not in ds_config(TrialConfig(device="cpu"))  # nothing to note
