"""What every command-line entry point shares: config arguments, quiet start-up, and the error contract
(bad input, and a disk that is full or read-only -> one clear message on stderr, exit code 2, a traceback only with
--debug)."""

from __future__ import annotations

import argparse
import ctypes
import errno
import logging
import os
import re
import signal
import sys
import threading
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Optional, Sequence

from minilm.errors import ConfigError, MinilmError
from minilm.files import cannot_write


class Once(argparse.Action):
    """A single-valued option given twice is an error: argparse keeps the last one without a word, so
    ``--config a.yaml ... --config b.yaml`` (a command edited from the shell history) trained b alone, and
    ``evaluate.py --lengths 64 ... --lengths 128`` evaluated 128 alone. An option with a default counts as given
    only when it is on the command line."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault("_given_once", set())  # the options seen so far in this parse
        if self.dest in given:
            was = getattr(namespace, self.dest)
            parser.error(f"{option_string} given twice ({was!r} and {values!r}); give it once")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


def once_parser(**kwargs) -> argparse.ArgumentParser:
    """An ArgumentParser whose options take ``Once`` unless they name another action (``store_true`` flags do): the
    scripts' value options, each refused when given twice, without ``action=Once`` on every one of them."""
    parser = argparse.ArgumentParser(**kwargs)
    parser.register("action", None, Once)
    return parser


PARAMETER = re.compile(r"^[A-Za-z_]\w*=")  # an --extension parameter: key=value, the key a name


def add_run_args(parser: argparse.ArgumentParser, dest: str, metavar: str, help: str) -> None:
    """The run a script reads, given first (``args.<dest>``) or as ``--run`` (the same): evaluate.py took ``--run``
    alone and generate.py the run first alone, and each refused the other's form. Not required for argparse: it may
    also come after --extension's parameters, which take it; ``one_run`` then puts it back and requires it."""
    parser.add_argument(dest, nargs="?", metavar=metavar, help=f"{help} (required)")
    parser.add_argument("--run", dest="run_flag", metavar=metavar, help=f"the same as {metavar}, as a flag")


def one_run(args: argparse.Namespace, dest: str, write: str) -> None:
    """The run of ``add_run_args``, as ``args.<dest>``: the one given first or by --run (both naming different runs is
    an error), else one typed after --extension's parameters (``run_after_extension``, which refuses none at all)."""
    flag = args.run_flag
    if flag is not None:
        if getattr(args, dest) not in (None, flag):
            raise ConfigError(f"two runs given, {getattr(args, dest)!r} and --run {flag!r}; give one")
        setattr(args, dest, flag)
    run_after_extension(args, dest, write)


def run_after_extension(args: argparse.Namespace, dest: str, write: str) -> None:
    """``--prompt hi --extension logn runs/tiny``: --extension takes every word after it (nargs="+"), the run too,
    and argparse then said the run was missing. Its parameters are key=value, so a last word without one is not a
    parameter: where no run came before, it is the run, set as ``args.<dest>``. Any other such word is an error that
    says how to write the command (``write``: the script and its positional arguments, ``evaluate.py RUN``), and so is
    no run at all. The scripts whose run is positional and that take --extension (generate.py, evaluate.py) share it."""
    method, *rest = args.extension or [None]
    words = [w for w in rest if not PARAMETER.match(w)]
    run = getattr(args, dest)
    if words and run is None and words == rest[-1:]:
        setattr(args, dest, rest[-1])
        args.extension = [method, *rest[:-1]]
    elif words:
        raise ConfigError(f"--extension {method}: {words[0]!r} is not a parameter (those are key=value, e.g. "
                          f"window=256)" + (f" and the run is {run!r}" if run else "")
                          + f"; write: {write} ... --extension {method} key=value ...")  # fmt: skip
    if getattr(args, dest) is None:
        raise ConfigError(f"no run directory or checkpoint given; write: {write} ... (a run directory, a phase "
                          "directory or a model.safetensors)")  # fmt: skip


def check_home_expanded(path, flag: str) -> None:
    """Refuse an output path that begins with '~': a shell expands it neither quoted nor after '=' (``--out=~/x``),
    so it names a directory called '~' in the working directory, where the outputs then went while the command
    said it wrote '~/x/...'. ``flag``: how the user gave the path (``--out``, or ``OUT_DIR`` for an argument)."""
    first = Path(path).parts[0] if Path(path).parts else ""
    if first.startswith("~"):
        home = f"$HOME{str(path)[1:]}" if first == "~" else "/full/path"
        example = f"{flag} {home}" if flag.startswith("-") else home
        raise ConfigError(f"{flag} {str(path)!r}: '~' is not expanded (quoted, or after '='): it names a directory "
                          f"called {first!r}; write the full path, e.g. {example}")  # fmt: skip


def add_config_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--config", required=required, action=Once,
                        help="YAML experiment file (may name a 'base:' YAML)")  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="dotlist overrides, e.g. model.n_layers=2 run.dir=/tmp/x")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def quiet_libraries() -> None:
    """Keep the console to what a user acts on: Lightning's tips and worker-count hints go."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*Checkpoint directory.*exists and is not empty.*")
    warnings.filterwarnings("ignore", message=".*You're resuming from a checkpoint that ended before the epoch.*")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")  # Lightning vs torch 2.13
    # a phase shorter than train.log_every: minilm logs its scalars itself, the phase's last step included, so
    # Lightning's "you will not see logs for the training epoch" is not true of a minilm run
    warnings.filterwarnings("ignore", message=".*is smaller than the logging interval.*")


def flush_denormals() -> None:
    """Flush subnormal floats to zero on CPU (FTZ/DAZ; a no-op where the CPU has no such mode). A softmax over
    logits far below the row's maximum — a distance bias such as ALiBi's, or a sharp trained head — yields
    exp(x) below 1.2e-38, and x86 arithmetic on such subnormals is many times slower: ALiBi's SDPA backward at
    T 2048 on 2 threads took 106 ms with them and 31 ms flushed (scripts/bench_attention.py; docs/performance.md).
    Nothing of that size changes a result. Call it before torch's first parallel operation: CPU threads copy the
    mode when they start, and torch's worker threads start with the first parallel operation."""
    import torch

    torch.set_flush_denormal(True)


# glibc's mallopt parameters (malloc.h) and the values keep_freed_memory sets
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 1 << 30  # allocations from 1 GiB up still get their own mmap
MMAP_THRESHOLD_CAPPED = 32 << 20  # mallopt(3)'s upper limit on 64-bit, for a glibc that refuses 1 GiB (2.36 takes it)
MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def keep_freed_memory() -> bool:
    """Let glibc's malloc keep the memory torch frees on CPU for the next allocation, instead of handing it back to
    the kernel: the default cost a training step a page fault per 4 KB of every large tensor, every step.

    glibc serves a large request (128 KB or more, to start with) with its own mmap, returned to the kernel on free,
    and trims the free top of its heap back to the kernel past a threshold. It adapts both to the sizes it sees
    freed, but not for a training step's mix of sizes: each new page faults, about a microsecond per 4 KB. On the
    2-core development machine (AMD EPYC Zen 4, 2 threads) the logits' log-softmax of 512 × 2048 rows took 4.4 ms
    with 2,529 faults and 1.0 ms with none, and the tiny config's training phase a median 44 s instead of 50 s
    (docs/performance.md "Freed memory kept on CPU").

    This sets a static mmap threshold of 1 GiB (32 MiB where a glibc refuses more) and turns trimming off: the
    process's resident size then stays at its peak instead of shrinking after it, as with jemalloc or tcmalloc.
    Nothing is done where the user set glibc's malloc variables (``MALLOC_MMAP_THRESHOLD_``,
    ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``, a ``glibc.malloc`` tunable in ``GLIBC_TUNABLES``: theirs win)
    nor off Linux glibc. A preloaded jemalloc or tcmalloc serves malloc itself and ignores these settings. Returns
    whether it changed them."""
    if any(name in os.environ for name in MALLOC_ENV) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no glibc, no mallopt
        return False
    if not mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and not mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_CAPPED):
        return False
    return bool(mallopt(M_TRIM_THRESHOLD, -1))  # -1: never trim (mallopt(3))


def set_up_process() -> None:
    """What every command does to the process before its work (run_cli, and the benchmark scripts, which time what
    train.py runs): subnormals flushed, before torch starts its worker threads, and freed memory kept."""
    flush_denormals()
    keep_freed_memory()


_sigterm = threading.Event()  # set once a SIGTERM arrived: what the KeyboardInterrupt that reaches run_cli was
_interrupt = threading.Event()  # set once a Ctrl-C (SIGINT) or a SIGTERM arrived: the command is to stop


def _on_sigterm(signum, frame):
    """SIGTERM raised as a KeyboardInterrupt where the process is, so that everything that handles Ctrl-C —
    Lightning's graceful shutdown, the ``finally`` blocks that remove temporary files and directories — handles it
    alike (Lightning re-raises a plain one: the flag, not the exception's type, tells run_cli which it was)."""
    _sigterm.set()
    _interrupt.set()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once, as before
    raise KeyboardInterrupt


def _on_sigint(signum, frame):
    """Ctrl-C: Python's own KeyboardInterrupt, and a flag that outlives it (``raise_if_interrupted``)."""
    _interrupt.set()
    raise KeyboardInterrupt


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt again where a Ctrl-C or SIGTERM was swallowed. A signal handler's exception raised while
    Python runs a finalizer (garbage collection: a ``weakref.finalize`` callback) is printed as 'Exception ignored
    in: ...' and lost, and so is one a library catches as any exception: a study interrupted so trained on to its
    end and exited 0. Called at every training step's end, before each phase and each study run, and when a
    command returns (``run_cli``)."""
    if _interrupt.is_set():
        raise KeyboardInterrupt


def sigterm_without_collective(world_size: int) -> None:
    """Under DDP, SIGTERM raises the KeyboardInterrupt of ``_on_sigterm`` at once, in place of the handler Lightning
    (2.6) installs at every ``fit`` / ``validate``: that one calls ``dist.broadcast`` inside the signal handler, a
    collective that rank 0 entered in the middle of the step's own (a ``barrier`` or ``all_reduce``) while the
    other ranks waited in theirs, so ``kill`` of the training process hung every rank for good (about one time in
    four on CPU). Interrupted, rank 0 shuts down as on Ctrl-C (Lightning kills the ranks it started) and exits 143.
    Call it once Lightning has installed its handler (on_train_start, on_validation_start); its teardown puts back
    the handler it found."""
    if world_size > 1 and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


@contextmanager
def stop_on_signals():
    """SIGTERM (a scheduler preempting or cancelling a job, ``kill``, ``timeout``) ends the command as Ctrl-C does:
    the work in hand stops, ``finally`` blocks run, and the message says how to continue (exit 143, 128 + 15).
    Its default action ended the process at once without a word, outside Lightning's training loop (which turns it
    into a stop at the next step): during data preparation, an evaluation, a study's summary; a corpus
    preparation's temporary directory then stayed until the next one. Both signals also set the flag that
    ``raise_if_interrupted`` reads. The previous handlers are restored after (an entry point run in process, as the
    tests do)."""
    _sigterm.clear()
    _interrupt.clear()
    if threading.current_thread() is not threading.main_thread():  # (signal handlers live in the main thread)
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig, handler in ((signal.SIGTERM, _on_sigterm),
                                                                      (signal.SIGINT, _on_sigint))}  # fmt: skip
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # (None: a handler set from C, which Python cannot put back)
                signal.signal(sig, handler)
        _interrupt.clear()  # (the command has ended: what runs after it in the process is not interrupted; _sigterm
        # stays set for run_cli's message)


def run_cli(main: Callable[[argparse.Namespace], Optional[int]], parser: argparse.ArgumentParser,
            argv: Optional[Sequence[str]] = None) -> int:
    args = parser.parse_intermixed_args(argv)  # overrides may follow flags: `--config X --resume key=value`
    resumable = any("--resume" in a.option_strings for a in parser._actions)  # (train.py, study.py)
    try:  # (torch is first imported here, a second or two: a Ctrl-C then was a KeyboardInterrupt traceback)
        with stop_on_signals():
            set_up_process()  # before anything else runs: before torch starts its worker threads
            quiet_libraries()
            code = main(args) or 0
            raise_if_interrupted()  # (a Ctrl-C that something swallowed: the command did not end as it should)
            return code
    except MinilmError as e:
        if getattr(args, "debug", False):
            traceback.print_exc()
        _report(f"error: {e}")
        return 2
    except KeyboardInterrupt:  # the --resume hint only where there is one (train.py, study.py; not generate.py)
        if _sigterm.is_set() and _failed_rank(None) is not None:  # torchrun stopping this rank: another one failed,
            return 2  # and said why (not "terminated; continue with --resume")
        what = "terminated (SIGTERM)" if _sigterm.is_set() else "interrupted"
        if _primary_process():
            # (the same command: a phase begun with --phase NAME --init PATH resumes with them)
            hint = "; continue with the same command plus --resume" if resumable else ""
            print(f"\n{what}{hint}", file=sys.stderr)
        return 143 if _sigterm.is_set() else 130
    except Exception as e:  # a full disk or a read-only file system: the user's to fix, not a bug (a traceback)
        if (failed := cannot_write(e)) is None:
            if _failed_rank(f"{type(e).__name__}: {e}") is None:
                raise  # (a bug, or the first rank's: its traceback)
            if getattr(args, "debug", False):  # another rank failed first, said why, and left this one's
                traceback.print_exc()  # collective with it (gloo: "Connection closed by peer")
            return 2
        if getattr(args, "debug", False):
            traceback.print_exc()
        _report(f"error: {cannot_write_message(failed, resumable)}")
        return 2


def cannot_write_message(e: OSError, resumable: bool) -> str:
    """What a command that could not write (``minilm.files.cannot_write``: a full disk or quota, a read-only file
    system) says: the file, why, and how to go on (``resumable``: the command has --resume, which continues from
    the files written before: each one is whole, minilm.files.atomic_write)."""
    what = f"cannot write {e.filename}" if e.filename else "cannot write its output"
    if e.errno == errno.EROFS:
        why, fix = "the file system is read-only", "make it writable" if resumable else "write to another directory"
    else:
        why = "the disk quota is exhausted" if e.errno == errno.EDQUOT else "the disk is full"
        fix = "free some space"
    then = ", then continue with the same command plus --resume" if resumable else " and run the command again"
    return f"{what}: {why}; {fix}{then}"


FIRST_FAILURE = "minilm_first_failure"  # the key of the run's store that the first rank to fail sets (per attempt)


def _first_failure_key() -> str:
    """FIRST_FAILURE of this attempt: torchrun --max-restarts reuses its agent's store for every attempt, where a
    failure of an earlier one would otherwise read as this one's (a bug's traceback swallowed, a message unsaid)."""
    return f"{FIRST_FAILURE}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def _report(message: str) -> None:
    """Print an error's ``message`` on stderr, but once for the processes of a run: every rank of a torchrun or
    DDP run meets the same bad config value or missing file and printed the same line, once per process. A rank
    whose message another rank already printed stays quiet (its exit code is 2 all the same)."""
    first = _failed_rank(message)
    if first is None or first[1] != message:
        print(message, file=sys.stderr)


def _failed_rank(message: Optional[str]) -> Optional[tuple[int, str]]:
    """(the rank, the message) of the first failure recorded in the run's store by another process of the run, or
    None: where this process fails first (it records ``message``, for the others to compare theirs with), where
    ``message`` is None and none failed, and where there is no store to share (one process; Lightning's launcher
    or SLURM before the process group exists). The store is torchrun's (its agent's, which outlives the ranks)
    or the process group's; one that cannot be reached is as none."""
    store, rank, restore = _run_store()
    if store is None:
        return None
    mine, key = f"{rank}\n{message}", _first_failure_key()
    # torchrun stops the other ranks with SIGTERM once one has ended: arriving after the command's own handler is gone
    # (stop_on_signals), during this exchange or the interpreter's exit, it killed a rank that was ending with exit 2
    # (-15). The command has ended in an error: a SIGTERM now is ignored
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        if message is not None and store.compare_set(key, "", mine) == mine.encode():  # (set if unset)
            return None
        if message is None and not store.check([key]):
            return None
        first, _, text = store.get(key).decode().partition("\n")
    except Exception:  # (its host is gone, a timeout: nothing known)
        return None
    finally:
        restore()
    return (int(first), text) if first != str(rank) else None


def _run_store():
    """(the key-value store the processes of a multi-process run share, this process's rank, a function that puts
    back the store's own timeout), or (None, 0, None). Its calls wait 10 s at most: a store whose host is gone
    must not hold an ending process for the process group's 30 minutes; the process group's store gets its own
    timeout back after (NCCL's watchdog reads it too)."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun: its agent hosts one
    if not agent and "torch.distributed" not in sys.modules:  # (no process group without it: torch not imported)
        return None, 0, None
    from datetime import timedelta

    import torch.distributed as dist

    short = timedelta(seconds=10)
    try:
        if agent and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                  timeout=short)  # fmt: skip
            return store, int(os.environ["RANK"]), lambda: None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            store = dist.distributed_c10d._get_default_store()
            own = store.timeout
            store.set_timeout(short)
            return store, dist.get_rank(), lambda: store.set_timeout(own)
    except Exception:  # (an unreachable store, a malformed variable: as none)
        return None, 0, None
    return None, 0, None


def _primary_process() -> bool:
    """False in the other ranks of a multi-process run: Ctrl-C reaches every process of the terminal's group, and
    each printed "interrupted; continue with --resume", once per process; the first one says it now. A process
    that has not imported Lightning was started by no launcher of ours (a rank interrupted while it still imports
    says it too, which is harmless), and this does not import it: generate.py's Ctrl-C stays immediate."""
    if "lightning.pytorch" not in sys.modules:
        return True
    from minilm.training.run_checks import is_primary_process

    return is_primary_process()
