"""What ``simulate --batch`` adds to the README's main command (issue 24, item 4: at most 20%).

Not a test; run ``python benchmarks/bench_simulate_batch.py [rounds]``.  Warm runs (Numba's cache filled by a first
run), each a fresh process as a user runs it, interleaved round-robin (:func:`_common.time_interleaved`), medians:

* ``main``: ``fastspec simulate data/smollm2_exit_top64.npz --k 1,2,4,8`` (the README main command);
* ``main+costs``: the same with ``--costs`` a version-2 table: ``data/smollm2_costs_v2.json`` (measured with
  ``fastspec cost --batch``; when it is missing, the shipped dump's version-1 table plus a made-up batch axis, for
  timing only);
* ``main+batch5``: the same with ``--batch 1,2,4,8,16`` (5 batch sizes);
* ``main+batch1``: the README command with ``--batch 1`` and the dump's own (version-1) table (the path that reads
  the dump's table before the simulation).

Also in-process: :func:`fastspec.simulate` alone and :func:`fastspec.simulation.batch.batch_predictions` on its
result with 5 batch sizes.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _common import time_interleaved  # noqa: E402

from fastspec.io import load_dump  # noqa: E402
from fastspec.simulation import simulate  # noqa: E402
from fastspec.simulation.batch import batch_predictions  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
DUMP = ROOT / "data" / "smollm2_exit_top64.npz"
BATCHES = "1,2,4,8,16"


def fake_v2_table(path: pathlib.Path) -> str:
    obj = load_dump(str(DUMP)).costs.as_dict()
    obj["version"], obj["note"] = 2, "made-up batch axis for timing only"
    bs = [int(b) for b in BATCHES.split(",") if b != "1"]
    obj["target"]["batch_forward_s"] = {str(b): {n: v * (1 + 0.1 * b) for n, v in obj["target"]["forward_s"].items()}
                                        for b in bs}
    obj["batch_overhead_s"] = {str(b): {k: v * b for k, v in obj["overhead_s"].items()} for b in bs}
    for e in obj["drafts"].values():
        e["batch_forward_s"] = {str(b): {n: v * (1 + 0.05 * b) for n, v in e["forward_s"].items()} for b in bs}
    path.write_text(json.dumps(obj))
    return str(path)


def main(rounds: int = 7) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        shipped = ROOT / "data" / "smollm2_costs_v2.json"
        table = str(shipped) if shipped.exists() else fake_v2_table(pathlib.Path(tmp) / "v2.json")
        base = [sys.executable, "-m", "fastspec_cli", "simulate", str(DUMP), "--k", "1,2,4,8"]
        cmds = {"main": base, "main+costs": base + ["--costs", table],
                "main+batch5": base + ["--costs", table, "--batch", BATCHES], "main+batch1": base + ["--batch", "1"]}

        def runner(cmd):
            return lambda: subprocess.run(cmd, check=True, capture_output=True)

        res = time_interleaved({k: runner(c) for k, c in cmds.items()}, repeats=rounds, warmup=1)
        print(f"== README main command, warm, fresh processes, interleaved medians of {rounds} rounds")
        for k, v in res.items():
            print(f"{k:>12}: {v:7.3f} s")
        print(f"--batch {BATCHES} adds {100 * (res['main+batch5'] / res['main'] - 1):+.1f}% to the main command "
              f"({100 * (res['main+batch5'] / res['main+costs'] - 1):+.1f}% vs the same --costs without --batch); "
              f"--batch 1 with the dump's table: {100 * (res['main+batch1'] / res['main'] - 1):+.1f}%")

        sim = simulate(str(DUMP), k=[1, 2, 4, 8], costs=table)
        t0 = time.perf_counter()
        n = 0
        while time.perf_counter() - t0 < 1.0:
            batch_predictions(sim, table, BATCHES)
            n += 1
        per = (time.perf_counter() - t0) / n
        inproc = time_interleaved({"simulate": lambda: simulate(str(DUMP), k=[1, 2, 4, 8], costs=table)},
                                  repeats=3, warmup=1)["simulate"]
        print(f"in-process: simulate {inproc:.3f} s; batch_predictions (5 batch sizes) {per * 1e3:.2f} ms "
              f"({100 * per / inproc:.2f}% of it)")

        from typer.testing import CliRunner

        from fastspec_cli.main import app

        def cli(args):
            return lambda: CliRunner().invoke(app, args)

        args = [str(DUMP), "--k", "1,2,4,8", "--costs", table]
        res = time_interleaved({"cli": cli(["simulate", *args]), "cli+batch5": cli(["simulate", *args, "--batch",
                                                                                     BATCHES])},
                               repeats=rounds, warmup=1)
        print(f"in-process command (CliRunner, tables rendered): {res['cli']:.3f} s vs {res['cli+batch5']:.3f} s "
              f"with --batch {BATCHES}: {100 * (res['cli+batch5'] / res['cli'] - 1):+.1f}%")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
