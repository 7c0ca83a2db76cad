"""Kernels of the draft-length policies' replay (:mod:`fastspec.simulation.policy_eval`): the exact DP over (start
position, policy state) and the Monte-Carlo replay with pre-drawn per-position draws.

Convention (as :mod:`fastspec._kernels.replay`): a step at s of a sequence of L positions drafts at most
``min(cap, L - 1 - s)``; s = L - 1 is a plain target step, not counted.  A stop rule reads the confidence of the
token just drafted; the token that triggers a stop is kept.  Drafting goes on after a draft that verification
will reject (the drafter does not know): those drafts only change the step's draft count, and the dump has no
distribution for them, so the recorded positions' statistics stand in for them (the proxy).

Policy codes (:mod:`fastspec._kernels.codes`): ``rule`` RULE_FIXED (never stops), RULE_THRESHOLD (continue iff
confidence >= theta; hf uses it), RULE_SPECDEC (SpecDec++: continue iff 1 - prod confidence < h); ``heuristic``
1: HF's +2 / -1 schedule on the cap; ``tune`` 1: HF's ROC threshold tuning (Monte-Carlo only).
"""
from __future__ import annotations

import numpy as np

from .._numba.jit import kernel
from .codes import NONE, RULE_SPECDEC, RULE_THRESHOLD

# columns of the per-sequence totals
P_STEPS, P_DRAFTED, P_ACCEPTED = range(3)
N_P = 3


@kernel
def _col(n, left, heuristic):
    """The state column of cap n at a start with ``left`` tokens to draft: min(n, left) (at least 1) under the
    heuristic schedule, column 0 otherwise."""
    return max(1, min(n, left)) if heuristic else 0


@kernel
def policy_dp(a, c, g, e, h, L, k0, heuristic, totals, hist, hist_all):
    """Exact expected counts of one sequence.  ``a[t]``: P(draft at t accepted); ``c[t]``: P(accepted and the stop
    rule continues); ``g[t]``: P(continues) (rule 1; fixed: c = a, g = 1).  ``h > 0``: SpecDec++ on a
    deterministic confidence ``e[t]`` (c and g are then computed from the running product).  ``k0``: the initial
    cap; ``heuristic``: HF's schedule on it.  Adds to totals [N_P], hist[n] (expected steps drafting n) and
    hist_all[n] (of those, all accepted).  The state n is kept as min(n, L - 1 - s): a cap at least the tokens
    left stays so (it falls by at most 1 per step while the start advances by at least 1)."""
    if L < 2:
        return
    # without the heuristic schedule the cap never changes: one state per start (column 0), O(L) memory
    W = L + 3 if heuristic else 1
    v = np.zeros((L + 1, W))
    v[0, max(1, min(k0, L - 1)) if heuristic else 0] = 1.0
    rej = np.zeros(L)
    acs = np.zeros(L)
    stop = np.zeros(L)
    reach_a = np.zeros(L + 1)   # P(draft j is made with every earlier draft accepted and continued)
    reach = np.zeros(L + 1)     # P(draft j is made)
    for s in range(L - 1):
        R = L - 1 - s
        tot = 0.0
        J = 0  # the largest cap with mass: the step's arrays are needed up to it
        if heuristic:
            for n in range(1, R + 1):
                tot += v[s, n]
                if v[s, n] != 0.0:
                    J = n
        else:
            tot = v[s, 0]
            J = min(k0, R)
        if tot == 0.0:
            continue
        m_a = 1.0
        m_r = 0.0
        prod = 1.0
        reach_a[0] = 1.0
        reach[0] = 1.0
        for j in range(J):
            t = s + j
            at = a[t]
            if h > 0.0:
                prod *= e[t]
                gj = 1.0 if 1.0 - prod < h else 0.0
                cj = at * gj
            else:
                cj = c[t]
                gj = g[t]
            rej[j] = m_a * (1.0 - at)
            acs[j] = m_a * (at - cj)
            stop[j] = acs[j] + m_a * ((1.0 - at) - (gj - cj)) + m_r * (1.0 - gj)
            m_r = m_r * gj + m_a * (gj - cj)
            m_a = m_a * cj
            reach_a[j + 1] = m_a
            reach[j + 1] = m_a + m_r
        lo, hi = (1, J) if heuristic else (J, J)
        for n in range(lo, hi + 1):
            w = v[s, n] if heuristic else v[s, 0]
            if w == 0.0:
                continue
            d = n
            totals[P_STEPS] += w
            dr = 0.0
            acc = 0.0
            for j in range(d):
                dr += reach[j]
                acc += reach_a[j] * a[s + j]
            totals[P_DRAFTED] += w * dr
            totals[P_ACCEPTED] += w * acc
            up = n + 2 if heuristic else n
            down = max(1, n - 1) if heuristic else n
            for j in range(d - 1):
                hist[j + 1] += w * stop[j]
                hist_all[j + 1] += w * acs[j]
                nxt = s + j + 1  # rejected at j
                v[nxt, _col(down, L - 1 - nxt, heuristic)] += w * rej[j]
                nxt = s + j + 2  # every draft accepted, stopped after j
                v[nxt, _col(up, L - 1 - nxt, heuristic)] += w * acs[j]
            hist[d] += w * reach[d - 1]
            all_d = acs[d - 1] + reach_a[d]
            hist_all[d] += w * all_d
            nxt = s + d
            v[nxt, _col(down, L - 1 - nxt, heuristic)] += w * rej[d - 1]
            nxt = s + d + 1
            if nxt <= L - 1:
                v[nxt, _col(up, L - 1 - nxt, heuristic)] += w * all_d


@kernel
def roc_threshold(p, y, m):
    """Hugging Face's tuned threshold from the first m (probability, match) pairs: scikit-learn's roc_curve
    (drop_intermediate) and argmin of fpr + 3 (1 - tpr), in the same float64 operations
    (:func:`fastspec.policies.hf_roc_threshold`)."""
    order = np.argsort(p[:m], kind="mergesort")
    n_pts = 0
    tps = np.empty(m + 1)
    fps = np.empty(m + 1)
    thr = np.empty(m + 1)
    cum = 0.0
    for i in range(m - 1, -1, -1):
        cur = p[order[i]]
        cum += y[order[i]]
        if i == 0 or p[order[i - 1]] != cur:
            idx = m - 1 - i  # position in descending order
            tps[n_pts] = cum
            fps[n_pts] = 1.0 + idx - cum
            thr[n_pts] = cur
            n_pts += 1
    keep = np.ones(n_pts, np.bool_)
    if n_pts > 2:
        for i in range(1, n_pts - 1):
            d2f = fps[i + 1] - 2.0 * fps[i] + fps[i - 1]
            d2t = tps[i + 1] - 2.0 * tps[i] + tps[i - 1]
            keep[i] = d2f != 0.0 or d2t != 0.0
    f_last = fps[n_pts - 1]
    t_last = tps[n_pts - 1]
    best = 3.0  # the prepended point (0, 0) with threshold inf: cost 0 + 3 * 1
    best_thr = np.inf
    for i in range(n_pts):
        if not keep[i]:
            continue
        cost = fps[i] / f_last + 3.0 * (1.0 - tps[i] / t_last)
        if cost < best:
            best = cost
            best_thr = thr[i]
    return best_thr


@kernel
def policy_mc(qx, acc, qmax, L, policy, tot, hist, hist_all, trial_out, cap_io):
    """Monte-Carlo replay of one sequence under ``policy = (rule, on_token, theta, h, k0, heuristic, tune)``
    (module docstring; :func:`fastspec.simulation.policy_eval._codes`): ``qx[r, t]`` the draft's probability of the
    token it drafts at t in trial r and ``acc[r, t]`` whether verification accepts it (drawn jointly), ``qmax[t]``
    its max probability.  Adds to tot [N_P], hist / hist_all (summed over trials) and writes per trial (steps,
    accepted) to trial_out [trials, 2].  ``cap_io[r]`` > 0: trial r starts from that cap instead of k0 (HF's
    heuristic cap carried over from the previous generate() call); the final cap is written back (after the plain
    last step, which HF also counts: +2)."""
    rule, on_token, theta, h, k0, heuristic, tune = policy
    trials = qx.shape[0]
    probs = np.empty(L + 1)
    matches = np.empty(L + 1)
    for r in range(trials):
        s = 0
        n = cap_io[r] if cap_io[r] > 0 else k0
        thr = theta
        m = 0
        has0 = False
        has1 = False
        steps = 0.0
        accepted_sum = 0.0
        while s < L - 1:
            d = min(n, L - 1 - s)
            D = 0
            rej_at = NONE
            prod = 1.0
            for j in range(d):
                t = s + j
                conf = qx[r, t] if on_token else qmax[t]
                D = j + 1
                if rej_at < 0 and not acc[r, t]:
                    rej_at = j
                if rule == RULE_THRESHOLD:
                    if thr > 0.0 and conf < thr:
                        break
                elif rule == RULE_SPECDEC:
                    prod *= conf
                    if 1.0 - prod >= h:
                        break
            accepted = rej_at if rej_at >= 0 else D
            steps += 1.0
            accepted_sum += accepted
            tot[P_STEPS] += 1.0
            tot[P_DRAFTED] += D
            tot[P_ACCEPTED] += accepted
            hist[D] += 1.0
            if accepted == D:
                hist_all[D] += 1.0
            if heuristic:
                n = n + 2 if accepted == D else max(1, n - 1)
            if tune and thr != 0.0:
                kept = min(D, accepted + 1)
                for i in range(kept):
                    probs[m] = qx[r, s + i]
                    mt = 1.0 if i < accepted else 0.0
                    matches[m] = mt
                    if mt == 1.0:
                        has1 = True
                    else:
                        has0 = True
                    m += 1
                if m > 5 and has0 and has1:
                    thr = roc_threshold(probs, matches, m)
            s += accepted + 1
        if heuristic and s == L - 1:  # the last token alone: a plain step, still an update with 0 of 0 accepted
            n += 2
        cap_io[r] = n
        trial_out[r, 0] = steps
        trial_out[r, 1] = accepted_sum
