"""The run lock: one training process per run directory, a stale lock taken over by exactly one process."""

import multiprocessing
import os
import queue
import socket
import threading
import time

import pytest

from minilm.errors import MinilmError
from minilm.training import phases


def _contender(run_dir, index, barrier, results):
    """Take the run lock over from a dead process, as one of several processes started at once. Every contender that
    finds the lock stale waits for the others to find it so too (the barrier), then goes on a moment after the one
    before it: the order in which two processes taking over one stale lock removed each other's fresh lock."""
    def dead(pid):
        try:
            barrier.wait(timeout=0.5)
        except threading.BrokenBarrierError:  # the others were refused before they looked
            pass
        time.sleep(0.2 * index)
        return False

    phases.pid_alive = dead
    try:
        with phases.run_lock(run_dir, log=lambda msg: None):
            results.put(("held", index, time.monotonic()))
            time.sleep(1.0)
            results.put(("released", index, time.monotonic()))
    except MinilmError as e:
        results.put(("refused", index, str(e)))


def test_two_processes_taking_over_one_stale_lock_do_not_both_hold_it(tmp_path):
    """Both read the dead pid, both removed the lock and created their own in turn: the second removed the first's
    fresh lock, and both trained into the run directory. Exactly one holds it at any time now."""
    (tmp_path / ".lock").write_text(f"999999999 {socket.gethostname()}")  # a process that is gone
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_contender, args=(tmp_path, i, barrier, results)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=30)
    events = []
    while True:
        try:
            events.append(results.get(timeout=1))
        except queue.Empty:
            break
    held = [e for e in events if e[0] == "held"]
    assert len(held) >= 1, events
    spans = {i: [t for kind, j, t in events if j == i and kind in ("held", "released")] for _, i, _ in held}
    if len(spans) == 2:  # both held it at some point: never at the same time
        (a0, a1), (b0, b1) = spans.values()
        assert a1 <= b0 or b1 <= a0, events
    refused = [e for e in events if e[0] == "refused"]
    assert all("is in use by process" in e[2] for e in refused), refused
    assert not (tmp_path / ".lock").exists()


def test_a_lock_of_another_host_is_respected_and_named(tmp_path):
    """flock may not reach across the hosts of a shared filesystem: a lock written on another host is still taken
    as held, and the message names the host."""
    (tmp_path / ".lock").write_text("12345 other-node")
    with pytest.raises(MinilmError, match=r"in use by process 12345 on other-node"):
        with phases.run_lock(tmp_path, log=lambda msg: None):
            pass
    assert (tmp_path / ".lock").read_text() == "12345 other-node"


def test_a_lock_that_may_be_stale_says_that_deleting_it_lets_the_run_go_on(tmp_path):
    """A run killed with its machine (a lost node) and requeued on another met the first host's lock on every
    --resume, told to 'wait for it, stop it, or choose another run.dir': not that the lock file was what kept it out,
    nor that deleting it continues the run. A live holder with the lock's flock on this machine is not stale."""
    lock = tmp_path / ".lock"
    lock.write_text("12345 lost-node")
    with pytest.raises(MinilmError, match=rf"on lost-node .*; if it no longer runs \(it was killed, or its machine "
                                          rf"was lost\), delete {lock} and run the command again$"):
        with phases.run_lock(tmp_path, log=lambda msg: None):
            pass
    lock.unlink()
    with phases.run_lock(tmp_path, log=lambda msg: None):  # deleted: the run goes on
        with pytest.raises(MinilmError, match=r"choose another run.dir$"):
            with phases.run_lock(tmp_path, log=lambda msg: None):
                pass


def test_a_live_holder_refuses_another_and_its_lock_goes_with_it(tmp_path):
    said = []
    with phases.run_lock(tmp_path, log=said.append):
        assert (tmp_path / ".lock").read_text() == f"{os.getpid()} {socket.gethostname()}"
        with pytest.raises(MinilmError, match=rf"in use by process {os.getpid()}"):
            with phases.run_lock(tmp_path, log=said.append):
                pass
    assert not (tmp_path / ".lock").exists() and said == []
