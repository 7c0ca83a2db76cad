"""Option definitions the commands share, so a flag means the same everywhere, and the translation of the
library's typed errors into messages about the flag the user typed."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

import typer

from ._common import fail

K_HELP = "Draft length(s): 4, a list 1,2,4,8 or a range 1-8 (each in 1..256)."
SCHEDULER_HELP = ("Run the α pass on Dask: local (one worker process per core), local:N (N worker processes on "
                  "this machine) or tcp://HOST:PORT (an existing dask-scheduler; every worker must see the dump's "
                  "paths). Needs pip install 'fastspec[dask]'.")


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
                              "(see data/README.md)."):
    return typer.Argument(..., metavar="DUMP", help=help)


@contextmanager
def option_errors(flag: str):
    """Report the library's InvalidInput / InvalidType as a mistake in ``flag`` (one line, exit 2)."""
    from fastspec.errors import InvalidInput, InvalidType

    try:
        yield
    except (InvalidInput, InvalidType) as exc:
        fail(flag_message(flag, str(exc)))


def flag_message(flag: str, message: str) -> str:
    """A library message about an argument, told about the flag: "top_p = 2 is invalid: ..." (the library's
    name of ``--top-p``) becomes "--top-p 2 is invalid: ..."; any other message is prefixed with the flag."""
    name = flag.lstrip("-").replace("-", "_")
    for lead in (f"{name} = ", f"{name} "):
        if message.startswith(lead):
            return f"{flag} {message[len(lead):]}"
    return f"{flag}: {message}"


def check_seed(seed: int) -> int:
    """--seed as the library takes it (an integer in [-2**63, 2**64)), checked before any work."""
    from fastspec._numba.rng import seed_bits

    with option_errors("--seed"):
        seed_bits(seed)
    return seed


def parse_k(text: str) -> list[int]:
    """--k as the sorted list of draft lengths (the library's one parser)."""
    from fastspec.simulate import parse_k_list

    with option_errors("--k"):
        return parse_k_list(text)


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
