"""Command-line flags derived from the config dataclasses' fields, as torchtitan derives its
job config's: the flag's type and choices from the field's annotation, its help from the
field's docstring. ``search``, ``estimate`` and ``rank`` declare a workload or layout flag by
naming it (``FLAGS``: a knob's flag as ``knobs.KNOBS`` declares it), so a field's rule and
meaning are written once, in ``config.py``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import types
import typing
from typing import Any, Literal

from autotune.cli.args import positive_float, positive_int
from autotune.config import TrialConfig, WorkloadSpec
from autotune.knobs import FLAG_FIELDS, NEWER_KNOB_FLAGS

FLAGS: dict[str, tuple[type, str]] = {
    **{flag: (TrialConfig, name) for flag, name in FLAG_FIELDS.items()},
    "--seq-len": (WorkloadSpec, "seq_len"),
    "--global-batch": (WorkloadSpec, "global_batch_size"),
}
"""Each flag and the config field it sets: the knobs' as they are declared
(``knobs.KNOBS``), and the workload's."""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass, read from its source (the string
    statement after the annotated assignment)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for stmt, after in zip(body, body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = " ".join(after.value.value.split())
    return docs


def _hint(cls: type, name: str) -> Any:
    hint = typing.get_type_hints(cls)[name]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None: the X
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def flag_kwargs(cls: type, name: str, *, default: Any = None) -> dict[str, Any]:
    """``add_argument`` keywords for the field: positive ints and floats checked in one line,
    a Literal's values as choices, a bool as a switch; the help is the field's docstring."""
    hint = _hint(cls, name)
    kwargs: dict[str, Any] = {
        "help": field_docs(cls).get(name, ""),
        "dest": name,
        "default": default,
    }
    if hint is bool:
        return {**kwargs, "action": "store_true", "default": default or False}
    if typing.get_origin(hint) is Literal:
        values = typing.get_args(hint)
        kind = type(values[0])
        return {**kwargs, "type": kind, "choices": values}
    if hint is int:
        return {**kwargs, "type": positive_int, "metavar": "N"}
    if hint is float:
        return {**kwargs, "type": positive_float, "metavar": "X"}
    return {**kwargs, "metavar": "TEXT"}


def add_flags(
    group: argparse._ActionsContainer,
    *flags: str,
    required: bool = False,
    help_prefix: str = "",
    **defaults: Any,
) -> None:
    """Add the named ``FLAGS`` to a parser or group; ``defaults`` by field name (None: the
    flag was not given, and the config's own value stands)."""
    for flag in flags:
        cls, name = FLAGS[flag]
        kwargs = flag_kwargs(cls, name, default=defaults.get(name))
        kwargs["help"] = help_prefix + kwargs["help"]
        group.add_argument(flag, **kwargs, **({"required": True} if required else {}))


KNOB_FLAGS = NEWER_KNOB_FLAGS
"""The newer layout knobs' flags (sequence and context parallelism, HSDP, virtual stages,
partial checkpointing, compile, float8), as ``knobs.KNOBS`` marks them."""


def add_knob_args(group: argparse._ActionsContainer, *, rank: bool = False) -> None:
    """The newer knobs' flags: ``estimate`` sets them on the config; ``rank`` lists only
    layouts with the given value, and enumerates the knobs not given."""
    add_flags(group, *KNOB_FLAGS, help_prefix="list only layouts with this: " if rank else "")


def given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of ``cls`` the command line set (a flag not given is None; a switch not
    given is False and left out too)."""
    names = {name for c, name in FLAGS.values() if c is cls}
    return {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)
        if f.name in names and getattr(args, f.name, None) not in (None, False)
    }
