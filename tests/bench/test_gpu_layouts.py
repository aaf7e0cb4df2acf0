"""bench/gpu_layouts.py (the GPU check's multi-GPU layouts) and the stage plumbing it adds to
bench/gpu_check.py: its row judges on made-up figures, its plan for 2, 4 and 8 GPUs, the
``--max-minutes`` guard (SKIP, never PASS), and the dry run of the plan on CPU (gloo, world 2,
GPT-tiny) through the session's executor: the same config building, trial runner, reference
losses, model comparisons and table a GPU run goes through.

The p2p spans below are shaped as ``profiler/capture.py`` gives a pipeline's transfers: kind
'p2p', name 'send' or 'recv' (NCCL's ``SendRecv`` kernel takes its direction from its
record), group 'pp', the payload of the record."""

from __future__ import annotations

import math
import time

import gpu_check  # noqa: E402
import gpu_dashboard  # noqa: E402
import gpu_layouts as gl  # noqa: E402
import pytest
from gpu_table import Check, Status  # noqa: E402

from profiler import Span  # noqa: E402

REFERENCE = [6.2489, 6.2448, 6.2411, 6.2379]


# ---- losses against the reference -------------------------------------------------------------
def test_losses_pass_at_the_reference_and_fail_with_one_planted_wrong_loss():
    atol = gl.LOSS_ATOL
    same = gl.loss_check("w2 dp", list(REFERENCE), REFERENCE)
    assert same.status is Status.PASS and same.name == "w2 dp losses"
    noisy = [x + 0.9 * atol * (-1) ** i for i, x in enumerate(REFERENCE)]
    assert gl.loss_check("w2 dp", noisy, REFERENCE).status is Status.PASS
    for step in range(len(REFERENCE)):
        wrong = list(REFERENCE)
        wrong[step] += 1.1 * atol  # one step just past the tolerance
        check = gl.loss_check("w2 dp", wrong, REFERENCE)
        assert check.failed, (step, check)
        assert f"at step {step}" in check.measured
    # a skipped gradient sync: the same first loss, then 1e-3 off (test_layouts' control)
    drift = [REFERENCE[0]] + [x + 1e-3 for x in REFERENCE[1:]]
    assert gl.loss_check("w2 dp", drift, REFERENCE).failed
    assert gl.loss_check("w2 dp", REFERENCE[:-1], REFERENCE).failed  # a step missing
    assert gl.loss_check("w2 dp", REFERENCE + [6.23], REFERENCE).failed  # one too many
    assert gl.loss_check("w2 dp", [math.nan] + REFERENCE[1:], REFERENCE).failed
    assert gl.loss_check("w2 dp", [], REFERENCE).failed


# ---- memory ratio bands ------------------------------------------------------------------------
def test_memory_peak_band_per_rank_against_its_own_pipeline_stage():
    mib = 2**20
    predicted = [1000 * mib, 600 * mib]  # pp rank 0 holds the embedding: more than rank 1
    inside = {0: (0, 1240 * mib), 1: (1, 460 * mib)}  # +24%, -23.3%
    check = gl.memory_check("w2 pp", inside, predicted)
    assert check.status is Status.PASS, check
    assert "2 ranks" in check.measured and "rank 0" in check.measured
    for peak, ok in ((1260, False), (740, False), (760, True), (1249, True)):
        check = gl.memory_check("w2 dp", {0: (0, peak * mib), 1: (0, 1000 * mib)}, predicted)
        assert (check.status is Status.PASS) is ok, (peak, check)
    # rank 1 is judged against stage 1's figure: 600 MiB there is right, though it is 40% under
    # stage 0's
    assert gl.memory_check("w2 pp", {0: (0, 1000 * mib), 1: (1, 600 * mib)}, predicted).status is (
        Status.PASS
    )
    wrong_stage = gl.memory_check("w2 pp", {0: (0, 1000 * mib), 1: (1, 1000 * mib)}, predicted)
    assert (
        wrong_stage.failed and "rank 1" in wrong_stage.measured and "1.67" in wrong_stage.measured
    )
    assert gl.memory_check("w2 dp", {}, predicted).failed
    assert gl.PEAK_BAND == gpu_check.TOLERANCES["peak"]  # the existing rows' band


# ---- pipeline send/recv bytes ------------------------------------------------------------------
def _pipeline(pp: int, schedule: str, world: int | None = None):
    layout = gl._layout("pp", world or pp, pp_degree=pp, pp_schedule=schedule)
    return gl.CPU_SCALE.config(layout)


def _boundary_crossings(pp: int, v: int, microbatches: int) -> dict[int, tuple[int, int]]:
    """(sends, receives) per pipeline rank per step, counted by walking the chunks: chunk c of
    the pp · v lives on rank c mod pp; each micro-batch goes forward from chunk c to c + 1 and
    its gradient back from c + 1 to c."""
    sends = dict.fromkeys(range(pp), 0)
    recvs = dict.fromkeys(range(pp), 0)
    for c in range(pp * v - 1):
        here, there = c % pp, (c + 1) % pp
        sends[here] += microbatches  # activations forward
        recvs[there] += microbatches
        sends[there] += microbatches  # their gradients backward
        recvs[here] += microbatches
    return {r: (sends[r], recvs[r]) for r in range(pp)}


def test_expected_p2p_bytes_are_the_activations_of_every_boundary_crossing():
    # GPT-tiny: hidden 64, seq 64; global batch 8 at pp 2: 4 micro-batches of 2; fp32
    boundary = 2 * 64 * 64 * 4
    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)):
        config = _pipeline(2, schedule)
        assert config.grad_accum_steps == 4 and config.micro_batch_size == 2
        crossings = _boundary_crossings(2, v, 4)
        for rank in (0, 1):
            sends, recvs = crossings[rank]
            assert sends == recvs
            assert gl.expected_p2p_bytes(config, rank, "cpu") == sends * boundary, (schedule, rank)
    assert gl.expected_p2p_bytes(_pipeline(2, "1f1b"), 0, "cpu") == 131_072  # measured on gloo
    assert gl.expected_p2p_bytes(_pipeline(2, "interleaved_1f1b"), 0, "cpu") == 393_216
    # pp 4: the middle ranks send both ways; the ends one way
    config = _pipeline(4, "1f1b")
    mb = config.micro_batch_size
    crossings = _boundary_crossings(4, 1, config.grad_accum_steps)
    for rank in range(4):
        want = crossings[rank][0] * mb * 64 * 64 * 4
        assert gl.expected_p2p_bytes(config, rank, "cpu") == want
    # on CUDA under bf16-mixed the activations are bf16: half the bytes
    bf16 = config.__class__(**{**_fields(config), "precision": "bf16-mixed"})
    assert gl.expected_p2p_bytes(bf16, 1, "cuda") * 2 == gl.expected_p2p_bytes(config, 1, "cpu")
    with pytest.raises(ValueError, match="pipelines"):
        gl.expected_p2p_bytes(gl.CPU_SCALE.config(gl._layout("dp", 2)), 0)


def _fields(config) -> dict:
    import dataclasses

    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def _p2p_spans(rank: int, sends: list[int], recvs: list[int], steps=(3,)) -> list[Span]:
    spans = []
    for step in steps:
        spans.append(Span(rank, step, "step", "step", "", 1_000_000 * step, 900_000))
        t = 1_000_000 * step + 1_000
        for name, sizes in (("send", sends), ("recv", recvs)):
            for size in sizes:
                spans.append(Span(rank, step, "p2p", name, "", t, 500, bytes=size, group="pp"))
                t += 1_000
    return spans


def test_send_recv_rows_pass_at_the_activation_bytes_and_fail_when_mislabelled():
    config = _pipeline(2, "interleaved_1f1b")
    want = gl.expected_p2p_bytes(config, 0, "cpu")
    each = [want // 12] * 12  # 12 transfers of one micro-batch's activations each way
    assert sum(each) == want

    def judged(rank0, rank1):
        return gl.p2p_check("w2 pp", config, [(0, rank0), (1, rank1)], "cpu")

    right = judged(_p2p_spans(0, each, each, (3, 4)), _p2p_spans(1, each, each, (3, 4)))
    assert right.status is Status.PASS, right
    assert "+0.0%" in right.measured and "2 ranks" in right.measured
    # every SendRecv kernel labelled 'send' (its direction lost): recv reads 0, send twice
    lost = _p2p_spans(0, each + each, [])
    assert judged(lost, _p2p_spans(1, each, each)).failed
    # a transfer per micro-batch missing (one chunk's boundary not counted)
    assert judged(_p2p_spans(0, each[:-4], each), _p2p_spans(1, each, each)).failed
    # payload in bf16 where the activations are fp32
    half = [b // 2 for b in each]
    assert judged(_p2p_spans(0, half, half), _p2p_spans(1, half, half)).failed
    # within the tolerance: 1% off passes
    near = [int(b * 1.01) for b in each]
    assert judged(_p2p_spans(0, near, near), _p2p_spans(1, each, each)).status is Status.PASS
    assert gl.p2p_check("w2 pp", config, [], "cpu").failed


# ---- CUPTI detached ----------------------------------------------------------------------------
def test_cupti_row_fails_a_trial_slowed_after_a_profiled_one():
    assert gl.cupti_check("w2", 0.100, 0.105).status is Status.PASS  # noise
    assert gl.cupti_check("w2", 0.100, 0.090).status is Status.PASS  # faster is fine
    assert gl.cupti_check("w2", 0.100, 0.112).failed  # CUPTI left attached: +10-20%
    assert gl.cupti_check("w2", 0.100, 0.120).failed
    assert gl.cupti_check("w2", 0.0, 0.1).failed
    on_cpu = gl.cupti_check("w2", 0.100, 0.130, "cpu")  # no CUPTI there: a figure
    assert on_cpu.status is Status.SKIP and "+30.0%" in on_cpu.measured


# ---- the plan ----------------------------------------------------------------------------------
KINDS = {
    "dp": lambda c: c.dp_degree == c.world_size and c.zero_stage == 0 and not c.compile,
    "ZeRO-1": lambda c: c.zero_stage == 1 and c.tp_degree == 1,
    "ZeRO-2": lambda c: c.zero_stage == 2,
    "ZeRO-3": lambda c: c.zero_stage == 3 and c.dp_replicate == 1,
    "tp": lambda c: c.tp_degree > 1 and not c.sequence_parallel,
    "tp × SP": lambda c: c.sequence_parallel,
    "gpipe": lambda c: c.pp_schedule == "gpipe" and c.pp_degree > 1,
    "1f1b": lambda c: c.pp_schedule == "1f1b" and c.pp_degree > 1,
    "interleaved": lambda c: c.num_pp_stages == 2 * c.pp_degree > 2,
    "cp": lambda c: c.cp_degree > 1,
    "HSDP": lambda c: c.dp_replicate > 1,
    "compile": lambda c: c.compile,
}


def test_the_plan_covers_every_kind_at_world_2_and_grows_with_the_gpus():
    from autotune.trial.parallel.compile import check_compile

    assert gl.plan(1) == []
    for scale in (gl.GPU_SCALE, gl.CPU_SCALE):
        for n in (2, 3, 4, 8):
            for layout in gl.plan(n):
                config = scale.config(layout)
                config.validate()  # every layout runs at both scales
                check_compile(config)  # and the runner's own rules at trial start
                assert config.workload == scale.workload()  # one reference for all
                assert config.precision == "32-true"
    two = [gl.GPU_SCALE.config(layout) for layout in gl.plan(2)]
    assert {c.world_size for c in two} == {2}
    missing = [kind for kind, has in KINDS.items() if not any(has(c) for c in two)]
    assert missing == []
    assert gl.plan(3) == gl.plan(2)
    four = [gl.GPU_SCALE.config(layout) for layout in gl.plan(4) if layout.world == 4]
    assert any(c.tp_degree == 2 and c.dp_degree == 2 for c in four)
    assert any(c.dp_replicate == 2 and c.dp_shard == 2 for c in four)
    assert any(c.pp_degree == 2 and c.dp_degree == 2 for c in four)
    eight = [gl.GPU_SCALE.config(layout) for layout in gl.plan(8) if layout.world == 8]
    assert any(c.tp_degree == c.pp_degree == c.dp_degree == 2 for c in eight)
    assert [layout.world for layout in gl.plan(8)] == sorted(layout.world for layout in gl.plan(8))
    labels = [layout.label for layout in gl.plan(8)]
    assert len(labels) == len(set(labels))


def test_the_whole_check_on_8_gpus_is_estimated_under_8_minutes_and_printed_first():
    layouts = gl.plan(8)
    estimate = gl.plan_seconds(layouts, gl.GPU_SCALE)
    assert estimate + gpu_check.STAGE_SECONDS["search"] < 8 * 60
    text = gl.format_plan(layouts, gl.GPU_SCALE)
    assert f"estimated {estimate:.0f}s" in text
    assert [line.split(":")[0].strip() for line in text.splitlines()[1:]] == [
        "world 2",
        "world 4",
        "world 8",
    ]
    plan = gpu_check.format_plan(["search", "layouts"], {"search": 150, "layouts": 300}, 8)
    assert plan == "plan: search ~150s, layouts ~300s; estimated 450s of the 8-minute budget"
    seconds = {"search": 150, "layouts": 60, "rows": 130}  # 210s fit in 4 minutes, 340s do not
    over = gpu_check.format_plan(["search", "layouts", "rows"], seconds, 4)
    assert over.endswith("of the 4-minute budget; past it (SKIP if still so): rows")


# ---- the --max-minutes guard -------------------------------------------------------------------
class _NoTrials:
    """An executor that must not be asked: the guard left every trial out."""

    def run(self, config):
        raise AssertionError(f"ran {config}")


def test_what_does_not_fit_is_skip_never_pass():
    layouts = gl.world_two()[:3]
    checks = gl.run_layouts(_NoTrials(), layouts, gl.CPU_SCALE, deadline=time.monotonic())
    assert checks and {c.status for c in checks} == {Status.SKIP}
    assert [c.name for c in checks[:3]] == ["w2 dp trial", "w2 dp losses", "w2 dp memory peak"]
    assert "left of --max-minutes" in checks[0].measured
    assert checks[-1].name == "w2 after a profiled trial"
    assert gpu_check.exit_status(checks) == 0
    assert gpu_check.summary_line(checks, 0).startswith("0 passed, 0 failed")

    ran = []
    row = gpu_check._run_stage(
        "1B rows", lambda: ran.append(1), 0.0, estimate=120, deadline=time.monotonic() + 60
    )
    assert ran == [] and [c.status for c in row] == [Status.SKIP]
    assert "estimated 120s" in row[0].measured
    fits = gpu_check._run_stage(
        "x", lambda: [Check.judged("x", "", "", True)], 0.0, estimate=1, deadline=math.inf
    )
    assert [c.status for c in fits] == [Status.PASS]


def test_one_gpu_reports_the_layouts_as_one_skip_row():
    rows = gpu_check.layouts_stage([], gl.GPU_SCALE, 10, math.inf)
    assert [c.status for c in rows] == [Status.SKIP]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-minutes", "0"], "--max-minutes must be > 0"),
        (["--only", "layouts,bogus"], "unknown stage 'bogus'"),
    ],
)
def test_usage_errors_exit_2_on_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        gpu_check.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


# ---- the dashboard row -------------------------------------------------------------------------
def test_dashboard_row_wants_exit_0_and_an_html_page(tmp_path):
    page = tmp_path / "dashboard.html"
    page.write_text("<!DOCTYPE html>\n<html><body>plotly</body></html>")
    assert gpu_dashboard.dashboard_check(0, "wrote it", page).status is Status.PASS
    assert gpu_dashboard.dashboard_check(1, "autotune: no study", page).failed
    assert gpu_dashboard.dashboard_check(None, "still running", page).failed
    assert gpu_dashboard.dashboard_check(0, "", tmp_path / "missing.html").failed
    (tmp_path / "empty.html").write_text("")
    assert gpu_dashboard.dashboard_check(0, "", tmp_path / "empty.html").failed


# ---- the dry run, on CPU -----------------------------------------------------------------------
DRY_RUN = ("dp", "pp 2 interleaved v2", "cp 2")
"""The fewest world-2 layouts that take every path of a layout's rows: the gradient payload
(pure data parallelism), the send/recv bytes (a pipeline with virtual stages), and neither (cp,
whose dK/dV gradients only the losses check); the CUPTI check's two runs besides."""


@pytest.mark.slow
def test_dry_run_of_the_plan_on_cpu_passes_through_the_gpu_code_paths(executor):
    """The layouts stage as a GPU run makes it, on gloo: trial rows on cpu / gloo /
    cpu_profiler, the losses equal to tests/reference.py's, the memory model within its band,
    the payload and send/recv bytes exact, the CUPTI row measured, the table printed."""
    layouts = [layout for layout in gl.world_two() if layout.name in DRY_RUN]
    assert [layout.name for layout in layouts] == list(DRY_RUN)
    start = time.monotonic()
    checks = gl.run_layouts(
        executor, layouts, gl.CPU_SCALE, gradient_check=gpu_check.payload_check, warm_up=False
    )
    print(gpu_check.format_table(checks))
    print(f"dry run: {time.monotonic() - start:.1f}s")
    by_name = {c.name: c for c in checks}
    expected = [
        "w2 dp trial",
        "w2 dp losses",
        "w2 dp memory peak",
        "w2 dp NCCL gradient payload",
        "w2 pp 2 interleaved v2 trial",
        "w2 pp 2 interleaved v2 losses",
        "w2 pp 2 interleaved v2 memory peak",
        "w2 pp 2 interleaved v2 send/recv bytes",
        "w2 cp 2 trial",
        "w2 cp 2 losses",
        "w2 cp 2 memory peak",
        "w2 after a profiled trial",
    ]
    assert [c.name for c in checks] == expected
    judged = [c for c in checks if c.name != "w2 after a profiled trial"]
    assert [c.name for c in judged if c.status is not Status.PASS] == []
    assert "cpu, gloo, cpu_profiler" in by_name["w2 dp trial"].measured
    assert "measured/model" in by_name["w2 cp 2 trial"].measured
    # the CUPTI row compared two real runs; on CPU (no CUPTI, shared cores) a figure, SKIP
    cupti = by_name["w2 after a profiled trial"]
    assert cupti.status is Status.SKIP and "no CUPTI on cpu" in cupti.measured
    assert "ms first" in cupti.measured
