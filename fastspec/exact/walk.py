"""The one enumerator of a verify step, shared by token, block and candidate (tree) verification.

Target and draft are functions ``prefix -> distribution`` (a tuple of token ids to a probability vector over
one vocabulary).  A verification method is a *rule*: at each node of the draft tree it yields what may happen
there, as :class:`Accept` (the drafted or candidate token is kept and the walk goes one position deeper) or
:class:`Emit` (the step ends: a token drawn from a distribution is emitted after the accepted drafts).
:func:`walk_step` sums the probabilities of every path into the law of the emitted tuple and of the number of
accepted drafts.  One-position rules (a :class:`~fastspec.exact.rules.VerificationRule`, recursive rejection over
``w`` candidates) are read at a single node by :func:`position_law`.
"""
from __future__ import annotations

from collections import defaultdict
from fractions import Fraction
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

from ..errors import InvalidInput, InvalidType
from .core import ONE, ZERO, Dist, as_distribution

__all__ = ["target_sequence_distribution"]

Model = Callable[[tuple], Sequence]


class Accept(NamedTuple):
    """Keep ``token`` with probability ``weight`` (relative to the node) and continue one position deeper."""

    token: int
    weight: Fraction
    state: object = None  # the rule's state at the child; one-position rules: which candidate (1-based) it was


class Emit(NamedTuple):
    """End the step with probability ``weight``: emit a token drawn from ``dist`` after ``accepted`` drafts
    (``None``: the drafts accepted on the way to this node)."""

    weight: Fraction
    dist: Dist
    accepted: int | None = None


#: rule(p, q, depth, state) -> outcomes at one node; q is None at depth k (every draft accepted)
Rule = Callable[[Dist, "Dist | None", int, object], Iterable]


class _Model:
    """Wraps ``prefix -> distribution``: exact conversion, caching, vocabulary-size check."""

    def __init__(self, fn: Model, name: str, vocab: int | None = None):
        if not callable(fn):
            raise InvalidType(f"{name} must be a function prefix -> distribution, got {type(fn).__name__}")
        self.fn, self.name, self.vocab, self.cache = fn, name, vocab, {}

    def __call__(self, prefix: tuple) -> Dist:
        d = self.cache.get(prefix)
        if d is None:
            d = as_distribution(self.fn(prefix), f"{self.name}({prefix})")
            if self.vocab is None:
                self.vocab = len(d)
            elif len(d) != self.vocab:
                raise InvalidInput(f"{self.name}({prefix}) has {len(d)} entries but the vocabulary has "
                                   f"{self.vocab}; every prefix must give a distribution over the same tokens")
            self.cache[prefix] = d
        return d


def model(fn, name: str = "target") -> _Model:
    """``fn`` wrapped once (a wrapped model is returned as it is)."""
    return fn if isinstance(fn, _Model) else _Model(fn, name)


def models(target, draft) -> tuple[_Model, _Model]:
    """Target and draft wrapped, the draft checked against the target's vocabulary."""
    t = model(target, "target")
    return t, draft if isinstance(draft, _Model) else _Model(draft, "draft", t.vocab)


def position_law(outcomes: Iterable, size: int) -> tuple[Dist, dict]:
    """The law of the token emitted at one position, and the accepted mass per :attr:`Accept.state`.

    A token accepted there is the emitted one (nothing is drafted after it at a single position).
    """
    out = [ZERO] * size
    accepted: dict = defaultdict(Fraction)
    for o in outcomes:
        if isinstance(o, Accept):
            out[o.token] += o.weight
            accepted[o.state] += o.weight
        else:
            for y, py in enumerate(o.dist):
                out[y] += o.weight * py
    return tuple(out), dict(accepted)


def walk_step(t: _Model, d: _Model, k: int, rule: Rule, prefix: tuple = (), *, start=None,
              visit: Callable[[int, Fraction, object], None] | None = None):
    """Enumerate one verify step with ``k`` drafts after ``prefix``.

    Returns ``(emitted, accepted)``: the emitted tuple (accepted drafts, then the recovered or bonus token)
    -> probability, and P(j drafts accepted) for j = 0..k.  ``start`` is the rule's state at the root;
    ``visit(depth, probability, state)`` is called at every node reached.
    """
    emitted: dict[tuple, Fraction] = defaultdict(Fraction)
    accepted = [ZERO] * (k + 1)

    def rec(ctx: tuple, drafts: tuple, prob: Fraction, state):
        depth = len(drafts)
        if visit is not None:
            visit(depth, prob, state)
        p = t(ctx)
        q = d(ctx) if depth < k else None
        if q is not None and len(q) != len(p):
            raise InvalidInput(f"draft({ctx}) has {len(q)} entries but the vocabulary has {len(p)} "
                               f"(target({ctx})); both models must cover the same tokens")
        for o in rule(p, q, depth, state):
            if isinstance(o, Accept):
                rec(ctx + (o.token,), drafts + (o.token,), prob * o.weight, o.state)
                continue
            j = depth if o.accepted is None else o.accepted
            pr = prob * o.weight
            accepted[j] += pr
            for y, py in enumerate(o.dist):
                if py:
                    emitted[drafts[:j] + (y,)] += pr * py

    rec(tuple(prefix), (), ONE, start)
    return dict(emitted), tuple(accepted)


def target_sequence_distribution(target: Model, length: int, prefix: tuple = ()) -> dict[tuple, Fraction]:
    """The target's own autoregressive distribution over the next ``length`` tokens after ``prefix``."""
    t = model(target, "target")
    dist = {(): ONE}
    for _ in range(length):
        nxt: dict[tuple, Fraction] = {}
        for seq, pr in dist.items():
            for y, py in enumerate(t(tuple(prefix) + seq)):
                if py:
                    nxt[seq + (y,)] = pr * py
        dist = nxt
    return dist


def extend_with_target(dist: Mapping[tuple, Fraction], target: _Model, prefix: tuple, length: int) -> dict:
    """Complete each emitted tuple to ``length`` tokens by sampling the rest from the target."""
    out: dict[tuple, Fraction] = defaultdict(Fraction)
    for seq, pr in dist.items():
        if len(seq) >= length:
            out[seq[:length]] += pr
            continue
        for tail, pt in target_sequence_distribution(target, length - len(seq), tuple(prefix) + seq).items():
            out[seq + tail] += pr * pt
    return dict(out)
