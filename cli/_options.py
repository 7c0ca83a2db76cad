"""Option definitions the commands share, so a flag means the same everywhere, and the translation of the
library's typed errors into messages about the flag the user typed."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

import typer
from fastspec.config import MAX_NEW_TOKENS, MAX_REPEATS
from fastspec.errors import InvalidInput
from fastspec.machine import available_cpus

K_HELP = "Draft length(s): 4, a list 1,2,4,8 or a range 1-8 (each in 1..256)."
SCHEDULER_HELP = ("Run the α pass on Dask: local (one worker process per core), local:N (N worker processes on "
                  "this machine) or tcp://HOST:PORT (an existing dask-scheduler; every worker must see the dump's "
                  "paths). Needs pip install 'fastspec[dask]'.")


# Bounds of the real-model commands (dump, cost, measure), checked before torch is imported or any model loaded
# (README "Bounds"): run-time guards -- a value past them is a typo or runs for days -- and sizes no array may take.
#: --max-new-tokens and --context-length: tokens (the models' position limits are checked once they are loaded,
#: before any generation); --repeats and --cost-repeats: rounds; --warmup: rounds discarded (fastspec.config)
MAX_TOKENS = MAX_NEW_TOKENS
#: --seed of dump, cost and measure: [0, 2**63) (NumPy's generators take no negative seed, and the loop's derived
#: seeds keep 63 bits: 2**63 + s would repeat s)
SEED_END = 1 << 63
TOKENS_HELP = f"at most {MAX_TOKENS} (2**20)"
REPEATS_HELP = f"1..{MAX_REPEATS}"
SEED_HELP = "an integer in [0, 2**63)"
THREADS_HELP = "1..the CPUs this process may run on"


POLICY_HELP = ("A draft-length policy replayed next to the fixed k (repeatable): fixed:k=K | "
               "conf:theta=T,kmax=K[,on=token|max] (stop when the draft's probability of its token, or its max, "
               "falls below T) | specdec:h=H,kmax=K[,on=token|max] (stop when 1 - prod of the drafts' probabilities "
               ">= H) | hf[:k=20,schedule=constant|heuristic|heuristic_transient,theta=0.4,tune=roc|off] (Hugging "
               "Face's assisted generation; bare hf: transformers 5.24's defaults).  Needs a dense dump with a model "
               "draft; exact DP or Monte-Carlo (--trials, --seed), as the output says.")


def policy_option(help: str = POLICY_HELP):
    return typer.Option(None, "--policy", metavar="SPEC", help=help)


def parse_policy_options(specs, flag: str = "--policy") -> list:
    """The --policy values as :class:`fastspec.policies.DraftPolicy` (each once), checked before any work; a bad one is
    one line naming the flag and why (exit 2)."""
    from fastspec.errors import InvalidType
    from fastspec.policies import parse_policy

    out = []
    for spec in specs or ():
        try:
            out.append(parse_policy(spec, name=flag))
        except (InvalidInput, InvalidType) as exc:
            raise FlagError(str(exc)) from None
    return list(dict.fromkeys(out))


def k_option(default: str = "4", extra: str = ""):
    return typer.Option(default, "--k", metavar="K", help=K_HELP + (" " + extra if extra else ""))


def temperature_option(default: Optional[float] = None, help: str = ""):
    return typer.Option(default, "--temperature", metavar="T", help=help or "Temperature for target and draft "
                        "(0 = greedy); default: the dump's recorded one.")


def top_k_option(default: Optional[int] = None, help: str = ""):
    return typer.Option(default, "--top-k", metavar="K", help=help or "Top-k for target and draft (0 disables); "
                        "default: the dump's recorded one.")


def top_p_option(default: Optional[float] = None, help: str = ""):
    return typer.Option(default, "--top-p", metavar="P", help=help or "Top-p for target and draft, in (0, 1]; "
                        "default: the dump's recorded one.")


def min_p_option(default: Optional[float] = None, help: str = ""):
    return typer.Option(default, "--min-p", metavar="P", help=help or "Min-p for target and draft, in [0, 1); "
                        "default: the dump's recorded one.")


def seed_option(help: str = "Seed; the same seed gives identical output whatever the number of threads."):
    return typer.Option(0, "--seed", metavar="SEED", help=help)


def target_option():
    """``--target MODEL`` of the real-model commands (dump, measure, cost)."""
    return typer.Option(..., "--target", metavar="MODEL", help="Target model: a local Hugging Face model directory or "
                        "a .gguf file.")


def json_option(help: str = "Print one JSON object on stdout."):
    return typer.Option(False, "--json", help=help)


def scheduler_option():
    return typer.Option(None, "--scheduler", metavar="SPEC", help=SCHEDULER_HELP)


def integrity_option():
    return typer.Option(True, "--integrity-check/--no-integrity-check", help="Check the CRC-32 of each uncompressed "
                        ".npz member as it is read (on by default; about 0.3 CPU-seconds per GiB). "
                        "--no-integrity-check skips it for storage you trust; compressed members are always checked "
                        "by the decompressor.")


def dump_argument(help: str = "Logit dump: an .npz file, a directory of .npy files or a directory of shards "
                              "(format: docs/reference/dump-format.md)."):
    return typer.Argument(..., metavar="DUMP", help=help)


class FlagError(InvalidInput):
    """A mistake in a command-line option, its message already told about the flag the user typed: the
    command's one error boundary (``cli.main``: InvalidInput) prints it as one line and exits 2; the translators
    below (:func:`option_errors`, :func:`argument_errors`) pass it on unchanged."""


@contextmanager
def option_errors(flag: str):
    """Raise the library's InvalidInput / InvalidType as a :class:`FlagError` about ``flag`` (one line, exit 2)."""
    from fastspec.errors import InvalidType

    try:
        yield
    except FlagError:
        raise
    except (InvalidInput, InvalidType) as exc:
        raise FlagError(flag_message(flag, str(exc))) from None


def flag_message(flag: str, message: str, name: str | None = None) -> str:
    """A library message about an argument, told about the flag: "top_p = 2 is invalid: ..." (the library's
    name of ``--top-p``; ``name`` when the library calls it otherwise) becomes "--top-p 2 is invalid: ..."; any
    other message is prefixed with the flag."""
    names = dict.fromkeys(n for n in (name, flag.lstrip("-").replace("-", "_")) if n)
    for n in names:
        for lead in (f"{n} = ", f"{n} "):
            if message.startswith(lead):
                return f"{flag} {message[len(lead):]}"
    return f"{flag}: {message}"


def config_from_flags(build, table: dict, conflicts: dict | None = None):
    """``build(**fields)`` (a library config) from a command's one table ``{flag: (field, value)}``: the library
    validates each field once; its typed error about field(s) (``exc.arguments``, fastspec.simulation.config.about)
    becomes one line about the flag(s) the user typed (:func:`flag_errors`)."""
    with flag_errors(table, conflicts):
        return build(**{name: value for name, value in table.values()})


#: the settings every engine's measurement takes (fastspec.runs.check_run): the library's argument names -> the flags
RUN_FLAGS = {"ks": "--k", "max_new_tokens": "--max-new-tokens", "seed": "--seed", "max_prompts": "--max-prompts"}


@contextmanager
def named_argument_errors(flags: dict):
    """Raise the library's :class:`InvalidInput` about an argument (``exc.argument``, a key of ``flags``, the
    library's argument names -> the flags they come from) as a :class:`FlagError` about that flag; any other error
    passes unchanged."""
    try:
        yield
    except InvalidInput as exc:
        flag = flags.get(getattr(exc, "argument", None))
        if flag is None:
            raise
        raise FlagError(flag_message(flag, str(exc))) from None


@contextmanager
def flag_errors(table: dict, conflicts: dict | None = None):
    """Raise the library's typed error about the fields of ``table`` (``{flag: (field, value)}``, the fields named by
    ``exc.arguments``) as a :class:`FlagError` about their flags: ``conflicts`` words the refusals of a combination
    of fields for the command line (``{(field, ...): message}``); any other error passes unchanged."""
    from fastspec.errors import InvalidType

    try:
        yield
    except FlagError:
        raise
    except (InvalidInput, InvalidType) as exc:
        names = getattr(exc, "arguments", None)
        flags = {name: flag for flag, (name, _) in table.items()}
        if names and names in (conflicts or {}):
            raise FlagError(conflicts[names]) from None
        if not names or not all(n in flags for n in names):
            raise
        flag = "/".join(flags[n] for n in names)
        raise FlagError(flag_message(flag, str(exc), names[0] if len(names) == 1 else None)) from None



def check_range(flag: str, value: Optional[int], low: int, high: int, unit: str = "") -> Optional[int]:
    """``value`` (None: not given) when in [low, high], else the one-line error naming ``flag`` (exit 2)."""
    from fastspec.errors import InvalidType, check_int

    if value is not None:
        try:
            check_int(flag, value, low, high)
        except (InvalidInput, InvalidType):
            raise FlagError(f"{flag} {value} is invalid: use an integer in [{low}, {high}]"
                            + (f" ({unit})" if unit else "")) from None
    return value


def check_model_seed(seed: int) -> int:
    """--seed of dump, cost and measure: an integer in [0, 2**63) (:data:`SEED_END`), the range every step of the
    real-model pipeline takes alike (NumPy's generators, the loop's derived seeds, simulate's seed): the library's
    rule (fastspec.runs.check_model_seed), told about the flag."""
    from fastspec.runs import check_model_seed as library_check

    with option_errors("--seed"):
        return library_check(seed)


def check_threads(threads: Optional[int]) -> Optional[int]:
    """--threads (None: the default) in [1, the CPUs this process may run on], before torch is imported: a count
    past them only oversubscribes the cores, and a huge one made OpenBLAS crash the process (RLIMIT_NPROC)."""
    return check_range("--threads", threads, 1, available_cpus(), "the CPUs this process may run on")


@contextmanager
def argument_errors(flags: dict):
    """Raise the library's InvalidInput / InvalidType about one of several arguments as a :class:`FlagError` about
    its flag: ``flags`` maps the library's argument name to (flag, the value as typed); a message ``"name = value
    ..."`` becomes ``"--flag typed ..."`` (one line, exit 2).  A message about no listed argument names the first
    flag."""
    import re

    from fastspec.errors import InvalidType

    try:
        yield
    except FlagError:
        raise
    except (InvalidInput, InvalidType) as exc:
        msg = str(exc)
        for name, (flag, typed) in flags.items():
            m = re.match(rf"{re.escape(name)} = [^\s:]+", msg)
            if m:
                raise FlagError(f"{flag} {typed}{msg[m.end():]}") from None
        flag, typed = next(iter(flags.values()))
        raise FlagError(f"{flag} {typed}: {msg}") from None


def parse_k(text: str, flag: str = "--k") -> list[int]:
    """--k (or ``flag``, e.g. --cost-k) as the sorted list of draft lengths (the library's one parser)."""
    from fastspec.analysis import parse_k_list
    from fastspec.errors import InvalidType

    try:
        return parse_k_list(text)
    except (InvalidInput, InvalidType) as exc:  # "k = 0 ..." told as "--cost-k 0 ..."
        raise FlagError(flag_message(flag, str(exc), "k")) from None


def check_sampling(temperature=None, top_k=None, top_p=None, min_p=None):
    """Validate each sampling option that was given (None = not given) with fastspec.params' rules, naming the
    flag; returns the given ones as a dict of library argument names."""
    from fastspec.params import SamplingParams

    given = {n: v for n, v in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("min_p", min_p))
             if v is not None}
    for name, value in given.items():
        with option_errors("--" + name.replace("_", "-")):
            SamplingParams(**{name: value})
    return given


def sampling_params(temperature: float, top_k: int, top_p: float, min_p: float):
    """The validated :class:`fastspec.params.SamplingParams` of --temperature/--top-k/--top-p/--min-p."""
    from fastspec.params import SamplingParams

    return SamplingParams(**check_sampling(temperature, top_k, top_p, min_p))
