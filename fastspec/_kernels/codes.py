"""The integer codes and sentinels the kernels share with their callers, named in one place.

Numba reads module-level integer globals as compile-time constants, so a kernel that writes ``PAD`` or tests
``mode == DETERMINISTIC`` compiles to the same code as one that writes the literal.  Column indices of a
kernel's own output arrays (e.g. :data:`fastspec._kernels.replay.N_DP`) stay next to the kernel that fills them.
"""
from __future__ import annotations

# --------------------------------------------------------------------------------------------- sentinels
PAD = -1
"""No token: token slots beyond the emitted tokens, a sampler that found no token (every weight 0)."""
NONE = -1
"""No index: no bad row, no block or in-block index with weight, an absent tree link (first child / next
sibling), no rejected position (yet)."""
NO_EXCLUDED = -1
"""The sampler's ``excl`` argument when no token is excluded from its distribution."""

# --------------------------------------------------------------------------------------------- row status
# what fastspec._kernels.rows.status returns for a row's max
ROW_OK = 0
ROW_NAN = 1
ROW_POSINF = 2
ROW_NO_FINITE = 3
DRAFT_STATUS = ROW_NO_FINITE
"""alpha_row's status: ROW_OK, a bad target row's status (1-3), or DRAFT_STATUS + a bad draft row's (4-6)."""

# --------------------------------------------------------------------------------------------- verification
# columns of the per-row stats array [B, N_STATS] of the token and block kernels
ACCEPTED = 0  # accepted drafts
UNDERFLOWS = 1  # 1 when the residual summed to 0 (p ~= q) and the recovered token came from p
BAD_DRAFT = 2  # 1 + the first drafted position whose token has draft probability 0 (0: none)
BAD_VALUES = 3  # 0, or which array has a NaN/+inf/all -inf row: TARGET_ROWS or DRAFT_ROWS
N_STATS = 4
# values of stats[BAD_VALUES]
TARGET_ROWS = 1
DRAFT_ROWS = 2

# --------------------------------------------------------------------------------------------- token trees
# candidate-sampling modes: the order of fastspec.methods.CANDIDATE_SAMPLING
IID = 0
WITHOUT_REPLACEMENT = 1
DETERMINISTIC = 2
CANDIDATE_CODES = {"iid": IID, "without_replacement": WITHOUT_REPLACEMENT, "deterministic": DETERMINISTIC}
"""fastspec.methods.CANDIDATE_SAMPLING name -> the tree kernels' mode."""
# tree-check codes
TREE_OK = 0
OUT_OF_RANGE = 1
REACHED_TWICE = 2
UNREACHABLE = 3

# --------------------------------------------------------------------------------------------- draft-length rules
# the stop rule of fastspec._kernels.policy (policy_dp / policy_mc)
RULE_FIXED = 0  # never stops: the cap decides
RULE_THRESHOLD = 1  # continue iff the confidence >= theta (Hugging Face's assistant_confidence_threshold)
RULE_SPECDEC = 2  # SpecDec++: continue iff 1 - prod(confidence) < h
