"""The precision knob: the ZeRO paper's model states, old configs, exports, bad input, and the
master-weight optimizer and loss scale on their own (no process group).

Losses of every mechanism in mixed precision against the single-process references are in
tests/trial/parallel/test_layouts.py; measured bytes per category in
tests/trial/parallel/test_zero_sharding.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from autotune.cli.estimate import main as estimate_main
from autotune.cli.main import main as cli_main
from autotune.config import TrialConfig, WorkloadSpec
from autotune.errors import ConfigError
from autotune.export.ds_config import ds_config
from autotune.model.memory import estimate_memory
from autotune.shapes import MODEL_SHAPES
from autotune.trial.parallel.precision import (
    LossScaler,
    MasterWeightAdamW,
    check_precision_supported,
)

GB = 1e9  # the ZeRO paper's GB (decimal): 16 · 7.5e9 bytes = 120 GB


@pytest.mark.parametrize("stage, paper_gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_estimate_reproduces_zero_paper_figure_1(capsys, stage, paper_gb):
    """Rajbhandari et al. 2020, Figure 1: Φ = 7.5B, N = 64, mixed-precision Adam (K = 12):
    16Φ, 4Φ + 12Φ/N, 2Φ + 14Φ/N, 16Φ/N. Ours at ZeRO-2 is 2Φ + 16Φ/N (FSDP2's fp32 gradient
    shards), 1.7% above the figure; in GiB no stage but ZeRO-3 would be within 2%."""
    code = estimate_main(
        [
            "--params",
            "7.5e9",
            "--world-size",
            "64",
            "--zero",
            str(stage),
            "--precision",
            "16-mixed",
            "--json",
        ]
    )
    assert code == 0
    states = json.loads(capsys.readouterr().out)["per_rank"]["model_states"]
    assert states == pytest.approx(paper_gb * GB, rel=0.02)
    phi, n = 7.5e9, 64
    formula = {0: 16 * phi, 1: 4 * phi + 12 * phi / n, 2: 2 * phi + 16 * phi / n, 3: 16 * phi / n}[
        stage
    ]
    assert states == formula


def test_precision_default_and_old_configs():
    config = TrialConfig()
    assert config.precision is None
    assert config.resolved_precision("cuda") == "bf16-mixed"
    assert config.resolved_precision("cpu") == "32-true"
    # A config written before precision existed: its dtype cast the whole model.
    for dtype, precision in [
        ("float32", "32-true"),
        ("bfloat16", "bf16-true"),
        ("float16", "16-true"),
    ]:
        old = TrialConfig.from_json(json.dumps({"workload": {"dtype": dtype}}))
        old.validate()
        assert old.resolved_precision("cuda") == precision == old.with_precision("cpu").precision
    resolved = TrialConfig(precision="16-mixed")
    assert TrialConfig.from_json(resolved.to_json()) == resolved


def test_bf16_mixed_is_the_cuda_default_in_the_memory_model():
    # GPT-2 small on one GPU, ZeRO-0: 2Φ bf16 parameters, 2Φ bf16 gradients, 12Φ of fp32 master
    # copy and moments (the paper's 16Φ), plus AdamW's 4-byte step per tensor.
    config = TrialConfig(
        world_size=1, workload=WorkloadSpec(size="small", seq_len=128, global_batch_size=1)
    )
    est = estimate_memory(config, device_type="cuda")
    assert est == estimate_memory(
        TrialConfig(**{**_fields(config), "precision": "bf16-mixed"}), device_type="cuda"
    )
    phi = MODEL_SHAPES[("gpt", "small")].num_params()
    tensors = 2 + 12 * 10 + 2 + 1
    assert (est.parameters, est.gradients) == (2 * phi, 2 * phi)
    assert est.optimizer_state == 12 * phi + 4 * tensors
    fp32 = estimate_memory(config, device_type="cpu")  # 32-true on CPU
    assert fp32.model_states == est.model_states  # 16Φ either way, split differently


def _fields(config: TrialConfig) -> dict:
    return {f: getattr(config, f) for f in config.__slots__}


@pytest.mark.parametrize(
    "precision, bf16, fp16",
    [
        ("32-true", False, False),
        ("bf16-mixed", True, False),
        ("16-mixed", False, True),
        ("bf16-true", True, False),
    ],
)
def test_ds_config_precision_sections(precision, bf16, fp16):
    ds = ds_config(TrialConfig(precision=precision))
    assert ds["bf16"]["enabled"] is bf16 and ds["fp16"]["enabled"] is fp16
    element = 4 if precision == "32-true" else 2
    assert ds["zero_optimization"]["reduce_bucket_size"] == 25 * 2**20 // element
    if precision == "16-mixed":
        assert ds["fp16"]["loss_scale"] == 0  # DeepSpeed's dynamic loss scale
    notes = " ".join(ds.get("autotune_notes", []))
    assert ("no DeepSpeed equivalent" in notes) is (precision == "bf16-true")


# ---- bad input: one line, exit 2 ------------------------------------------------------------
def test_unknown_precision_is_one_line(capsys, tmp_path):
    assert estimate_main(["--params", "1e9", "--precision", "fp8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown precision 'fp8'" in err and "bf16-mixed" in err
    config = tmp_path / "c.json"
    config.write_text('{"precision": "fp8"}')
    assert cli_main(["trial", "--config", str(config), "--db", "none"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'precision' must be" in err and "Traceback" not in err


def test_dtype_and_precision_that_disagree_are_refused():
    config = TrialConfig(precision="bf16-mixed", workload=WorkloadSpec(dtype="bfloat16"))
    with pytest.raises(ConfigError, match="conflicts with precision bf16-mixed; drop the dtype"):
        config.validate()


def test_bf16_on_a_gpu_without_it_is_refused():
    """Compute capability < 8.0 (V100, T4) has no bfloat16: refused by name with the fix.
    No GPU here, so the device's capability is passed in (the runner reads torch's)."""
    v100 = dict(bf16_supported=False, device_name="Tesla V100-SXM2-16GB")
    for precision in ("bf16-mixed", "bf16-true"):
        with pytest.raises(ConfigError, match="needs a GPU with bfloat16.*use 16-mixed") as e:
            check_precision_supported(precision, "cuda", **v100)
        assert "\n" not in str(e.value)
    check_precision_supported("16-mixed", "cuda", **v100)  # fp16 runs on every CUDA GPU
    # torch 2.13 runs bf16 and fp16 on any CPU (emulated without AVX512-BF16/AMX): no refusal.
    for precision in ("bf16-mixed", "16-mixed"):
        check_precision_supported(precision, "cpu", bf16_supported=False, device_name="cpu")


# ---- the mechanisms on their own ----------------------------------------------------------
def test_master_weight_adamw_is_torch_adamw_on_the_fp32_copy():
    torch.manual_seed(0)
    init = [torch.randn(8, 4) * 0.02, torch.ones(4)]
    params = [torch.nn.Parameter(t.to(torch.bfloat16)) for t in init]
    masters = [torch.nn.Parameter(p.detach().float()) for p in params]
    ours = MasterWeightAdamW(params, lr=1e-4, weight_decay=0.1)
    theirs = torch.optim.AdamW(masters, lr=1e-4, weight_decay=0.1)
    for _ in range(3):
        grads = [torch.randn_like(t).to(torch.bfloat16) for t in init]
        for p, m, g in zip(params, masters, grads):
            p.grad, m.grad = g, g.float()
        ours.step()
        theirs.step()
        for p, m in zip(params, masters):
            assert torch.equal(ours.state[p]["master"], m.detach())
            assert torch.equal(p.detach(), m.detach().to(torch.bfloat16))
    # The ones (norm weights) moved by about 3e-4 in fp32, less than half bf16's spacing below
    # 1 (2⁻⁸): the master copy keeps the updates a bf16 parameter alone would round away.
    assert not torch.equal(ours.state[params[1]]["master"], init[1])
    assert torch.equal(params[1].detach().float(), init[1])


def test_loss_scaler_skips_overflow_and_unscales():
    scaler = LossScaler(init_scale=8.0, growth_interval=2)
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float16))
    p.grad = torch.tensor([8.0, 16.0, float("inf")], dtype=torch.float16)
    assert not scaler.unscale_and_check([p], torch.device("cpu"))
    assert scaler.scale == 4.0 and scaler.num_skipped == 1
    for _ in range(2):
        p.grad = torch.tensor([8.0, 16.0, 4.0], dtype=torch.float16)
        assert scaler.unscale_and_check([p], torch.device("cpu"))
        assert p.grad.tolist() == [2.0, 4.0, 1.0]  # divided by the scale, 4
    assert scaler.scale == 8.0  # doubled after growth_interval clean steps
