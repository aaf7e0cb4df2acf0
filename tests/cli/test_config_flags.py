"""Flags derived from the config dataclasses (``cli/config_flags.py``): help from the field's
docstring, type and choices from its annotation, and what the command line set."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from autotune.cli.config_flags import FLAGS, add_flags, field_docs, given
from autotune.config import TrialConfig, WorkloadSpec


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t", exit_on_error=False)
    add_flags(p, *FLAGS)
    return p


def test_every_flag_names_a_field_with_a_docstring():
    for flag, (cls, name) in FLAGS.items():
        assert name in {f.name for f in dataclasses.fields(cls)}, flag
        assert field_docs(cls)[name], flag


def test_help_is_the_fields_docstring():
    actions = {a.option_strings[0]: a for a in _parser()._actions if a.option_strings}
    # The texts under the fields in config.py, copied here.
    assert actions["--tp"].help == "Tensor-parallel degree; divides the attention heads."
    assert actions["--seq-len"].help == "Tokens per sequence."
    assert actions["--zero"].choices == (0, 1, 2, 3)
    assert actions["--schedule"].choices == ("gpipe", "1f1b", "interleaved_1f1b")


def test_values_are_checked_and_only_given_ones_are_returned():
    p = _parser()
    args = p.parse_args(["--tp", "2", "--sp", "--zero", "3", "--global-batch", "16"])
    assert given(args, TrialConfig) == {"tp_degree": 2, "zero_stage": 3, "sequence_parallel": True}
    assert given(args, WorkloadSpec) == {"global_batch_size": 16}
    for bad in (["--tp", "0"], ["--zero", "4"], ["--bucket-mb", "-1"], ["--cp", "two"]):
        with pytest.raises((argparse.ArgumentError, SystemExit)):
            p.parse_args(bad)
