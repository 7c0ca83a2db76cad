"""What the llama.cpp wall-clock benches share (``bench_llamacpp_ngram.py``, ``bench_llamacpp_draft.py``): a
``llama-server`` on a free port, the prompts with their chat template, the interleaved rounds, the cost table's
cached-prefix forwards, the overhead fit (c per verified position, e per speculative step) and the result rows.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import time
import urllib.request

import numpy as np

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "fastspec")
DEFAULT_BIN = os.environ.get("FASTSPEC_LLAMACPP_BIN", os.path.join(CACHE, "llama.cpp-11434", "bin"))
MODELS = os.path.join(CACHE, "llamacpp-models")
DEFAULT_MODEL = os.path.join(MODELS, "target-f32.gguf")
EOG = (0, 2)  # SmolLM2's <|endoftext|> and <|im_end|> (llama-vocab.cpp marks both end-of-generation)
#: generated tokens before the positions a cached-prefix forward evaluates
PREFIX = 32


def parser(doc, configs):
    """The benches' shared flags (``--configs`` defaults to ``configs``)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--bin", default=DEFAULT_BIN)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--prompts", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                      "data", "prompts_lookup.jsonl"))
    ap.add_argument("--configs", default=configs)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--costs-out")
    return ap


def cost_table(threads, script, target_ms, drafts_ms, fit):
    """The version-1 cost table ({n: ms} forwards of the target and of each draft, the fitted overheads)."""
    from fastspec.costs import CostTable

    def seconds_of(ms):
        return {"forward_s": {str(n): v / 1e3 for n, v in ms.items()}}
    return CostTable.from_dict({
        "version": 1, "machine": f"{os.cpu_count()} CPUs, llama.cpp 11434", "threads": threads,
        "note": "measured through llama-server: forward_s[n] cached-prefix forwards over n tokens, overhead_s[k] = "
                "(k + 1) c + e (k > 0), c per verified position and e per speculative step fitted on calibration "
                f"prompts ({script})",
        "target": seconds_of(target_ms), "drafts": {d: seconds_of(ms) for d, ms in drafts_ms.items()},
        "overhead_s": {str(k): fit.overhead(k) for k in range(0, max(target_ms))}})


def med(xs):
    return statistics.median(xs)


class Server:
    """One llama-server on a free loopback port, stopped on exit; ``body`` is added to every ``/completion``."""

    def __init__(self, bin_dir, model, threads, extra=(), body=None, name="llama-server"):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.body, self.name = dict(body or {}), name
        cmd = [os.path.join(bin_dir, "llama-server"), "-m", model, "--host", "127.0.0.1", "--port", str(self.port),
               "-t", str(threads), "-c", "2048", "-np", "1", "--no-webui", *extra]
        self.log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"llama-server-{self.port}.log"), "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log,
                                     env={**os.environ, "LD_LIBRARY_PATH": bin_dir})
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"llama-server exited with {self.proc.returncode} at start: see {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if json.load(r).get("status") == "ok":
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise SystemExit(f"llama-server did not answer /health in 300 s: see {self.log.name}")

    def post(self, path, obj):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(obj).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.load(r)

    def complete(self, ids, n_predict, cache=False):
        return self.post("/completion", {"prompt": ids, "n_predict": n_predict, "temperature": 0,
                                         "cache_prompt": cache, "return_tokens": True, **self.body})

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def stop_all(servers):
    for s in servers:
        s.stop()


def prompt_ids(server, path):
    ids = []
    with open(path) as f:
        for line in f:
            text = json.loads(line)["prompt"]
            tmpl = server.post("/apply-template", {"messages": [{"role": "user", "content": text}]})["prompt"]
            ids.append(server.post("/tokenize", {"content": tmpl, "add_special": False, "parse_special": True})
                       ["tokens"])
    return ids


def forward_ms(server, prompt, record, n):
    """A forward over n new tokens after a cached prefix (prompt + PREFIX generated), ms."""
    prefix = prompt + record[:PREFIX]
    server.complete(prefix, 1, cache=True)
    t = server.complete(prefix + record[PREFIX:PREFIX + n], 1, cache=True)["timings"]
    if t["prompt_n"] != n:
        raise SystemExit(f"the cached-prefix forward evaluated {t['prompt_n']} tokens, not {n}: is cache_prompt on?")
    return t["prompt_ms"]


class Forwards:
    """A model's cached-prefix forward times over n = 1 .. n_max tokens, one sample per prompt and round."""

    def __init__(self, server, n_max):
        self.server, self.n_max, self.ms = server, n_max, {}

    def measure(self, prompt, record):
        if len(record) > PREFIX + self.n_max:
            for n in range(1, self.n_max + 1):
                self.ms.setdefault(n, []).append(forward_ms(self.server, prompt, record, n))

    def table(self):
        """{n: median ms}."""
        return {n: med(v) for n, v in sorted(self.ms.items())}

    def seconds(self):
        """forward_s(n), seconds; n past the table takes its largest n."""
        t = self.table()
        return lambda n: t[min(n, max(t))] / 1e3


def interleaved_rounds(servers, names, prompts, rounds, n_predict, after=None):
    """``rounds`` rounds; in each, every prompt goes to every server, the order rotated per prompt (machine drift
    hits all alike).  ``runs[name][i]``: the requests' tokens and timings; ``records[i]``: the first server's
    (the plain one's) first output, given to ``after(prompt, record)`` after each prompt of each round."""
    for s in servers:  # warm-up: page the weights in
        s.complete(prompts[0], 8)
    runs = {name: [[] for _ in prompts] for name in names}
    records = [None] * len(prompts)
    for rnd in range(rounds):
        for i, ids in enumerate(prompts):
            order = list(range(len(servers)))
            shift = (rnd * len(prompts) + i) % len(order)
            for j in order[shift:] + order[:shift]:
                r = servers[j].complete(ids, n_predict)
                runs[names[j]][i].append({"tokens": r["tokens"], "timings": r["timings"]})
            if records[i] is None:
                records[i] = runs[names[0]][i][0]["tokens"]
            if after is not None:
                after(ids, records[i])
    return runs, records


def measured(run) -> tuple[int, int]:
    """llama-server's counters of one request (absent: nothing drafted)."""
    return run["timings"].get("draft_n", 0), run["timings"].get("draft_n_accepted", 0)


def counters(steps) -> tuple[int, int]:
    return steps.draft_n, steps.draft_n_accepted


def seconds(runs) -> float:
    """The median over rounds of llama-server's generation time (``predicted_ms``, after the first token), s."""
    return med([r["timings"]["predicted_ms"] for r in runs]) / 1e3


class OverheadFit:
    """The per-step overheads: c per verified position, e per speculative step, fitted by least squares of
    (measured - forwards) against (verified positions, speculative steps) over calibration requests, plain and
    speculative together; ``overhead(d) = (d + 1) c + (e if d else 0)``."""

    def __init__(self):
        self.x, self.y = [], []

    def add(self, steps, measured_s, forwards_s):
        self.x.append((steps.draft_n + len(steps.steps), sum(d > 0 for d, _ in steps.steps)))
        self.y.append(measured_s - forwards_s)

    def add_plain(self, tokens, measured_s, step_s):
        self.x.append((tokens - 1, 0))
        self.y.append(measured_s - (tokens - 1) * step_s)

    def fit(self):
        """(c, e) minimizing sum (y - c x0 - e x1)^2; e = 0 when no row has x1 (the minimum-norm solution).
        ``self.c``, ``self.e`` (the fit, printed as is) and ``overhead(d)`` (clipped positive: the cost-table
        schema wants overhead_s > 0)."""
        c, e = np.linalg.lstsq(np.asarray(self.x, dtype=float), np.asarray(self.y, dtype=float), rcond=None)[0]
        self.c, self.e = float(c), float(e)
        return self.c, self.e

    def overhead(self, d):
        return (d + 1) * max(self.c, 1e-9) + (max(self.e, 0.0) if d > 0 else 0.0)


def row(name, part, idx, runs, records, plain_runs, rounds, p_counts, own, p_spec, p_plain):
    """One result row: counters measured (each prompt's first request) / predicted, how many requests' counters
    are exact, how many prompts give the plain text in every round, ``own`` (requests whose counters equal the
    prediction from their own output), the speed-up measured (plain / speculative generation time, medians over
    rounds, summed over ``idx``) and predicted (``p_plain`` / ``p_spec`` seconds)."""
    m_counts = [measured(runs[name][i][0]) for i in idx]
    m_spec = sum(seconds(runs[name][i]) for i in idx)
    m_plain = sum(seconds(plain_runs[i]) for i in idx)
    return {"config": name, "prompts": part, "requests": len(idx),
            "counters_measured": [sum(a for a, _ in m_counts), sum(b for _, b in m_counts)],
            "counters_predicted": [sum(a for a, _ in p_counts), sum(b for _, b in p_counts)],
            "requests_exact": sum(a == b for a, b in zip(m_counts, p_counts, strict=True)),
            "same_text": sum(all(r["tokens"] == records[i] for r in runs[name][i]) for i in idx),
            "own_output_exact": [own, len(idx) * rounds],
            "speedup_measured": m_plain / m_spec, "speedup_predicted": p_plain / p_spec,
            "error": (p_plain / p_spec) / (m_plain / m_spec) - 1}


def print_report(load0, load1, threads, n_prompts, half, rounds, n_predict, tables, fit, rows, width=20):
    """The load averages, the cost tables ({model: {n: ms}}), the fit and one line per row with its verdict."""
    print(f"load average before {load0[0]:.2f}, after {load1[0]:.2f} ({os.cpu_count()} CPUs); "
          f"threads {threads}; {n_prompts} prompts ({half} calibration), {rounds} rounds, n_predict {n_predict}")
    for model, t in tables.items():
        print(f"{model} forward (ms): " + ", ".join(f"[{n}] {v:.2f}" for n, v in t.items()))
    print(f"per verified position {fit.c * 1e3:.3f} ms, per speculative step {fit.e * 1e3:.3f} ms")
    print(f"{'config':<{width}} {'prompts':<12} {'counters meas':>14} {'predicted':>11} {'exact':>6} {'same':>5} "
          f"{'own':>7} {'speed-up meas':>13} {'pred':>6} {'error':>7}  verdict")
    for r in rows:
        verdict = "pays" if r["speedup_measured"] > 1 else "does not pay"
        right = (r["speedup_measured"] > 1) == (r["speedup_predicted"] > 1)
        print(f"{r['config']:<{width}} {r['prompts']:<12} {str(tuple(r['counters_measured'])):>14} "
              f"{str(tuple(r['counters_predicted'])):>11} {r['requests_exact']:>3}/{r['requests']:<2} "
              f"{r['same_text']:>2}/{r['requests']:<2} {r['own_output_exact'][0]:>3}/{r['own_output_exact'][1]:<3} "
              f"{r['speedup_measured']:>13.2f} {r['speedup_predicted']:>6.2f} "
              f"{r['error']:>+7.1%}  {verdict}{'' if right else ' (predicted verdict WRONG)'}")


def timings_json(runs, names):
    """Every request's generation time and token count, for ``--out``."""
    return {name: [[{"predicted_ms": r["timings"]["predicted_ms"], "predicted_n": r["timings"].get("predicted_n")}
                    for r in rs] for rs in runs[name]] for name in names}
