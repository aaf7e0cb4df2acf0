"""The knob registry: each layout knob declared once (``KNOBS``), and every table that names
knobs derived from it.

A knob's declaration (:class:`Knob`) says its ``TrialConfig`` field (whose docstring is its
flag's help and whose annotation its flag's type, ``cli/config_flags.py``), its command-line
flag, the mark it adds to a layout's short name (``layouts.short_name``; ``rank``'s knobs
column shows the newer knobs' marks), its ``rank --compare`` key, whether the search chooses it
and in what words (``layouts.KNOB_ORDER``, ``KNOB_WORDS``), its values a search takes unless
told otherwise (``layouts.SEARCHED_BY_DEFAULT``) and those ``rank`` lists, and which memos of
the models do not read it (``BLIND_MEMOS``: the memo keys ``model/layout_quantities.py``
builds with ``fields_key``). A field no knob declares blind to a memo is in that memo's key,
so a new knob can only make a memo miss, never confuse two layouts.

Derived here: ``KNOB_ORDER``, ``KNOB_WORDS``, ``SEARCHED_BY_DEFAULT``, ``FLAG_FIELDS``,
``NEWER_KNOB_FLAGS``, ``COMPARE_KEYS``, ``short_marks``, ``memo_ignores``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autotune.config import INTERLEAVED_STAGES_PER_RANK, TrialConfig

DEFAULT_BUCKET_MB = TrialConfig().bucket_mb
"""``TrialConfig``'s default gradient bucket (a name omits it; the baselines prefer it)."""

BLIND_MEMOS = ("stage", "sharded_stage", "activations", "engine_memory", "step_layer")
"""The models' memos by the fields they read: ``memory``'s pipeline-rank estimate
(``stage``: every field but the run's) and its ZeRO-2/3 form (``sharded_stage``),
``memory``'s held activations (``activations``), ``engine_memory``'s estimate
(``engine_memory``) and ``perf_model``'s per-layer cost (``step_layer``). The fields of a
trial's measurement (``TrialConfig.fields_of("measurement")``) are read by none."""

_DP_SYNC = frozenset({"sharded_stage", "activations", "step_layer", "engine_memory"})
"""What the bucket and overlap leave alone: they group and time the gradient sync only."""
_DP_SHARDING = frozenset({"activations", "step_layer"})
"""What how the data-parallel ranks shard states leaves alone: activations and layer cost."""


@dataclass(frozen=True, slots=True)
class Knob:
    """One knob, declared once."""

    field: str
    """Its ``TrialConfig`` field."""
    flag: str | None = None
    """Its command-line flag (its help: the field's docstring)."""
    words: str | None = None
    """In a user's words; given only for a knob the search chooses (``KNOB_ORDER``, in the
    order of ``KNOBS``)."""
    compare_key: str | None = None
    """Its key in ``rank --compare KEY=VALUE``."""
    mark: Callable[[TrialConfig], str] | None = None
    """The mark it adds to a layout's short name ('' where it adds none)."""
    mark_position: int = 0
    """Where its mark stands among the short name's optional marks (the names are stored, so
    their order is kept)."""
    newer: bool = False
    """A newer knob: its flag narrows ``rank`` and sets ``estimate`` (``NEWER_KNOB_FLAGS``), and
    its mark is in ``rank``'s knobs column."""
    search_default: tuple | None = None
    """The values a search space takes for it unless told otherwise (newer knobs only; the
    others range over their whole type)."""
    rank_default: tuple | None = None
    """The values ``rank`` lists for it unless its flag names one (where a fixed list)."""
    blind: frozenset[str] = frozenset()
    """The memos (``BLIND_MEMOS``) that do not read it."""


def _v(c: TrialConfig) -> str:
    return f"-v{c.virtual_stages}" if c.virtual_stages != INTERLEAVED_STAGES_PER_RANK else ""


KNOBS: tuple[Knob, ...] = (
    Knob("world_size", "--world-size"),
    Knob("tp_degree", "--tp", "tensor-parallel degree", "tp"),
    Knob("pp_degree", "--pp", "pipeline-parallel degree", "pp"),
    Knob(
        "pp_schedule",
        "--schedule",
        "pipeline schedule",
        "schedule",
        mark=lambda c: f"-{c.pp_schedule}" if c.pp_degree > 1 else "",
        mark_position=1,
    ),
    Knob(
        "zero_stage",
        "--zero",
        "ZeRO stage",
        "zero",
        blind=frozenset({"sharded_stage"}) | _DP_SHARDING,
    ),
    Knob(
        "overlap_enabled",
        None,
        "communication/compute overlap",
        "overlap",
        mark=lambda c: "" if c.overlap_enabled else "-noov",
        mark_position=3,
        blind=_DP_SYNC,
    ),
    Knob("micro_batch_size", "--micro-batch", "micro-batch (hence accumulation)", "mb"),
    Knob("activation_checkpointing", "--ac", "activation checkpointing", "ac"),
    Knob(
        "bucket_mb",
        "--bucket-mb",
        "gradient bucket size",
        "bucket",
        mark=lambda c: (
            f"-b{c.bucket_mb:g}" if c.dp_degree > 1 and c.bucket_mb != DEFAULT_BUCKET_MB else ""
        ),
        mark_position=4,
        blind=_DP_SYNC,
    ),
    Knob(
        "sequence_parallel",
        "--sp",
        "sequence parallelism",
        "sp",
        mark=lambda c: "-sp" if c.sequence_parallel else "",
        mark_position=5,
        newer=True,
        search_default=(False, True),
        rank_default=(True,),
    ),
    Knob(
        "cp_degree",
        "--cp",
        "context-parallel degree",
        "cp",
        mark=lambda c: f"-cp{c.cp_degree}" if c.cp_degree > 1 else "",
        mark_position=6,
        newer=True,
        search_default=(1, 2),  # trials run context parallelism (models/context_parallel.py)
    ),
    Knob(
        "dp_replicate",
        "--dp-replicate",
        "HSDP replicas",
        mark=lambda c: f"-hsdp{c.dp_replicate}" if c.dp_replicate > 1 else "",
        mark_position=7,
        newer=True,
        search_default=(1, 2),  # HSDP 2 × dp/2 (tests/trial/parallel/test_hsdp_vpp.py runs it)
        blind=_DP_SHARDING,
    ),
    Knob(
        "virtual_stages",
        "--virtual-stages",
        "virtual pipeline stages",
        "v",
        mark=lambda c: _v(c) if c.pp_degree > 1 else "",
        mark_position=2,
        newer=True,
        search_default=(INTERLEAVED_STAGES_PER_RANK, 4),  # pp 2 × 4 runs there too
        rank_default=(2, 4),
    ),
    Knob(
        "ac_layers",
        "--ac-layers",
        mark=lambda c: f"-l{c.ac_layers}" if c.ac_layers is not None else "",
        mark_position=0,
        newer=True,
    ),
    Knob(
        "compile",
        "--compile",
        "torch.compile",
        mark=lambda c: "-compile" if c.compile else "",
        mark_position=8,
        newer=True,
        search_default=(False,),
    ),
    Knob(
        "float8",
        "--fp8",
        "float8 linears",
        mark=lambda c: "-fp8" if c.float8 else "",
        mark_position=9,
        newer=True,
        search_default=(False,),
    ),
    Knob(
        "ep_degree",
        "--ep",
        "expert-parallel degree",
        "ep",
        mark=lambda c: f"-ep{c.ep_degree}" if c.ep_degree > 1 else "",
        mark_position=10,
        newer=True,
        # Refused for a dense model (TrialConfig.validate), so only a mixture of experts' search
        # space holds ep 2 (tests/trial/parallel/test_moe_ep.py runs it); last in the search's
        # order, so a dense model's questions are those it had before.
        search_default=(1, 2),
    ),
    Knob("attention", "--attention"),
    Knob("optimizer_offload_enabled", blind=_DP_SHARDING),
)
"""Every knob, in the order the search asks them (``KNOB_ORDER``)."""

KNOB_BY_FIELD = {k.field: k for k in KNOBS}

KNOB_ORDER = tuple(k.field for k in KNOBS if k.words is not None)
"""The knobs a search chooses, in the order it asks them and a report lists them (a knob whose
reachable configurations all share one value is not asked, so the later knobs add no question
to a space that does not vary them)."""
KNOB_WORDS = {k.field: k.words for k in KNOBS if k.words is not None}
"""Each knob of ``KNOB_ORDER`` in a user's words: the one list the commands' help and the docs'
knob lists are made from, or checked against (``tests/test_docs.py``)."""
SEARCHED_BY_DEFAULT = {k.field: k.search_default for k in KNOBS if k.search_default is not None}
"""The values of the newer knobs a search space takes unless --fix or a space file names others:
the value that keeps the layout as before, plus each value the trial engine runs and the search
has been shown to use (sequence parallelism: every TP layout also with SP;
tests/trial/parallel/test_layouts.py and test_sequence_parallel.py)."""
FLAG_FIELDS = {k.flag: k.field for k in KNOBS if k.flag is not None}
"""Each knob's flag and the ``TrialConfig`` field it sets."""
NEWER_KNOB_FLAGS = tuple(k.flag for k in KNOBS if k.newer and k.flag is not None)
"""The newer layout knobs' flags (sequence and context parallelism, HSDP, virtual stages,
partial checkpointing, compile, float8, expert parallelism)."""
COMPARE_KEYS = {k.compare_key: k.field for k in KNOBS if k.compare_key is not None}
"""``rank --compare``'s keys and the fields they set."""
_MARKED = tuple(sorted((k for k in KNOBS if k.mark is not None), key=lambda k: k.mark_position))


def short_marks(c: TrialConfig, *, newer_only: bool = False) -> list[str]:
    """The optional marks of ``c``'s short name, in their order ('-sp', '-cp2', …);
    ``newer_only``: the newer knobs' alone (``rank``'s knobs column)."""
    return [m for k in _MARKED if (k.newer or not newer_only) and (m := k.mark(c))]


def memo_ignores(memo: str) -> frozenset[str]:
    """The ``TrialConfig`` fields memo ``memo`` (one of ``BLIND_MEMOS``) does not read: the
    measurement's, and every knob declared blind to it."""
    if memo not in BLIND_MEMOS:
        raise ValueError(f"not a memo: {memo!r}; one of {', '.join(BLIND_MEMOS)}")
    run = frozenset(TrialConfig.fields_of("measurement"))
    return run | {k.field for k in KNOBS if memo in k.blind}
