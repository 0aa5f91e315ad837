"""Engine processes that do not outlive fi-profile: each process of an engine fi-profile starts
asks the kernel to kill it when its parent dies (``PR_SET_PDEATHSIG``, Linux), so a SIGKILLed or
OOM-killed fi-profile leaves no EngineCore, worker or scheduler holding the GPU. The chain holds
for vLLM's and SGLang's trees: fi-profile -> engine core / scheduler -> TP workers, each the child
of the process (and thread) that spawned it. Elsewhere (not Linux) nothing changes."""

from __future__ import annotations

import os
import signal
import sys

#: set by the driver in its own environment before an engine starts: its pid (the engine's
#: processes inherit it; the driver's own process, which runs a single-process engine, is left be)
ENV_DRIVER = "FI_PROFILE_DRIVER_PID"
_PR_SET_PDEATHSIG = 1


def mark_driver() -> None:
    """In the driver, before the engine starts: its processes are to die with it."""
    os.environ[ENV_DRIVER] = str(os.getpid())


def die_with_parent() -> bool:
    """In an engine process the driver started (directly or not): be killed when the parent dies;
    killed now where it is gone already (it died before this ran). False where not asked (no
    driver, the driver itself) or not possible (not Linux, no libc)."""
    driver = os.environ.get(ENV_DRIVER)
    if not driver or driver == str(os.getpid()) or not sys.platform.startswith("linux"):
        return False
    import ctypes
    import multiprocessing

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid != os.getppid():  # reparented: the parent died before prctl
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def kill_engine_processes() -> list[int]:
    """In the driver: SIGKILL the engine's processes below it (those that :func:`mark_driver` names
    it the driver of: they did not answer at a signal); returns their pids. psutil comes with every
    engine fi-profile drives."""
    import psutil

    engine = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.environ().get(ENV_DRIVER) == str(os.getpid()):
                engine.append(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    for child in engine:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(engine, timeout=10)
    return [child.pid for child in engine]
