"""minilm.runs.find_results: what compare_runs.py is given, and what it says when that is not a run."""

import pytest

from minilm.errors import MinilmError
from minilm.runs import find_results


def test_a_folder_of_runs_is_named_as_such(tmp_path):
    """A study's variant folder holds one run per seed; compare_runs.py told the user to evaluate the folder itself,
    which is not a run."""
    variant = tmp_path / "yarn"
    for seed in ("seed1", "seed2"):
        (variant / seed).mkdir(parents=True)
        (variant / seed / "config.yaml").write_text("run: {name: x}\n")
    with pytest.raises(MinilmError, match=r"yarn: not a run but a folder of runs \(seed1, seed2\); name them: "):
        find_results(variant)
    with pytest.raises(MinilmError, match="no such file or directory"):
        find_results(tmp_path / "missing")
    with pytest.raises(MinilmError, match=r"not a run directory \(no config.yaml\)"):
        find_results(tmp_path)  # holds no run: only a folder that does
