"""Prompt-lookup (n-gram) kernels: the longest earlier match of a context's end and the proposals along a
recorded sequence.  The rules, the validation and the public API are in :mod:`fastspec.ngram`."""
from __future__ import annotations

from .._numba.jit import kernel
from .codes import NONE


@kernel
def match(ctx, L, min_n, max_n, latest):
    """(s + n, n) for the chosen occurrence in ctx[:L] (see :mod:`fastspec.ngram`), or (NONE, 0) when none.

    e runs over the last index of a candidate occurrence, e <= L - 2; m is how many tokens ending at e agree
    with the tokens ending at L - 1 (at most max_n).  Only a strictly longer m replaces the best, so the first e
    in scan order reaching the final length wins: the latest scanning down, the earliest scanning up."""
    best_n = min_n - 1
    best_end = NONE
    for i in range(L - 1):
        e = L - 2 - i if latest else i
        cap = min(max_n, e + 1)
        if cap <= best_n:
            if latest:
                break  # every later e is shorter still
            continue
        m = 0
        while m < cap and ctx[e - m] == ctx[L - 1 - m]:
            m += 1
        if m > best_n:
            best_n = m
            best_end = e
            if m == max_n:
                break
    if best_end < 0:
        return NONE, 0
    return best_end + 1, best_n


@kernel
def along(tokens, prompt_len, k, min_n, max_n, latest, drafts, num_draft, num_matching):
    """The proposal at every generated position t of tokens (context ``tokens[:prompt_len + t]``): its tokens into
    drafts[t] (left as they are beyond num_draft[t]), their count and how many lead the recorded continuation."""
    N = tokens.shape[0]
    for t in range(N - prompt_len):
        L = prompt_len + t
        start, _ = match(tokens, L, min_n, max_n, latest)
        d = 0 if start < 0 else min(k, L - start)
        m = 0
        for j in range(d):
            drafts[t, j] = tokens[start + j]
            if m == j and L + j < N and tokens[L + j] == tokens[start + j]:
                m += 1
        num_draft[t] = d
        num_matching[t] = m
