"""``autotune rank``: the layouts it scores are enumerate_configs' valid ones, its order is the
performance model's, everything it lists fits, and each bad input is one line."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli.main import main
from autotune.config import DEFAULT_PRECISION, TrialConfig, WorkloadSpec
from autotune.layouts import enumerate_configs
from autotune.model.cluster import load_cluster
from autotune.model.memory import estimate_memory
from autotune.model.perf_model import Calibration, predict_step_time
from autotune.ranking.score import ScoringProgress
from autotune.ranking.space import enumerate_layouts
from autotune.search.screen import ALLOWANCES
from autotune.search.space import DEFAULT_BUCKETS_MB, SearchSpace
from autotune.shapes import MODEL_SHAPES

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["rank", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _base(model: str, world: int, batch: int, seq: int, dtype: str | None = None) -> TrialConfig:
    family, _, size = model.partition("-")
    return TrialConfig(
        workload=WorkloadSpec(
            family=family, size=size, seq_len=seq, global_batch_size=batch, dtype=dtype
        ),
        world_size=world,
        device="cuda",
    )


# ---- the layouts -------------------------------------------------------------------------
@pytest.mark.parametrize("model, world, batch", [("gpt-small", 8, 16), ("llama-tiny", 8, 24)])
def test_layouts_are_enumerate_configs_valid_ones(model, world, batch):
    base = _base(model, world, batch, 64)
    ours = enumerate_layouts(base)
    grid = list(enumerate_configs(base, overlap=(True, False)))
    # The search's own grid: the valid layouts, less the overlap-off twin of each dp-1 layout
    # (nothing to overlap), each dp > 1 layout once per bucket size.
    assert len(ours) == len(set(ours))
    assert set(ours) == set(SearchSpace(base).configs)
    plain = {dataclasses.replace(c, bucket_mb=base.bucket_mb) for c in ours}
    assert plain == {c for c in grid if c.overlap_enabled or c.dp_degree > 1}
    dropped = [c for c in grid if c not in plain]
    assert dropped and all(c.dp_degree == 1 and not c.overlap_enabled for c in dropped)
    assert len(ours) == sum(len(DEFAULT_BUCKETS_MB) if c.dp_degree > 1 else 1 for c in plain)
    # Every knob the command says it enumerates does vary.
    for knob in (
        "tp_degree",
        "pp_degree",
        "micro_batch_size",
        "zero_stage",
        "activation_checkpointing",
        "pp_schedule",
        "overlap_enabled",
        "bucket_mb",
    ):
        assert len({getattr(c, knob) for c in ours}) > 1, knob


def test_explicit_shape_layouts_follow_its_heads_and_layers():
    # gpt-small's shape given explicitly: the same layouts as the built-in model.
    shape = MODEL_SHAPES[("gpt", "small")]
    base = _base("gpt-small", 8, 16, 64)
    explicit = dataclasses.replace(
        base, workload=dataclasses.replace(base.workload, workload="explicit:architecture")
    )
    strip = {
        dataclasses.replace(c, workload=base.workload) for c in enumerate_layouts(explicit, shape)
    }
    assert strip == set(enumerate_layouts(base))


# ---- the ranking -------------------------------------------------------------------------
# The newer knobs fixed at one value each; rank lists sequence parallelism on wherever tp > 1.
NEWER_FIXED = ("--cp", "1", "--dp-replicate", "1", "--virtual-stages", "2")
RANK_ARGS = (
    "--model",
    "gpt-small",
    *NEWER_FIXED,
    "--cluster",
    "a100-sxm4-80gb",
    "--global-batch",
    "32",
    "--seq-len",
    "1024",
    "--memory-limit",
    "4",
    "--top",
    "10000",
    "--json",
)


def _folded(scored: list[tuple[float, float, int, TrialConfig]]) -> list[tuple]:
    """Fastest first; a layout equal to a listed one but for its bucket, with step and peak
    within 0.1% of it, is not listed (independently of rank.collapse_equivalent)."""
    rows: list[tuple] = []
    for tps, step, peak, config in sorted(scored, key=lambda r: (-r[0], r[2])):
        if not any(
            dataclasses.replace(c, bucket_mb=0) == dataclasses.replace(config, bucket_mb=0)
            and abs(s - step) <= 1e-3 * s
            and abs(p - peak) <= 1e-3 * p
            for _, s, p, c in rows
        ):
            rows.append((tps, step, peak, config))
    return rows


def test_order_is_predicted_throughput_and_all_fit(capsys):
    code, out, err = _run(capsys, *RANK_ARGS)
    assert code == 0
    data = json.loads(out)
    cluster = load_cluster("a100-sxm4-80gb")
    limit = 4 * GIB
    # Independently: every valid layout, its predicted peak and, if it fits with the screen's
    # CUDA allowances (the model's margin, the allocator's reserve, the memory outside the
    # allocator: screen.ALLOWANCES), its predicted tokens/s with the built-in's shipped
    # calibration (fitted on published A100 runs), in the search's default precision on GPUs
    # (bf16-mixed).
    cuda = ALLOWANCES["cuda"]

    def fits(peak: int) -> bool:
        return (
            peak * (1 + cuda.model_margin) * cuda.fragmentation + cuda.outside_allocator
        ) <= limit

    scored = []
    grid = SearchSpace(
        _base("gpt-small", 8, 32, 1024),
        # rank's choices for these flags (RANK_ARGS) and at seq 1024 (no cp: < 4,096 tokens)
        narrowed={
            "sequence_parallel": [True],
            "cp_degree": [1],
            "dp_replicate": [1],
            "virtual_stages": [2],
        },
    ).configs
    for config in grid:
        peak = estimate_memory(config, device_type="cuda").total
        if fits(peak):
            t = predict_step_time(config, cluster, Calibration.for_cluster(cluster))
            scored.append((t.tokens_per_s, t.step_time_s, peak, config))
    rows = _folded(scored)
    # The memory screen drops layouts before they are scored, never one that fits.
    assert data["scored"] < len(grid) and data["fit"] == len(scored)
    assert data["screened_groups"] + data["screened_branches"] > 0
    assert data["collapsed"] == len(scored) - len(rows) > 0
    assert 0 < data["fit"] < data["scored"]  # the limit bites
    assert data["world_size"] == 8 and data["cluster"] == "a100-sxm4-80gb"
    listed = [layout["tokens_per_s"] for layout in data["layouts"]]
    assert listed == [r[0] for r in rows]
    for layout in data["layouts"]:
        config = TrialConfig.from_dict(layout["config"])
        assert config.precision == "bf16-mixed"
        estimate = predict_step_time(config, cluster, Calibration.for_cluster(cluster))
        assert layout["tokens_per_s"] == estimate.tokens_per_s
        assert layout["step_time_s"] == estimate.step_time_s
        assert layout["breakdown"] == estimate.breakdown
        peak = estimate_memory(config, device_type="cuda").total
        assert layout["peak_memory_bytes"] == peak and fits(peak)
        for bucket in layout["collapsed_bucket_mb"]:  # each folded layout fits, predicted alike
            twin = dataclasses.replace(config, bucket_mb=bucket, precision=None)
            assert twin in grid and bucket != config.bucket_mb
            twin_time = predict_step_time(twin, cluster, Calibration.for_cluster(cluster))
            assert abs(twin_time.step_time_s - estimate.step_time_s) <= 1e-3 * estimate.step_time_s
    # Not a terminal: one plain line on stderr, none of the progress line's carriage returns.
    assert err.startswith(f"scored {data['scored']:,} layouts in ") and err.count("\n") == 1
    assert "\r" not in err


def test_precision_defaults_as_the_search_does(capsys):
    # No --precision: bf16-mixed on a GPU cluster (config.DEFAULT_PRECISION, the search's
    # default), whose fp32 master weights make every peak larger than bf16-true's.
    args = (*RANK_ARGS[:-5], "--memory-limit", "80", "--top", "1")
    _, out, _ = _run(capsys, *args)
    assert out.splitlines()[0].endswith("bf16-mixed")
    _, mixed, _ = _run(capsys, *args, "--json")
    _, true, _ = _run(capsys, *args, "--json", "--precision", "bf16-true")
    mixed, true = json.loads(mixed)["layouts"][0], json.loads(true)["layouts"][0]
    assert mixed["config"]["precision"] == DEFAULT_PRECISION["cuda"] == "bf16-mixed"
    assert true["config"]["precision"] == "bf16-true"
    as_true = dataclasses.replace(TrialConfig.from_dict(mixed["config"]), precision="bf16-true")
    assert mixed["peak_memory_bytes"] > estimate_memory(as_true, device_type="cuda").total
    code, out, err = _run(capsys, *args, "--precision", "fp8")
    assert code == 2 and "unknown precision 'fp8'" in err


def test_table_folds_layouts_predicted_alike_and_says_so(capsys):
    _, js, _ = _run(capsys, *RANK_ARGS[:-3], "--top", "10", "--json")
    data = json.loads(js)
    code, out, _ = _run(capsys, *RANK_ARGS[:-3], "--top", "10")
    assert code == 0
    rows = [ln.split() for ln in out.splitlines() if ln.split() and ln.split()[0].isdigit()]
    for row, layout in zip(rows, data["layouts"]):
        sizes = sorted([layout["config"]["bucket_mb"], *layout["collapsed_bucket_mb"]])
        if layout["config"]["derived"]["dp_degree"] > 1:
            assert row[9] == "/".join(f"{b:g}" for b in sizes)
    message = [ln for ln in out.splitlines() if ln.startswith("folded: ")]
    assert message == [
        f"folded: {data['collapsed']:,} layouts that differ from a listed one "
        "only in bucket size, with the same prediction (step and peak within "
        "0.1%), share its row; its bucket column lists their sizes"
    ]


def test_table_lists_the_json_order(capsys):
    _, out, _ = _run(capsys, *RANK_ARGS[:-3], "--top", "5", "--json")
    best = json.loads(out)["layouts"]
    code, out, _ = _run(capsys, *RANK_ARGS[:-3], "--top", "5")
    assert code == 0
    rows = [ln.split() for ln in out.splitlines() if ln.split() and ln.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4, 5]
    for row, layout in zip(rows, best):
        c = layout["config"]
        assert row[1:6] == [
            str(c["tp_degree"]),
            str(c["pp_degree"]),
            str(c["derived"]["dp_degree"]),
            str(c["zero_stage"]),
            f"{c['micro_batch_size']}×{c['derived']['grad_accum_steps']}",
        ]
        assert f"{layout['tokens_per_s']:,.0f}" in row
    assert "predicted to fit in 4 GiB" in out


def test_rank_imports_no_torch():
    # Nor SQLAlchemy: rank stores nothing (the CLI's error handling needs db.errors only).
    code = (
        "import sys; from autotune.cli.main import main; "
        "main(['rank', '--model', 'gpt-small', '--cluster', 'h100-sxm', '--global-batch', "
        "'8', '--seq-len', '128', '--top', '1']); "
        "loaded = {'torch', 'ray', 'sqlalchemy'} & set(sys.modules); "
        "assert not loaded, loaded"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr


def test_progress_on_a_terminal_every_two_percent(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    progress = ScoringProgress(1000)
    for done in range(1, 1001):
        progress.update(done)
    progress.close(7)
    updates = stream.getvalue().split("\r")[1:]
    assert len(updates) == 51  # every 20 of 1,000, then the final line
    assert updates[0].startswith("scoring layouts:   2% (20/1,000)")
    assert updates[-1].startswith("scored 1,000 layouts in ") and updates[-1].endswith(
        "; 7 predicted to fit\n"
    )


# ---- bad input ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "case, message",
    [
        ("unknown_cluster", "unknown cluster 'dgx-9000'"),
        ("bad_json", "is not valid JSON"),
        ("no_device", "device is missing"),
        ("unknown_model", "unknown model 'gpt-huge'"),
        ("no_model", "give --model NAME or an explicit architecture"),
        ("unsplittable", "choose a global batch that is a multiple of 2"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, case, message):
    good = load_cluster("h100-sxm").to_dict()
    (tmp_path / "bad.json").write_text(json.dumps(good)[:-5])
    (tmp_path / "nodevice.json").write_text(
        json.dumps({k: v for k, v in good.items() if k != "device"})
    )
    common = ("--global-batch", "16", "--seq-len", "256")
    argv = {
        "unknown_cluster": ("--model", "gpt-small", "--cluster", "dgx-9000", *common),
        "bad_json": ("--model", "gpt-small", "--cluster", str(tmp_path / "bad.json"), *common),
        "no_device": (
            "--model",
            "gpt-small",
            "--cluster",
            str(tmp_path / "nodevice.json"),
            *common,
        ),
        "unknown_model": ("--model", "gpt-huge", "--cluster", "h100-sxm", *common),
        "no_model": ("--cluster", "h100-sxm", *common),
        # gpt-small on 128 devices: tp ≤ 4 (12 heads), pp ≤ 8 (≤ 12 layers, dividing 128) and
        # cp ≤ 2 (the default space) leave dp ≥ 2, so no layout splits a global batch of 1.
        "unsplittable": (
            "--model",
            "gpt-small",
            "--cluster",
            "h100-sxm",
            "--nodes",
            "16",
            "--global-batch",
            "1",
            "--seq-len",
            "256",
        ),
    }[case]
    code, out, err = _run(capsys, *argv)
    assert code == 2 and not out
    assert len(err.splitlines()) == 1 and err.startswith("autotune: error: ")
    assert message in err and "Traceback" not in err


def test_nothing_fits_is_a_runtime_error_naming_the_smallest_peak(capsys):
    code, out, err = _run(
        capsys,
        "--model",
        "gpt-small",
        "--cluster",
        "h100-sxm",
        "--global-batch",
        "16",
        "--seq-len",
        "256",
        "--memory-limit",
        "0.1",
    )
    errors = [ln for ln in err.splitlines() if ln.startswith("autotune: error:")]
    assert code == 1 and not out and len(errors) == 1
    assert "smallest predicted peak" in errors[0] and "raise --memory-limit" in errors[0]


def test_an_engines_memory_judges_the_fit():
    # rank_layouts(memory_traits=...): each layout's peak is that engine's (torchtitan's here,
    # whose op-mode AC, bf16 logits and fused norms fit where autotune's runtime does not).
    from autotune.model.engine_memory import TORCHTITAN, estimate_engine_memory
    from autotune.ranking.score import rank_layouts

    base = _base("llama-7b", 8, 16, 2048)
    layouts = [c for c in enumerate_layouts(base) if c.pp_degree == 1 and c.zero_stage == 3]
    cluster = load_cluster("a100-sxm4-80gb")
    limit = 30 * GIB
    own = rank_layouts(layouts, cluster, limit_bytes=limit)
    titan = rank_layouts(layouts, cluster, limit_bytes=limit, memory_traits=TORCHTITAN)
    assert len(titan.fitting) > len(own.fitting)
    for s in titan.fitting:
        peak = estimate_engine_memory(s.config, None, TORCHTITAN).total
        assert s.peak_memory_bytes == peak and peak * 1.15 <= limit


def test_an_engines_measured_allocator_is_counted_once():
    # DeepSpeed's traits carry the allocator's reserve and the context as measured on
    # BigScience's sweep (nvidia-smi's figure): its layouts fit on their peak × (1 + margin),
    # without the device's reserve and context again (which dropped layouts that ran).
    from autotune.model.engine_memory import DEEPSPEED, estimate_engine_memory
    from autotune.ranking.score import rank_layouts

    base = _base("llama-7b", 8, 32, 4096)
    layouts = enumerate_layouts(base)
    cluster = load_cluster("a100-sxm4-80gb")
    limit = 80 * GIB
    cuda = ALLOWANCES["cuda"]
    ranked = rank_layouts(layouts, cluster, limit_bytes=limit, memory_traits=DEEPSPEED)
    peaks = {
        c: estimate_engine_memory(c, None, DEEPSPEED, device_type="cuda").total for c in layouts
    }
    once = {c for c, p in peaks.items() if p * (1 + cuda.model_margin) <= limit}
    twice = {c for c in once if cuda.required_bytes(peaks[c]) <= limit}
    assert {s.config for s in ranked.fitting} == once
    assert twice < once < set(layouts)  # the limit bites, and the old rule dropped more
    for s in ranked.fitting:
        assert s.peak_memory_bytes == peaks[s.config]


# ---- the newer knobs and the memory screen ---------------------------------------------------
@pytest.mark.parametrize("engine", ["autotune", "megatron", "torchtitan", "deepspeed"])
def test_screen_keeps_every_layout_that_fits(engine):
    # Every newer knob enumerated (SP, cp 1/2/4/8, HSDP, virtual stages): the layouts the
    # screen keeps and that fit are exactly those of the whole grid that fit, each estimated,
    # in autotune's runtime's memory and in each engine's.
    from autotune.model.engine_memory import estimate_engine_memory
    from autotune.model.engines import engine_traits
    from autotune.ranking.space import screened_layouts
    from autotune.search.screen import allowance, predicted_to_fit

    traits = engine_traits(engine).memory

    base = dataclasses.replace(_base("gpt-tiny", 8, 16, 256), precision="bf16-mixed")
    shape = base.workload.shape
    choices = {
        "sequence_parallel": (False, True),
        "cp_degree": (1, 2, 4),
        "dp_replicate": (1, 2, 4, 8),
        "virtual_stages": (2, 4),
        "compile": (False,),
        "float8": (False,),
    }
    grid = SearchSpace(base, narrowed={k: list(v) for k, v in choices.items()}).configs
    peaks = {c: estimate_engine_memory(c, None, traits, device_type="cuda").total for c in grid}
    rule = allowance("cuda", traits)
    limit = int(sorted(rule.required_bytes(p) for p in peaks.values())[len(peaks) // 3])
    fits = {c for c, p in peaks.items() if predicted_to_fit(p, limit, "cuda", traits)}
    screened = screened_layouts(
        base,
        shape,
        choices,
        tp_degrees=[1, 2, 4],
        fits=lambda b: predicted_to_fit(b, limit, "cuda", traits),
        traits=traits,
    )
    kept = set(screened.layouts)
    assert kept <= set(grid) and len(kept) == len(screened.layouts)
    assert {c for c in kept if c in fits} == fits
    assert screened.groups_dropped + screened.branches_dropped > 0 and len(kept) < len(grid)
    assert {c.cp_degree for c in fits} >= {1, 2} and any(c.sequence_parallel for c in fits)


def test_knob_flags_fix_the_listed_layouts(capsys):
    code, out, _ = _run(
        capsys,
        "--model",
        "llama-7b",
        "--cluster",
        "h100-sxm",
        "--global-batch",
        "16",
        "--seq-len",
        "4096",
        "--sp",
        "--cp",
        "2",
        "--top",
        "50",
        "--json",
    )
    assert code == 0
    layouts = [TrialConfig.from_dict(s["config"]) for s in json.loads(out)["layouts"]]
    assert layouts and all(c.cp_degree == 2 for c in layouts)
    assert all(c.sequence_parallel == (c.tp_degree > 1) for c in layouts)
    with pytest.raises(SystemExit) as info:
        _run(
            capsys,
            "--model",
            "llama-7b",
            "--cluster",
            "h100-sxm",
            "--global-batch",
            "16",
            "--seq-len",
            "4096",
            "--cp",
            "0",
        )
    # argparse's usage error: the usage, then one line naming the flag and its rule
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.splitlines()[-1].endswith("argument --cp: must be ≥ 1, not 0")


def test_default_hsdp_replicas_follow_each_layouts_dp():
    # Shard groups of 8 and 64 ranks whatever tp, pp and cp leave as dp: a tp-8 layout on 1,024
    # GPUs (dp 128) lists 2 and 16 replicas, not world / 8 = 128 (dp_shard 1, no sharding).
    from autotune.ranking.space import _replica_counts

    assert _replica_counts(128, None) == [1, 2, 16]
    assert _replica_counts(1024, None) == [1, 16, 128]
    assert _replica_counts(8, None) == [1]
    assert _replica_counts(128, (4,)) == [4]


def test_the_peak_words_follow_the_engine_profiles_memory_part():
    # autotune's runtime (its profile's memory part, a preset like the others) states its
    # peak as allocated bytes without saying so; another engine says what its peak counts.
    from autotune.cli.rank import _peak_words
    from autotune.model.engines import engine_traits

    assert _peak_words(engine_traits("autotune").memory) == "peak"
    assert _peak_words(engine_traits("deepspeed").memory) == "peak, reserved + context"
    assert _peak_words(engine_traits("torchtitan").memory) == "peak, reserved"
    assert _peak_words(engine_traits("megatron").memory) == "peak, allocated"
