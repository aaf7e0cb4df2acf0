"""Whether a rank's exception means it ran out of memory.

A CUDA out-of-memory error reaches Python under many types: the caching allocator raises
``torch.OutOfMemoryError``, but an allocation that fails inside NCCL, cuBLAS or a CUDA runtime
call surfaces as ``DistBackendError``, ``torch.AcceleratorError`` or a plain ``RuntimeError``
whose message carries the cause. So the type name is not enough: the message text (and that of
every exception it was raised from) is matched against ``OOM_PATTERNS``.

Imports nothing beyond the standard library, so the driver can classify without torch.
"""

from __future__ import annotations

import re

OOM_TYPE_NAMES = frozenset({"OutOfMemoryError", "MemoryError"})
"""``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError`` is the same class; c10 raises it
for the CUDA caching allocator and for ``DefaultCPUAllocator: not enough memory``) and Python's
own ``MemoryError``."""

OOM_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), source)
    for pattern, source in (
        (
            r"\b(CUDA|HIP) out of memory\b",
            "c10/cuda/CUDACachingAllocator.cpp: 'CUDA out of memory. Tried to allocate …' "
            "(hipified 'HIP out of memory' on ROCm); re-raised as RuntimeError by wrappers",
        ),
        (
            r"\b(CUDA|HIP) error: out of memory\b",
            "c10/cuda/CUDAException.cpp c10_cuda_check_implementation: 'CUDA error: ' + "
            "cudaGetErrorString(cudaErrorMemoryAllocation), which is 'out of memory' (CUDA "
            "Runtime API, enum cudaError); raised as torch.AcceleratorError, or as "
            "DistBackendError from ProcessGroupNCCL's work",
        ),
        (
            r"\bCUDA driver error: out of memory\b|\bCUDA_ERROR_OUT_OF_MEMORY\b",
            "c10/cuda/driver_api.h C10_CUDA_DRIVER_CHECK: 'CUDA driver error: ' + "
            "cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY) (CUDA Driver API, enum CUresult)",
        ),
        (
            r"\bcudaErrorMemoryAllocation\b|\bhipErrorOutOfMemory\b",
            "the runtime's error name (cudaGetErrorName / hipGetErrorName), as NCCL/RCCL, "
            "Triton and CUDA-graph messages print it",
        ),
        (
            r"\b(CUBLAS|CUSOLVER|CUSPARSE|CUDNN)_STATUS_ALLOC_FAILED\b",
            "cuBLAS/cuBLASLt, cuSOLVER, cuSPARSE and cuDNN status 'resource allocation failed', "
            "e.g. aten/src/ATen/cuda/CUDABlas.cpp TORCH_CUDABLAS_CHECK: 'CUDA error: "
            "CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`'",
        ),
        (
            r"\bFailed to CUDA calloc\b",
            'NCCL src/include/alloc.h ncclCudaCallocDebug: WARN("Failed to CUDA calloc %ld '
            "bytes\") (also '… calloc async'), carried into the exception by torch/csrc/"
            "distributed/c10d/NCCLUtils.cpp getNcclErrorDetailStr ('Last error:\\n' + "
            "ncclGetLastError())",
        ),
        (
            r"\bCuda failure (\d+ )?'out of memory'",
            "NCCL src/include/checks.h CUDACHECK: WARN(\"Cuda failure '%s'\", "
            "cudaGetErrorString(err)) (newer NCCL: \"Cuda failure %d '%s'\"), returned as "
            "ncclUnhandledCudaError with that text as its last error",
        ),
        (
            r"\bncclSystemError\b[\s\S]*\bout of memory\b",
            "NCCLUtils.cpp getNcclErrorDetailStr: 'ncclSystemError: System call (e.g. socket, "
            "malloc) or external library call failed or device error', whose last error names "
            "the cause",
        ),
    )
)
"""(pattern, where the text comes from) for each message that means an allocation failed."""


def oom_pattern(message: str) -> str | None:
    """The source of the first ``OOM_PATTERNS`` entry that ``message`` matches, else None."""
    for pattern, source in OOM_PATTERNS:
        if pattern.search(message):
            return source
    return None


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error``, or any exception it was raised from or during, is an allocation
    failure: by its type name or by its message (``OOM_PATTERNS``)."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if type(e).__name__ in OOM_TYPE_NAMES or isinstance(e, MemoryError):
            return True
        if oom_pattern(str(e)) is not None:
            return True
        # What Python prints above it: the cause, else the exception being handled.
        e = e.__cause__ if e.__suppress_context__ else e.__context__
    return False
