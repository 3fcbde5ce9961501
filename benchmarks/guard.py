"""What a measurement needs to be one: a quiet machine and a pinned training worker, watched while it runs.

`Monitor` is one sampling thread for the whole benchmark. Every `every_s` it reads /proc:

- **our process tree**: this process and its descendants, found by parent pid and remembered by
  (pid, start time), so that processes reparented later (the detached Prefect server, Ray's daemons) stay
  ours and another session's processes never become ours;
- **foreign CPU**: the CPU time every other user-space process used (kernel threads are left out: most of
  their work here is our own I/O). That is the "no other heavy process on the machine" precondition,
  measured rather than inferred from the load average, which counts the benchmark itself;
- **affinity**, during a way with pinning: once a train worker has pinned itself (see benchmarks.pinning),
  every other process of ours is moved off the training core, and checked: every thread of the train
  worker must be on the training core, and no other process of ours may stay allowed on it. When no pinned
  train worker is alive any more, every process of ours gets every core back.

`check_attempt` turns what a way produced plus what the monitor saw into the reasons it is not a
measurement (none: it is one).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from benchmarks.pinning import CoreSplit, read_pins, set_process_affinity

PF_KTHREAD = 0x00200000
TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Proc:
    """One /proc/<pid>/stat, the fields used here."""

    pid: int
    ppid: int
    start: int  # clock ticks after boot
    cpu: int  # utime + stime, clock ticks
    kernel: bool
    comm: str


def read_proc(pid: int) -> Proc | None:
    """The process's stat, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    comm = data[data.find("(") + 1:data.rfind(")")]
    rest = data[data.rfind(")") + 2:].split()
    ppid, flags = int(rest[1]), int(rest[6])
    return Proc(pid=pid, ppid=ppid, start=int(rest[19]), cpu=int(rest[11]) + int(rest[12]),
                kernel=bool(flags & PF_KTHREAD) or pid == 2 or ppid == 2, comm=comm)


def scan() -> dict[int, Proc]:
    """Every process now."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            p = read_proc(int(name))
            if p is not None:
                out[p.pid] = p
    return out


def uptime_ticks() -> float:
    """Clock ticks since boot (the unit of a process's start time)."""
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) * TICK


def machine_busy_ticks() -> int:
    """Clock ticks every core of the machine spent busy since boot (/proc/stat: user, nice, system, irq,
    softirq, steal; idle and iowait left out): what every process used, the short-lived and the kernel's
    included."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq + steal


def load_average() -> tuple[float, float, float]:
    """1-, 5- and 15-minute load averages."""
    return os.getloadavg()


@dataclass
class Window:
    """What the monitor saw between two moments: one way, or a probe of the machine before it."""

    start: float
    end: float = 0.0
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    foreign_ticks: dict[str, int] = field(default_factory=dict)  # "comm[pid]" -> CPU ticks
    our_ticks: dict[str, int] = field(default_factory=dict)  # the benchmark's own processes, the same way
    violations: list[str] = field(default_factory=list)
    samples: int = 0
    busy_start: int = 0  # machine_busy_ticks() at the start and at the end
    busy_end: int = 0
    harness_cpu_s: float = 0.0  # this process's own CPU meanwhile (the monitor's sampling, reading the records)
    pins: list[dict[str, Any]] = field(default_factory=list)
    pin_log: str | None = None

    @property
    def seconds(self) -> float:
        """Length of the window."""
        return max(1e-9, (self.end or time.time()) - self.start)

    @property
    def foreign_cpu_s(self) -> float:
        """CPU seconds other processes used meanwhile."""
        return sum(self.foreign_ticks.values()) / TICK

    @property
    def machine_cpu_s(self) -> float:
        """CPU seconds the whole machine used meanwhile, less what other processes used: the benchmark's
        processes, every one (the podium process, its servers, Ray's processes, the short-lived ones) and
        the kernel's work for them, but not this harness's own process."""
        return max(0.0, (self.busy_end - self.busy_start) / TICK - self.foreign_cpu_s - self.harness_cpu_s)

    @property
    def foreign_cores(self) -> float:
        """Mean number of cores other processes kept busy meanwhile."""
        return self.foreign_cpu_s / self.seconds

    def top_foreign(self, n: int = 3) -> str:
        """The busiest other processes, for a reason line."""
        return _top(self.foreign_ticks, n)

    def top_ours(self, n: int = 8) -> str:
        """The benchmark's own busiest processes (where the CPU went, for a closer look)."""
        return _top(self.our_ticks, n)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (summaries.json)."""
        return {"seconds": round(self.seconds, 1), "foreign_cores": round(self.foreign_cores, 3),
                "top_foreign": self.top_foreign(), "top_ours": self.top_ours(24),
                "load_before": self.load_before, "load_after": self.load_after,
                "violations": self.violations[:10], "samples": self.samples, "pins": self.pins,
                "machine_cpu_s": round(self.machine_cpu_s, 2)}


class Monitor:
    """The sampling thread (see the module docstring). Use `with monitor.window(pin_log) as w:` per way."""

    def __init__(self, split: CoreSplit, every_s: float = 0.5):
        self.split = split
        self.every_s = every_s
        self._ours: set[tuple[int, int]] = set()
        self._last: dict[tuple[int, int], int] = {}
        self._window: Window | None = None
        self._window_ticks = 0.0
        self._suspects: set[int] = set()
        self._moved = False  # other processes of ours were moved off the training core (a train worker is pinned)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-monitor", daemon=True)

    def __enter__(self) -> Monitor:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @contextlib.contextmanager
    def window(self, pin_log: str | None = None) -> Iterator[Window]:
        """Watch the machine (and, with a pin log, the pinning) for the duration of the block."""
        w = Window(start=time.time(), load_before=load_average(), pin_log=pin_log, busy_start=machine_busy_ticks())
        own0 = time.process_time()
        with self._lock:
            self._last = {}
            self._window_ticks = uptime_ticks()
            self._suspects = set()
            self._window = w
        self._sample()
        try:
            yield w
        finally:
            self._sample()
            with self._lock:
                self._window = None
                self._give_back(self._update_ours(scan()))  # a way that ended with its train worker still pinned
            w.end, w.load_after, w.busy_end = time.time(), load_average(), machine_busy_ticks()
            w.harness_cpu_s = time.process_time() - own0
            if pin_log:
                w.pins = read_pins(pin_log)

    def probe(self, seconds: float) -> Window:
        """The machine over the next `seconds`, with nothing of ours running but this process."""
        with self.window() as w:
            time.sleep(seconds)
        return w

    def wait_quiet(self, max_foreign: float, probe_s: float, wait_s: float) -> tuple[Window, float]:
        """Probe until other processes use at most `max_foreign` cores, for at most `wait_s`.

        Returns the last probe and the seconds waited."""
        t0 = time.time()
        while True:
            w = self.probe(probe_s)
            if w.foreign_cores <= max_foreign or time.time() - t0 >= wait_s:
                return w, time.time() - t0

    # ------------------------------------------------------------ sampling

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def _sample(self) -> None:
        procs = scan()
        with self._lock:
            ours = self._update_ours(procs)
            w = self._window
            if w is None:
                return
            w.samples += 1
            current: dict[tuple[int, int], int] = {}
            for p in procs.values():
                key = (p.pid, p.start)
                if p.kernel:
                    continue
                current[key] = p.cpu
                if key in self._last:
                    delta = p.cpu - self._last[key]
                elif p.start >= self._window_ticks and w.samples > 1:
                    delta = p.cpu  # started inside the window: all of its CPU time is
                else:
                    delta = 0  # first sight of a process older than the window: the baseline
                if delta > 0:
                    name = f"{p.comm}[{p.pid}]"
                    ticks = w.our_ticks if key in self._ours else w.foreign_ticks
                    ticks[name] = ticks.get(name, 0) + delta
            self._last = current
            if w.pin_log and self.split.enabled:
                self._check_affinity(w, ours)

    def _update_ours(self, procs: dict[int, Proc]) -> list[int]:
        children: dict[int, list[int]] = {}
        for p in procs.values():
            children.setdefault(p.ppid, []).append(p.pid)
        todo = [os.getpid()] + [p.pid for p in procs.values() if (p.pid, p.start) in self._ours]
        seen: set[int] = set()
        while todo:
            pid = todo.pop()
            if pid in seen or pid not in procs:
                continue
            seen.add(pid)
            self._ours.add((pid, procs[pid].start))
            todo.extend(children.get(pid, []))
        return sorted(seen)

    def _give_back(self, ours: list[int]) -> None:
        """Every core to every process of ours again, if any was moved off the training core."""
        if self._moved:
            for pid in ours:
                set_process_affinity(self.split.all, pid)
            self._moved = False

    def _check_affinity(self, w: Window, ours: list[int]) -> None:
        """While a train worker that pinned itself is alive, keep every other process of ours off the training
        core (move it, then check it moved); once none is alive, give them every core back."""
        pins = {r["pid"] for r in read_pins(w.pin_log or "")}
        train = {pid for pid in pins if pid in ours}
        if not train:
            self._give_back(ours)  # training is over: the machine is whole again
            return
        for pid in ours:
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            for tid in tids:
                try:
                    cpus = os.sched_getaffinity(tid)
                except OSError:
                    continue
                if pid in train:
                    if cpus != self.split.train:
                        w.violations.append(f"train worker {pid} thread {tid} allowed on cores {sorted(cpus)}")
                elif cpus & self.split.train:
                    set_process_affinity(self.split.other, pid)
                    self._moved = True
                    # it may have been moved just now; a process still allowed there at the next sample is a violation
                    if pid in self._suspects:
                        w.violations.append(f"process {pid} ({_comm(pid)}) allowed on the training core "
                                            f"(cores {sorted(cpus)})")
                    self._suspects.add(pid)
                    break


def _top(ticks: dict[str, int], n: int) -> str:
    top = sorted(ticks.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{name} {t / TICK:.1f} CPU-s" for name, t in top if t) or "none"


def _comm(pid: int) -> str:
    p = read_proc(pid)
    return p.comm if p else "?"


# ---------------------------------------------------------------- preconditions

@dataclass
class Expectations:
    """What one way must show to count as a measurement."""

    epochs: int
    validates: bool  # every checkpoint gets a validation result
    pinned: bool  # CoreSplit was on
    num_workers: int = 1
    max_foreign_cores: float = 0.10
    validation_s: float | None = None  # expected cost of one validation, when the way runs the costly one
    validation_source: str = "calibrated"  # where validation_s comes from, for the reason
    validation_tolerance: tuple[float, float] = (0.67, 1.5)


def check_attempt(summary: dict[str, Any] | None, window: Window, expect: Expectations,
                  error: str | None = None) -> list[str]:
    """Why this attempt is not a measurement ([] when it is one)."""
    reasons = []
    if error:
        reasons.append(error)
    if window.foreign_cores > expect.max_foreign_cores:
        reasons.append(f"machine busy: other processes used {window.foreign_cores:.2f} cores on average "
                       f"(limit {expect.max_foreign_cores:.2f}; {window.top_foreign()})")
    if expect.pinned:
        if len(window.pins) < expect.num_workers:
            reasons.append(f"training not pinned: {len(window.pins)} of {expect.num_workers} Ray Train worker(s) "
                           "pinned themselves")
        if window.violations:
            reasons.append(f"pinning violated: {window.violations[0]}"
                           + (f" (+{len(window.violations) - 1} more)" if len(window.violations) > 1 else ""))
    if summary is None:
        return reasons
    if summary.get("checkpoints", 0) < expect.epochs:
        reasons.append(f"incomplete: {summary.get('checkpoints', 0)} of {expect.epochs} checkpoints")
    elif expect.validates and summary.get("n", 0) < expect.epochs:
        reasons.append(f"incomplete: {summary.get('n', 0)} of {expect.epochs} checkpoints have metrics")
    val, cal = summary.get("val_p50"), expect.validation_s
    if cal and val:
        lo, hi = expect.validation_tolerance
        if not lo * cal <= val <= hi * cal:
            reasons.append(f"validation not as expected: p50 {val:.2f} s against {cal:.2f} s {expect.validation_source} "
                           f"({val / cal:.2f}×, allowed {lo:g}–{hi:g}×)")
    return reasons
