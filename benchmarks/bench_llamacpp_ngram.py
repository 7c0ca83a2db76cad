"""llama.cpp's ngram-simple speculator on the clock: predicted counters and speed-up against llama-server's own.

    python benchmarks/bench_llamacpp_ngram.py [--model GGUF] [--configs 3:4,2:8,5:5] [--rounds 3]
                                              [--n-predict 96] [--threads 2] [--out RESULT.json]

Needs the llama.cpp build (``scripts/llamacpp_build.sh``; ``FASTSPEC_LLAMACPP_BIN`` or ``--bin``) and a GGUF
target (default: the F32 SmolLM2-135M-Instruct of ``scripts/llamacpp_models.sh``).  It starts, on free loopback
ports, one plain ``llama-server`` and one per ngram-simple configuration (``-np 1 -c 2048 -t THREADS``), then:

1. **The record.**  Each prompt of ``data/prompts_lookup.jsonl`` (its chat template applied by the server) is
   generated at T = 0 by the plain server.  The prediction of every configuration's counters and steps comes from
   this record alone (:func:`fastspec.engines.llamacpp.ngram.ngram_simple_counters`).
2. **The cost table**, measured through the plain server at the same thread count: ``target.forward_s[n]`` is
   a forward over n new tokens after a cached prefix (``/completion`` with ``cache_prompt``: ``timings.prompt_ms``
   with ``prompt_n = n``), n = 1 .. size_m + 1.  Such a forward computes the logits of its last position only,
   while a decoding or verification step computes (and samples) all n: that is a cost ``c`` per verified
   position.  A step that verified a draft also pays a constant ``e`` of its own (the draft's batch, the KV
   cache's rollback of rejected positions), so ``overhead_s[0] = c`` and ``overhead_s[k] = (k + 1) c + e``;
   ``c`` and ``e`` are fitted on the **calibration** prompts (the first half) by least squares of (measured -
   forwards) against (verified positions, speculative steps), plain and speculative runs together.
3. **The clock.**  ``--rounds`` rounds; in each, every prompt goes to every server, the server order rotated
   per prompt, so machine drift hits all alike.  Speed-up measured = plain ``predicted_ms`` / speculative
   ``predicted_ms`` (llama-server's own generation time, after the first token), medians over rounds, summed
   over the **test** prompts (the second half); predicted = ((n - 1) (forward_s[1] + overhead_s[0])) / sum over
   the predicted steps of (forward_s[d + 1] + overhead_s[d]).  ``--out`` keeps every request's timings, so the
   fit can be redone from the file.

Prints one row per configuration: counters measured / predicted (test and calibration prompts), same text or
not, speed-up measured / predicted and the error, and the verdict (pays / does not pay) of each.  ``--out``
writes the whole result as JSON, ``--costs-out`` the cost table (version 1 schema, ``fastspec.costs``).
Wall-clock figures are valid on a quiet machine only: the script prints the load average before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fastspec.costs import CostTable  # noqa: E402
from fastspec.engines.llamacpp.ngram import NgramSimple, ngram_simple_counters, ngram_simple_time  # noqa: E402

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "fastspec")
DEFAULT_BIN = os.environ.get("FASTSPEC_LLAMACPP_BIN", os.path.join(CACHE, "llama.cpp-11434", "bin"))
DEFAULT_MODEL = os.path.join(CACHE, "llamacpp-models", "target-f32.gguf")
EOG = (0, 2)  # SmolLM2's <|endoftext|> and <|im_end|> (llama-vocab.cpp marks both end-of-generation)


class Server:
    """One llama-server on a free loopback port, stopped on exit."""

    def __init__(self, bin_dir, model, threads, extra=()):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
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
                                         "cache_prompt": cache, "return_tokens": True})

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


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
    """A forward over n new tokens after a cached prefix (prompt + 32 generated), ms."""
    prefix = prompt + record[:32]
    server.complete(prefix, 1, cache=True)
    t = server.complete(prefix + record[32:32 + n], 1, cache=True)["timings"]
    if t["prompt_n"] != n:
        raise SystemExit(f"the cached-prefix forward evaluated {t['prompt_n']} tokens, not {n}: is cache_prompt on?")
    return t["prompt_ms"]


def _measured(run) -> tuple[int, int]:
    """llama-server's counters of one request (absent: nothing drafted)."""
    return run["timings"].get("draft_n", 0), run["timings"].get("draft_n_accepted", 0)


def _counters(steps) -> tuple[int, int]:
    return steps.draft_n, steps.draft_n_accepted


def _least_squares(xs, ys) -> tuple[float, float]:
    """(c, e) minimizing sum (y - c x0 - e x1)^2; e = 0 when no row has x1 (the minimum-norm solution)."""
    c, e = np.linalg.lstsq(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), rcond=None)[0]
    return float(c), float(e)


def write_record(path, args, configs, names, prompts, records, runs):
    out = {"what": f"llama-server (llama.cpp 11434) at T = 0, {os.path.basename(args.model)}, -t {args.threads} "
                   "-c 2048 -np 1, /completion with token-id prompts (the chat template of data/prompts_lookup.jsonl), "
                   f"n_predict {args.n_predict}, cache_prompt false: the plain server's output, then each ngram-simple "
                   f"configuration's counters; written by benchmarks/bench_llamacpp_ngram.py --record on "
                   f"{time.strftime('%Y-%m-%d')}",
           "n_predict": args.n_predict, "n_ctx": 2048, "eog": list(EOG), "prompts": prompts, "plain": records,
           "runs": []}
    for c, name in zip(configs, names[1:], strict=True):
        for i in range(len(prompts)):
            first = runs[name][i][0]
            out["runs"].append({"size_n": c.size_n, "size_m": c.size_m, "prompt": i,
                                "draft_n": _measured(first)[0], "draft_n_accepted": _measured(first)[1],
                                "tokens": None if first["tokens"] == records[i] else first["tokens"]})
    with open(path, "w") as f:
        f.write(json.dumps(out, separators=(",", ":")) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=DEFAULT_BIN)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--prompts", default=os.path.join(ROOT, "data", "prompts_lookup.jsonl"))
    ap.add_argument("--configs", default="3:4,2:8,5:5")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--costs-out")
    ap.add_argument("--record", help="write the first round's requests (prompt ids, the plain output, each "
                    "configuration's counters and output where it differs) as the JSON that "
                    "tests/test_llamacpp_ngram.py replays")
    args = ap.parse_args(argv)
    configs = [NgramSimple(*map(int, c.split(":"))) for c in args.configs.split(",")]
    load0 = os.getloadavg()

    plain = Server(args.bin, args.model, args.threads)
    specs = []
    try:
        specs = [Server(args.bin, args.model, args.threads, c.server_args()) for c in configs]
        prompts = prompt_ids(plain, args.prompts)
        half = len(prompts) // 2
        servers = [plain, *specs]
        names = ["plain"] + [f"ngram-simple {c.size_n}:{c.size_m}" for c in configs]
        for s in servers:  # warm-up: page the weights in
            s.complete(prompts[0], 8)
        runs = {name: [[] for _ in prompts] for name in names}
        fwd = {}
        n_max = max(c.size_m for c in configs) + 1
        records = [None] * len(prompts)
        for rnd in range(args.rounds):
            for i, ids in enumerate(prompts):
                order = list(range(len(servers)))
                shift = (rnd * len(prompts) + i) % len(order)
                for j in order[shift:] + order[:shift]:
                    r = servers[j].complete(ids, args.n_predict)
                    runs[names[j]][i].append({"tokens": r["tokens"], "timings": r["timings"]})
                if records[i] is None:
                    records[i] = runs["plain"][i][0]["tokens"]
                if len(records[i]) > 32 + n_max:
                    for n in range(1, n_max + 1):
                        fwd.setdefault(n, []).append(forward_ms(plain, ids, records[i], n))
        load1 = os.getloadavg()
    finally:
        for s in [plain, *specs]:
            s.stop()

    def med(xs):
        return statistics.median(xs)

    plain_ms = [med([r["timings"]["predicted_ms"] for r in rs]) / 1e3 for rs in runs["plain"]]
    plain_tok = [len(rs[0]["tokens"]) for rs in runs["plain"]]
    forward = {n: med(v) for n, v in sorted(fwd.items())}

    def forward_of(n):
        return forward[min(n, max(forward))] / 1e3

    rows, fit_x, fit_y, pred_steps = [], [], [], {}
    for c, name in zip(configs, names[1:], strict=True):
        for i, ids in enumerate(prompts):
            steps = ngram_simple_counters(ids, records[i], c, n_predict=args.n_predict, n_ctx=2048, eog=EOG)
            pred_steps[name, i] = steps
            if i < half:
                meas = med([r["timings"]["predicted_ms"] for r in runs[name][i]]) / 1e3
                fit_x.append((steps.draft_n + len(steps.steps), sum(d > 0 for d, _ in steps.steps)))
                fit_y.append(meas - ngram_simple_time(steps, forward_of))
    for i in range(half):
        fit_x.append((plain_tok[i] - 1, 0))
        fit_y.append(plain_ms[i] - (plain_tok[i] - 1) * forward_of(1))
    c_fit, e_fit = _least_squares(fit_x, fit_y)
    c_pos, e_pos = max(c_fit, 1e-9), max(e_fit, 0.0)  # the schema wants overhead_s > 0; the fit is printed as is

    def overhead(d):
        return (d + 1) * c_pos + (e_pos if d > 0 else 0.0)

    for name in names[1:]:
        for part, idx in (("calibration", range(half)), ("test", range(half, len(prompts)))):
            m_counts = [_measured(runs[name][i][0]) for i in idx]
            p_counts = [_counters(pred_steps[name, i]) for i in idx]
            same = sum(all(r["tokens"] == records[i] for r in runs[name][i]) for i in idx)
            c = configs[names.index(name) - 1]
            own = sum(_counters(ngram_simple_counters(prompts[i], r["tokens"], c, n_predict=args.n_predict,
                                                      n_ctx=2048, eog=EOG)) == _measured(r)
                      for i in idx for r in runs[name][i])
            m_spec = sum(med([r["timings"]["predicted_ms"] for r in runs[name][i]]) for i in idx) / 1e3
            m_plain = sum(plain_ms[i] for i in idx)
            p_spec = sum(ngram_simple_time(pred_steps[name, i], forward_of, overhead) for i in idx)
            p_plain = sum((plain_tok[i] - 1) * (forward_of(1) + overhead(0)) for i in idx)
            rows.append({"config": name, "prompts": part, "requests": len(idx),
                         "counters_measured": [sum(a for a, _ in m_counts), sum(b for _, b in m_counts)],
                         "counters_predicted": [sum(a for a, _ in p_counts), sum(b for _, b in p_counts)],
                         "requests_exact": sum(a == b for a, b in zip(m_counts, p_counts, strict=True)),
                         "same_text": same, "own_output_exact": [own, len(idx) * args.rounds],
                         "speedup_measured": m_plain / m_spec,
                         "speedup_predicted": p_plain / p_spec,
                         "error": (p_plain / p_spec) / (m_plain / m_spec) - 1})

    print(f"load average before {load0[0]:.2f}, after {load1[0]:.2f} ({os.cpu_count()} CPUs); "
          f"threads {args.threads}; {len(prompts)} prompts ({half} calibration), {args.rounds} rounds, "
          f"n_predict {args.n_predict}")
    print("cost table (ms): " + ", ".join(f"forward[{n}] {v:.2f}" for n, v in forward.items())
          + f"; per verified position {c_fit * 1e3:.3f}, per speculative step {e_fit * 1e3:.3f}")
    print(f"{'config':<20} {'prompts':<12} {'counters meas':>14} {'predicted':>11} {'exact':>6} {'same':>5} {'own':>7} "
          f"{'speed-up meas':>13} {'pred':>6} {'error':>7}  verdict")
    for r in rows:
        verdict = "pays" if r["speedup_measured"] > 1 else "does not pay"
        right = (r["speedup_measured"] > 1) == (r["speedup_predicted"] > 1)
        print(f"{r['config']:<20} {r['prompts']:<12} {str(tuple(r['counters_measured'])):>14} "
              f"{str(tuple(r['counters_predicted'])):>11} {r['requests_exact']:>3}/{r['requests']:<2} "
              f"{r['same_text']:>2}/{r['requests']:<2} {r['own_output_exact'][0]:>3}/{r['own_output_exact'][1]:<3} "
              f"{r['speedup_measured']:>13.2f} {r['speedup_predicted']:>6.2f} "
              f"{r['error']:>+7.1%}  {verdict}{'' if right else ' (predicted verdict WRONG)'}")
    table = CostTable.from_dict({
        "version": 1, "machine": f"{os.cpu_count()} CPUs, llama.cpp 11434", "threads": args.threads,
        "note": "measured through llama-server: forward_s[n] cached-prefix forwards over n tokens, overhead_s[k] = "
                "(k + 1) c + e (k > 0), c per verified position and e per speculative step fitted on calibration "
                "prompts (benchmarks/bench_llamacpp_ngram.py)",
        "target": {"forward_s": {str(n): v / 1e3 for n, v in forward.items()}},
        "drafts": {}, "overhead_s": {str(k): overhead(k) for k in range(0, max(forward))}})
    if args.costs_out:
        table.save(args.costs_out)
    if args.record:
        write_record(args.record, args, configs, names, prompts, records, runs)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"load_before": load0, "load_after": load1, "threads": args.threads, "rounds": args.rounds,
                       "n_predict": args.n_predict, "model": os.path.basename(args.model),
                       "cost_table": table.as_dict(), "fit": {"c_s": c_fit, "e_s": e_fit}, "rows": rows,
                       "forward_ms": {str(n): v for n, v in sorted(fwd.items())},
                       "timings": {name: [[{"predicted_ms": r["timings"]["predicted_ms"],
                                            "predicted_n": r["timings"].get("predicted_n")} for r in rs]
                                          for rs in runs[name]] for name in names}}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
