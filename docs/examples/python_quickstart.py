"""racsim from Python: one run as DataFrames, a small sweep as a loop, a plot, a capacity plan.

Run it from the repository's root (it writes one picture, outputs/tau_sweep.png):
    python docs/examples/python_quickstart.py
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no window: the picture goes to a file

import pandas as pd  # noqa: E402

import racsim  # noqa: E402

SMALL = ["learner.trials=200", "learner.train.enabled=false"]  # a quick run: fewer trials, no training curves

# 1. One run of the default scenario. racsim.run takes what the command line takes and returns its tables.
t = racsim.run(overrides=SMALL)
print(t.results[["corrector", "bias_exact", "reduction_exact", "wallclock_ratio"]].round(5).to_string(index=False))
print(t.channels[["channel", "emitted", "injected", "dropped", "pending", "delay_p95_steps"]].to_string(index=False))

# 2. A sweep as a loop: RAC's bias against its age scale tau_age (the command line's `racsim -m` does the same).
rows = []
for tau in (2, 10, 50, 1000):
    r = racsim.run(overrides=[*SMALL, "corrector.names=[naive,rac]", f"corrector.tau_age={tau}"]).results
    rac = r.set_index("corrector").loc["rac"]
    rows.append({"tau_age": tau, "rac bias": rac["bias_exact"], "x less than naive": rac["reduction_exact"]})
sweep = pd.DataFrame(rows)
print(sweep.round(5).to_string(index=False))

# 3. A plot: any DataFrame method works.
ax = sweep.plot(x="tau_age", y="rac bias", logx=True, marker="o", legend=False)
ax.set_ylabel("RAC's exact bias")
Path("outputs").mkdir(exist_ok=True)  # where racsim writes its runs (ignored by git)
ax.figure.savefig("outputs/tau_sweep.png", dpi=80)

# 4. A capacity plan: the fewest GPUs behind the judge that meet the scenario's targets.
plan = racsim.run("capacity/judge_rm_h100", overrides=["learner.trials=20"])
print("recommended:", plan.recommended, "GPUs")
rac = plan.curve[plan.curve["corrector"] == "rac"]
print(rac[["count", "load", "status", "bias_exact", "step_s", "dropped_frac"]].round(4).to_string(index=False))
