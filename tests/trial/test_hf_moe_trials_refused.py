"""A Hugging Face mixture of experts that the cost model prices (``hf_config.PRICED_MOE_TYPES``)
but the trials do not train is refused in one line where a rank builds it (``build_hf``), also
when its config arrives without the CLI's check (``autotune trial --config FILE``)."""

from __future__ import annotations

import pytest
from testkit.hf_moe import QWEN3_MOE

from autotune.config import WorkloadSpec
from autotune.errors import ConfigError

transformers = pytest.importorskip("transformers")  # the hf extra; CI installs it


def test_a_priced_moe_is_refused_where_a_rank_builds_it(tmp_path):
    from autotune.trial.models.hf import build_hf

    folder = tmp_path / "qwen3-moe"
    transformers.Qwen3MoeConfig(**QWEN3_MOE).save_pretrained(folder)
    spec = WorkloadSpec(hf_model=str(folder), seq_len=16, global_batch_size=2)
    with pytest.raises(ConfigError, match=r"mixture of experts \(\w+ 8\).*'autotune estimate'"):
        build_hf(spec)
    # The same folder made dense builds: the refusal is the experts', not the folder's.
    dense = tmp_path / "qwen3"
    transformers.Qwen3Config(
        **{k: v for k, v in QWEN3_MOE.items() if "expert" not in k and "moe" not in k}
    ).save_pretrained(dense)
    workload = build_hf(WorkloadSpec(hf_model=str(dense), seq_len=16, global_batch_size=2))
    assert sum(p.numel() for p in workload.model.parameters()) > 0
