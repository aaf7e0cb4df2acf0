"""Every export of every layout kind the default search can choose loads in its target's own
parser at the layout's world size.

The layouts are one of each kind (tp, pp under each schedule and its virtual stages, cp, HSDP, SP,
each activation-checkpointing mode, ZeRO 0–3; every other one compiled) of the default search
spaces on 2, 4 and 8 ranks. Each is exported as a search's end exports it
(``write_layout_exports``) and read back:

- ``ds_config.json`` by DeepSpeed's ``DeepSpeedConfig`` with ``deepspeed.comm`` answering the
  layout's world size and rank 0, and the mpu a job running the layout passes
  ``deepspeed.initialize`` (its data-parallel size: world / (tp × pp) under DeepSpeed's pipeline,
  whose topology has no sequence axis, else world / (tp × sequence_parallel_size)); context
  parallel files also without an mpu, DeepSpeed's own Ulysses path (world /
  sequence_parallel_size). Without a group DeepSpeed falls back to world 1 and accepts anything,
  so the parsed world size is checked too;
- ``accelerate_config.yaml`` through Accelerate's launcher into its ``ParallelismConfig``, which
  checks its sizes against the launched processes (``_validate_accelerator``);
- ``torchtitan_config.py`` through torchtitan's ``ConfigManager`` into its ``ParallelDims`` at the
  world size (its ``_validate``);
- ``megatron_args.txt`` into Megatron-Core's ``TransformerConfig`` and
  ``DistributedDataParallelConfig``, and its rank generator at the world size.

A file is left out only where its target has no way to run the layout; ``LEFT_OUT`` names each
such (layout kind, target) pair.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from export_loaders import accelerate_parallelism_config

from autotune.config import CHECKPOINTING_MODES, TrialConfig, WorkloadSpec
from autotune.export.best_config import export_study, write_layout_exports
from autotune.export.ds_config import ds_config
from autotune.search.space import SearchSpace

WORLDS = (2, 4, 8)
DS = "ds_config.json"
# (layout kind, target file) pairs whose target has no way to run the layout at all.
LEFT_OUT = {
    ("pp with ZeRO-2/3", DS): lambda c: c.pp_degree > 1 and c.zero_stage >= 2,
    ("cp with pp", DS): lambda c: c.cp_degree > 1 and c.pp_degree > 1,
    ("cp with tp", DS): lambda c: c.cp_degree > 1 and c.tp_degree > 1,
}
FILES = (DS, "accelerate_config.yaml", "torchtitan_config.py", "megatron_args.txt")


def _kind(c: TrialConfig) -> tuple:
    pp = c.pp_degree > 1
    interleaved = pp and c.pp_schedule == "interleaved_1f1b"
    return (
        c.tp_degree > 1,
        pp,
        c.pp_schedule if pp else None,
        c.virtual_stages if interleaved else None,
        c.cp_degree > 1,
        c.dp_replicate > 1,
        c.sequence_parallel,
        c.zero_stage,
    )


@functools.cache
def layouts() -> tuple[TrialConfig, ...]:
    """The first layout of each kind, smallest world first, the checkpointing modes and
    compile taken in turn (neither changes which ranks do what)."""
    kinds: dict[tuple, TrialConfig] = {}
    bases = [TrialConfig(world_size=world) for world in WORLDS]
    # the tiny model's 4 layers hold no 2 × 4 virtual stages; GPT small's 12 do
    bases.append(TrialConfig(workload=WorkloadSpec(size="small"), world_size=4))
    for base in bases:
        for c in SearchSpace(base).configs:
            kinds.setdefault(_kind(c), c)
    return tuple(
        dataclasses.replace(
            c,
            activation_checkpointing=CHECKPOINTING_MODES[i % len(CHECKPOINTING_MODES)],
            compile=i // len(CHECKPOINTING_MODES) % 2 == 1,
        )
        for i, c in enumerate(kinds.values())
    )


class Mpu:
    """The model-parallel unit a job running the layout gives ``deepspeed.initialize``."""

    def __init__(self, tp: int, pp: int, dp: int, sp: int) -> None:
        self.tp, self.pp, self.dp, self.sp = tp, pp, dp, sp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_model_parallel_world_size(self) -> int:
        return self.tp

    def get_tensor_model_parallel_world_size(self) -> int:
        return self.tp

    def get_pipeline_model_parallel_world_size(self) -> int:
        return self.pp

    def get_sequence_parallel_world_size(self) -> int:
        return self.sp


@pytest.fixture
def deepspeed_world(monkeypatch):
    """``load(path or dict, world, pp, mpu=True)``: DeepSpeedConfig of the file on ``world``
    ranks."""
    pytest.importorskip("deepspeed")
    import deepspeed.comm as dist
    from deepspeed.runtime.config import DeepSpeedConfig

    def load(path_or_dict, world: int, pp: int, *, mpu: bool = True):
        doc = (
            path_or_dict if isinstance(path_or_dict, dict) else json.loads(path_or_dict.read_text())
        )
        tp = doc.get("tensor_parallel", {}).get("autotp_size", 1)
        sp = doc.get("sequence_parallel_size", 1)
        dp = world // (tp * pp) if pp > 1 else world // (tp * sp)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: world)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
        # deepspeed.initialize reads a file into a dict before DeepSpeedConfig sees it (which
        # looks for sequence_parallel_size in that dict when there is no mpu); with an mpu the
        # file's path, which DeepSpeedConfig opens itself.
        source = str(path_or_dict) if mpu and isinstance(path_or_dict, Path) else doc
        parsed = DeepSpeedConfig(source, mpu=Mpu(tp, pp, dp, sp) if mpu else None)
        # not the fallback to world 1 that accepts anything
        assert parsed.world_size == (dp if mpu else world / sp)
        return parsed

    return load


def _check_deepspeed(load, path: Path, c: TrialConfig) -> None:
    for with_mpu in (True, False) if c.cp_degree > 1 else (True,):
        parsed = load(path, c.world_size, c.pp_degree, mpu=with_mpu)
        dp = c.world_size // (c.tp_degree * c.pp_degree * c.cp_degree)
        assert parsed.world_size == dp
        assert (
            parsed.train_batch_size,
            parsed.train_micro_batch_size_per_gpu,
            parsed.gradient_accumulation_steps,
            parsed.zero_optimization_stage,
        ) == (c.workload.global_batch_size, c.micro_batch_size, c.grad_accum_steps, c.zero_stage)
    doc = json.loads(path.read_text())
    assert doc.get("sequence_parallel_size", 1) == c.cp_degree


def _check_accelerate(path: Path, c: TrialConfig, seen: dict) -> None:
    """Accelerate's launcher and ParallelismConfig (once for each distinct file body)."""
    body = "".join(line for line in path.read_text().splitlines() if not line.startswith("#"))
    if body in seen:
        return
    seen[body] = c
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = _validate_launch_command(args)
    # Accelerate has no pipeline: the file runs the dp × cp × tp ranks of each stage
    assert args.num_processes * c.pp_degree == c.world_size
    if args.num_processes == 1:
        return
    env = prepare_multi_gpu_env(args)
    pc = accelerate_parallelism_config(env)
    accelerator = SimpleNamespace(
        multi_device=True,
        num_processes=args.num_processes,
        is_fsdp2=bool(args.use_fsdp),
        distributed_type=SimpleNamespace(),
    )
    if args.use_parallelism_config:
        pc._validate_accelerator(accelerator)
        assert (pc.tp_size, pc.cp_size) == (c.tp_degree, c.cp_degree)
    else:  # TP from the model's tp_plan, named in the file
        assert c.cp_degree == 1 and (c.tp_degree == 1 or "tp_plan" in path.read_text())


def _titan_job(path: Path, c: TrialConfig, *, cli: bool):
    """torchtitan's job config: through its ConfigManager (the command line it runs, about a
    second), or the module's config function alone (what ConfigManager calls)."""
    if cli:
        from test_exports import _load_torchtitan

        return _load_torchtitan(path.parent, c)
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace["autotune_best"]()


def _check_torchtitan(path: Path, c: TrialConfig, *, cli: bool) -> None:
    from torchtitan.distributed.parallel_dims import ParallelDims

    titan = _titan_job(path, c, cli=False)
    if cli:  # the command line torchtitan runs builds the same job
        assert _titan_job(path, c, cli=True).parallelism == titan.parallelism
    p = titan.parallelism
    dims = ParallelDims(
        dp_replicate=p.data_parallel_replicate_degree,
        dp_shard=p.data_parallel_shard_degree,
        cp=p.context_parallel_degree,
        tp=p.tensor_parallel_degree,
        pp=p.pipeline_parallel_degree,
        ep=1,
        world_size=c.world_size,
    )  # its _validate: the degrees multiply to the world size
    assert (dims.tp, dims.pp, dims.cp) == (c.tp_degree, c.pp_degree, c.cp_degree)


def _check_megatron(c: TrialConfig) -> None:
    from megatron.core.parallel_state import RankGenerator
    from test_exports import _megatron_configs

    tc, ddp, _ = _megatron_configs(c)
    tp, pp, cp = (
        tc.tensor_model_parallel_size,
        tc.pipeline_model_parallel_size,
        tc.context_parallel_size,
    )
    assert c.world_size % (tp * pp * cp) == 0  # initialize_model_parallel's rule
    ranks = RankGenerator(
        tp=tp, ep=1, dp=c.world_size // (tp * pp * cp), pp=pp, cp=cp, order="tp-cp-ep-dp-pp"
    )
    assert ranks.world_size == c.world_size
    dp_groups = ranks.get_ranks("dp")
    assert all(len(g) % ddp.num_distributed_optimizer_instances == 0 for g in dp_groups)
    assert (tp, pp, cp) == (c.tp_degree, c.pp_degree, c.cp_degree)


def test_the_walk_covers_every_layout_kind():
    seen = layouts()
    assert {c.world_size for c in seen} == set(WORLDS)
    assert {c.pp_schedule for c in seen if c.pp_degree > 1} == {"gpipe", "1f1b", "interleaved_1f1b"}
    assert {c.virtual_stages for c in seen if c.pp_schedule == "interleaved_1f1b"} >= {2, 4}
    assert {c.activation_checkpointing for c in seen} == {"none", "selective", "op", "full"}
    assert {c.zero_stage for c in seen} == {0, 1, 2, 3}
    for knob in ("sequence_parallel", "compile"):
        assert {getattr(c, knob) for c in seen} == {False, True}
    assert {c.cp_degree for c in seen} == {1, 2} and {c.dp_replicate for c in seen} == {1, 2}
    for kind in LEFT_OUT.values():  # each left-out kind is among the layouts
        assert any(kind(c) for c in seen)


def test_every_export_loads_in_its_targets_parser_at_the_layouts_world_size(
    tmp_path, deepspeed_world
):
    for name in ("accelerate", "torchtitan", "megatron.core"):
        pytest.importorskip(name)
    accelerate_bodies: dict = {}
    for i, c in enumerate(layouts()):
        out = tmp_path / str(i)
        out.mkdir()
        exports = write_layout_exports(c, out)
        left_out = {f for (_, f), kind in LEFT_OUT.items() if kind(c)}
        assert {p.name for p in exports} == set(FILES) - left_out, c
        assert {p.name for p in out.iterdir()} == set(FILES) - left_out
        assert [line.split(" ")[0] for line in exports.left_out] == sorted(left_out)
        if DS not in left_out:
            _check_deepspeed(deepspeed_world, out / DS, c)
        _check_accelerate(out / "accelerate_config.yaml", c, accelerate_bodies)
        _check_torchtitan(out / "torchtitan_config.py", c, cli=i == 0)
        _check_megatron(c)


def test_the_old_context_parallel_file_is_refused_and_the_new_one_accepted(deepspeed_world):
    """The negative control: the file the search wrote for cp 2 on 2 ranks (no
    sequence_parallel_size) is what DeepSpeed refused; the harness refuses it the same way."""
    c = TrialConfig(world_size=2, cp_degree=2, micro_batch_size=8)
    c.validate()
    new = ds_config(c)
    assert new["sequence_parallel_size"] == 2
    old = {k: v for k, v in new.items() if k != "sequence_parallel_size"}
    with pytest.raises(AssertionError, match=r"8 != 8 \* 1 \* 2"):
        deepspeed_world(old, 2, 1)
    assert deepspeed_world(new, 2, 1).train_batch_size == 8
    assert deepspeed_world(new, 2, 1, mpu=False).train_batch_size == 8
    notes = " ".join(new["autotune_notes"])
    assert "Ulysses sequence parallelism" in notes and "4 heads and 4 KV heads" in notes


def test_deepspeed_refuses_zero_2_and_3_under_its_pipeline():
    """Why pp with ZeRO-2/3 gets no ds_config.json: the installed DeepSpeed's pipeline engine
    asserts against it."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.pipe.engine import PipelineEngine

    source = inspect.getsource(PipelineEngine.__init__)
    assert "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" in source


def test_context_parallel_with_heads_ulysses_cannot_split_writes_no_ds_config(tmp_path):
    """GPT XL's 25 heads do not split over cp 2: no ds_config.json (an older one is removed),
    one line saying why, and the other exports still written."""
    c = TrialConfig(
        workload=WorkloadSpec(family="gpt", size="xl", seq_len=64, global_batch_size=8),
        world_size=2,
        cp_degree=2,
    )
    c.validate()
    (tmp_path / DS).write_text("{}")
    exports = write_layout_exports(c, tmp_path)
    assert not (tmp_path / DS).exists()
    assert {p.name for p in exports} == set(FILES) - {DS}
    (line,) = exports.left_out
    assert line.startswith("ds_config.json not written: cp 2 runs in DeepSpeed as Ulysses")
    assert "25 and 25" in line
    ok = dataclasses.replace(c, workload=dataclasses.replace(c.workload, size="small"))
    assert not write_layout_exports(ok, tmp_path).left_out  # 12 heads split over 2
    assert (tmp_path / DS).exists()


def _stored_study(tmp_path: Path, config: TrialConfig):
    """A database holding study 's' whose one complete trial ran ``config``."""
    from datetime import UTC, datetime

    from db import Database, TrialRecord

    database = Database.open(f"sqlite:///{tmp_path / 'study.db'}")
    study = database.create_study("s", {})
    database.add_trial(
        TrialRecord(
            id=None,
            study_id=study.id,
            number=0,
            status="complete",
            config=config.resolved(),
            metrics={"step_time_s": 0.1, "throughput_tokens_per_s": 5120.0},
            env={"torch": "2.13.0", "device": "cpu", "backend": "gloo", "world_size": 2},
            error=None,
            created_at=datetime.now(UTC),
        )
    )
    return database


@pytest.mark.parametrize("size, written", [("tiny", True), ("xl", False)])
def test_a_stored_context_parallel_study_exports_what_deepspeed_accepts_on_2_ranks(
    tmp_path, deepspeed_world, size, written
):
    """What `autotune search --fix cp_degree=2` exports at its end (``export_study``): a
    ds_config.json DeepSpeed accepts on the layout's 2 ranks, or none and one line saying why."""
    import io

    c = TrialConfig(workload=WorkloadSpec(size=size), world_size=2, cp_degree=2, micro_batch_size=8)
    c.validate()
    out, stream = tmp_path / "out", io.StringIO()
    with _stored_study(tmp_path, c) as database:
        exports = export_study(database, "s", out, stream=stream)
    assert (out / DS in exports) is written and (out / DS).exists() is written
    expected = {"best_config.json", *FILES} - (set() if written else {DS})
    assert {p.name for p in exports} == expected == {p.name for p in out.iterdir()}
    if written:
        assert deepspeed_world(out / DS, 2, 1).train_batch_size == 8
        assert stream.getvalue() == ""
    else:
        assert stream.getvalue().count("\n") == 1
        assert stream.getvalue().startswith("ds_config.json not written: cp 2 runs in DeepSpeed")
