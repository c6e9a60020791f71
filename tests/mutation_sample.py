"""A fixed sample of mutmut's mutants, so that the suite's strength can be compared before and after a
change on the same mutants (issue 42). Generate the mutants (``mutmut run none``: it generates every
mutant, collects which tests reach each, then stops on the name that matches none), then run the sample:

    mutmut run $(python tests/mutation_sample.py 200); mutmut results --all true

The sample is drawn with a fixed seed from every mutant name in mutants/**/*.meta, sorted, so the same
source gives the same sample on any machine."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path


def mutant_names(root: Path = Path("mutants")) -> list:
    """Every mutant mutmut generated under ``root``, sorted."""
    return sorted(name for meta in sorted(root.rglob("*.meta"))
                  for name in json.loads(meta.read_text()).get("exit_code_by_key", {}))


def sample(names: list, n: int, seed: int = 42) -> list:
    """``n`` of ``names`` (all of them when fewer), drawn with ``seed``, sorted."""
    return sorted(random.Random(seed).sample(names, min(n, len(names))))


if __name__ == "__main__":
    names = mutant_names()
    if not names:
        sys.exit("mutation_sample: no mutants under mutants/: run `mutmut run` first to generate them")
    print("\n".join(sample(names, int(sys.argv[1]) if len(sys.argv) > 1 else 200)))
