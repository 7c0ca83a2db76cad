"""Numba infrastructure of fastspec: compilation options and caching (:mod:`.jit`), LLVM intrinsics
(:mod:`.intrinsics`), a vectorizable exp (:mod:`.fastexp`), fixed-order sums (:mod:`.lanes`) and the
counter-based random streams (:mod:`.rng`).  Nothing here is public API."""
