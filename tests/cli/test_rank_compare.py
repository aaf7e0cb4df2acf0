"""``rank --compare``: a reference layout's place in the ranking and the term the top pick
gains in, worked from the ranking's own predictions."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.config import GIB, TrialConfig, WorkloadSpec
from autotune.errors import ConfigError
from autotune.model.cluster import load_cluster
from autotune.model.engines import engine_traits
from autotune.ranking.compare import compare_to_top, parse_layout
from autotune.ranking.score import rank_layouts
from autotune.ranking.space import enumerate_layouts
from autotune.shapes import ModelShape

SHAPE = ModelShape(
    family="gpt",
    num_layers=24,
    hidden_size=2304,
    num_heads=24,
    num_kv_heads=24,
    ffn_hidden_size=4 * 2304,
    vocab_size=51200,
    max_seq_len=2048,
)


def _ranking():
    cluster = load_cluster("a100-sxm4-80gb", nodes=1)
    base = TrialConfig(
        workload=WorkloadSpec(workload="explicit:test", seq_len=2048, global_batch_size=64),
        world_size=8,
        device="cuda",
        precision="bf16-mixed",
    )
    engine = engine_traits("megatron")
    ranking = rank_layouts(
        enumerate_layouts(base, SHAPE),
        cluster,
        shape=SHAPE,
        limit_bytes=int(80 * GIB),
        engine=engine,
        memory_traits=engine.memory,
    )
    return base, cluster, engine, ranking


def test_the_top_pick_compares_first_and_a_slower_layout_names_its_largest_loss():
    base, cluster, engine, ranking = _ranking()
    top = ranking.fitting[0]
    first = compare_to_top(ranking, top.config, cluster, SHAPE, engine)
    assert first.position == 1 and first.percentile == 0.0
    ref = parse_layout("tp=8,pp=1,mb=1,zero=0,ac=full", base)
    c = compare_to_top(ranking, ref, cluster, SHAPE, engine)
    slower = [s for s in ranking.fitting if s.time.step_time_s < c.time.step_time_s]
    assert c.position == len(slower) + 1 > 1
    assert c.percentile == pytest.approx(len(slower) / len(ranking.fitting))
    gains = {k: c.time.breakdown[k] - top.time.breakdown[k] for k in top.time.breakdown}
    assert c.term == max(gains, key=gains.get) and c.gain_s == gains[c.term] > 0


def test_a_layout_key_the_option_does_not_know_is_refused_in_one_line():
    base = TrialConfig(world_size=8)
    with pytest.raises(ConfigError, match="KEY one of tp, pp"):
        parse_layout("tp=2,xq=2", base)
    assert parse_layout("tp=2,ac=full,overlap=off", base) == dataclasses.replace(
        base, tp_degree=2, activation_checkpointing="full", overlap_enabled=False
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("tp=two", "tp=two: give an integer"),
        ("tp=2 bucket=big", "bucket=big: give a number"),
        ("tp=2,sp=maybe", "sp=maybe: give on or off"),
        ("tp=2,,pp", "'pp' is not KEY=VALUE"),
    ],
)
def test_a_value_that_does_not_parse_is_refused_naming_it(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_layout(text, TrialConfig(world_size=8))


def test_pairs_may_be_separated_by_spaces_as_well_as_commas():
    base = TrialConfig(world_size=8)
    expected = dataclasses.replace(
        base, tp_degree=2, cp_degree=2, sequence_parallel=True, bucket_mb=5.0
    )
    assert parse_layout(" tp=2  cp=2, sp=on bucket=5 ", base) == expected
    assert parse_layout("tp=2,cp=2,sp=on,bucket=5", base) == expected


def test_a_bad_reference_is_refused_before_the_ranking(capsys):
    from autotune.cli.main import main

    code = main(
        ["rank", "--model", "gpt-tiny", "--cluster", "a100-sxm4-80gb", "--global-batch", "16"]
        + ["--seq-len", "256", "--compare", "tp=x"]
    )
    _, err = capsys.readouterr()
    assert code == 2
    assert err.strip().splitlines() == ["autotune: error: --compare: tp=x: give an integer"]
