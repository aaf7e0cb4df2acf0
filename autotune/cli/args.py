"""What the verbs share: the argument types and flag groups several of them add, opening the
database, the Ray executor's settings, and the translation of errors into one line on stderr.

Every error a user can cause is one line on stderr and a non-zero exit (2: usage, 1: runtime);
``--debug`` adds the traceback. Nothing here imports torch or Ray at module level.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from autotune.config import DTYPE_PRECISION, PRECISION_COMPUTE_DTYPE, TrialConfig, WorkloadSpec
from autotune.errors import EXIT_RUNTIME, AutotuneError, ConfigError
from autotune.model.cluster import ClusterSpec
from autotune.shapes import ModelShape

DEFAULT_DB = "sqlite:///autotune.db"
EXAMPLES = "examples/ holds ready configuration files, e.g. examples/tiny_zero2_dp2.json"
EXPLICIT_WORKLOAD = "explicit:architecture"
"""Workload name of an explicit architecture in the printed / JSON config."""
SHAPE_FLAGS = ("num_layers", "hidden_size", "num_heads", "vocab_size")
"""Flags that, with --seq-len, describe a model that is not built in."""


# ---- argument types ------------------------------------------------------------------------
def _checked(
    convert: Callable[[str], float], kind: str, accept: Callable[[float], bool], rule: str
):
    """An argparse type: ``convert(text)``, refused as not ``kind`` or as breaking ``rule``."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not {kind}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"{rule}, not {text}")
        return value

    return parse


positive_int = _checked(int, "a whole number", lambda v: v >= 1, "must be ≥ 1")
positive_float = _checked(float, "a number", lambda v: v > 0, "must be > 0")
port = _checked(int, "a whole number", lambda v: 0 <= v <= 65535, "must be a port number 0-65535")


def precision_arg(text: str | None) -> str | None:
    """--precision checked: an unknown name is one line, exit 2 (argparse's choices would
    print the usage too)."""
    if text is not None and text not in PRECISION_COMPUTE_DTYPE:
        raise ConfigError(
            f"unknown precision '{text}'; choose one of {', '.join(PRECISION_COMPUTE_DTYPE)}"
        )
    return text


# ---- flag groups ---------------------------------------------------------------------------
def add_debug_arg(p: argparse.ArgumentParser) -> None:
    """A verb's own ``--debug`` (``autotune VERB ... --debug``); SUPPRESS keeps the top-level
    flag's value when the verb's is not given."""
    p.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors"
    )


def add_db_arg(p: argparse.ArgumentParser, *, with_help: bool = True) -> None:
    """``--db URL`` of a verb that reads or keeps a study."""
    p.add_argument(
        "--db",
        default=DEFAULT_DB,
        metavar="URL",
        help=f"database URL (default {DEFAULT_DB})" if with_help else None,
    )


def add_store_db_arg(p: argparse.ArgumentParser) -> None:
    """``--db URL`` of ``trial`` and ``profile``, which may store nothing."""
    p.add_argument(
        "--db",
        default=DEFAULT_DB,
        metavar="URL",
        help=f"SQLAlchemy URL to store the result in (default {DEFAULT_DB}); 'none' stores nothing",
    )


def add_ray_args(p: argparse.ArgumentParser) -> None:
    """Where and how trials run. The defaults are ``ExecutorSettings``' (not imported here: it
    imports Ray): a flag not given is not passed on (``executor_settings``)."""
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="join this Ray cluster instead of starting a local one",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        metavar="S",
        help="per-trial timeout in seconds (default 300)",
    )
    p.add_argument(
        "--cpus-per-rank",
        type=positive_float,
        metavar="N",
        help="Ray CPUs each CPU rank reserves (default 0.5)",
    )


def add_precision_args(group) -> None:
    """``--precision`` and the older ``--dtype`` (``estimate``, ``rank`` and ``search``)."""
    group.add_argument(
        "--precision",
        metavar="NAME",
        help=f"{', '.join(PRECISION_COMPUTE_DTYPE)} (Lightning's names; mixed: "
        "fp32 master weights and optimizer state, half-precision compute); "
        "default: bf16-mixed on GPUs, 32-true on CPUs",
    )
    group.add_argument(
        "--dtype",
        choices=tuple(DTYPE_PRECISION),
        help="older spelling of the *-true precisions (float32 = 32-true, "
        "bfloat16 = bf16-true, float16 = 16-true)",
    )


def add_architecture_args(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The explicit-architecture flags (``estimate`` and ``rank``); returns their group."""
    arch = p.add_argument_group("explicit architecture (instead of --model)")
    arch.add_argument("--num-layers", type=int, metavar="N")
    arch.add_argument("--hidden-size", type=int, metavar="N")
    arch.add_argument("--num-heads", type=int, metavar="N")
    arch.add_argument(
        "--num-kv-heads", type=int, metavar="N", help="key/value heads (default --num-heads)"
    )
    arch.add_argument(
        "--ffn-hidden-size",
        type=int,
        metavar="N",
        help="MLP width (default 4h for gpt, Llama's 8h/3 rounded up to 256)",
    )
    arch.add_argument("--vocab-size", type=int, metavar="N")
    arch.add_argument(
        "--family",
        choices=("gpt", "llama"),
        help="block type of the explicit architecture (default gpt)",
    )
    return arch


def add_cluster_args(
    p: argparse.ArgumentParser, *, required: bool = False, nodes_help: str
) -> None:
    """``--cluster NAME|FILE`` and ``--nodes N`` (``estimate`` and ``rank``)."""
    from autotune.model.cluster import builtin_names

    p.add_argument(
        "--cluster",
        metavar="NAME|FILE",
        required=required,
        help=f"the cluster to predict the step time on: {', '.join(builtin_names())}"
        ", or a ClusterSpec JSON/TOML file (its stored calibration is used)",
    )
    p.add_argument("--nodes", type=int, metavar="N", help=nodes_help)


def add_engine_arg(p: argparse.ArgumentParser) -> None:
    """``--engine NAME`` (``estimate`` and ``rank``): the framework whose time and memory
    traits judge the layout (``model/engines.py``, ``engine_memory.MEMORY_TRAITS``)."""
    from autotune.model.engines import ENGINE_NAMES

    p.add_argument(
        "--engine",
        choices=ENGINE_NAMES,
        default="autotune",
        help="the training framework that will run the layout: its TP plan, "
        "sequence parallelism, overlap, optimizer and memory (default autotune, "
        "the trial engine)",
    )


# ---- what the handlers share ---------------------------------------------------------------
def open_db(url: str, *, create: bool = True, required_by: str | None = None):
    """The database at URL, or None for 'none' (trial and profile then store nothing). A
    command that keeps or reads a study cannot work without one: it says why in required_by,
    and 'none' is then a usage error naming the fix."""
    if url.lower() == "none":
        if required_by:
            raise ConfigError(
                f"{required_by}: give --db URL or leave the default "
                f"({DEFAULT_DB}); --db none is only for trial and profile"
            )
        return None
    from db import Database

    return Database.open(url, create=create)


@contextmanager
def opened_db(url: str, *, create: bool = True, required_by: str | None = None) -> Iterator:
    """``open_db``'s database (None for 'none'), closed at the end of the block."""
    database = open_db(url, create=create, required_by=required_by)
    try:
        yield database
    finally:
        if database is not None:
            database.close()


def executor_settings(args: argparse.Namespace):
    """``ExecutorSettings`` from ``add_ray_args``' flags; those not given keep its defaults."""
    from autotune.trial.executor import ExecutorSettings

    given = {
        "ray_address": args.ray_address,
        "trial_timeout_s": args.timeout,
        "cpus_per_rank": args.cpus_per_rank,
    }
    return ExecutorSettings(**{k: v for k, v in given.items() if v is not None})


def run_command(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``command(args)``'s exit status, every error translated: an autotune or storage error is
    one line and its exit code, Ctrl-C 130, anything else (an internal bug) one line and 1;
    ``--debug`` adds the traceback."""
    debug = getattr(args, "debug", False)
    from db.errors import StorageError

    try:
        return command(args)
    except (AutotuneError, StorageError) as e:
        if debug:
            traceback.print_exc()
            tb = getattr(e, "traceback", "")
            if tb:
                print(tb, file=sys.stderr)
        print(f"autotune: error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", EXIT_RUNTIME)
    except KeyboardInterrupt:
        from autotune.cli.interrupt import EXIT_INTERRUPTED, say_interrupted

        say_interrupted()  # once: the interrupt guard may be ending the process too
        return EXIT_INTERRUPTED
    except Exception as e:  # an internal bug: still one line unless --debug
        if debug:
            traceback.print_exc()
        print(
            f"autotune: internal error: {type(e).__name__}: {e} (rerun with --debug for the "
            "traceback)",
            file=sys.stderr,
        )
        return EXIT_RUNTIME


def builtin_workload(workload: WorkloadSpec, model: str, *, trials: bool = True) -> WorkloadSpec:
    """``workload`` training the model named ``model``: a built-in one (e.g. 'llama-70b') or a
    Hugging Face causal LM ('hf:PATH_OR_ID', read from its config.json). ``trials``: the
    command runs trials, so a model the trial runtime cannot train is refused here
    (``hf_config.check_trainable``); ``estimate`` and ``rank`` only price it."""
    import dataclasses

    from autotune.config import BUILTIN_SHAPES, builtin_model_names

    if model.startswith("hf:"):
        from autotune.hf_config import check_trainable, hf_shape, load_config

        ref = model[3:]
        if trials:  # a missing or unsupported config is one line here
            check_trainable(load_config(ref), ref)
        hf_shape(ref)
        return dataclasses.replace(workload, hf_model=ref, workload=None)
    family, _, size = model.partition("-")
    if (family, size) not in BUILTIN_SHAPES:
        raise ConfigError(
            f"unknown model '{model}': choose one of {', '.join(builtin_model_names())}"
        )
    return dataclasses.replace(workload, family=family, size=size, workload=None)


# ---- the model and cluster estimate and rank describe ----------------------------------
def explicit_shape(args: argparse.Namespace, config: TrialConfig) -> ModelShape | None:
    given = [f for f in SHAPE_FLAGS if getattr(args, f) is not None and f != "vocab_size"]
    if not given:
        if args.num_kv_heads or args.ffn_hidden_size or args.family:
            raise ConfigError(
                "--num-kv-heads, --ffn-hidden-size and --family describe an "
                "explicit architecture: give --num-layers, --hidden-size, "
                "--num-heads, --seq-len and --vocab-size too"
            )
        return None
    if args.model is not None:
        raise ConfigError(
            "give either --model or an explicit architecture (--num-layers "
            "--hidden-size --num-heads --seq-len --vocab-size), not both"
        )
    missing = [f for f in SHAPE_FLAGS if getattr(args, f) is None]
    if args.seq_len is None:
        missing.append("seq_len")
    if missing:
        raise ConfigError(
            "an explicit architecture needs "
            + ", ".join("--" + f.replace("_", "-") for f in missing)
        )
    h, a = args.hidden_size, args.num_heads
    for name in (*SHAPE_FLAGS, "num_kv_heads", "ffn_hidden_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, not {value}")
    if h % a:
        raise ConfigError(f"--num-heads {a} must divide --hidden-size {h}")
    kv = args.num_kv_heads or a
    if a % kv:
        raise ConfigError(f"--num-kv-heads {kv} must divide --num-heads {a}")
    family = args.family or "gpt"
    ffn = args.ffn_hidden_size or (4 * h if family == "gpt" else 256 * math.ceil(8 * h / 3 / 256))
    return ModelShape(
        family, args.num_layers, h, a, kv, ffn, args.vocab_size, max_seq_len=config.workload.seq_len
    )


def mark_explicit(config: TrialConfig, shape: ModelShape) -> TrialConfig:
    """The config as estimated: its workload named as the explicit architecture."""
    return dataclasses.replace(
        config,
        workload=dataclasses.replace(
            config.workload, family=shape.family, workload=EXPLICIT_WORKLOAD
        ),
    )


def describe_cluster(cluster: ClusterSpec, engine: str = "autotune") -> str:
    """'64 nodes × 8 A100-SXM4-80GB, default calibration, autotune engine'."""
    nodes = f"{cluster.num_nodes} node{'s' if cluster.num_nodes > 1 else ''}"
    calibration = "stored calibration" if cluster.calibration else "default calibration"
    return (
        f"{nodes} × {cluster.devices_per_node} {cluster.device.name}, {calibration}, "
        f"{engine} engine"
    )
