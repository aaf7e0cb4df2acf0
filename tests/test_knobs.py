"""The knob registry: every table that names knobs is derived from ``knobs.KNOBS`` and equals
what it listed by hand before the registry, and each knob reaches every table it declares."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from autotune import knobs
from autotune.cli.config_flags import FLAGS, KNOB_FLAGS, add_flags
from autotune.cli.rank import _knobs
from autotune.config import TrialConfig, WorkloadSpec
from autotune.layouts import KNOB_ORDER, KNOB_WORDS, SEARCHED_BY_DEFAULT, short_name
from autotune.model import engine_memory, layout_quantities, memory, perf_model
from autotune.model.layout_quantities import fields_key
from autotune.ranking.compare import LAYOUT_KEYS, parse_layout
from autotune.ranking.space import VIRTUAL_STAGES

RUN = {"seed", "num_warmup_steps", "num_timed_steps", "num_profiled_steps"}
TODAY = {
    "KNOB_ORDER": (
        "tp_degree",
        "pp_degree",
        "pp_schedule",
        "zero_stage",
        "overlap_enabled",
        "micro_batch_size",
        "activation_checkpointing",
        "bucket_mb",
        "sequence_parallel",
        "cp_degree",
        "dp_replicate",
        "virtual_stages",
        "compile",
        "float8",
        "ep_degree",  # expert parallelism, searched since
    ),
    "KNOB_WORDS": {
        "tp_degree": "tensor-parallel degree",
        "pp_degree": "pipeline-parallel degree",
        "pp_schedule": "pipeline schedule",
        "zero_stage": "ZeRO stage",
        "overlap_enabled": "communication/compute overlap",
        "micro_batch_size": "micro-batch (hence accumulation)",
        "activation_checkpointing": "activation checkpointing",
        "bucket_mb": "gradient bucket size",
        "sequence_parallel": "sequence parallelism",
        "cp_degree": "context-parallel degree",
        "dp_replicate": "HSDP replicas",
        "virtual_stages": "virtual pipeline stages",
        "compile": "torch.compile",
        "float8": "float8 linears",
        "ep_degree": "expert-parallel degree",
    },
    "SEARCHED_BY_DEFAULT": {
        "sequence_parallel": (False, True),
        "cp_degree": (1, 2),
        "dp_replicate": (1, 2),
        "virtual_stages": (2, 4),
        "compile": (False,),
        "float8": (False,),
        "ep_degree": (1, 2),  # expert parallelism, declared since
    },
    "FLAGS": {
        "--world-size": (TrialConfig, "world_size"),
        "--tp": (TrialConfig, "tp_degree"),
        "--pp": (TrialConfig, "pp_degree"),
        "--zero": (TrialConfig, "zero_stage"),
        "--micro-batch": (TrialConfig, "micro_batch_size"),
        "--ac": (TrialConfig, "activation_checkpointing"),
        "--ac-layers": (TrialConfig, "ac_layers"),
        "--schedule": (TrialConfig, "pp_schedule"),
        "--virtual-stages": (TrialConfig, "virtual_stages"),
        "--attention": (TrialConfig, "attention"),
        "--bucket-mb": (TrialConfig, "bucket_mb"),
        "--sp": (TrialConfig, "sequence_parallel"),
        "--cp": (TrialConfig, "cp_degree"),
        "--dp-replicate": (TrialConfig, "dp_replicate"),
        "--compile": (TrialConfig, "compile"),
        "--fp8": (TrialConfig, "float8"),
        "--ep": (TrialConfig, "ep_degree"),
        "--seq-len": (WorkloadSpec, "seq_len"),
        "--global-batch": (WorkloadSpec, "global_batch_size"),
    },
    "KNOB_FLAGS": {"--sp", "--cp", "--virtual-stages", "--dp-replicate", "--ac-layers"}
    | {"--compile", "--fp8", "--ep"},
    "LAYOUT_KEYS": {
        "tp": "tp_degree",
        "pp": "pp_degree",
        "cp": "cp_degree",
        "mb": "micro_batch_size",
        "zero": "zero_stage",
        "ac": "activation_checkpointing",
        "schedule": "pp_schedule",
        "v": "virtual_stages",
        "bucket": "bucket_mb",
        "overlap": "overlap_enabled",
        "sp": "sequence_parallel",
        "ep": "ep_degree",
    },
    "VIRTUAL_STAGES": (2, 4),
    "RUN_FIELDS": RUN,
    "DATA_PARALLEL_SHARDING_FIELDS": {
        "zero_stage",
        "dp_replicate",
        "bucket_mb",
        "overlap_enabled",
        "optimizer_offload_enabled",
    },
    "_SHARDED_BLIND": RUN | {"overlap_enabled", "zero_stage", "bucket_mb"},
    "ACTIVATIONS_IGNORE": RUN
    | {"zero_stage", "dp_replicate", "bucket_mb", "overlap_enabled", "optimizer_offload_enabled"},
    "ENGINE_MEMORY_IGNORE": RUN | {"overlap_enabled", "bucket_mb"},
    "SHARDING_BLIND": RUN
    | {"zero_stage", "dp_replicate", "bucket_mb", "overlap_enabled", "optimizer_offload_enabled"},
}
"""Each table as it was listed by hand before the registry."""


def test_the_derived_tables_are_todays():
    q = layout_quantities
    derived = {
        "KNOB_ORDER": KNOB_ORDER,
        "KNOB_WORDS": KNOB_WORDS,
        "SEARCHED_BY_DEFAULT": SEARCHED_BY_DEFAULT,
        "FLAGS": FLAGS,
        "KNOB_FLAGS": set(KNOB_FLAGS),
        "LAYOUT_KEYS": LAYOUT_KEYS,
        "VIRTUAL_STAGES": VIRTUAL_STAGES,
        "RUN_FIELDS": q.RUN_FIELDS,
        "DATA_PARALLEL_SHARDING_FIELDS": q.DATA_PARALLEL_SHARDING_FIELDS,
        "_SHARDED_BLIND": q.SHARDED_STAGE_IGNORE,
        "ACTIVATIONS_IGNORE": q.ACTIVATIONS_IGNORE,
        "ENGINE_MEMORY_IGNORE": q.ENGINE_MEMORY_IGNORE,
        "SHARDING_BLIND": q.STEP_LAYER_IGNORE,
    }
    assert derived == TODAY
    assert list(KNOB_WORDS) == list(KNOB_ORDER) and len(KNOB_FLAGS) == len(TODAY["KNOB_FLAGS"])
    # The models' own sets (until they import these names) hold the same fields.
    assert memory._SHARDED_BLIND == TODAY["_SHARDED_BLIND"]
    assert memory.ACTIVATIONS_IGNORE == TODAY["ACTIVATIONS_IGNORE"]
    assert engine_memory.ENGINE_MEMORY_IGNORE == TODAY["ENGINE_MEMORY_IGNORE"]
    assert perf_model.SHARDING_BLIND == TODAY["SHARDING_BLIND"]


def _config(**fields) -> TrialConfig:
    wl = WorkloadSpec(family="llama", size="tiny", seq_len=64, global_batch_size=64)
    return TrialConfig(workload=wl, world_size=16, device="cuda", **fields)


def test_short_names_and_the_knobs_column_are_todays():
    c = _config(tp_degree=2, pp_degree=2, zero_stage=3, micro_batch_size=2)
    assert short_name(c) == "w16-tp2-pp2-dp4-z3-mb2x8-ac_none-1f1b"
    c = dataclasses.replace(
        c,
        pp_schedule="interleaved_1f1b",
        virtual_stages=4,
        overlap_enabled=False,
        bucket_mb=5.0,
        sequence_parallel=True,
        activation_checkpointing="full",
        ac_layers=2,
        compile=True,
        float8=True,
    )
    assert short_name(c) == (
        "w16-tp2-pp2-dp4-z3-mb2x8-ac_full-l2-interleaved_1f1b-v4-noov-b5-sp-compile-fp8"
    )
    assert _knobs(c) == "l2,v4,sp,compile,fp8"
    c = _config(cp_degree=2, dp_replicate=2, zero_stage=2)
    assert (
        short_name(c) == "w16-tp1-pp1-dp8-z2-mb1x8-ac_none-cp2-hsdp2" and _knobs(c) == "cp2,hsdp2"
    )
    assert _knobs(_config()) == "-"


NON_DEFAULT = {
    "world_size": 8,
    "tp_degree": 2,
    "pp_degree": 2,
    "pp_schedule": "gpipe",
    "zero_stage": 3,
    "overlap_enabled": False,
    "micro_batch_size": 2,
    "activation_checkpointing": "full",
    "ac_layers": 1,
    "bucket_mb": 5.0,
    "sequence_parallel": True,
    "cp_degree": 2,
    "dp_replicate": 2,
    "virtual_stages": 4,
    "compile": True,
    "float8": True,
    "attention": "eager",
    "optimizer_offload_enabled": True,
    "ep_degree": 2,
}
"""A value other than the default for each knob (a layout that sets it)."""
COMPARE_TEXT = {True: "on", False: "off"}


@pytest.mark.parametrize("knob", knobs.KNOBS, ids=lambda k: k.field)
def test_each_knob_reaches_every_table_it_declares(knob, monkeypatch):
    name = knob.field
    value = NON_DEFAULT[name]
    # Its flag sets its field, typed from the field.
    assert (knob.flag is not None) == any(f == (TrialConfig, name) for f in FLAGS.values())
    if knob.flag is not None:
        assert FLAGS[knob.flag] == (TrialConfig, name)
        p = argparse.ArgumentParser()
        add_flags(p, knob.flag)
        text = [] if value is True else [str(value)]
        assert getattr(p.parse_args([knob.flag, *text]), name) == value
    assert (knob.flag in KNOB_FLAGS) == knob.newer
    # The search asks it, in its words; the newer ones with their default values.
    assert (name in KNOB_ORDER) == (knob.words is not None) == (name in KNOB_WORDS)
    assert SEARCHED_BY_DEFAULT.get(name) == knob.search_default
    # --compare sets it.
    assert (name in LAYOUT_KEYS.values()) == (knob.compare_key is not None)
    if knob.compare_key is not None:
        monkeypatch.setattr(TrialConfig, "validate", lambda self, **rules: None)
        text = COMPARE_TEXT.get(value, value) if isinstance(value, bool) else value
        got = parse_layout(
            f"{knob.compare_key}={text:g}"
            if isinstance(text, float)
            else f"{knob.compare_key}={text}",
            TrialConfig(),
        )
        assert getattr(got, name) == value
        monkeypatch.undo()
    # Its mark is in the short name of a layout that sets it (pipelined, where it needs one).
    base = _config(pp_degree=2, micro_batch_size=1, tp_degree=2)
    if name in ("pp_degree", "tp_degree", "world_size"):
        base = _config()
    config = dataclasses.replace(base, **{name: value})
    if knob.mark is not None:
        mark = knob.mark(config)
        assert mark and mark in short_name(config)
        assert (mark[1:] in _knobs(config).split(",")) == knob.newer
        assert knob.mark(_config(pp_degree=2)) == ("-1f1b" if name == "pp_schedule" else "")
    # The memos it is declared blind to share one key across its values; the others do not.
    for memo in knobs.BLIND_MEMOS:
        ignoring = knobs.memo_ignores(memo)
        same = fields_key(base, ignoring) == fields_key(config, ignoring)
        assert same == (memo in knob.blind), memo
