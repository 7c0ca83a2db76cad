"""vLLM's throughput at several concurrencies and its batch cost table (the experiment of
``benchmarks/vllm_batch/``, imported from there as ``vllm_batch``).

Fast tests: the arithmetic of the cost table (known forward times in, the same out), the exact counters against a
slow obvious replay of vLLM's n-gram speculative decoding at T = 0, the aggregation of recorded runs (counters
that differ from the prediction by one are flagged), the comparison with a prediction and the break-even rule,
and the worker protocol with a fake worker (errors, exits, time-outs are one-line EngineErrors).  The test marked
``vllm`` runs the real engine on a tiny random model: the counters at T = 0 equal the exact prediction at
concurrency 1 and 4, the outputs equal the record, the throughputs are positive and the table parses.
"""
from __future__ import annotations

import json
import os
import stat
import sys
from fractions import Fraction

import numpy as np
import pytest

from fastspec.engines.errors import EngineError
from fastspec.errors import InvalidInput

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
if BENCHMARKS not in sys.path:  # the experiment lives with its benchmark (benchmarks/vllm_batch/)
    sys.path.insert(0, BENCHMARKS)
from vllm_batch import driver as VB  # noqa: E402


# -- the cost table -------------------------------------------------------------------------------------------------

def _rounds(F, A, batches, ns, D, jitter=()):
    """Cost rounds from known forward times F(B, n) and an admission + retirement cost A(B) (binary fractions, so
    the arithmetic is exact)."""
    out = []
    for r in range(len(jitter) or 3):
        j = jitter[r] if jitter else 0.0
        got = {f"pref {b} {n}": A(b) + F(b, n) + j for b in batches for n in ns}
        got.update({f"dec {b} 1": A(b) + F(b, 1) + D * F(b, 1) + j for b in batches})
        out.append(got)
    return out


def test_cost_table_recovers_known_forward_times_exactly():
    batches, ns, D = [1, 2, 4], [1, 2, 3], 8

    def F(b, n):
        return 0.015625 * (1 + b * n / 8)

    def A(b):
        return 0.25 + 0.0625 * b

    t = VB.cost_table_v2(_rounds(F, A, batches, ns, D), batches, ns, D, k=2, draft="ngram.vllm1-3",
                         machine="m", context_length=128)
    assert t["version"] == 2
    for b in batches:
        for n in ns:
            assert t["target"]["batch_forward_s"][str(b)][str(n)] == F(b, n)
            assert t["target"]["batch_forward_s_se"][str(b)][str(n)] == 0.0
    assert t["target"]["forward_s"] == t["target"]["batch_forward_s"]["1"]
    from fastspec.costs import CostTable

    table = CostTable.of(t, "t")  # the schema's own reader accepts it
    assert table.has_batch_axis and sorted(table.batch_sizes) == batches


def test_cost_table_median_over_rounds_and_bad_rounds_refused():
    batches, ns, D = [1], [1, 2], 4
    # per-round jitter cancels in the differences: the median is still exact
    rounds = _rounds(lambda _b, n: 0.125 * n, lambda _b: 0.5, batches, ns, D, jitter=(0.0, 0.25, 0.5))
    t = VB.cost_table_v2(rounds, batches, ns, D, k=1, draft="d", machine="m", context_length=1)
    assert t["target"]["batch_forward_s"]["1"] == {"1": 0.125, "2": 0.25}
    # a decode run faster than its own prefill: the noise exceeds the differences
    bad = [{"pref 1 1": 1.0, "pref 1 2": 1.0, "dec 1 1": 0.5}] * 3
    with pytest.raises(InvalidInput, match="not positive"):
        VB.cost_table_v2(bad, batches, ns, D, k=1, draft="d", machine="m", context_length=1)


def test_median_se_order_statistics():
    med, se = VB.median_se([float(x) for x in range(9, 0, -1)])
    # n = 9: ranks floor(4.5 - 2.94) = 1 and ceil(5.5 + 2.94) = 9 -> (9 - 1) / (2 x 1.96)
    assert med == 5.0 and se == pytest.approx(8 / (2 * 1.959963984540054))
    assert VB.median_se([3.0]) == (3.0, 0.0)
    with pytest.raises(InvalidInput):
        VB.median_se([])


def test_forward_cells_cover_every_batch_and_n():
    cells = VB.forward_cells([1, 4], [1, 2])
    assert cells == [("pref", 1, 1), ("pref", 1, 2), ("pref", 4, 1), ("pref", 4, 2), ("dec", 1, 1), ("dec", 4, 1)]


# -- exact counters against a slow obvious replay ---------------------------------------------------------------------

def _naive_vllm_ngram(prompt, record, k, min_n, max_n, budget):
    """vLLM's n-gram speculation at T = 0, step by step: the prefill emits record[0]; a step at s proposes from
    prompt + record[:s] (earliest occurrence of the longest match), accepts the leading drafts equal to the record,
    counts all k drafts even past the budget, and emits the accepted ones plus one token."""
    from fastspec.ngram import propose

    drafts = tokens = accepted = 0
    per_pos = [0] * k
    s = 1
    while s < budget:
        x = propose(list(prompt) + list(record[:s]), k, min_n=min_n, max_n=max_n, occurrence="earliest")
        if len(x) == 0:
            s += 1
            continue
        drafts += 1
        tokens += len(x)
        a = 0
        while a < len(x) and int(x[a]) == int(record[s + a]):
            per_pos[a] += 1
            a += 1
        accepted += a
        s += a + 1
    return drafts, tokens, accepted, per_pos


@pytest.mark.parametrize("seed", range(6))
def test_exact_counters_equal_a_step_by_step_replay(seed):
    rng = np.random.default_rng(seed)
    k, budget = int(rng.integers(1, 5)), int(rng.integers(2, 30))
    min_n = int(rng.integers(1, 3))
    max_n = min_n + int(rng.integers(0, 3))
    prompts, records = [], []
    for _ in range(3):
        motif = [int(v) for v in rng.integers(0, 6, 5)]
        prompts.append(motif * 2 + [int(v) for v in rng.integers(0, 6, 4)])
        records.append((motif * 20)[:budget + k] if rng.random() < 0.5 else
                       [int(v) for v in rng.integers(0, 6, budget + k)])
    got = VB.exact_counters(prompts, records, k=k, min_n=min_n, max_n=max_n, max_tokens=budget)
    total = VB.sum_counters(got, k)
    want = [_naive_vllm_ngram(p, r, k, min_n, max_n, budget) for p, r in zip(prompts, records, strict=True)]
    for c, (d, t, a, pp) in zip(got, want, strict=True):
        assert (Fraction(c.num_drafts), Fraction(c.num_draft_tokens), Fraction(c.num_accepted_tokens)) == (d, t, a)
        assert [Fraction(v) for v in c.num_accepted_tokens_per_pos] == pp
    assert total["num_drafts"] == sum(w[0] for w in want)
    assert total["num_accepted_tokens_per_pos"] == [float(sum(w[3][j] for w in want)) for j in range(k)]


def test_exact_counters_need_a_long_enough_record():
    with pytest.raises(InvalidInput, match=r"records\[0\].*need 11"):
        VB.exact_counters([[1, 2, 1]], [[2] * 10], k=4, min_n=1, max_n=3, max_tokens=8)


# -- aggregation of recorded runs ------------------------------------------------------------------------------------

EXACT = {"num_drafts": 3.0, "num_draft_tokens": 6.0, "num_accepted_tokens": 4.0, "num_accepted_tokens_per_pos":
         [3.0, 1.0]}


def _run(cfg, b, wall, tokens=16, counters=None, same=True, r=0):
    return {"round": r, "config": cfg, "batch": b, "wall_s": wall, "tokens": tokens, "steps": 5, "request_steps": 8,
            "counters": counters, "same_as_record": same}


def _summary(runs):
    return VB.summarize(runs, [], dict(EXACT), {}, [], batches=[1, 2], k=2, min_n=1, max_n=3, max_tokens=8,
                        prompts=2, rounds=1, target="/m", version="0.32.0", load_s={}, wall_s=1.0)


def test_summarize_ratios_of_totals_and_counter_agreement():
    c = {"num_drafts": 3, "num_draft_tokens": 6, "num_accepted_tokens": 4, "num_accepted_tokens_per_pos": [3, 1]}
    runs = [_run("plain", 1, 2.0), _run("spec", 1, 1.0, counters=c), _run("plain", 2, 1.0),
            _run("spec", 2, 2.0, counters=c), _run("plain", 1, 2.0, tokens=48, r=1)]
    s = _summary(runs)
    assert s.throughput["plain"]["1"]["tokens_per_s"] == 64 / 4.0       # a ratio of totals over rounds
    assert s.throughput["plain"]["1"]["spread"] == [8.0, 24.0]
    assert s.speedup == {"1": 16.0 / 16.0, "2": 8.0 / 16.0}
    assert s.acceptance["1"]["mean_acceptance_length"] == 1 + 4 / 3
    assert s.acceptance["1"]["tokens_per_request_step"] == 2.0
    assert s.counters_exact_match and s.outputs_match_record and s.warnings == []
    json.dumps(s.as_dict())  # JSON-ready


def test_summarize_flags_counters_off_by_one_and_changed_outputs():
    bad = {"num_drafts": 3, "num_draft_tokens": 6, "num_accepted_tokens": 4, "num_accepted_tokens_per_pos": [2, 2]}
    s = _summary([_run("plain", 1, 1.0, same=False), _run("spec", 1, 1.0, counters=bad)])
    assert not s.counters_exact_match and not s.outputs_match_record
    assert any("differ from the exact prediction" in w for w in s.warnings)
    assert any("outputs differ from the record" in w for w in s.warnings)


# -- the comparison ----------------------------------------------------------------------------------------------------

def test_break_even_rules():
    assert VB.break_even([(1, 1.5), (2, 1.2), (4, 0.9)])["status"] == "stops paying"
    be = VB.break_even([(1, 2.0), (4, 0.5)])
    assert (be["pays_up_to"], be["stops_at"]) == (1, 4) and be["estimate"] == pytest.approx(2.0)
    assert VB.break_even([(1, 1.1), (2, 1.01)])["status"] == "pays at every batch"
    assert VB.break_even([(1, 0.9), (2, 0.8)])["status"] == "never pays"
    assert VB.break_even([(1, 1.2), (2, 0.9), (4, 1.1)])["status"] == "not monotone"
    assert VB.break_even([(1, 1.0)])["status"] == "never pays"  # exactly 1 does not pay


def test_compare_with_prediction_errors_and_break_even():
    measured = {"batches": [1, 2, 4],
                "throughput": {"plain": {"1": {"tokens_per_s": 10.0}, "2": {"tokens_per_s": 20.0},
                                         "4": {"tokens_per_s": 40.0}},
                               "spec": {"1": {"tokens_per_s": 15.0}, "2": {"tokens_per_s": 22.0},
                                        "4": {"tokens_per_s": 30.0}}},
                "speedup": {"1": 1.5, "2": 1.1, "4": 0.75},
                "acceptance": {"1": {"mean_acceptance_length": 2.0, "tokens_per_request_step": 1.8}}}
    pred = {"plain": [{"batch": b, "tokens_per_s": 10.0 * b * 1.25} for b in (1, 2, 4)],
            "rows": [{"draft": "ng", "k": 4, "batch": b, "tokens_per_s": t, "speedup": s, "speedup_ci95": [s - .1,
                      s + .1], "tokens_per_step": 1.7} for b, t, s in ((1, 18.0, 1.44), (2, 22.0, 0.88),
                                                                     (4, 25.0, 0.5))]
            + [{"draft": "other", "k": 4, "batch": 1, "tokens_per_s": 1.0, "speedup": 9.0, "speedup_ci95": None,
                "tokens_per_step": 1.0}]}
    c = VB.compare_with_prediction(measured, pred, "ng", 4)
    r1 = c["rows"][0]
    assert r1["plain_rel_error"] == pytest.approx(0.25) and r1["spec_rel_error"] == pytest.approx(0.2)
    assert r1["speedup_rel_error"] == pytest.approx(1.44 / 1.5 - 1)
    assert c["break_even"]["measured"]["pays_up_to"] == 2 and c["break_even"]["predicted"]["pays_up_to"] == 1
    assert not c["break_even_matches"]
    assert r1["plain_predicted_e2e"] is None and c["break_even"]["predicted_e2e"] is None  # no prefill measured
    # with the measured prefill: 4 prompts x 8 tokens; plain decodes 7 tokens each, spec 8 - 1.7 after prefill
    measured.update(prompts=4, max_tokens=8, prefill_s={"1": 1.0, "2": 0.5, "4": 0.25})
    c = VB.compare_with_prediction(measured, pred, "ng", 4)
    r1 = c["rows"][0]
    assert r1["plain_predicted_e2e"] == pytest.approx(32 / (1.0 + 4 * 7 / 12.5))
    assert r1["spec_predicted_e2e"] == pytest.approx(32 / (1.0 + 4 * (8 - 1.7) / 18.0))
    assert r1["speedup_predicted_e2e"] == pytest.approx(r1["spec_predicted_e2e"] / r1["plain_predicted_e2e"])
    assert r1["spec_rel_error_e2e"] == pytest.approx(r1["spec_predicted_e2e"] / 15.0 - 1)
    e2e = c["break_even"]["predicted_e2e"]  # speed-ups 1.35, 0.985, 0.644 at B = 1, 2, 4
    assert (e2e["status"], e2e["pays_up_to"], e2e["stops_at"]) == ("stops paying", 1, 2)
    assert c["break_even_matches_e2e"] is False  # measured: pays up to 2
    text = VB.comparison_table(c)
    assert "with the measured prefill added" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert "does NOT match" in text and len(rows) == 3
    assert "1.80 / 1.70" in rows[0]  # tokens per request-step, measured / predicted


# -- the schedule replay (benchmarks/vllm_batch/schedule.py) ----------------------------------------------------------

def test_replay_schedule_by_hand():
    from vllm_batch.schedule import replay_schedule

    # decode steps of 2, 1, 3 (tokens 5, 1 / 1 / 1, 5, 1) at concurrency 2: the third joins when the second ends
    reqs = [[5, 1], [1], [1, 5, 1]]
    assert replay_schedule(reqs, 2) == [(2, 6), (2, 2), (1, 5), (1, 1)]
    assert replay_schedule(reqs, 1) == [(1, 5), (1, 1), (1, 1), (1, 1), (1, 5), (1, 1)]
    assert replay_schedule(reqs, 8) == [(3, 7), (2, 6), (1, 1)]   # one static batch that drains
    assert replay_schedule([[], [1]], 1) == [(1, 1)]              # a request that ends with its prefill
    with pytest.raises(InvalidInput):
        replay_schedule(reqs, 0)


def test_request_tokens_follow_the_step_by_step_replay():
    from vllm_batch.schedule import request_steps, request_tokens
    from fastspec.ngram import propose

    rng = np.random.default_rng(3)
    k, budget = 3, 20
    motif = [int(v) for v in rng.integers(0, 5, 4)]
    prompts = [motif * 3, [int(v) for v in rng.integers(0, 5, 9)]]
    records = [(motif * 9)[:budget + k], [int(v) for v in rng.integers(0, 5, budget + k)]]
    got = request_tokens(prompts, records, k=k, min_n=1, max_n=2, max_tokens=budget)
    for p, r, toks in zip(prompts, records, got, strict=True):
        want, s = [], 1
        while s < budget:
            x = propose(list(p) + list(r[:s]), k, min_n=1, max_n=2, occurrence="earliest")
            a = 0
            while a < len(x) and int(x[a]) == int(r[s + a]):
                a += 1
            want.append(1 + len(x))
            s += a + 1
        assert toks == want
    assert request_steps(prompts, records, k=k, min_n=1, max_n=2, max_tokens=budget) == [1 + len(t) for t in got]


def _table(batches=(1, 4)):
    fwd = {str(b): {str(n): 0.25 * b + 0.0625 * b * n for n in range(1, 6)} for b in batches}
    ovh = {str(b): {"0": 0.0, "4": 0.125} for b in batches}
    return {"target": {"batch_forward_s": fwd}, "batch_overhead_s": ovh}


def test_step_price_interpolates_in_n_and_b():
    from vllm_batch.schedule import step_price

    t = _table()
    assert step_price(t, 1, 1, 4) == 0.25 + 0.0625                      # plain step at B = 1
    assert step_price(t, 1, 5, 4) == 0.25 + 0.3125 + 0.125               # a full verify step, overhead k
    assert step_price(t, 4, 10, 4) == pytest.approx(1.0 + 0.25 * 2.5 + 0.125)   # n = 2.5: linear in n
    two = step_price(t, 2, 2, 4)                                         # B = 2: a third of the way to 4
    assert two == pytest.approx((2 / 3) * (0.25 + 0.0625) + (1 / 3) * (1.0 + 0.25))
    assert step_price(t, 9, 9, 4) == step_price(t, 4, 4, 4)              # beyond the table: its end value


def test_schedule_predictions_plain_arithmetic_and_break_even():
    from vllm_batch.schedule import schedule_predictions

    t = _table((1, 2))
    prompts = [[1, 2, 3, 1, 2, 3], [4, 5, 6, 4, 5, 6]]
    records = [[1, 2, 3, 1, 2, 3, 1, 2], [9, 9, 8, 7, 9, 9, 8, 7]]
    measured = {"prompts": 2, "max_tokens": 6, "k": 4, "prompt_lookup": [1, 3], "records": records,
                "batches": [1, 2], "prefill_s": {"1": 0.5, "2": 0.25}, "cost_table": t,
                "throughput": {"plain": {"1": {"tokens_per_s": 10.0}, "2": {"tokens_per_s": 20.0}},
                               "spec": {"1": {"tokens_per_s": 12.0}, "2": {"tokens_per_s": 18.0}}}}
    r = schedule_predictions(measured, prompts)
    plain1 = 12 / (0.5 + 2 * 5 * (0.25 + 0.0625))           # 2 requests x 5 decode steps at B = 1
    plain2 = 12 / (0.25 + 5 * (0.5 + 0.125))                # 5 steps of both at B = 2
    assert r["rows"][0]["plain_predicted"] == pytest.approx(plain1)
    assert r["rows"][1]["plain_predicted"] == pytest.approx(plain2)
    assert r["rows"][0]["speedup_measured"] == pytest.approx(1.2)
    assert r["break_even"]["measured"]["status"] == "stops paying"
    with pytest.raises(InvalidInput, match="prompts holds 1"):
        schedule_predictions(measured, prompts[:1])


# -- the worker protocol, with a fake worker ---------------------------------------------------------------------------

FAKE = r'''
import json, os, sys, time
mode = os.environ["FAKE_MODE"]
reply = os.fdopen(os.dup(1), "w"); os.dup2(2, 1)
if mode == "exit":
    sys.exit(5)
if mode == "fail":
    reply.write(json.dumps({"error": "vllm failed: RuntimeError: no kernel"}) + "\n"); reply.flush(); sys.exit(3)
reply.write(json.dumps({"ready": True, "load_s": 0.1, "vllm_version": "fake", "block_size": 16}) + "\n")
reply.flush()
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "quit":
        break
    if mode == "hang":
        time.sleep(60)
    if mode == "die":
        sys.exit(7)
    if cmd["op"] == "bad":
        reply.write(json.dumps({"error": "vllm failed: ValueError: unknown op 'bad'"}) + "\n")
    else:
        print("vLLM chatter on stdout goes to the log")
        reply.write(json.dumps({"echo": cmd}) + "\n")
    reply.flush()
'''


@pytest.fixture
def fake_python(tmp_path):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE)
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nshift\nexec {sys.executable} {script} \"$@\"\n")  # drop the worker path
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


def _worker(fake_python, tmp_path, mode):
    return VB.BatchWorker(fake_python, {"model": "m"}, name="plain", log_path=str(tmp_path / f"{mode}.log"),
                          env={"FAKE_MODE": mode})


@pytest.mark.subprocess
def test_worker_answers_and_reports_errors(fake_python, tmp_path):
    w = _worker(fake_python, tmp_path, "ok")
    try:
        with open(os.path.join(w._tmp.name, "job.json")) as f:  # counters are read by fastspec's vLLM worker's code
            assert os.path.isfile(json.load(f)["counters_from"])
        assert w.wait_ready(30)["vllm_version"] == "fake"
        assert w.call({"op": "run", "x": 1}, 30) == {"echo": {"op": "run", "x": 1}}
        with pytest.raises(EngineError, match=r"vllm \(plain\): vllm failed: ValueError: unknown op"):
            w.call({"op": "bad"}, 30)
        assert w.call({"op": "time"}, 30) == {"echo": {"op": "time"}}  # it keeps serving
    finally:
        w.close()
    assert w.proc.returncode == 0
    assert "chatter" in (tmp_path / "ok.log").read_text()


@pytest.mark.subprocess
@pytest.mark.parametrize("mode, match", [("exit", r"exited with 5; see .*exit\.log"),
                                         ("fail", r"vllm \(plain\): vllm failed: RuntimeError: no kernel")])
def test_worker_that_does_not_start_is_one_engine_error(fake_python, tmp_path, mode, match):
    w = _worker(fake_python, tmp_path, mode)
    try:
        with pytest.raises(EngineError, match=match):
            w.wait_ready(30)
    finally:
        w.close()


@pytest.mark.subprocess
def test_worker_that_dies_or_hangs_mid_run(fake_python, tmp_path):
    w = _worker(fake_python, tmp_path, "die")
    try:
        w.wait_ready(30)
        with pytest.raises(EngineError, match="exited with 7"):
            w.call({"op": "run"}, 30)
    finally:
        w.close()
    w = _worker(fake_python, tmp_path, "hang")
    w.quit_wait_s = 1.0  # a hung worker never reads "quit": terminated after this grace (30 s by default)
    try:
        w.wait_ready(30)
        with pytest.raises(EngineError, match="no answer within 1 s"):
            w.call({"op": "run"}, 1)
    finally:
        w.close()
    assert w.proc.poll() is not None  # closed: terminated, not left behind


def test_bad_arguments_are_refused_before_anything_starts():
    for kw, match in (({"batches": [0]}, r"batches\[0\] = 0"), ({"k": 0}, "k = 0"),
                      ({"max_tokens": 1}, "max_tokens = 1")):
        with pytest.raises(InvalidInput, match=match):
            VB.measure_vllm_batch("/nonexistent/python", "/m", [[1, 2]], **kw)
    with pytest.raises(InvalidInput, match="prompts is empty"):
        VB.measure_vllm_batch("/nonexistent/python", "/m", [])


# -- the real engine -------------------------------------------------------------------------------------------------

def _tiny_model(path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=2, intermediate_size=256, max_position_embeddings=512,
                                   initializer_range=0.2, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
                                   torch_dtype="float32")
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(path)
    words = ["<s>", "</s>"] + [f"w{i}" for i in range(2, 256)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w2"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>",
                                         unk_token="w2").save_pretrained(path)
    return str(path)


@pytest.mark.vllm
@pytest.mark.hf
@pytest.mark.slow
def test_real_vllm_counters_exact_at_every_concurrency(vllm_python, tmp_path):
    model = _tiny_model(tmp_path / "target")
    rng = np.random.default_rng(0)
    prompts = []
    for i in range(4):  # repeated motifs: the n-gram proposer finds matches (prompts of >= one 128-token block)
        motif = [int(x) for x in rng.integers(2, 256, 6 + i)]
        prompts.append([0] + (motif * 40)[:130 + 3 * i])
    res = VB.measure_vllm_batch(vllm_python, model, prompts, k=3, min_n=1, max_n=3, batches=[1, 4], max_tokens=40,
                                rounds=1, cost_rounds_per_round=5, decode_steps=16, log_dir=str(tmp_path / "logs"),
                                timeout_s=900, env={"OMP_WAIT_POLICY": "PASSIVE"})
    d = res.as_dict()
    assert res.engine_version == "0.32.0"
    assert res.outputs_match_record, res.warnings        # batching and speculation keep the T = 0 tokens
    assert res.counters_exact_match, res.warnings        # at B = 1 and B = 4, to the token
    assert res.exact["num_drafts"] > 0 and 0 < res.exact["num_accepted_tokens"]  # something to check
    for cfg in VB.CONFIGS:
        for b in ("1", "4"):
            assert res.throughput[cfg][b]["tokens_per_s"] > 0
    assert len([r for r in d["runs"] if r["config"] == "spec"]) == 2
    from vllm_batch.schedule import request_steps

    steps = request_steps(prompts, res.records, k=3, min_n=1, max_n=3, max_tokens=40)
    for r in d["runs"]:  # the replayed steps per request are vLLM's own, at every concurrency
        if r["config"] == "spec":
            assert r["request_steps"] == sum(steps), r
    from fastspec.costs import CostTable

    table = CostTable.of(res.cost_table, "vllm table")
    assert sorted(table.batch_sizes) == [1, 4]
    assert all(v > 0 for b in ("1", "4") for v in res.cost_table["target"]["batch_forward_s"][b].values())
    assert os.path.exists(tmp_path / "logs" / "vllm_batch_spec.log")
