"""The address-space limit (``ulimit -v``, RLIMIT_AS) and what a run needs under it.

Under such a limit native code that fastspec cannot catch fails when the limit is reached: LLVM aborts while it
compiles or loads the kernels (``std::bad_alloc``, "LLVM ERROR: out of memory": rc 134), OpenBLAS spins forever or
exits when its start-up buffers or threads do not fit, libgomp exits when a worker thread cannot start.  So, when a
limit is set, importing this module keeps the BLAS thread pools from starting (fastspec never calls BLAS; it must be
imported before numpy), and :func:`address_space_shortfall` says, before any work, when a limit leaves less than a
run needs.
"""
from __future__ import annotations

import os

MIB = 1 << 20
#: address space a run needs beyond what start-up has mapped, besides a stack per worker thread: LLVM compiling
#: (or loading) the kernels, scipy's BLAS start-up buffer, a chunk of rows.  Measured with a cold kernel cache
#: (fastspec simulate/inspect data/smollm2_exit_top64.npz, 2 CPUs, OpenBLAS on one thread): runs aborted in LLVM
#: with up to 140 MiB left after start-up and all passed from 154 MiB; this keeps a margin above that.
RUN_RESERVE = 224 * MIB


def address_space_limit() -> int | None:
    """The soft address-space limit (``ulimit -v``, RLIMIT_AS) in bytes; None when there is none."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if soft == resource.RLIM_INFINITY else soft


if address_space_limit() is not None:
    # numpy's and scipy's OpenBLAS each start a thread per CPU, with a 32 MiB buffer each, when they load: room a
    # limit cannot spare, and OpenBLAS exits or spins when it does not get it.  Before numpy is imported (the
    # command modules below); an explicit setting wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _mapped_bytes() -> int | None:
    """The address space this process has mapped now (VmSize; Linux), else None."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def run_reserve() -> int:
    """:data:`RUN_RESERVE` plus a stack for each worker thread a run may start (Numba's pool, the CRC-32 pool)."""
    import resource

    import numba

    from fastspec.io.crc import MAX_THREADS
    from fastspec.machine import available_cpus

    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    stack = stack if stack != resource.RLIM_INFINITY and 0 < stack <= 64 * MIB else 8 * MIB
    return RUN_RESERVE + stack * (numba.config.NUMBA_NUM_THREADS + min(available_cpus(), MAX_THREADS) + 1)


def address_space_shortfall() -> str | None:
    """Why the address-space limit is too small for a run, or None (no limit, or room enough)."""
    limit, used = address_space_limit(), _mapped_bytes()
    if limit is None or used is None:
        return None
    need = used + run_reserve()
    if limit >= need:
        return None
    return (f"the address-space limit (ulimit -v) of {limit // MIB} MiB is too small: start-up has mapped "
            f"{used // MIB} MiB and a run needs about {(need - used) // MIB} MiB more (compiling or loading the "
            f"kernels, their threads, a chunk of rows); raise the limit to at least {-(-need // MIB)} MiB")
