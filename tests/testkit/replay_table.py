"""Measured tables, and a search replayed against one instead of run.

A :class:`MeasuredTable` holds measured trials: each row a ``TrialConfig`` (with the model's
``ModelShape`` when the workload is not built in), its step time, peak memory and status. It
reads two formats:

- the shared CSV format of ``shared/data/a100-megatron/single_node.csv`` (``# GPUs``, ``global
  batch``, ``micro batch``, ``hidden size``, ``attention heads``, ``# layers``, ``sequence
  length``, ``tensor/data/pipeline parallelism``, ``iteration time (ms)``; a UTF-8 byte-order
  mark allowed). The columns say the layout and the model; how the table's code trained (dtype,
  recomputation, schedule, …) they do not, so :class:`TableTraining` supplies it. Each row
  becomes a GPT shape (4h MLP, learned positions) and a ``TrialConfig`` of that layout;
- the JSON format ``bench/cpu_sweep.py measure`` writes (``{"rows": [{"config":
  TrialConfig.to_dict(), "step_time_s", "peak_memory_bytes", "status"}, …]}``).

A table that measured one configuration more than once holds it once: its repeats are merged
(:func:`merge_repeats`: the median of their step times, the union of their rounds), and the
table counts how many rows were folded so.

``groups()`` splits a table into the sets of layouts a search would choose among: rows with the
same world size, global batch, sequence length and model. :class:`TableExecutor` answers a
trial from the table — with the row's median (``Answer.MEDIAN``), or, as a live trial would
measure it, with one of the row's rounds drawn at random (``Answer.ONE_ROUND``) — and
:func:`replay` runs the search's own loop (``autotune.search.loop.SearchLoop``) with a strategy
(an Optuna sampler the search ships, the model-guided one, or a baseline of
``testkit.strategies``) over a ``ReplayTrialExecutor`` of one group, counting the trials it
needs to come within 3% of the group's best: a tabular benchmark in which every strategy sees
the same measured numbers, and is run as ``autotune search`` runs it.

Part of the testing kit (``tests/testkit``: no product module imports it); benches and tests
also hand a ``ReplayTrialExecutor`` to ``Search.open`` to run a whole search
over a table.

No torch here: replays run in the driver's process.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import random
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from autotune.config import (
    ActivationCheckpointing,
    Attention,
    DType,
    PipelineSchedule,
    TrialConfig,
    WorkloadSpec,
    ZeroStage,
)
from autotune.errors import ConfigError
from autotune.layouts import SEARCHED_BY_DEFAULT, short_name
from autotune.search.strategies.base import Measured, Strategy
from autotune.shapes import ModelShape
from autotune.status import RowStatus

CSV_COLUMNS = (
    "# GPUs",
    "global batch",
    "micro batch",
    "hidden size",
    "attention heads",
    "# layers",
    "sequence length",
    "tensor parallelism",
    "data parallelism",
    "pipeline parallelism",
    "iteration time (ms)",
)
"""The columns of the shared CSV format."""
MIN_LAYOUTS = 8
"""Groups with fewer layouts are too small for a search to matter."""
WITHIN = 0.03
"""A trial reaches the target when its step time is within 3% of the group's best."""

# ---- what a replayed trial would have cost -------------------------------------------------
_DEFAULTS = TrialConfig()
TRIAL_STEPS = _DEFAULTS.timed_steps.stop
"""Steps a trial runs by default (TrialConfig: 2 warm-up + 5 timed). Profiled steps are not
counted: a search can turn them off."""
TRIAL_OVERHEAD_S = 0.020
"""Fixed seconds per trial on a warm worker group: the median warm trial overhead that
``bench/trial_overhead.py`` measured (docs/benchmarks.md, tiny GPT on 2 CPU ranks)."""


def trial_wall_s(step_time_s: float | None) -> float:
    """Wall seconds one trial costs: TRIAL_STEPS × step time + TRIAL_OVERHEAD_S (a failed or
    infeasible trial, with no step time, costs the overhead alone)."""
    return TRIAL_STEPS * (step_time_s or 0.0) + TRIAL_OVERHEAD_S


# ---- the table -----------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class TableTraining:
    """How the code that measured a CSV table trained: what its columns do not say.

    The defaults are the shared A100 table's (its README): Megatron-LM/DeepSpeed GPT, fp16
    mixed precision, full activation recomputation, the 1F1B schedule, gradient
    synchronisation after the backward (no overlap), unfused attention, vocabulary 50,257."""

    dtype: DType = "float16"
    """Compute dtype of the measured runs."""
    activation_checkpointing: ActivationCheckpointing = "full"
    """Activation recomputation of the measured runs."""
    pp_schedule: PipelineSchedule = "1f1b"
    """Pipeline schedule of the measured runs."""
    overlap_enabled: bool = False
    """Whether the measured runs overlapped gradient synchronisation with the backward."""
    attention: Attention = "eager"
    """Attention implementation of the measured runs (eager: explicit softmax)."""
    zero_stage: ZeroStage = 0
    """ZeRO stage of the measured runs."""
    vocab_size: int = 50257
    """Vocabulary of the measured GPT."""


@dataclass(frozen=True, slots=True)
class MeasuredRow:
    """One measured configuration."""

    config: TrialConfig
    shape: ModelShape | None
    """The model's shape where the workload is not built in (a CSV row's GPT), else None."""
    step_time_s: float | None
    """Measured seconds per optimizer step; None when the trial did not complete."""
    peak_memory_bytes: int | None
    """Peak memory of the slowest rank, where the table has it."""
    status: RowStatus
    rounds: tuple[float | None, ...] = ()
    """Each interleaved round's step time, where the table has them (bench/cpu_sweep.py's
    JSON; None for a round that failed); ``step_time_s`` is their median — for a row merged
    from repeats (``merge_repeats``), the median of the repeats' step times, and these are the
    union of the repeats' rounds."""


@dataclass(frozen=True, slots=True)
class TableGroup:
    """The layouts of one search: same world size, global batch, sequence length and model."""

    key: str
    rows: tuple[MeasuredRow, ...]

    @property
    def shape(self) -> ModelShape | None:
        return self.rows[0].shape

    @property
    def world_size(self) -> int:
        return self.rows[0].config.world_size

    @property
    def best_step_time_s(self) -> float:
        return min(
            r.step_time_s
            for r in self.rows
            if r.status == RowStatus.COMPLETE and r.step_time_s is not None
        )


def group_key(config: TrialConfig) -> str:
    """World size, global batch, sequence length and model of a configuration."""
    w = config.workload
    return f"w{config.world_size}-gb{w.global_batch_size}-s{w.seq_len}-{w.name}"


@dataclass(frozen=True, slots=True)
class MeasuredTable:
    """Measured rows read from a table file (or built from measurements in memory)."""

    rows: tuple[MeasuredRow, ...]
    source: str = "table"
    """Where the rows come from (a path, for messages)."""
    kind: str = "json"
    """'csv' (the shared format, trained as ``training`` says) or 'json' (our own configs)."""
    training: TableTraining | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    """The JSON table's other keys (``machine``, ``settings``, …)."""
    merged_rows: int = 0
    """Rows of the file that repeated a configuration of an earlier row and were merged into
    it (``merge_repeats``)."""
    merged_configs: int = 0
    """Configurations whose row is such a merge of repeats."""

    @classmethod
    def load(cls, path: str | Path, *, training: TableTraining | None = None) -> MeasuredTable:
        """A CSV (.csv) or JSON (.json) table, by the file's suffix."""
        suffix = Path(path).suffix.lower()
        if suffix == ".csv":
            return cls.from_csv(path, training=training or TableTraining())
        if suffix == ".json":
            return cls.from_json(path)
        raise ConfigError(
            f"table '{path}' must be a .csv (the shared format) or a .json "
            "(bench/cpu_sweep.py's format) file"
        )

    @classmethod
    def from_csv(
        cls, path: str | Path, *, training: TableTraining = TableTraining()
    ) -> MeasuredTable:
        merged = merge_repeats([csv_row(r, training) for r in read_csv_rows(path)])
        return cls(
            merged.rows,
            source=str(path),
            kind="csv",
            training=training,
            merged_rows=merged.merged_rows,
            merged_configs=merged.merged_configs,
        )

    @classmethod
    def from_json(cls, path: str | Path) -> MeasuredTable:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8-sig"))
        except OSError as e:
            raise ConfigError(f"cannot read table '{path}': {e.strerror}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"table '{path}' is not valid JSON: {e}") from None
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise ConfigError(
                f"table '{path}' must be an object with a 'rows' list (bench/cpu_sweep.py's format)"
            )
        rows = []
        for i, item in enumerate(data["rows"]):
            where = f"table '{path}' row {i}"
            if not isinstance(item, dict):
                raise ConfigError(f"{where} must be an object")
            missing = [k for k in ("config", "step_time_s", "status") if k not in item]
            if missing:
                raise ConfigError(f"{where} lacks {', '.join(missing)}")
            try:
                config = TrialConfig.from_dict(item["config"])
            except ConfigError as e:
                raise ConfigError(f"{where}: {e}") from None
            rows.append(_json_row(item, config, where))
        if not rows:
            raise ConfigError(f"table '{path}' has no rows")
        meta = {k: v for k, v in data.items() if k != "rows"}
        merged = merge_repeats(rows)
        return cls(
            merged.rows,
            source=str(path),
            kind="json",
            meta=meta,
            merged_rows=merged.merged_rows,
            merged_configs=merged.merged_configs,
        )

    def groups(self, min_layouts: int = MIN_LAYOUTS) -> list[TableGroup]:
        """Groups of at least ``min_layouts`` rows with one complete, in the table's order."""
        by_key: dict[str, list[MeasuredRow]] = {}
        for row in self.rows:
            by_key.setdefault(group_key(row.config), []).append(row)
        chosen = [
            TableGroup(k, tuple(rows))
            for k, rows in by_key.items()
            if len(rows) >= min_layouts and any(r.status == RowStatus.COMPLETE for r in rows)
        ]
        if not chosen:
            largest = max((len(r) for r in by_key.values()), default=0)
            raise ConfigError(
                f"table '{self.source}' has no group of ≥ {min_layouts} measured layouts with "
                f"the same world size, global batch, sequence length and model (its largest "
                f"has {largest}); measure more layouts per group"
            )
        return chosen

    @property
    def cores(self) -> int | None:
        """CPU cores of the machine a JSON table was measured on, where it says."""
        cores = (
            self.meta.get("machine", {}).get("cores")
            if isinstance(self.meta.get("machine"), dict)
            else None
        )
        return cores if isinstance(cores, int) and cores > 0 else None


def _json_row(item: dict, config: TrialConfig, where: str) -> MeasuredRow:
    status = item["status"]
    if status not in tuple(RowStatus):
        raise ConfigError(f"{where}: status must be complete, infeasible or failed, not {status!r}")
    step = item["step_time_s"]
    status = RowStatus(status)
    if status == RowStatus.COMPLETE and not (_number(step) and step > 0):
        raise ConfigError(f"{where}: a complete row needs a positive step_time_s, not {step!r}")
    peak = item.get("peak_memory_bytes")
    if peak is not None and not (isinstance(peak, int) and not isinstance(peak, bool)):
        raise ConfigError(f"{where}: peak_memory_bytes must be an integer or null")
    rounds = item.get("rounds", [])
    if not isinstance(rounds, list) or not all(r is None or (_number(r) and r > 0) for r in rounds):
        raise ConfigError(f"{where}: rounds must be a list of positive step times or nulls")
    return MeasuredRow(
        config,
        None,
        float(step) if status == RowStatus.COMPLETE else None,
        peak,
        status,
        tuple(None if r is None else float(r) for r in rounds),
    )


def one_round_trials(group: TableGroup, within: float = WITHIN) -> float | None:
    """The noise floor of trials-to-target on ``group``: trials a strategy needs that knew one
    round's step times exactly and tried the layouts fastest first, counted until one's median
    is within ``within`` of the group's best median, averaged over the rounds. A perfect model
    of the machine in one round still pays this, because the rounds disagree on the order of
    close layouts. None when the rows do not all carry the same number (≥ 2) of rounds."""
    counts = {len(r.rounds) for r in group.rows}
    if len(counts) != 1 or (n := counts.pop()) < 2:
        return None
    complete = [r for r in group.rows if r.status == RowStatus.COMPLETE and r.step_time_s]
    if not complete:
        return None
    target = min(r.step_time_s for r in complete) * (1 + within)
    per_round = []
    for k in range(n):
        order = sorted(group.rows, key=lambda r: (r.rounds[k] is None, r.rounds[k] or 0.0))
        per_round.append(
            next(
                i + 1
                for i, r in enumerate(order)
                if r.step_time_s is not None and r.step_time_s <= target
            )
        )
    return statistics.fmean(per_round)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# ---- the shared CSV format ---------------------------------------------------------------
def read_csv_rows(path: str | Path) -> list[dict[str, float]]:
    """Rows of a table in the shared format, as numbers; a missing column is one clear error."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise ConfigError(f"table '{path}' lacks column(s): {', '.join(missing)}")
            rows = [{k: float(r[k]) for k in CSV_COLUMNS} for r in reader]
    except OSError as e:
        raise ConfigError(f"cannot read table '{path}': {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"table '{path}' is not UTF-8 text: {e.reason}") from None
    except (ValueError, TypeError) as e:
        raise ConfigError(f"table '{path}' has a non-numeric or missing cell: {e}") from None
    if not rows:
        raise ConfigError(f"table '{path}' has no rows")
    return rows


def csv_row(row: dict[str, float], training: TableTraining = TableTraining()) -> MeasuredRow:
    """The TrialConfig and GPT shape one row of the shared format describes."""
    h, heads, layers = int(row["hidden size"]), int(row["attention heads"]), int(row["# layers"])
    seq = int(row["sequence length"])
    shape = ModelShape("gpt", layers, h, heads, heads, 4 * h, training.vocab_size, seq)
    tp, dp, pp = (
        int(row["tensor parallelism"]),
        int(row["data parallelism"]),
        int(row["pipeline parallelism"]),
    )
    config = TrialConfig(
        workload=WorkloadSpec(
            family="gpt",
            seq_len=seq,
            dtype=training.dtype,
            global_batch_size=int(row["global batch"]),
            vocab_size=training.vocab_size,
            workload=f"table:gpt_h{h}_a{heads}_l{layers}",
        ),
        world_size=tp * dp * pp,
        tp_degree=tp,
        pp_degree=pp,
        zero_stage=training.zero_stage,
        micro_batch_size=int(row["micro batch"]),
        activation_checkpointing=training.activation_checkpointing,
        pp_schedule=training.pp_schedule,
        attention=training.attention,
        overlap_enabled=training.overlap_enabled,
        device="cuda",
    )
    return MeasuredRow(config, shape, row["iteration time (ms)"] / 1000, None, RowStatus.COMPLETE)


def csv_group_key(row: dict[str, float]) -> tuple:
    """GPUs, global batch and model of a CSV row (the same partition as ``group_key``)."""
    return (
        row["# GPUs"],
        row["global batch"],
        row["hidden size"],
        row["attention heads"],
        row["# layers"],
        row["sequence length"],
    )


# ---- answering trials from a table ---------------------------------------------------------
LAYOUT_FIELDS = (
    "tp_degree",
    "pp_degree",
    "zero_stage",
    "micro_batch_size",
    "bucket_mb",
    "overlap_enabled",
    "activation_checkpointing",
    "pp_schedule",
    "attention",
    "optimizer_offload_enabled",
    "dp_replicate",
    "virtual_stages",
    "cp_degree",
)
"""TrialConfig fields that change what a trial measures, beside workload and world size."""


ALWAYS_COMPARED = ("dp_replicate", "virtual_stages", "cp_degree")
"""Layout fields a row measured at the value it holds even where every row holds one: a table
that never ran HSDP, CP or another virtual-stage count did not measure those layouts (the
default search space proposes them), unlike the fields a CSV table does not state."""


def compared_fields(rows: Iterable[MeasuredRow]) -> tuple[str, ...]:
    """The layout fields (``LAYOUT_FIELDS``) that vary among ``rows``, and those of
    ``ALWAYS_COMPARED``: the ones a row's identity compares (``config_key``)."""
    rows = tuple(rows)
    return tuple(
        f
        for f in LAYOUT_FIELDS
        if f in ALWAYS_COMPARED or len({getattr(r.config, f) for r in rows}) > 1
    )


def config_key(config: TrialConfig, compared: tuple[str, ...]) -> tuple:
    """The identity of ``config`` among rows that vary in ``compared``: what a row must equal
    to have measured it (``TableExecutor``'s docstring says which fields count). Two
    configurations with one key are one trial."""
    ignored = set()
    if config.pp_degree == 1:
        ignored.add("pp_schedule")
    if config.pp_degree == 1 or config.pp_schedule != "interleaved_1f1b":
        ignored.add("virtual_stages")
    if config.dp_degree == 1:
        ignored.update(("zero_stage", "overlap_enabled", "bucket_mb"))
    # The precision as trained, however spelled (a table's workload dtype, or the
    # precision a search resolves before proposing).
    device = "cuda" if config.device == "cuda" else "cpu"
    # The newer knobs always count: a row holds them at the values its trial ran (a CSV row
    # at their defaults), and a table answers only the values it measured.
    return (
        dataclasses.replace(config.workload, dtype=None),
        config.resolved_precision(device),
        config.world_size,
        *((f, getattr(config, f)) for f in compared if f not in ignored),
        *((f, getattr(config, f)) for f in SEARCHED_BY_DEFAULT),
    )


@dataclass(frozen=True, slots=True)
class MergedRows:
    """Rows with each configuration once (``merge_repeats``)."""

    rows: tuple[MeasuredRow, ...]
    merged_rows: int
    """Rows folded into an earlier row of the same configuration."""
    merged_configs: int
    """Configurations that had repeats."""


def merge_repeats(rows: Iterable[MeasuredRow]) -> MergedRows:
    """One row per configuration (``config_key``), in the order each first appears. The
    repeats of a configuration become one row: complete if any repeat completed, its step
    time the median of the complete repeats' step times (else the first repeat's status),
    its peak memory the largest any repeat measured (memory one run needed, the
    configuration needs), its rounds the union of the repeats' rounds (in file order), its
    configuration and shape the first repeat's."""
    rows = tuple(rows)
    compared = compared_fields(rows)
    by_key: dict[tuple, list[MeasuredRow]] = {}
    for row in rows:
        by_key.setdefault(config_key(row.config, compared), []).append(row)
    merged = tuple(
        repeats[0] if len(repeats) == 1 else _merged_row(repeats) for repeats in by_key.values()
    )
    return MergedRows(
        merged, len(rows) - len(merged), sum(len(repeats) > 1 for repeats in by_key.values())
    )


def _merged_row(repeats: list[MeasuredRow]) -> MeasuredRow:
    first = repeats[0]
    times = [
        r.step_time_s
        for r in repeats
        if r.status == RowStatus.COMPLETE and r.step_time_s is not None
    ]
    peaks = [r.peak_memory_bytes for r in repeats if r.peak_memory_bytes is not None]
    return MeasuredRow(
        first.config,
        first.shape,
        statistics.median(times) if times else None,
        max(peaks) if peaks else None,
        RowStatus.COMPLETE if times else first.status,
        tuple(t for r in repeats for t in r.rounds),
    )


class Answer(StrEnum):
    """How a table answers a trial of a configuration it measured."""

    MEDIAN = "median"
    """The row's step time: the median of its rounds. Quieter than any one live trial."""
    ONE_ROUND = "one-round"
    """One of the row's rounds, drawn at random: what one live trial of it would have
    measured. Each trial draws again, so a configuration measured twice can read two rounds."""


@dataclass(frozen=True, slots=True)
class TableOutcome:
    """What the table says a trial of a configuration measured."""

    status: str
    step_time_s: float | None
    peak_memory_bytes: int | None


class TableExecutor:
    """Answers trials from measured rows instead of running them.

    A configuration matches a row when their workload and world size are equal and so is every
    layout field (``LAYOUT_FIELDS``) that varies among the rows; fields the table holds at one
    value (a CSV table's ZeRO stage, recomputation, …) and the measurement's own settings
    (seed, step counts, device) are not compared; the newer knobs (``SEARCHED_BY_DEFAULT``:
    sequence parallelism, …) always are, so a table answers only the values it ran. Knobs
    without effect are not compared
    either, as ``autotune.layouts`` and the search space treat them: the schedule without a
    pipeline, and ZeRO stage, overlap and bucket size without data parallelism. Rows that
    repeat one configuration are merged (``merge_repeats``; ``merged_rows`` counts them).

    ``answer`` says what a trial reads (``Answer``). With ``Answer.ONE_ROUND`` the k-th trial
    of a row reads the round that ``random.Random(f"{seed}/{row}/{k}")`` chooses among its
    rounds: independent draws, the same for every strategy replayed with the same ``seed``
    (each meets the same machine), and a round that failed (None) answers as a failed trial.
    A table whose complete rows do not all carry rounds (a shared CSV's one figure per layout)
    is refused: its one-round answers would be its medians, under another name."""

    def __init__(
        self,
        table: MeasuredTable | Iterable[MeasuredRow],
        *,
        answer: Answer | str = Answer.MEDIAN,
        seed: int = 0,
    ) -> None:
        rows = tuple(table.rows if isinstance(table, MeasuredTable) else table)
        self.source = table.source if isinstance(table, MeasuredTable) else "table"
        if not rows:
            raise ConfigError("a table executor needs at least one measured row")
        if answer not in tuple(Answer):
            raise ConfigError(f"answer must be one of {', '.join(Answer)}, not {answer!r}")
        self.answer, self.seed = Answer(answer), seed
        # A MeasuredTable merged its repeats when it was read; rows given bare are merged here.
        merged = (
            MergedRows(rows, table.merged_rows, table.merged_configs)
            if isinstance(table, MeasuredTable)
            else merge_repeats(rows)
        )
        self.merged_rows = merged.merged_rows
        """Rows given that repeated an earlier row's configuration, merged into it."""
        self.compared = compared_fields(merged.rows)
        self._rows: dict[tuple, MeasuredRow] = {self.key(r.config): r for r in merged.rows}
        self._index = {key: i for i, key in enumerate(self._rows)}
        self._draws: dict[tuple, int] = {}
        if self.answer == Answer.ONE_ROUND:
            bare = sum(1 for r in merged.rows if r.status == RowStatus.COMPLETE and not r.rounds)
            if bare:
                raise ConfigError(
                    f"table '{self.source}' keeps no rounds for {bare} of its complete rows "
                    "(one step time per layout), so it cannot answer one round per trial; "
                    "answer it with the median"
                )
        self.calls: list[TrialConfig] = []
        """Every configuration run, in order."""

    def key(self, config: TrialConfig) -> tuple:
        """The table's identity of ``config`` (``config_key`` over the fields that vary among
        the rows)."""
        return config_key(config, self.compared)

    def __contains__(self, config: TrialConfig) -> bool:
        """Whether a row measured ``config``."""
        return self.key(config) in self._rows

    def row_for(self, config: TrialConfig) -> MeasuredRow:
        """The row that measured ``config``; ConfigError naming it when none did."""
        row = self._rows.get(self.key(config))
        if row is None:
            raise ConfigError(
                f"configuration {short_name(config)} of "
                f"{config.workload.name} is not in table '{self.source}'; "
                "replay only the table's configurations"
            )
        return row

    def run(self, config: TrialConfig) -> TableOutcome:
        """What a trial of ``config`` measures, as ``answer`` says."""
        row = self.row_for(config)
        self.calls.append(config)
        if self.answer == Answer.MEDIAN or row.status != RowStatus.COMPLETE:
            return TableOutcome(row.status, row.step_time_s, row.peak_memory_bytes)
        key = self.key(config)
        k = self._draws[key] = self._draws.get(key, 0) + 1
        step = random.Random(f"{self.seed}/{self._index[key]}/{k}").choice(row.rounds)
        if step is None:
            return TableOutcome(RowStatus.FAILED, None, row.peak_memory_bytes)
        return TableOutcome(row.status, step, row.peak_memory_bytes)


# ---- replaying a strategy --------------------------------------------------------------
class ReplayTrialExecutor:
    """A ``TableExecutor`` behind the search's executor protocol (``search.loop.TrialExecutor``):
    ``run`` returns a ``TrialResult`` built from the measured row (its step time on every rank,
    its peak memory, no timeline), or raises ``TrialFailed`` for a row that failed or ran out of
    memory. ``Search`` runs on it exactly as on Ray, so a search over a table is stored, resumed
    and exported like any other."""

    slots = 1

    def __init__(
        self,
        table: MeasuredTable | Iterable[MeasuredRow],
        *,
        answer: Answer | str = Answer.MEDIAN,
        seed: int = 0,
    ) -> None:
        self.table = TableExecutor(table, answer=answer, seed=seed)
        self.history: list[Measured] = []
        """Every trial answered, in order, as a strategy sees it."""

    def reached(self, target_s: float):
        """A function: the 1-based trial that first ran a layout whose row's median is within
        ``target_s``, or None before one has."""

        def first() -> int | None:
            for i, m in enumerate(self.history, 1):
                if (
                    m.status == RowStatus.COMPLETE
                    and self.table.row_for(m.config).step_time_s <= target_s
                ):
                    return i
            return None

        return first

    def contains(self, config: TrialConfig) -> bool:
        return config in self.table

    def run(self, config: TrialConfig):
        from autotune.errors import TrialFailed
        from autotune.trial.result import MemoryBreakdown, RankResult, TrialResult

        outcome = self.table.run(config)
        self.history.append(Measured(config, outcome.step_time_s, RowStatus(outcome.status)))
        if outcome.status != "complete" or not outcome.step_time_s:
            kind = "oom" if outcome.status == "infeasible" else "error"
            raise TrialFailed(
                f"the table measured {short_name(config)} as {outcome.status}", kind=kind
            )
        t, peak = outcome.step_time_s, outcome.peak_memory_bytes or 0
        steps = len(config.step_schedule())
        ranks = [
            RankResult(
                rank=r,
                pp_rank=0,
                dp_rank=0,
                tp_rank=0,
                device="table",
                backend="table",
                num_threads=1,
                step_times=[t] * steps,
                losses=[],
                memory=MemoryBreakdown(0, 0, 0, 0, 0, peak, "table"),
                setup_s=0.0,
            )
            for r in range(config.world_size)
        ]
        return TrialResult(
            config=config.resolved(),
            step_time_s=t,
            throughput_tokens_per_s=config.tokens_per_step / t,
            losses=[None] * steps,  # a table keeps no losses
            ranks=ranks,
            wall_s=t * steps,
            steps_s=t * steps,
            cold_start=False,
            env={"executor": "table", "table": self.table.source},
        )


@dataclass(frozen=True, slots=True)
class ReplayRun:
    """One strategy replayed on one group."""

    group: str
    candidates: int
    history: tuple[Measured, ...]
    """The trials the strategy ran, in order."""
    reached_at: int | None
    """The trial (1-based) that first tried a layout within the target (judged by its row's
    median, however the trial was answered); None if none did."""
    stopped: bool
    """True when the strategy stopped by itself (proposed None) rather than at the target."""

    @property
    def trials_to_target(self) -> int:
        """Trials until one within the target; a strategy that stopped before counts as the
        number of candidates + 1 (it would need at least one more search to get there)."""
        return self.reached_at if self.reached_at is not None else self.candidates + 1

    @property
    def wall_s(self) -> float:
        """What the trials up to the target (all of them if never reached) would have cost:
        Σ ``trial_wall_s``."""
        counted = self.history[: self.reached_at] if self.reached_at else self.history
        return sum(trial_wall_s(m.step_time_s) for m in counted)


class _Unfitted:
    """The study calibration of a replay: none (a model-guided strategy fits its own trials,
    as in a search its ``fitted`` would read the study's)."""

    def predict(self, config: TrialConfig) -> dict:
        return {}

    def remember_spans(self, trial_id: int, config: TrialConfig, spans) -> None:
        pass

    def refit(self) -> None:
        pass


def replay(
    strategy: Strategy | str,
    group: TableGroup,
    *,
    within: float = WITHIN,
    until_target: bool = True,
    answer: Answer | str = Answer.MEDIAN,
    seed: int = 0,
    workdir: str | Path | None = None,
) -> ReplayRun:
    """Run the search's own loop (``autotune.search.loop.SearchLoop``) over a
    ``ReplayTrialExecutor`` of ``group``'s rows, answering as ``answer`` says (with ``seed``).
    ``strategy`` is a ``Strategy``, or the name of an Optuna sampler the search ships (tpe,
    gp, random: ``OptunaStrategy``, seeded with ``seed``). The space is the group's
    configurations; no baseline, no memory limit, no re-measurement. Ends at the first trial
    of a layout whose median is within ``within`` of the group's best median (with
    ``until_target``), when the strategy stops, or when every layout is tried. The target is
    judged by the medians whatever the answers, as the noise floor (``one_round_trials``) is:
    a lucky round does not make a slow layout a find. A configuration the strategy proposes
    again is answered by the loop from what it stored, and costs no trial."""
    import tempfile

    import optuna

    from autotune.search.loop import SearchLoop
    from autotune.search.space import SearchSpace
    from autotune.search.spec import SearchSpec
    from autotune.search.strategies.optuna_strategy import OptunaStrategy, make_sampler
    from db import Database

    executor = ReplayTrialExecutor(group.rows, answer=answer, seed=seed)
    configs = [r.config for r in group.rows]
    space = SearchSpace.of(configs)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = strategy if isinstance(strategy, str) else "tpe"
    study = optuna.create_study(direction="maximize", sampler=make_sampler(sampler, seed))
    if isinstance(strategy, str):
        strategy = OptunaStrategy(strategy, study, space)
    target = group.best_step_time_s * (1 + within)
    reached = executor.reached(target)
    first = configs[0]
    spec = SearchSpec(
        workload=first.workload,
        world_size=first.world_size,
        n_trials=len(configs),
        patience=None,
        top_k=1,
        remeasure_repeats=0,
        seed=seed,
        device=first.device,
        study_name=group.key,
    )
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        db = Database.open(f"sqlite:///{tmp}/replay.db")
        try:
            record = db.create_study(group.key, {})
            loop = SearchLoop(
                spec=spec,
                space=space,
                study=study,
                database=db,
                study_id=record.id,
                executor=executor,
                limit=None,
                device_type="cuda" if first.device == "cuda" else "cpu",
                calibration=_Unfitted(),
                say=lambda _: None,
                strategy=strategy,
                until=(lambda: "target" if reached() else None) if until_target else None,
                shape=group.shape,
            )
            outcome = loop.run(time.monotonic())
        finally:
            db.close()
    return ReplayRun(
        group.key,
        len(configs),
        tuple(executor.history),
        reached(),
        outcome.stopped_because != "target",
    )
