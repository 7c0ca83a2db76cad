"""Wire formats: vLLM's OpenAI-compatible server and SGLang's native ``/generate``.

Each engine object wraps one :class:`~fastspec.io.servers.client.HttpClient` and offers the same four calls:
:meth:`info` (model name, version), :meth:`vocab_probe` (something two servers with the same tokenizer answer
identically), :meth:`generate` (a sampled continuation, as token ids) and :meth:`score` (teacher-forced top-k
log-probabilities of every position of a given token sequence from ``start`` on, plus the logprob of the token
actually there, plus -- SGLang only -- the logprobs of extra given ids).  Every malformed answer (a missing or
truncated field, a NaN or +inf logprob, a logprob that is not a number, an id that is not a canonical integer in
[0, 2**31), an id listed twice, top-k probabilities summing over 1, the wrong token at a position) is a
:class:`ServerError` naming the server, the request and the position, raised as the answer arrives.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ...config import LOGPROB_SUM_TOLERANCE
from ...errors import InvalidInput, shown
from ...params import SamplingParams
from .client import HttpClient, ServerError, body_bound, finite_or_none

__all__ = ["Scored", "VllmEngine", "SglangEngine", "ENGINES", "make_engine"]

#: a text every tokenizer splits into several tokens: two servers that tokenize it differently differ
PROBE_TEXT = "The quick brown fox, 1234 — héllo wörld! 東京 w5 w17 </s>"
#: ids whose text two servers must agree on
PROBE_IDS = list(range(0, 64))

_CAP = re.compile(r"(?:max(?:imum)?(?: allowed)?[^0-9]{0,40}?)(\d+)", re.I)


@dataclass
class Scored:
    """Teacher-forced rows of one sequence, positions ``start .. len(seq) - 1``.

    ``ids`` / ``logprobs``: per position the top-k list, most probable first (its length is the k received);
    ``own``: the logprob of the token at that position; ``extra``: per position {id: logprob} of requested ids
    (empty dicts when none were asked)."""
    ids: list
    logprobs: list
    own: list
    extra: list = field(default_factory=list)


#: token ids lie in [0, ID_END): they are stored as int32
ID_END = 2 ** 31
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,9}")


def _finite(x, where: str) -> float:
    """A logprob: a JSON number (not a bool), not NaN, not +inf, <= 1e-3 (rounding above 0 is clipped to 0)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ServerError(f"{where}: the logprob {shown(x)} is not a number")
    v = float(x)
    if math.isnan(v) or v == math.inf or v > 1e-3:
        raise ServerError(f"{where}: logprob {v!r} is not a log-probability (NaN, +inf or > 0)")
    return min(v, 0.0)


def _token_id(x, where: str, what: str = "id") -> int:
    """A token id: a JSON integer (not a bool) in [0, 2**31)."""
    if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < ID_END:
        raise ServerError(f"{where}: {what} {shown(x)} is not a token id (an integer in [0, 2**31))")
    return x


def _key_id(key, where: str) -> int:
    """A token id written as a JSON object key: the canonical decimal ("7", not "07", " 7" or "+7")."""
    if not isinstance(key, str) or not _DECIMAL.fullmatch(key) or int(key) >= ID_END:
        raise ServerError(f"{where}: key {shown(key)} is not a token id (a decimal integer in [0, 2**31), written "
                          "without padding)")
    return int(key)


def _check_mass(lps, where: str, what: str = "top-k") -> None:
    """The probabilities of distinct ids sum to at most 1 + LOGPROB_SUM_TOLERANCE."""
    tot = math.fsum(math.exp(v) for v in lps)
    if tot > 1.0 + LOGPROB_SUM_TOLERANCE:
        raise ServerError(f"{where}: the {what} probabilities sum to {tot:.6g} > 1 (beyond the float tolerance "
                          f"{LOGPROB_SUM_TOLERANCE:g}): not log-probabilities of one distribution")


def _token_list(ids, where: str, field: str) -> list:
    """A non-empty list of token ids (a sampled continuation)."""
    if not isinstance(ids, list) or not ids:
        raise ServerError(f"{where}: no {field} in the response")
    for j, t in enumerate(ids):
        _token_id(t, where, f"{field}[{j}] =")
    return ids


def _text_or_none(x):
    return x if isinstance(x, str) else None


class VllmEngine:
    """vLLM's OpenAI-compatible server (``/v1/completions`` with token-id prompts, ``/v1/models``, ``/version``,
    ``/tokenize``, ``/detokenize``).  vLLM has no field for the logprob of given ids: no tight bounds."""

    kind = "vllm"
    can_score_ids = False

    def __init__(self, client: HttpClient, model: str | None = None):
        self.client = client
        self._model = model
        self.k_cap: int | None = None

    @property
    def model(self) -> str:
        if self._model is None:
            self.info()
        return self._model

    def info(self) -> dict:
        models = self.client.get("/v1/models", "model name")
        data = models.get("data") if isinstance(models, dict) else None
        if not data or not isinstance(data, list) or not isinstance(data[0], dict) \
                or not isinstance(data[0].get("id"), str) or not data[0]["id"]:
            raise ServerError(f"{self.client.where('/v1/models')}: no model listed")
        names = [d.get("id") for d in data if isinstance(d, dict) and isinstance(d.get("id"), str)]
        if self._model is None:
            self._model = names[0]
        elif self._model not in names:
            raise ServerError(f"{self.client.where('/v1/models')}: the server serves {names}, not {self._model!r}")
        try:
            v = self.client.get("/version", "version")
            version = _text_or_none(v.get("version")) if isinstance(v, dict) else None
        except ServerError:
            version = None
        mml = finite_or_none(data[0].get("max_model_len"))
        return {"engine": "vllm", "model": self._model, "version": version,
                "max_model_len": mml if isinstance(mml, int) else None}

    def vocab_probe(self) -> dict:
        tok = self.client.post("/tokenize", {"model": self.model, "prompt": PROBE_TEXT, "add_special_tokens": False},
                               "tokenizer probe")
        det = self.client.post("/detokenize", {"model": self.model, "tokens": PROBE_IDS[:64]}, "detokenize probe")
        texts = [det.get("prompt") if isinstance(det, dict) else None]
        return {"tokens": tok.get("tokens") if isinstance(tok, dict) else None, "texts": texts}

    def _completion(self, body: dict, what: str, entries: int) -> dict:
        r = self.client.post("/v1/completions", dict(body, model=self.model), what, max_bytes=body_bound(entries))
        ch = r.get("choices") if isinstance(r, dict) else None
        if not isinstance(ch, list) or not ch or not isinstance(ch[0], dict):
            raise ServerError(f"{self.client.where('/v1/completions')} ({what}): no choices in the response")
        return ch[0]

    def generate(self, prompt: list, max_new_tokens: int, sampling: SamplingParams, seed: int, ignore_eos: bool,
                 what: str = "generate") -> list:
        body = {"prompt": list(prompt), "max_tokens": int(max_new_tokens), "temperature": sampling.temperature,
                "top_p": sampling.top_p, "min_p": sampling.min_p, "seed": int(seed),
                "ignore_eos": bool(ignore_eos), "return_tokens_as_token_ids": True, "return_token_ids": True,
                "skip_special_tokens": False}
        if sampling.top_k:
            body["top_k"] = int(sampling.top_k)
        ch = self._completion(body, what, 2 * len(prompt) + int(max_new_tokens))
        ids = ch.get("token_ids")
        where = f"{self.client.where('/v1/completions')} ({what})"
        if not isinstance(ids, list) or not ids:
            raise ServerError(f"{where}: no token_ids in the response (vLLM >= 0.10 returns them with "
                              "return_token_ids)")
        return _token_list(ids, where, "token_ids")

    def score(self, seq: list, start: int, k: int, extra_ids=None, what: str = "score") -> Scored:
        if extra_ids:
            raise InvalidInput("vLLM's server cannot return the logprobs of given ids")
        if self.k_cap is not None:
            k = min(k, self.k_cap)
        body = {"prompt": list(seq), "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": int(k),
                "return_tokens_as_token_ids": True, "return_token_ids": True}
        where = f"{self.client.where('/v1/completions')} ({what})"
        try:
            ch = self._completion(body, what, len(seq) * (int(k) + 3))
        except ServerError as exc:
            m = _CAP.search(exc.body or "") if exc.status == 400 and "logprobs" in (exc.body or "") else None
            if m and 1 <= int(m.group(1)) < k:
                self.k_cap = int(m.group(1))
                return self.score(seq, start, self.k_cap, None, what)
            raise
        pl = ch.get("prompt_logprobs")
        if not isinstance(pl, list) or len(pl) != len(seq):
            n = len(pl) if isinstance(pl, list) else 0
            raise ServerError(f"{where}: prompt_logprobs missing or truncated ({n} entries for {len(seq)} tokens)")
        ids, lps, own = [], [], []
        for j in range(start, len(seq)):
            entry = pl[j]
            wj = f"{where}: position {j}"
            if not isinstance(entry, dict) or not entry:
                raise ServerError(f"{wj}: no logprobs")
            rows = []
            for key, v in entry.items():
                tid = _key_id(key, wj)
                if not isinstance(v, dict) or "logprob" not in v:
                    raise ServerError(f"{wj}: entry {shown(key)} has no logprob")
                rank = v.get("rank")
                rank = rank if isinstance(rank, int) and not isinstance(rank, bool) else 10 ** 9
                rows.append((rank, _finite(v["logprob"], f"{wj}, id {tid}"), tid))
            _check_mass([lp for _r, lp, _t in rows], wj, "listed")
            tok = int(seq[j])
            own_lp = [lp for _r, lp, t in rows if t == tok]
            if not own_lp:
                raise ServerError(f"{wj}: the logprob of the token there ({tok}) is missing")
            top = sorted(((r, -lp, t) for r, lp, t in rows if r <= k), key=lambda x: (x[1], x[0], x[2]))[:k]
            if not top:
                raise ServerError(f"{wj}: no top-k entries (rank <= {k})")
            ids.append([t for _r, _n, t in top])
            lps.append([-n for _r, n, _t in top])
            own.append(own_lp[0])
        return Scored(ids, lps, own, [{} for _ in ids])


class SglangEngine:
    """SGLang's native API (``/generate`` with ``input_ids``, ``/get_model_info``, ``/get_server_info``).
    ``token_ids_logprob`` gives the logprobs of given ids: the tight bounds."""

    kind = "sglang"
    can_score_ids = True
    #: at most this many ids in one token_ids_logprob request
    ID_CHUNK = 1024

    def __init__(self, client: HttpClient, model: str | None = None):
        self.client = client
        self._model = model
        self.k_cap: int | None = None

    def info(self) -> dict:
        mi = self.client.get("/get_model_info", "model name")
        if not isinstance(mi, dict) or not isinstance(mi.get("model_path"), str) or not mi["model_path"]:
            raise ServerError(f"{self.client.where('/get_model_info')}: no model_path in the response")
        model = mi["model_path"]
        if self._model is not None and self._model != model:
            raise ServerError(f"{self.client.where('/get_model_info')}: the server serves {model!r}, "
                              f"not {self._model!r}")
        self._model = model
        version = None
        try:
            si = self.client.get("/get_server_info", "version")
            version = _text_or_none(si.get("version")) if isinstance(si, dict) else None
        except ServerError:
            pass
        return {"engine": "sglang", "model": model, "version": version,
                "tokenizer": _text_or_none(mi.get("tokenizer_path"))}

    def _generate(self, body: dict, what: str, entries: int = 0) -> dict:
        r = self.client.post("/generate", body, what, max_bytes=body_bound(entries))
        if isinstance(r, list):
            r = r[0] if r else None
        if not isinstance(r, dict) or not isinstance(r.get("meta_info"), dict):
            raise ServerError(f"{self.client.where('/generate')} ({what}): no meta_info in the response")
        return r

    def vocab_probe(self) -> dict:
        r = self._generate({"input_ids": PROBE_IDS[:64], "sampling_params": {"max_new_tokens": 0},
                            "return_logprob": True, "logprob_start_len": 0, "return_text_in_logprobs": True},
                           "tokenizer probe")
        rows = r["meta_info"].get("input_token_logprobs")
        rows = rows if isinstance(rows, list) else []
        return {"texts": [row[2] if isinstance(row, list) and len(row) > 2 else None for row in rows]}

    def generate(self, prompt: list, max_new_tokens: int, sampling: SamplingParams, seed: int, ignore_eos: bool,
                 what: str = "generate") -> list:
        sp = {"max_new_tokens": int(max_new_tokens), "temperature": sampling.temperature,
              "top_p": sampling.top_p, "min_p": sampling.min_p, "ignore_eos": bool(ignore_eos),
              "sampling_seed": int(seed), "skip_special_tokens": False}
        if sampling.top_k:
            sp["top_k"] = int(sampling.top_k)
        r = self._generate({"input_ids": list(prompt), "sampling_params": sp}, what, 2 * len(prompt) + max_new_tokens)
        return _token_list(r.get("output_ids"), f"{self.client.where('/generate')} ({what})", "output_ids")

    @staticmethod
    def _pairs(row, where: str, what: str) -> list:
        """[(logprob, id)] of an SGLang row of ``[logprob, id, text]`` entries; the ids distinct."""
        if not isinstance(row, list) or not row:
            raise ServerError(f"{where}: no {what}")
        out, seen = [], set()
        for e in row:
            if not isinstance(e, (list, tuple)) or len(e) < 2:
                raise ServerError(f"{where}: an entry of the {what} is {shown(e)}, not [logprob, id, text]")
            t = _token_id(e[1], where)
            if t in seen:
                raise ServerError(f"{where}: id {t} is listed twice in the {what}")
            seen.add(t)
            out.append((_finite(e[0], f"{where}, id {t}"), t))
        return out

    def _rows(self, meta: dict, key: str, n: int, where: str) -> list:
        rows = meta.get(key)
        if not isinstance(rows, list) or len(rows) < n:
            got = len(rows) if isinstance(rows, list) else 0
            raise ServerError(f"{where}: meta_info.{key} missing or truncated ({got} entries for {n} positions)")
        return rows[len(rows) - n:]

    def score(self, seq: list, start: int, k: int, extra_ids=None, what: str = "score") -> Scored:
        n = len(seq) - start
        where = f"{self.client.where('/generate')} ({what})"
        body = {"input_ids": list(seq), "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
                "return_logprob": True, "logprob_start_len": int(start), "top_logprobs_num": int(k),
                "return_text_in_logprobs": False}
        meta = self._generate(body, what, len(seq) * (int(k) + 3))["meta_info"]
        tok_rows = self._rows(meta, "input_token_logprobs", n, where)
        top_rows = self._rows(meta, "input_top_logprobs", n, where)
        ids, lps, own = [], [], []
        for i in range(n):
            j = start + i
            wj = f"{where}: position {j}"
            tr = tok_rows[i]
            if not isinstance(tr, (list, tuple)) or len(tr) < 2 or tr[0] is None:
                raise ServerError(f"{wj}: no logprob of the token there")
            if _token_id(tr[1], wj, "the scored token") != int(seq[j]):
                raise ServerError(f"{wj}: the server scored token {tr[1]}, the sequence has {seq[j]} (misaligned)")
            own.append(_finite(tr[0], wj))
            pairs = self._pairs(top_rows[i], wj, "top logprobs")
            _check_mass([lp for lp, _t in pairs], wj)
            pairs = sorted(pairs, key=lambda x: (-x[0], x[1]))[:k]
            ids.append([t for _lp, t in pairs])
            lps.append([lp for lp, _t in pairs])
        extra = [{} for _ in range(n)]
        want = sorted({int(t) for t in (extra_ids or ())})
        for c in range(0, len(want), self.ID_CHUNK):
            chunk = want[c:c + self.ID_CHUNK]
            b = dict(body, top_logprobs_num=0, token_ids_logprob=chunk)
            m2 = self._generate(b, f"{what}, logprobs of {len(chunk)} given ids",
                                len(seq) * (len(chunk) + 3))["meta_info"]
            rows = self._rows(m2, "input_token_ids_logprobs", n, where)
            for i in range(n):
                wi = f"{where}: position {start + i}"
                got = dict((t, lp) for lp, t in self._pairs(rows[i], wi, "logprobs of the given ids"))
                if set(chunk) - set(got):
                    raise ServerError(f"{where}: position {start + i}: logprobs of "
                                      f"{len(set(chunk) - set(got))} given ids missing")
                extra[i].update(got)
        return Scored(ids, lps, own, extra)


ENGINES = {"vllm": VllmEngine, "sglang": SglangEngine}


def make_engine(kind: str, client: HttpClient, model: str | None = None):
    """The engine ``kind`` over ``client``; ``model``: the served model name to use (checked against the server's
    list; None: the first one it serves)."""
    if kind not in ENGINES:
        raise InvalidInput(f"engine {kind!r}: use one of {', '.join(ENGINES)}")
    return ENGINES[kind](client, model)
