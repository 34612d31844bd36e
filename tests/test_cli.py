"""minilm.cli: what every entry point shares."""

import subprocess
import sys

from tests.conftest import REPO

# In a fresh process (torch's worker threads not started yet), as train.py, evaluate.py and generate.py run.
SUBNORMALS_AFTER_RUN_CLI = """
import argparse, torch
from minilm.cli import run_cli
torch.set_num_threads(2)

def main(args):
    x = torch.full((4_000_000,), 2.0) * 5e-40  # subnormal in fp32 (below 1.2e-38), on both threads
    print("nonzero", int((x * 1.0).count_nonzero()))

raise SystemExit(run_cli(main, argparse.ArgumentParser()))
"""


def test_entry_points_flush_subnormals_on_every_cpu_thread():
    """Subnormal floats (a softmax over logits far below the row's maximum: ALiBi's bias at long T) make x86
    arithmetic many times slower; run_cli flushes them to zero before torch starts its worker threads, so
    every thread of an intra-op parallel region does (a thread started earlier would keep them)."""
    proc = subprocess.run([sys.executable, "-c", SUBNORMALS_AFTER_RUN_CLI], cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "nonzero 0" in proc.stdout, proc.stdout
