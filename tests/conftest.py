"""Shared fixtures. Tests are CPU-first; keep each one small (CI has 2 cores)."""

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_runtest_setup(item):
    """A gpu-marked test selected without a CUDA device (``-m "not slow"`` replaces the default ``-m`` that leaves
    them out) is skipped, saying why, instead of failing in its first ``.cuda()``."""
    if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (marked gpu)")


@pytest.fixture(autouse=True)
def _close_figures():
    """Figures a test draws and does not close (a report's _ppl_figure, looked at) are closed after it: pyplot keeps
    them for the process, and past 20 every later figure warned, in the runs of other tests."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


@pytest.fixture
def tiny_text_dir(tmp_path: Path) -> Path:
    """A few dozen small Python-like documents: enough to train a tokenizer and a few steps, in seconds."""
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(40):
        body = "\n".join(
            f"def function_{i}_{j}(x, y={j}):\n    '''Return x plus {j} times y.'''\n    return x + {j} * y\n"
            for j in range(8 + i % 5)
        )
        (root / f"doc_{i:03d}.py").write_text(textwrap.dedent(body))
    return root


def local_data_yaml(corpus: Path, cache: Path, vocab_size: int = 400, **extra) -> str:
    """The ``data:`` section of the tests' tiny YAML configs: the ``tiny_text_dir`` corpus, a small tokenizer and a
    cache of the test's own (so no test reads or writes data/cache); ``extra`` adds keys to it (YAML values)."""
    text = textwrap.dedent(f"""\
        data:
          sources:
            embedded: null
            local: {{kind: files, paths: ["{corpus}/*.py"]}}
          tokenizer: {{vocab_size: {vocab_size}, sample_chars: 200000}}
          cache_dir: {cache}
          val_fraction: 0.1
        """)
    return text + "".join(f"  {key}: {value}\n" for key, value in extra.items())


def tiny_run_yaml(corpus: Path, cache: Path, *, steps: int = 3, batch_size: int = 4, ckpt_every: int = 0,
                  phases: str = "", **data_extra) -> str:
    """A whole tiny YAML config over ``local_data_yaml``'s data: 1 layer of d_model 32 at 32 tokens, ``steps`` steps
    of ``batch_size`` sequences on the CPU, validated at the end on one batch, every step logged, a checkpoint every
    ``ckpt_every`` steps (0: none); ``phases``: a ``phases:`` section's YAML, as written after its key."""
    text = local_data_yaml(corpus, cache, **data_extra) + textwrap.dedent(f"""\
        model: {{n_layers: 1, d_model: 32, n_heads: 2}}
        train: {{seq_len: 32, batch_size: {batch_size}, steps: {steps}, val_every: 0, val_batches: 1, log_every: 1,
                 ckpt_every: {ckpt_every}}}
        optim: {{lr: 0.003, warmup_steps: 1}}
        trainer: {{accelerator: cpu}}
        """)
    return text + (f"phases:\n{textwrap.indent(textwrap.dedent(phases), '  ')}" if phases else "")


def load_script(path: str):
    """The module of a repository script (``"scripts/study.py"``, ``"train.py"``), loaded from its file as a user
    runs it, so a test can call its ``main`` / ``parser`` in-process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(path).stem, REPO / path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_train(*args, check: bool = True, timeout: int = 600, env: dict | None = None, script: str = "train.py", **kw):
    """``python train.py ARGS`` (or another ``script``) as a user runs it, from the repository root, one intra-op
    thread, no inherited distributed environment (a DDP launcher's RANK etc. would change what the child does);
    ``env`` adds variables. Returns the CompletedProcess."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, str(REPO / script), *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, **kw)  # fmt: skip
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@dataclass
class Finished:
    """What ``train_here`` returns: the fields of ``subprocess.CompletedProcess`` the tests read, and the Python
    warnings the run raised past its filters (a child prints them on stderr; pytest would capture them here)."""

    returncode: int
    stdout: str
    stderr: str
    warnings: list


@pytest.fixture
def train_here(capsys):
    """``train.py ARGS`` in this process, through the script's own ``main`` and ``run_cli``: what ``run_train``'s
    child would return and print, without its ~10 s of torch and Lightning imports. One intra-op thread, as the
    child has. The warnings that pass the filters (``run_cli``'s own included, set inside the call and gone after
    it) come back as ``Finished.warnings``, the messages as text. What needs a process of its own (a signal, a
    second process, the exit status a shell sees) stays with ``run_train``. Reads (and so empties) ``capsys`` at
    each call."""
    import warnings

    from minilm.cli import run_cli

    script = load_script("train.py")

    def call(*args, check: bool = True) -> Finished:
        capsys.readouterr()
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            # record=True: shown warnings are kept, not printed; entering resets the once-per-place registries, so
            # a warning an earlier test raised is seen again, as a fresh process would see it
            with warnings.catch_warnings(record=True) as caught:
                code = run_cli(script.main, script.parser(), [str(a) for a in args])
        finally:
            torch.set_num_threads(before)
        out, err = capsys.readouterr()
        if check and code != 0:
            raise AssertionError(f"train.py failed ({code}):\n{out[-3000:]}\n{err[-3000:]}")
        return Finished(code, out, err, [str(w.message) for w in caught])

    return call


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def one_thread():
    """One intra-op thread for the duration of a test: for tests of many tiny ops (decoding, tiny models), where on
    a shared 2-core machine a second thread spends its time waiting (measured: 30 training steps of a position test
    took 1.3 s with one thread, 28 s with two). Modules opt in with ``pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def python_doc(rng: np.random.Generator, n_funcs: int, tag: str) -> str:
    """A Python-like document of ``n_funcs`` small functions with random argument names (data and eval corpora)."""
    words = ["alpha", "beta", "gamma", "delta", "value", "index", "result", "total", "count", "item"]
    out = []
    for j in range(n_funcs):
        a, b = rng.choice(words, 2)
        out.append(f"def {tag}_{a}_{j}({a}, {b}={j}):\n    '''Return {a} plus {j} times {b}.'''\n"
                   f"    return {a} + {j} * {b}\n")  # fmt: skip
    return "\n".join(out)
