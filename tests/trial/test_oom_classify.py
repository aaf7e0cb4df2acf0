"""A rank out of memory is told apart by its exception's type or text, wherever it was raised.

Each text below is shaped as the library that raises it writes it (the source is named in
``autotune.trial.oom.OOM_PATTERNS``); each must make the trial infeasible (``FailureKind.OOM``),
and the errors that only look alike must not.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from autotune.status import FailureKind
from autotune.trial.executor import _failure_kind, first_failure, keeps_group

NCCL_HEAD = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, "
    "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.5\n"
    "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
)

OOM_ERRORS = {
    "caching allocator": torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.72 "
        "GiB of which 1.06 GiB is free."
    ),
    "allocator text re-raised": RuntimeError(
        "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 3; 79.15 GiB total capacity)"
    ),
    "runtime call": RuntimeError(
        "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at "
        "some other API call, so the stacktrace below might be incorrect."
    ),
    "runtime call in NCCL's work": dist.DistBackendError(
        "CUDA error: out of memory\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side "
        "assertions.\nException raised from c10_cuda_check_implementation"
    ),
    "NCCL calloc": dist.DistBackendError(NCCL_HEAD + "Failed to CUDA calloc 536870912 bytes"),
    "NCCL calloc async": dist.DistBackendError(
        NCCL_HEAD + "Failed to CUDA calloc async 2432 bytes"
    ),
    "NCCL CUDACHECK": dist.DistBackendError(NCCL_HEAD + "Cuda failure 'out of memory'"),
    "NCCL CUDACHECK numbered": dist.DistBackendError(NCCL_HEAD + "Cuda failure 2 'out of memory'"),
    "NCCL system error": dist.DistBackendError(
        "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error, NCCL version "
        "2.21.5\nncclSystemError: System call (e.g. socket, malloc) or external library call "
        "failed or device error. \nLast error:\nCuda failure 'out of memory'"
    ),
    "cuBLAS handle": RuntimeError(
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    ),
    "cuDNN": RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    "error name": RuntimeError("CUDA graph capture failed: cudaErrorMemoryAllocation"),
    "driver API": RuntimeError("CUDA driver error: out of memory"),
    "ROCm": RuntimeError("HIP out of memory. Tried to allocate 1.00 GiB"),
    "CPU allocator": torch.OutOfMemoryError(
        "[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: not enough memory: you tried "
        "to allocate 8589934592 bytes."
    ),
    "Python": MemoryError(),
}

OTHER_ERRORS = {
    "illegal access": RuntimeError("CUDA error: an illegal memory access was encountered"),
    "remote peer gone": dist.DistBackendError(
        "NCCL error in: ProcessGroupNCCL.cpp:3356, remote process exited or there was a network "
        "error, NCCL version 2.27.5\nncclRemoteError: A call failed possibly due to a network "
        "error or a remote process exiting prematurely.\nLast error:\nsocketProgress: "
        "Connection closed by remote peer"
    ),
    "NCCL system error, not memory": dist.DistBackendError(
        "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error, NCCL version 2.21.5"
        "\nncclSystemError: System call (e.g. socket, malloc) or external library call failed "
        "or device error. \nLast error:\nsocketStartConnect: Connect to 10.0.0.2<45839> failed "
        ": Software caused connection abort"
    ),
    "cuBLAS execution": RuntimeError(
        "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, ...)`"
    ),
    "a rank's own error": RuntimeError("injected failure (micro-batch 2)"),
}


@pytest.mark.parametrize("name", OOM_ERRORS)
def test_out_of_memory_texts(name):
    assert _failure_kind(OOM_ERRORS[name]) == FailureKind.OOM


@pytest.mark.parametrize("name", OTHER_ERRORS)
def test_other_errors_are_not_out_of_memory(name):
    assert _failure_kind(OTHER_ERRORS[name]) == FailureKind.ERROR


def test_an_oom_beneath_another_error():
    """The outermost exception is not always the cause: an OOM it was raised from counts."""
    try:
        try:
            raise OOM_ERRORS["NCCL calloc"]
        except dist.DistBackendError as e:
            raise RuntimeError("all_reduce failed on the tp group") from e
    except RuntimeError as outer:
        assert _failure_kind(outer) == FailureKind.OOM
    try:
        try:
            raise OOM_ERRORS["runtime call"]
        except RuntimeError:
            raise ValueError("unrelated") from None  # the cause is suppressed: not an OOM
    except ValueError as outer:
        assert _failure_kind(outer) == FailureKind.ERROR


def _outcome(error: BaseException | None, *, setup: bool = False, type_: str | None = None):
    if error is None:
        return {"ok": True}
    return {
        "ok": False,
        "type": type_ or type(error).__name__,
        "message": str(error),
        "setup": setup,
        "kind": _failure_kind(error),
        "traceback": "",
    }


def test_the_oom_rank_is_reported_and_the_group_rebuilt():
    """Rank 1 runs out of memory inside NCCL; rank 0 sees its peer's collective fail and rank
    2 is aborted: the trial reports rank 1's OOM, and the group is rebuilt."""
    outcomes = [
        _outcome(OTHER_ERRORS["remote peer gone"]),
        _outcome(OOM_ERRORS["NCCL calloc"]),
        _outcome(RuntimeError("aborted after another rank failed"), type_="Aborted"),
    ]
    rank, first = first_failure(outcomes)
    assert (rank, first["kind"]) == (1, FailureKind.OOM)
    assert not keeps_group(outcomes)
    # Every rank out of memory alike (data parallelism loads all ranks the same): rebuilt too.
    assert not keeps_group([_outcome(OOM_ERRORS["caching allocator"])] * 2)


def test_the_group_is_kept_only_after_setup_errors_on_every_rank():
    from autotune.errors import ConfigError

    refused = ConfigError("tp_degree 3 does not divide 8 heads")
    assert keeps_group([_outcome(refused, setup=True)] * 2)
    assert not keeps_group([_outcome(refused, setup=True), _outcome(None)])
    assert first_failure([_outcome(None)] * 2) is None
