"""Golden runs: a fixed set of racsim runs whose result tables must not change
when the code is moved around (issue 8: results byte-identical before and after).

    python tests/golden.py write   # record the digests in tests/golden.json
    python tests/golden.py check   # rerun and compare (exit 1 on a difference)

Each run goes through the real command line (``python -m racsim``), so the set
survives any reshuffle of the package. Two digests per output table:
``bytes``, the SHA-256 of the file as written (depends on the pyarrow version
that wrote it, so it is compared only when that version is the recorded one),
and ``content``, the SHA-256 of a canonical text form of the data frame (column
names, dtypes, every float by its repr, which round-trips exactly). The test
(tests/test_golden.py) compares the content digests. A change that alters
results on purpose records new digests with ``write`` and says so in its commit.

The last bits of some values depend on the CPU: NumPy picks AVX-512 loops and OpenBLAS
its SkylakeX kernels where the CPU has them, which round some sums, exponentials and
products differently from their AVX2 forms. So the golden runs pin one CPU profile
(:data:`PINNED`: NumPy's AVX2 loops, OpenBLAS's Haswell kernels), which any x86-64 CPU
with AVX2 can run, and golden.json records it; on a machine that cannot run it (no AVX2,
another architecture) the digests cannot be compared, and the check says so.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pyarrow

HERE = Path(__file__).resolve().parent
DIGESTS = HERE / "golden.json"
QUIET = ["output.plots=false", "output.progress=false"]
# The CPU profile the digests hold for (module docstring): set in every golden run's environment.
PINNED = {"NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR", "OPENBLAS_CORETYPE": "Haswell"}
PROFILE_PROBE = ("import json, platform; from numpy._core._multiarray_umath import __cpu_features__ as f, "
                 "__cpu_dispatch__ as d; print(json.dumps([platform.machine()] + [x for x in d if f[x]]))")
GPU = "channel@pipeline.channels.judge=judge_gpu_rm"

# name -> overrides. Together they reach every engine, channel kind, batcher
# order, blocking with and without a timeout, drain, kernels, every study kind,
# the capacity search and the training loop.
RUNS = {
    "default": [],
    "default_simpy_timeout": ["pipeline.engine=simpy", "learner.trials=200", "corrector.wait_timeout_s=30",
                              "learner.train.lanes=4"],
    "gpu_shortest_packed": [GPU, "pipeline.channels.judge.rm.order=shortest", "pipeline.channels.judge.rm.padded=false",
                            "pipeline.channels.judge.rm.gpus=2", "learner.trials=100", "learner.train.lanes=4"],
    "gpu_fifo_simpy_timeout": [GPU, "pipeline.engine=simpy", "corrector.wait_timeout_s=5", "learner.trials=40",
                               "pipeline.channels.judge.rm.gpus=1", "pipeline.channels.judge.rm.sequences_per_sample=4",
                               "learner.train.enabled=false"],
    "latency_kinds": ["latency@pipeline.channels.verifier.latency=pareto", "latency@pipeline.channels.judge.latency=cauchy",
                      "pipeline.channels.judge.latency.low=1", "pipeline.channels.judge.latency.high=300",
                      "pipeline.channels.judge.latency.mean=20", "pipeline.channels.verifier.latency.mean=15",
                      "learner.trials=300", "learner.train.enabled=false"],
    "latency_discrete": ["latency@pipeline.channels.verifier.latency=gaussian", "pipeline.channels.verifier.latency.std=8",
                         "pipeline.channels.verifier.latency.mean=10", "pipeline.channels.verifier.latency.discrete=true",
                         "pipeline.channels.verifier.latency.low=2", "pipeline.channels.verifier.latency.high=40",
                         "latency@pipeline.channels.judge.latency=uniform", "pipeline.channels.judge.latency.mean=30",
                         "pipeline.generate.kind=exponential", "pipeline.generate.mean=5",
                         "learner.trials=300", "learner.train.enabled=false"],
    "capacity": ["scenario=capacity/judge_rm_h100", "capacity.counts=[2,4,8]", "capacity.benchmark=false",
                 "capacity.sensitivity.enabled=false",  # its table is not a golden one (tests/test_capacity_sensitivity.py)
                 "learner.trials=20"],
    "capacity_verifier": ["scenario=capacity/code_verifier", "capacity.benchmark=false", "learner.trials=50"],
}
PAPER = ["k_sweep", "baselines_k2", "knob_ablation_k2", "cross_topology", "heavy_tail", "mdp_scaling",
         "slack_sweep", "identity_kernel", "tv_bound", "advantage_probe"]
RUNS.update({f"paper/{s}": [f"scenario=paper/{s}", "study.fast=true"] for s in PAPER})
# The paper runs' tables are also made by tests/test_paper.py's one multirun of the suite (the same overrides,
# on the same profile): the test suite compares them there (test_paper_jobs_reproduce_the_golden_tables), not twice.
SUITE_RUNS = [f"paper/{s}" for s in PAPER]
TABLES = ("results.parquet", "channels.csv", "identity.parquet", "slack.parquet")


def canonical(df: pd.DataFrame) -> bytes:
    """Column names, dtypes and values; floats by repr (exact), so equal bytes mean equal frames."""
    buf = io.StringIO()
    buf.write(json.dumps([[str(c), str(t)] for c, t in df.dtypes.items()]) + "\n")
    for row in df.itertuples(index=False):
        buf.write(json.dumps([repr(v) for v in row]) + "\n")
    return buf.getvalue().encode()


def _read(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


def profile() -> list:
    """The machine and NumPy's SIMD loops a golden run gets here: ``["x86_64", "X86_V3"]`` where
    :data:`PINNED` holds (probed without OpenBLAS's kernel pin, which needs AVX2 to load)."""
    env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": PINNED["NPY_DISABLE_CPU_FEATURES"]}
    env.pop("OPENBLAS_CORETYPE", None)
    out = subprocess.run([sys.executable, "-c", PROFILE_PROBE], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout)


def digest_run(name: str, overrides: list, root: Path) -> dict:
    """Run one golden scenario in its own folder, on the :data:`PINNED` profile; digests of every table it wrote."""
    out = root / name.replace("/", "_")
    cmd = [sys.executable, "-m", "racsim", *overrides, *QUIET, f"hydra.run.dir={out}"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=900, env={**os.environ, **PINNED})
    if done.returncode != 0:
        raise RuntimeError(f"golden run {name} failed:\n{done.stderr[-3000:]}")
    return digest_folder(out)


def digest_folder(out: Path) -> dict:
    """Digests of every golden table a run wrote in ``out`` (a run's folder, or a sweep job's written in full)."""
    tables = {}
    for f in TABLES:
        p = out / f
        if p.exists():
            with open(p, "rb") as fh:
                raw = hashlib.file_digest(fh, "sha256").hexdigest()
            tables[f] = {"bytes": raw, "content": hashlib.sha256(canonical(_read(p))).hexdigest()}
    return tables


def digest_all(workers: int = 2) -> dict:
    with tempfile.TemporaryDirectory(prefix="racsim-golden-") as tmp:
        with ThreadPoolExecutor(workers) as pool:
            futs = {n: pool.submit(digest_run, n, ov, Path(tmp)) for n, ov in RUNS.items()}
            return {n: f.result() for n, f in futs.items()}


def compare(recorded: dict, now: dict, *, raw: bool) -> list:
    """Differences as lines; ``raw`` also compares file bytes."""
    bad = []
    for name in sorted(set(recorded) | set(now)):
        a, b = recorded.get(name), now.get(name)
        if a is None or b is None or set(a) != set(b):
            bad.append(f"{name}: tables {sorted(a or {})} vs {sorted(b or {})}")
            continue
        for table in a:
            keys = ("content", "bytes") if raw else ("content",)
            for k in keys:
                if a[table][k] != b[table][k]:
                    bad.append(f"{name}/{table}: {k} digest differs")
    return bad


def unreachable(recorded: dict) -> str:
    """Why this machine cannot reproduce the recorded profile ("" if it can)."""
    here = profile()
    if here != recorded["profile"]:
        return (f"golden: this machine runs the golden runs as {here}, the digests were recorded as "
                f"{recorded['profile']} (tests/golden.py PINNED): not compared")
    return ""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    mode = argv[0] if argv else "check"
    if mode == "write":
        here = profile()
        now = digest_all()
        DIGESTS.write_text(json.dumps({"pyarrow": pyarrow.__version__, "profile": here, "runs": now}, indent=1,
                                      sort_keys=True) + "\n")
        print(f"golden: {len(now)} runs recorded in {DIGESTS} on {here}")
        return 0
    recorded = json.loads(DIGESTS.read_text())
    why = unreachable(recorded)
    if why:
        print(why)
        return 2
    now = digest_all()
    bad = compare(recorded["runs"], now, raw=recorded["pyarrow"] == pyarrow.__version__)
    for line in bad:
        print("golden:", line)
    print(f"golden: {len(now)} runs, {len(bad)} differences"
          + ("" if recorded["pyarrow"] == pyarrow.__version__ else " (content only: another pyarrow)"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
