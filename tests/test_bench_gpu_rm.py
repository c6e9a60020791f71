"""racsim-bench --gpu-rm --token-budget: a budget the judge cannot take stops the command with
one line naming the key (the benchmark itself is timed by hand, not in CI)."""

import pytest

from racsim.bench import main


@pytest.mark.parametrize("budget", ["0", "-5"])
def test_bad_token_budget_names_the_key(budget, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--gpu-rm", "chunked", "--token-budget", budget, "--quick"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--token-budget {budget}" in err and "pipeline.channels.judge.rm.token_budget" in err
