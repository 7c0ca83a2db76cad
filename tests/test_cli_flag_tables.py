"""Each command maps its flags onto the library's config in one table (issue #29, item 4): the library validates
every value once, and its error about an argument is one line naming the flag the user typed (exit 2), before any
work; a command that reads a dump opens it once."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from fastspec import save_dump
from fastspec_cli.main import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


_PROGRESS = re.compile(r"^fastspec: [\w ()]+: \d+(/\d+)?$")  # a progress line (loading models) on a non-terminal


def one_line(r, prefix: str) -> str:
    """The single stderr line of a bad-input exit, which must start with ``prefix`` (the flag)."""
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if not _PROGRESS.match(ln)]
    assert len(lines) == 1 and lines[0].startswith(f"fastspec: error: {prefix}"), r.stderr
    assert "Traceback" not in r.stderr and "np." not in r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    rng = np.random.default_rng(3)
    n, t, v = 3, 12, 16
    target = rng.normal(0, 2, (n, t, v))
    path = tmp_path_factory.mktemp("d") / "pair.npz"
    return save_dump(str(path), target.astype(np.float16),
                     {"near": (target + rng.normal(0, 0.5, (n, t, v))).astype(np.float16)},
                     temperature=1.0, top_k=0, top_p=1.0)


def _costs_table(n=12) -> dict:
    return {"version": 1, "machine": "test",
            "target": {"forward_s": {str(i): 0.01 + 0.0002 * i for i in range(1, n + 1)}},
            "drafts": {"near": {"forward_s": {"1": 0.002}}}, "overhead_s": {str(i): 0.0003 for i in range(0, n)}}


@pytest.fixture(scope="module")
def costs(tmp_path_factory):
    p = tmp_path_factory.mktemp("c") / "costs.json"
    p.write_text(json.dumps(_costs_table()))
    return str(p)


@pytest.fixture(scope="module")
def priced_dump(tmp_path_factory):
    """A dump that records its cost table."""
    rng = np.random.default_rng(4)
    target = rng.normal(0, 2, (3, 12, 16))
    path = tmp_path_factory.mktemp("p") / "priced.npz"
    return save_dump(str(path), target, {"near": target + rng.normal(0, 0.5, target.shape)}, temperature=1.0,
                     costs=_costs_table())


@pytest.fixture
def opens(monkeypatch):
    """The number of times an .npz dump is opened (every open_dump of a file goes through the opener's load_dump)."""
    from fastspec.io import opener

    count = {"n": 0}
    real = opener.load_dump

    def counted(*a, **kw):
        count["n"] += 1
        return real(*a, **kw)

    monkeypatch.setattr(opener, "load_dump", counted)
    return count


def _no_work(monkeypatch, module, name):
    """Fail the test if the command reaches ``module.name`` (the work after the checks)."""
    monkeypatch.setattr(module, name, lambda *_a, **_kw: pytest.fail(f"{name} reached before the flags were checked"))


# ------------------------------------------------------------------ policy-search

POLICY_SEARCH_BAD = [("--costs", "no-such-costs.json"), ("--budget-s", "0"), ("--trials", "1"),
                     ("--seed", str(2 ** 64)), ("--temperature", "-1"), ("--top-k", "-3"), ("--top-p", "1.5"),
                     ("--min-p", "1")]


def test_policy_search_table_is_covered():
    """Every flag of the command's table but --draft (checked against the dump) has a bad value here."""
    import inspect as pyinspect

    from fastspec_cli import policy_cmd

    src = pyinspect.getsource(policy_cmd.policy_search_command)
    table = src[src.index("flags = {"):src.index("conflicts = {")]
    assert table
    flags = {f for f in ("--costs", "--draft", "--budget-s", "--trials", "--seed", "--temperature", "--top-k",
                         "--top-p", "--min-p") if f'"{f}"' in table}
    assert flags - {"--draft"} == {f for f, _ in POLICY_SEARCH_BAD}


@pytest.mark.parametrize("flag, value", POLICY_SEARCH_BAD)
def test_policy_search_bad_flag_is_one_line_before_the_dump_is_read(dump, costs, opens, flag, value, monkeypatch):
    from fastspec.simulation import policy_search

    _no_work(monkeypatch, policy_search, "policy_features")
    line = one_line(run("policy-search", dump, "--costs", costs, flag, value), flag)
    assert opens["n"] == 0, line  # refused before the dump was opened
    for name in ("budget_s", "top_p", "min_p", "top_k", "temperature =", "trials =", "seed ="):
        assert name not in line  # told about the flag, not the library's argument


def test_policy_search_opens_the_dump_once(dump, priced_dump, costs, opens):
    for args in ([dump, "--costs", costs], [priced_dump]):  # a given table; the dump's recorded one
        before = opens["n"]
        r = run("policy-search", *args, "--trials", "10", "--json")
        assert r.exit_code == 0, r.stderr
        assert opens["n"] == before + 1, args
    r = run("policy-search", dump)  # the dump records no table: refused after one open, naming --costs
    assert "needs one" in one_line(r, "--costs: ") and opens["n"] == 3


def test_policy_search_config_tags_its_errors_and_is_one_way_in(dump, costs):
    from fastspec.errors import InvalidInput
    from fastspec.simulation.policy_search import PolicySearchConfig, search_policies

    for field, value in (("budget_s", 0), ("trials", 1), ("seed", 2 ** 64), ("top_p", 1.5), ("costs", "nope.json")):
        with pytest.raises((InvalidInput, TypeError)) as exc:
            PolicySearchConfig(**{"costs": costs, field: value})
        assert exc.value.arguments == (field,)
    config = PolicySearchConfig(costs=costs, trials=10, grid=["fixed:k=2"])
    assert search_policies(dump, config=config).draft == "near"
    with pytest.raises(InvalidInput, match="not both"):
        search_policies(dump, config=config, trials=20)


# ------------------------------------------------------------------ inspect

INSPECT_BAD = [("--k", "0"), ("--k", "1-1000"), ("--temperature", "-1"), ("--top-k", "-3"), ("--top-p", "1.5"),
               ("--min-p", "1")]


@pytest.mark.parametrize("flag, value", INSPECT_BAD)
def test_inspect_bad_flag_is_one_line_before_the_dump_is_read(dump, opens, flag, value):
    line = one_line(run("inspect", dump, flag, value), f"{flag} ")
    assert opens["n"] == 0, line
    assert "ks =" not in line and " ks " not in line and "top_p" not in line and "min_p" not in line


def test_inspect_opens_the_dump_once(dump, opens):
    r = run("inspect", dump, "--k", "1,2", "--json")
    assert r.exit_code == 0, r.stderr
    assert opens["n"] == 1 and json.loads(r.stdout)["acceptance"]["near"]["exact"]


def test_inspect_config_tags_its_errors_and_is_one_way_in(dump):
    from fastspec.acceptance import InspectConfig, inspect_dump
    from fastspec.errors import InvalidInput

    for field, value in (("ks", 0), ("top_p", 1.5), ("temperature", -1.0)):
        with pytest.raises(InvalidInput) as exc:
            InspectConfig(**{field: value})
        assert exc.value.arguments == (field,)
    config = InspectConfig(ks=(2, 1), temperature=0.5)
    assert inspect_dump(dump, config=config).ks == (2, 1)
    with pytest.raises(InvalidInput, match=r"one by one \(top_k\), not both"):
        inspect_dump(dump, config=config, top_k=3)


# ------------------------------------------------------------------ audit-output

AUDIT_BAD = [("--temperature", "-1"), ("--top-k", "-3"), ("--top-p", "2"), ("--min-p", "1"), ("--epsilon", "0"),
             ("--epsilon", "1"), ("--seed", str(2 ** 64))]


@pytest.mark.parametrize("flag, value", AUDIT_BAD)
def test_audit_output_bad_flag_is_one_line_before_torch(tmp_path, monkeypatch, flag, value):
    from fastspec_cli import audit_output_cmd

    _no_work(monkeypatch, audit_output_cmd, "import_hf")
    _no_work(monkeypatch, audit_output_cmd, "load_models")
    line = one_line(run("audit-output", "--target", tmp_path / "no-model", "--tokens", tmp_path / "no.jsonl",
                        flag, value), f"{flag} ")
    assert "no-model" not in line and "no.jsonl" not in line  # nothing was looked for on disk first


def test_audit_epsilon_message_is_the_flags():
    line = one_line(run("audit-output", "--target", "m", "--tokens", "t.jsonl", "--epsilon", "0"), "--epsilon ")
    assert line == "fastspec: error: --epsilon 0.0 is invalid: use a number in (0, 1), e.g. 1e-6"


def test_audit_config_tags_its_errors_and_is_one_way_in():
    from fastspec.audit import AuditConfig, OutputAudit
    from fastspec.errors import InvalidInput

    for field, value in (("epsilon", 1.0), ("top_p", 2.0), ("seed", 2 ** 64), ("alpha", 0.6)):
        with pytest.raises(InvalidInput) as exc:
            AuditConfig(**{field: value})
        assert exc.value.arguments == (field,)
    config = AuditConfig(temperature=0.5, seed=3)
    a = OutputAudit(config=config)
    assert a.params.temperature == 0.5 and a.seed == 3 and a.config is config
    with pytest.raises(InvalidInput, match=r"one by one \(seed\), not both"):
        OutputAudit(config=config, seed=4)


# ------------------------------------------------------------------ cost

COST_BAD = [("--k", "0"), ("--temperature", "-1"), ("--top-k", "-3"), ("--top-p", "2"), ("--min-p", "1"),
            ("--batch", "0"), ("--batch", "1,,2"), ("--repeats", "0"), ("--repeats", "1001"), ("--warmup", "101"),
            ("--max-new-tokens", "0"), ("--context-length", "0"), ("--seed", "-1"), ("--seed", str(2 ** 63))]


def test_cost_table_is_covered():
    import inspect as pyinspect

    from fastspec_cli import cost_cmd

    src = pyinspect.getsource(cost_cmd.cost_command)
    table = src[src.index("flags = {"):src.index("config = config_from_flags")]
    assert {f for f, _ in COST_BAD} == set(re.findall(r'"(--[a-z-]+)": \(', table))


@pytest.mark.parametrize("flag, value", COST_BAD)
def test_cost_bad_flag_is_one_line_before_torch(tmp_path, monkeypatch, flag, value):
    from fastspec_cli import cost_cmd

    _no_work(monkeypatch, cost_cmd, "import_hf")
    line = one_line(run("cost", "--target", tmp_path / "no-model", flag, value), f"{flag} ")
    assert "no-model" not in line
    for name in ("max_new_tokens", "context_length", "top_p", "batches", "repeats =", "warmup =", "seed ="):
        assert name not in line


def test_cost_messages_are_the_flags():
    """The library's bounds, told about the flags exactly as the command told them before (README "Bounds")."""
    cases = {("--repeats", "1001"): "--repeats 1001 is invalid: use an integer in [1, 1000] (rounds)",
             ("--warmup", "101"): "--warmup 101 is invalid: use an integer in [0, 100] (rounds)",
             ("--context-length", "0"): "--context-length 0 is invalid: use an integer in [1, 1048576] (tokens)",
             ("--seed", "-1"): f"--seed -1 is invalid: use an integer in [0, 2**63) (0..{2 ** 63 - 1})",
             ("--batch", "1,,2"): "--batch '1,,2' is not a list of batch sizes; write e.g. 1,2,4,8"}
    for (flag, value), want in cases.items():
        assert one_line(run("cost", "--target", "m", flag, value), flag) == f"fastspec: error: {want}"


@pytest.mark.hf
def test_cost_batch_budget_is_the_librarys_and_names_the_flag(tmp_path, monkeypatch):
    """The largest batch forward is checked once, by fastspec.hf.measure_costs before any forward, and told about
    --batch."""
    from hf_models import save_model

    from fastspec.hf import timing

    monkeypatch.setattr(timing, "KVRunner", lambda *_a, **_kw: pytest.fail("a forward ran before the check"))
    target = save_model(tmp_path / "t", 0)
    line = one_line(run("cost", "--target", target, "--k", "8", "--batch", "4096", "--context-length", "8"),
                    "--batch: ")
    assert "B = 4096 with k up to 8 feeds 36864 tokens" in line


# ------------------------------------------------------------------ dump

DUMP_BAD = [("--temperature", "-1"), ("--top-k", "-3"), ("--top-p", "2"), ("--min-p", "1"), ("--cost-k", "0"),
            ("--dtype", "float64"), ("--cost-repeats", "0"), ("--cost-repeats", "1001"), ("--max-new-tokens", "0"),
            ("--top-k-save", "0"), ("--top-k-save", str(2 ** 24 + 1)), ("--seed", "-1")]
#: the table's flags that take no bad value on the command line (switches)
DUMP_SWITCHES = {"--ignore-eos", "--compress", "--costs"}


def test_dump_table_is_covered():
    import inspect as pyinspect

    from fastspec_cli import dump_cmd

    src = pyinspect.getsource(dump_cmd.dump_command)
    table = src[src.index("flags = {"):src.index("config = config_from_flags")]
    assert {f for f, _ in DUMP_BAD} | DUMP_SWITCHES == set(re.findall(r'"(--[a-z-]+)": \(', table))


@pytest.mark.parametrize("flag, value", DUMP_BAD)
def test_dump_bad_flag_is_one_line_before_torch(tmp_path, monkeypatch, flag, value):
    from fastspec_cli import dump_cmd

    _no_work(monkeypatch, dump_cmd, "import_hf")
    line = one_line(run("dump", "--target", tmp_path / "no-model", "--prompts", tmp_path / "no-prompts.txt",
                        "--out", tmp_path / "d.npz", flag, value), f"{flag} ")
    assert "no-model" not in line and "no-prompts" not in line
    for name in ("max_new_tokens", "top_k_save", "cost_repeats", "top_p", " dtype ", "seed =", " k "):
        assert name not in line


def test_dump_messages_are_the_flags():
    cases = {("--dtype", "float64"): "--dtype float64: use float16 or float32",
             ("--cost-repeats", "1001"): "--cost-repeats 1001 is invalid: use an integer in [1, 1000] (rounds)",
             ("--top-k-save", "0"): "--top-k-save 0 is invalid: use an integer in [1, 16777216] (2**24, the widest "
                                    "row a dump holds)",
             ("--max-new-tokens", "0"): "--max-new-tokens 0 is invalid: use an integer in [1, 1048576] (tokens)",
             # named --k before (the text was parsed as if it were --k)
             ("--cost-k", "0"): "--cost-k 0 is invalid: the draft length must be >= 1"}
    for (flag, value), want in cases.items():
        r = run("dump", "--target", "m", "--prompts", "p.txt", "--out", "d.npz", flag, value)
        assert one_line(r, flag) == f"fastspec: error: {want}"


def test_dump_config_checks_the_cost_measurement_before_any_generation():
    from fastspec.errors import InvalidInput
    from fastspec.runs import DumpConfig

    with pytest.raises(InvalidInput) as exc:
        DumpConfig(cost_repeats=1001)
    assert exc.value.arguments == ("cost_repeats",)
    c = DumpConfig(seed=5, temperature=0.5, cost_k=(4, 2))
    m = c.cost_config
    assert (m.ks, m.repeats, m.seed, m.temperature) == ([2, 4], 10, 5, 0.5)
    assert DumpConfig(costs=False).cost_config is None


# ------------------------------------------------------------------ measure (fastspec's loop and --engine hf)

MEASURE_BAD = [("--k", "0"), ("--policy", "nonsense"), ("--temperature", "-1"), ("--top-k", "-3"), ("--top-p", "2"),
               ("--min-p", "1"), ("--dump", "no-such-dump.npz"), ("--save-dump", "no/such/dir/d.npz"),
               ("--top-k-save", "0"), ("--max-prompts", "0"), ("--trials", "1"), ("--repeats", "0"),
               ("--cost-repeats", "1001"), ("--max-new-tokens", "0"), ("--seed", "-1"),
               ("--costs", "no-such-costs.json")]
#: the table's flags that take no bad value on the command line (switches)
MEASURE_SWITCHES = {"--ignore-eos", "--hf-generate"}


def test_measure_table_is_covered():
    import inspect as pyinspect

    from fastspec_cli import measure_cmd

    src = pyinspect.getsource(measure_cmd.measure_command)
    table = src[src.index("flags = {"):src.index("config = config_from_flags")]
    assert {f for f, _ in MEASURE_BAD} | MEASURE_SWITCHES == set(re.findall(r'"(--[a-z-]+)": \(', table))


@pytest.mark.parametrize("engine", ["fastspec", "hf"])
@pytest.mark.parametrize("flag, value", MEASURE_BAD)
def test_measure_bad_flag_is_one_line_before_torch(tmp_path, monkeypatch, flag, value, engine):
    from fastspec_cli import measure_cmd

    _no_work(monkeypatch, measure_cmd, "import_hf")
    prompts = tmp_path / "p.txt"
    prompts.write_text("a b\n")
    monkeypatch.chdir(tmp_path)
    line = one_line(run("measure", "--target", tmp_path / "no-model", "--draft", "ngram", "--prompts", prompts,
                        "--engine", engine, "--ignore-eos", flag, value), flag)
    assert line[len(f"fastspec: error: {flag}")] in " :" and "no-model" not in line
    for name in ("max_new_tokens", "top_k_save", "cost_repeats", "max_prompts", "save_dump", "top_p", "seed =",
                 "policies", "measure_and_predict"):
        assert name not in line


def test_measure_messages_are_the_flags(tmp_path, monkeypatch):
    """The lines the command printed before its flags went through one table, byte for byte (the --policy line
    named the flag twice before: "--policy: --policy 'nonsense': ...")."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.txt").write_text("a b\n")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "old.npz").write_bytes(b"x")
    cases = {("--max-prompts", "0"): "--max-prompts 0 is invalid: use a positive count",
             ("--trials", "0"): "--trials 0 is invalid: give an integer from 2 to 10000000 (replays per sequence)",
             ("--repeats", "0"): "--repeats 0 is invalid: use an integer in [1, 1000] (runs)",
             ("--cost-repeats", "1001"): "--cost-repeats 1001 is invalid: use an integer in [1, 1000] (rounds)",
             ("--max-new-tokens", "0"): "--max-new-tokens 0 is invalid: use an integer in [1, 1048576] (tokens)",
             ("--top-k-save", str(2 ** 25)): "--top-k-save 33554432 is invalid: use an integer in [1, 16777216] "
                                             "(2**24, the widest row a dump holds)",
             ("--seed", str(2 ** 63)): "--seed 9223372036854775808 is invalid: use an integer in [0, 2**63) "
                                       "(0..9223372036854775807)",
             ("--temperature", "-1"): "--temperature -1 is invalid: use a finite value >= 0 (0 means greedy)",
             ("--dump", "none.npz"): "--dump none.npz: no such file or directory",
             ("--costs", "none.json"): "--costs: cost table: no such file 'none.json'",
             ("--costs", "bad.json"): "--costs: cost table (bad.json): not valid JSON (Expecting property name "
                                      "enclosed in double quotes at line 1 column 2)",
             ("--save-dump", "nodir/x.npz"): "--save-dump: out 'nodir/x.npz': directory nodir does not exist",
             ("--dump", "old.npz", "--save-dump", "x.npz"): "--dump uses an existing dump; --save-dump and "
                                                            "--top-k-save only apply to the dump measure makes",
             ("--dump", "old.npz", "--top-k-save", "4"): "--dump uses an existing dump; --save-dump and "
                                                         "--top-k-save only apply to the dump measure makes"}
    for args, want in cases.items():
        r = run("measure", "--target", "no-model", "--draft", "ngram", "--prompts", "p.txt", *args)
        assert one_line(r, args[0]) == f"fastspec: error: {want}"
    r = run("measure", "--target", "no-model", "--draft", "ngram", "--prompts", "p.txt", "--policy", "nonsense")
    assert one_line(r, "--policy 'nonsense': unknown policy kind")


def test_measure_config_tags_its_errors_and_is_one_way_in(tmp_path, monkeypatch):
    """MeasureConfig checks every setting before torch is imported, tags the argument at fault, and
    measure_and_predict takes it or the settings one by one, not both; a missing dump is refused before any model
    is loaded (it used to fail after the models were loaded and the costs measured)."""
    from fastspec.errors import InvalidInput, InvalidType
    from fastspec.policies import DraftPolicy
    from fastspec.runs import MeasureConfig

    for kwargs, names in [({"max_prompts": 0}, ("max_prompts",)), ({"trials": 1}, ("trials",)),
                          ({"repeats": 1001}, ("repeats",)), ({"ks": [2, 0]}, ("ks",)), ({"ks": []}, ("ks",)),
                          ({"policies": "conf:theta=2,kmax=4"}, ("policies",)), ({"top_p": 0}, ("top_p",)),
                          ({"dump": str(tmp_path / "none.npz")}, ("dump",)),
                          ({"dump": str(tmp_path), "top_k_save": 3}, ("dump", "save_dump", "top_k_save")),
                          ({"save_dump": str(tmp_path / "no" / "d.npz")}, ("save_dump",)),
                          ({"costs": {"version": 1}}, ("costs",)), ({"hf_generate": "yes"}, ("hf_generate",)),
                          ({"seed": -1}, ("seed",))]:
        with pytest.raises((InvalidInput, InvalidType)) as exc:
            MeasureConfig(**kwargs)
        assert exc.value.arguments == names, kwargs
    c = MeasureConfig(ks=[4, 1], policies=["fixed:k=2", "fixed:k=2"], costs=_costs_table(), temperature=0)
    assert c.ks == (1, 4) and len(c.policies) == 1 and isinstance(c.policies[0], DraftPolicy)
    assert c.costs.plain_step_s() > 0 and c.params.temperature == 0.0

    hf = pytest.importorskip("fastspec.hf")
    from fastspec.hf import pipeline

    monkeypatch.setattr(pipeline, "resolve_models", lambda *_a, **_k: pytest.fail("a model was loaded"))
    with pytest.raises(InvalidInput) as exc:
        hf.measure_and_predict("no-model", ["ngram"], "p.txt", [1], config=c)
    assert exc.value.argument == "config"
    with pytest.raises(InvalidInput) as exc:
        hf.measure_and_predict("no-model", ["ngram"], "p.txt", config=c, repeats=3)
    assert exc.value.argument == "config"
    with pytest.raises(InvalidInput) as exc:
        hf.measure_and_predict("no-model", ["ngram"], "p.txt", dump=str(tmp_path / "none.npz"))
    assert exc.value.argument == "dump"


# ------------------------------------------------------------------ measure --engine vllm / llamacpp

ENGINE_RUN_BAD = [("--max-prompts", "-3"), ("--max-prompts", "0"), ("--seed", "-1"), ("--seed", str(2 ** 32 - 1)),
                  ("--max-new-tokens", "0"), ("--k", "0")]


@pytest.mark.parametrize("engine", ["vllm", "llamacpp"])
@pytest.mark.parametrize("flag, value", ENGINE_RUN_BAD)
def test_engine_run_settings_are_the_librarys_and_come_first(tmp_path, monkeypatch, engine, flag, value):
    """The engines' measurements check --k, --max-new-tokens, --seed and --max-prompts in the library
    (fastspec.runs.check_run) before anything else: --max-prompts -3 used to slice the last three prompts off,
    and --seed -1 reached llama.cpp as its random seed (a uint32 2**32 - 1)."""
    monkeypatch.setenv("FASTSPEC_VLLM_PYTHON", str(tmp_path / "no-python"))
    monkeypatch.setenv("FASTSPEC_LLAMACPP_BIN", str(tmp_path / "no-bin"))
    prompts = tmp_path / "p.txt"
    prompts.write_text("a b\nc d\n")
    line = one_line(run("measure", "--engine", engine, "--ignore-eos", "--target", tmp_path / "no-model", "--draft",
                        "ngram", "--prompts", prompts, flag, value), f"{flag} {value}")
    assert "no-model" not in line and "no-bin" not in line


def test_engine_request_seeds_stay_below_the_random_seed():
    from fastspec.errors import InvalidInput
    from fastspec.runs import ENGINE_SEED_END, check_request_seeds, check_run

    assert ENGINE_SEED_END == 0xFFFFFFFF  # llama.cpp's LLAMA_DEFAULT_SEED: a random seed
    check_request_seeds(ENGINE_SEED_END - 3, 3)  # seeds up to 2**32 - 2
    with pytest.raises(InvalidInput) as exc:
        check_request_seeds(ENGINE_SEED_END - 3, 4)
    assert exc.value.argument == "seed" and "use a seed <= 4294967291" in str(exc.value)
    assert check_run(ks=[4, 2], max_new_tokens=8, seed=5, max_prompts=None, seed_end=ENGINE_SEED_END) == {
        "ks": (2, 4), "max_new_tokens": 8, "seed": 5, "max_prompts": None}
    with pytest.raises(InvalidInput) as exc:
        check_run(ks=1, max_new_tokens=8, seed=ENGINE_SEED_END, seed_end=ENGINE_SEED_END)
    assert exc.value.arguments == ("seed",)

