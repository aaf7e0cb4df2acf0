"""``autotune estimate``: predicted per-rank memory of a configuration, without running it.

The configuration comes from ``--config FILE`` (a TrialConfig), from knob flags (which also
override the file's fields), or from an explicit architecture (``--num-layers --hidden-size
--num-heads --seq-len --vocab-size``) for models that are not built in; ``--params N`` alone
gives the model states only. With ``--cluster NAME|FILE`` (and ``--nodes N``) it also prints the
predicted step time, tokens/s, MFU and their breakdown (``perf_model.predict_step_time`` with
the cluster's stored calibration, for autotune's own engine). With ``--engine megatron|
torchtitan|deepspeed`` that framework's figures lead (``engine_memory.estimate_engine_memory``,
the step time with its traits): the text prints its table first, named, and the JSON carries
them at the top level (``per_rank``, ``stage``, ``phase``, ``time``); autotune's own runtime's
follow, named, under ``autotune_runtime`` in the JSON (its ``per_rank``, ``stages``, ``time``).
Without ``--engine`` (or with ``--engine autotune``) there is one runtime, autotune's, at the top
level, and ``engine_peak_bytes`` is null (under ``--engine``: the engine's total again). Nothing
here imports torch or Ray:
an estimate takes milliseconds, so models far too large for this machine (Llama 70B on 512
GPUs) can be planned.

``add_estimate_parser(sub)`` adds the command to the CLI's subparsers; ``cmd_estimate(args)``
runs it and returns the exit status. Bad input raises :class:`ConfigError` (one line, exit 2).
The model / cluster helpers and the flag groups it shares with ``autotune rank`` and
``autotune search`` are in ``cli/args.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

from autotune.cli.args import (
    EXPLICIT_WORKLOAD,
    SHAPE_FLAGS,
    add_architecture_args,
    add_cluster_args,
    add_debug_arg,
    add_engine_arg,
    add_precision_args,
    builtin_workload,
    describe_cluster,
    explicit_shape,
    mark_explicit,
    precision_arg,
)
from autotune.cli.config_flags import add_flags, add_knob_args, given
from autotune.config import (
    TrialConfig,
    WorkloadSpec,
)
from autotune.errors import ConfigError
from autotune.model.cluster import ClusterSpec, load_cluster
from autotune.model.engine_memory import estimate_engine_memory
from autotune.model.engines import EngineProfile
from autotune.model.memory import (
    CATEGORIES,
    MemoryEstimate,
    estimate_all_stages,
    gathered_parameter_bytes,
    model_state_bytes,
    state_shards,
)
from autotune.model.perf_model import (
    ALL_TERMS,
    Calibration,
    StepTimeEstimate,
    engine_traits,
    predict_step_time,
)
from autotune.shapes import ModelShape, model_names


def add_estimate_parser(sub) -> None:
    p = sub.add_parser(
        "estimate",
        help="predict per-rank memory of a configuration, without running it",
        description="Print the predicted peak memory of the worst rank (the worst pipeline "
        "stage) by category — parameters, gradients, optimizer state, activations, "
        "communication buffers, other — for a TrialConfig, a built-in model with knob flags, "
        "or an explicit architecture. Formulas: ZeRO (Rajbhandari et al. 2020) for model "
        "states, Korthikanti et al. 2022 for activations, calibrated to this implementation "
        "(see autotune/model/memory.py). With --cluster, also the predicted step time, "
        "tokens/s, MFU and where the time goes (autotune/model/perf_model.py). With "
        "--engine megatron|torchtitan|deepspeed, that framework's memory and time come first "
        "(the JSON's per_rank and time), autotune's own runtime's after (autotune_runtime).",
        epilog="example: autotune estimate --model llama-70b --world-size 512 --tp 8 --pp 8 "
        "--zero 1 --micro-batch 1 --global-batch 1024 --seq-len 4096 --precision bf16-mixed "
        "--cluster a100-sxm4-80gb",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="TrialConfig JSON; knob flags given as well override its fields",
    )
    p.add_argument(
        "--model",
        metavar="NAME",
        help=f"built-in model: {', '.join(model_names())} (default gpt-tiny), or "
        "hf:PATH_OR_ID, a Hugging Face causal LM's config.json",
    )
    knobs = p.add_argument_group("layout and batch (default: the config's, else TrialConfig's)")
    add_flags(
        knobs,
        "--world-size",
        "--tp",
        "--pp",
        "--zero",
        "--micro-batch",
        "--global-batch",
        "--seq-len",
        "--ac",
        "--schedule",
    )
    add_precision_args(knobs)
    add_flags(knobs, "--attention", "--bucket-mb")
    knobs.add_argument(
        "--no-overlap",
        action="store_true",
        help="overlap_enabled false (one bucketed all-reduce after backward)",
    )
    add_knob_args(knobs)
    arch = add_architecture_args(p)
    arch.add_argument(
        "--params",
        type=float,
        metavar="N",
        help="parameter count only (e.g. 7e9): model states, activations unknown",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="whose memory: cuda (default unless the config says cpu) or cpu, "
        "which adds the CPU measurement's allowance",
    )
    add_cluster_args(
        p,
        nodes_help="nodes of the cluster (default: the fewest that hold the "
        "world size; nodes × devices per node must equal it when given)",
    )
    add_engine_arg(p)
    p.add_argument("--json", action="store_true", help="print the estimate as JSON")
    add_debug_arg(p)
    p.set_defaults(run=cmd_estimate)


def cmd_estimate(args: argparse.Namespace) -> int:
    config = _config_from_args(args)
    device = args.device or ("cpu" if config.device == "cpu" else "cuda")
    config.validate_precision()
    config = config.with_precision(device)
    if args.nodes is not None and args.cluster is None:
        raise ConfigError("--nodes sizes the cluster of --cluster NAME|FILE: give --cluster too")
    cluster = (
        cluster_for_world(args.cluster, args.nodes, config.world_size) if (args.cluster) else None
    )
    if args.params is not None:
        return _print_states_only(args, config, device, cluster)
    shape = explicit_shape(args, config)
    if shape is not None:
        config = mark_explicit(config, shape)
    stages = estimate_all_stages(config, shape, device_type=device)
    worst = max(stages, key=lambda e: e.total)
    refusal = _engine_refusal(config, shape)
    engine = engine_traits(args.engine)
    engine_worst = estimate_engine_memory(config, shape, engine.memory, device_type=device)
    time = own_time = None
    if cluster is not None:
        calibration = Calibration.for_cluster(cluster)
        time = predict_step_time(config, cluster, calibration, shape=shape, engine=engine)
        own_time = predict_step_time(config, cluster, calibration, shape=shape)
    report = _Report(
        config,
        shape,
        device,
        stages,
        _Figures(worst, own_time),
        refusal,
        engine,
        _Figures(engine_worst, time),
        cluster,
    )
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        report.print_text()
    return 0


@dataclasses.dataclass(frozen=True)
class _Figures:
    """One runtime's prediction: its worst pipeline rank's memory and, with a cluster, the
    step time."""

    worst: MemoryEstimate
    time: StepTimeEstimate | None

    def memory_json(self) -> dict:
        return {
            "per_rank": self.worst.as_dict(),
            "stage": self.worst.stage,
            "phase": self.worst.phase,
        }


@dataclasses.dataclass(frozen=True)
class _Report:
    """What ``estimate`` predicted, as JSON or as text. ``own``: autotune's own runtime;
    ``by_engine``: the ``--engine`` framework's, which leads where it is another engine than
    autotune's own (``MemoryTraits.own_runtime``): its figures come first, at the top level of
    the JSON, and autotune's follow under ``autotune_runtime``."""

    config: TrialConfig
    shape: ModelShape | None
    device: str
    stages: list[MemoryEstimate]
    own: _Figures
    refusal: str | None
    engine: EngineProfile
    by_engine: _Figures
    cluster: ClusterSpec | None

    @property
    def engine_leads(self) -> bool:
        """Another engine's figures lead autotune's own (which are printed once otherwise)."""
        return not self.engine.memory.own_runtime

    def as_json(self) -> dict:
        head = {
            "config": self.config.resolved(),
            "shape": _shape_json(self.shape, self.config),
            "device": self.device,
        }
        stages = [e.as_dict() for e in self.stages]
        if not self.engine_leads:
            return {
                **head,
                **self.own.memory_json(),
                "stages": stages,
                "engine_refusal": self.refusal,
                **self._time_json(self.own),
                "engine": self.engine.name,
                "engine_peak_bytes": None,
                "engine_peak_kind": None,
            }
        own = {**self.own.memory_json(), "stages": stages}
        if self.cluster is not None:
            own["time"] = self.own.time.as_dict()
        return {
            **head,
            "engine": self.engine.name,
            "engine_peak_kind": self.engine.memory.peak_kind,
            **self.by_engine.memory_json(),
            "engine_refusal": self.refusal,
            **self._time_json(self.by_engine),
            "engine_peak_bytes": self.by_engine.worst.total,
            "autotune_runtime": own,
        }

    def _time_json(self, figures: _Figures) -> dict:
        cluster = self.cluster
        if cluster is None:
            return {}
        return {"cluster": cluster.name, "nodes": cluster.num_nodes, "time": figures.time.as_dict()}

    def print_text(self) -> None:
        config = self.config
        print(_describe(config, self.shape, self.device))
        own_label = ""
        if self.engine_leads:
            kind = self.engine.memory.peak_kind
            self._print_figures(self.by_engine, f"as {self.engine.name} runs it ({kind} bytes): ")
            own_label = "autotune's own runtime: "
        self._print_figures(self.own, own_label)
        if config.pp_degree > 1:
            print(
                f"{own_label}total per stage: "
                + ", ".join(f"{e.stage}: {_human(e.total)}" for e in self.stages)
            )
        if self.refusal:
            print(
                f"note: the trial engine refuses this layout ({self.refusal}); the estimate is of "
                "the layout itself"
            )

    def _print_figures(self, figures: _Figures, label: str) -> None:
        """One runtime's memory table, and beside it the step time's terms with a cluster."""
        config, worst, time = self.config, figures.worst, figures.time
        where = (
            ""
            if config.pp_degree == 1
            else (f", worst pipeline stage: {worst.stage} (of 0-{config.pp_degree - 1})")
        )
        title = f"{label}per rank{where}, peak {worst.phase}"
        if time is None:
            print(f"{title}:")
            _print_table(worst.as_dict())
        else:
            print(f"{title}; predicted step time on {self.cluster.name}:")
            print(_side_by_side(_table_lines(worst.as_dict()), _time_lines(time)))
            engine = self.engine.name if figures is self.by_engine else "autotune"
            print(_time_summary(time, self.cluster, engine))


# ---- building the configuration ------------------------------------------------------------
def _config_from_args(args: argparse.Namespace) -> TrialConfig:
    config = TrialConfig.from_file(args.config) if args.config else TrialConfig()
    workload = config.workload
    if args.model is not None:
        workload = builtin_workload(workload, args.model, trials=False)
    wl_fields = {**given(args, WorkloadSpec), "dtype": args.dtype, "vocab_size": args.vocab_size}
    workload = dataclasses.replace(
        workload, **{k: v for k, v in wl_fields.items() if v is not None}
    )
    fields = given(args, TrialConfig)
    if args.no_overlap:
        fields["overlap_enabled"] = False
    if precision_arg(args.precision) is not None:
        fields["precision"] = args.precision
    config = dataclasses.replace(
        config, workload=workload, **{k: v for k, v in fields.items() if v is not None}
    )
    if args.global_batch_size is None and not args.config:
        # No batch given: one micro-batch per data-parallel rank (no accumulation).
        tp_pp = config.tp_degree * config.pp_degree * config.cp_degree
        if tp_pp > 0 and config.world_size % tp_pp == 0 and config.world_size >= tp_pp:
            batch = config.micro_batch_size * config.dp_degree
            if config.pp_degree > 1:  # enough micro-batches for the schedule to fill
                batch *= config.pp_degree * (2 if config.pp_schedule == "interleaved_1f1b" else 1)
            config = dataclasses.replace(
                config, workload=dataclasses.replace(config.workload, global_batch_size=batch)
            )
    return config


def cluster_for_world(name_or_path: str, nodes: int | None, world_size: int) -> ClusterSpec:
    """The cluster ``--cluster`` names with ``--nodes`` nodes, which must hold exactly
    ``world_size`` devices; without ``--nodes``, the fewest nodes that hold the world."""
    cluster = load_cluster(name_or_path, nodes=nodes)
    if nodes is not None:
        cluster.check_world(world_size)
        return cluster
    return cluster.with_nodes(max(1, math.ceil(world_size / cluster.devices_per_node)))


def _shape_json(shape: ModelShape | None, config: TrialConfig) -> dict | None:
    """The shape the estimate read, with the parameter count it used: an explicit
    architecture's, or a Hugging Face model's as read from its config and built model; None for
    a built-in model (``--model`` names it) or a user workload."""
    if shape is None and config.workload.hf_model is not None:
        shape = config.workload.shape
    if shape is None:
        return None
    fields = {f: getattr(shape, f) for f in ModelShape.__dataclass_fields__}
    if shape.moe is not None:  # its experts' part, as an object of MoESpec's fields
        fields["moe"] = dataclasses.asdict(shape.moe)
    return {**fields, "head_dim": shape.head_dim, "num_params": shape.num_params()}


def _engine_refusal(config: TrialConfig, shape: ModelShape | None) -> str | None:
    """Why the trial engine would refuse this layout (the estimate still describes it)."""
    try:
        if shape is None:
            config.validate()
        else:
            config.validate(
                num_heads=shape.num_heads,
                num_kv_heads=shape.num_kv_heads,
                num_layers=shape.num_layers,
            )
    except ConfigError as e:
        return str(e)
    return None


# ---- output --------------------------------------------------------------------------------
def _describe(config: TrialConfig, shape: ModelShape | None, device: str) -> str:
    wl = config.workload
    name = (
        wl.name
        if shape is None
        else (
            f"{shape.family} architecture ({shape.num_layers} layers, hidden "
            f"{shape.hidden_size}, {shape.num_heads} heads, vocab {shape.vocab_size}, "
            f"{shape.num_params():,} parameters)"
        )
    )
    schedule = f", schedule {config.pp_schedule}" if config.pp_degree > 1 else ""
    cp = f" × cp {config.cp_degree}" if config.cp_degree > 1 else ""
    return (
        f"{name}: world {config.world_size} = tp {config.tp_degree} × pp "
        f"{config.pp_degree}{cp} × dp {config.dp_degree}, ZeRO-{config.zero_stage}, "
        f"micro-batch {config.micro_batch_size} × {config.grad_accum_steps} accumulation, "
        f"seq {wl.seq_len}, {config.precision}, checkpointing "
        f"{config.activation_checkpointing}"
        f"{schedule}{''.join(', ' + k for k in knobs_text(config))} (device {device})"
    )


def knobs_text(config: TrialConfig) -> list[str]:
    """The newer knobs ``config`` sets away from their defaults, in words."""
    interleaved = config.pp_degree > 1 and config.pp_schedule == "interleaved_1f1b"
    given = (
        (config.sequence_parallel, "sequence parallel"),
        (
            config.dp_replicate > 1,
            f"HSDP {config.dp_replicate} replicas × {config.dp_shard} shards",
        ),
        (interleaved, f"{config.virtual_stages} virtual stages per rank"),
        (config.ac_layers is not None, f"{config.ac_layers} blocks per stage recomputed"),
        (config.compile, "compiled"),
        (config.float8, "float8 linears"),
    )
    return [text for flag, text in given if flag]


def _table_lines(row: dict[str, int | None]) -> list[str]:
    lines = [f"  {'category':<16} {'bytes':>18} {'size':>12}"]
    for name in (*CATEGORIES, "total"):
        value = row.get(name)
        if name == "total":
            lines.append("  " + "-" * 48)
        if value is None:
            lines.append(f"  {name:<16} {'unknown':>18} {'unknown':>12}")
        else:
            lines.append(f"  {name:<16} {value:>18,} {_human(value):>12}")
    return lines


def _print_table(row: dict[str, int | None]) -> None:
    print("\n".join(_table_lines(row)))


def _time_lines(time: StepTimeEstimate) -> list[str]:
    """The predicted step's breakdown: seconds and share of the step per term."""
    lines = [f"{'term':<12} {'seconds':>12} {'share':>7}"]
    for term in (t for t in ALL_TERMS if t in time.breakdown):
        seconds = time.breakdown[term]
        lines.append(f"{term:<12} {seconds:>12.4f} {seconds / time.step_time_s:>7.1%}")
    lines += ["-" * 33, f"{'step':<12} {time.step_time_s:>12.4f} {1:>7.1%}"]
    return lines


def _time_summary(time: StepTimeEstimate, cluster: ClusterSpec, engine: str) -> str:
    mfu = f", MFU {time.mfu:.1%}" if time.mfu is not None else ""
    return (
        f"predicted step {time.step_time_s:.4g} s, {time.tokens_per_s:,.0f} tokens/s{mfu} "
        f"({describe_cluster(cluster, engine)})"
    )


def _side_by_side(left: list[str], right: list[str], gap: int = 4) -> str:
    width = max(len(line) for line in left) + gap
    rows = max(len(left), len(right))
    left, right = left + [""] * (rows - len(left)), right + [""] * (rows - len(right))
    return "\n".join(f"{a:<{width}}{b}".rstrip() for a, b in zip(left, right))


def _human(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _print_states_only(
    args: argparse.Namespace, config: TrialConfig, device: str, cluster: ClusterSpec | None
) -> int:
    if args.model is not None or any(getattr(args, f) is not None for f in SHAPE_FLAGS[:3]):
        raise ConfigError(
            "--params gives the parameter count alone: drop --model and the "
            "architecture flags, or drop --params"
        )
    if not (args.params >= 1 and math.isfinite(args.params)):
        raise ConfigError(f"--params must be a positive parameter count, not {args.params:g}")
    checked = dataclasses.replace(
        config, workload=dataclasses.replace(config.workload, workload=EXPLICIT_WORKLOAD)
    )
    checked.validate()
    kw = dict(
        zero_stage=config.zero_stage,
        dp_degree=state_shards(config),  # HSDP shards within dp_shard, CP ranks with it
        tp_degree=config.tp_degree,
        pp_degree=config.pp_degree,
        precision=config.precision,
    )
    parameters, gradients, optimizer_state = model_state_bytes(int(args.params), **kw)
    gathered = gathered_parameter_bytes(int(args.params), **kw)
    # Model states at the step's peak: at rest, plus what ZeRO-2 keeps gathered from forward
    # through backward (the ZeRO paper's unpartitioned 2Φ of fp16 parameters).
    row: dict[str, int | None] = {
        "parameters": parameters,
        "gradients": gradients,
        "optimizer_state": optimizer_state,
        "activations": None,
        "comm_buffers": None,
        "other": None,
        "total": None,
        "gathered_parameters": gathered,
        "model_states": parameters + gradients + optimizer_state + gathered,
    }
    no_time = (
        (
            "note: --params gives no architecture, so no step time is predicted on "
            f"cluster '{cluster.name}'; give --model or the architecture flags instead"
        )
        if cluster is not None
        else None
    )
    if args.json:
        extra = {} if cluster is None else {"cluster": cluster.name, "time": None}
        print(
            json.dumps(
                {
                    "config": config.resolved(),
                    "params": int(args.params),
                    "device": device,
                    "per_rank": row,
                    **extra,
                },
                indent=2,
            )
        )
        if no_time:
            print(no_time, file=sys.stderr)
        return 0
    print(
        f"{int(args.params):,} parameters: world {config.world_size} = tp "
        f"{config.tp_degree} × pp {config.pp_degree} × dp {config.dp_degree}, "
        f"ZeRO-{config.zero_stage}, {config.precision}"
    )
    print(
        "per rank, model states only (parameters spread evenly over tp × pp; activations "
        "need the architecture):"
    )
    _print_table(row)
    if gathered:
        print(
            f"  {'+ gathered':<16} {gathered:>18,} {_human(gathered):>12}  (ZeRO-2 "
            "parameters gathered from forward through backward)"
        )
    print(f"  {'model states':<16} {row['model_states']:>18,} {_human(row['model_states']):>12}")
    if no_time:
        print(no_time)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``estimate`` alone (``python -m autotune.cli.estimate ...``)."""
    parser = argparse.ArgumentParser(prog="autotune")
    add_estimate_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["estimate", *(sys.argv[1:] if argv is None else argv)])
    try:
        return cmd_estimate(args)
    except ConfigError as e:
        print(f"autotune: error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
