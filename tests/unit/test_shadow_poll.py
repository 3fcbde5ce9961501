"""The one poller of the live checks (podium.tasks.live.poll_live), as the shadow and the watch use it: it ends
when the policy has decided, on a stop, when CURRENT moves, or when the duration is over, and says which."""

from __future__ import annotations

from podium.tasks.live import poll_live


def test_the_poll_ends_when_decided_stopped_moved_or_over_and_says_which(tmp_path):
    serving = str(tmp_path)  # nothing promoted: CURRENT names no version
    reads = iter(range(100))

    def never(*_):
        return False

    decided = poll_live(serving, lambda: next(reads), lambda n, _: n >= 2, None, 60, lambda: False, 0)
    assert (decided.numbers, decided.ended, decided.over) == (2, "decided", False)
    stopped = poll_live(serving, lambda: 7, never, None, 60, lambda: True, 0)
    assert (stopped.numbers, stopped.ended) == (7, "stopped")
    moved = poll_live(serving, lambda: 7, never, "v000001", 60, lambda: False, 0)
    assert (moved.ended, moved.current) == ("moved", None)
    over = poll_live(serving, lambda: 7, never, None, 0, lambda: False, 0)
    assert (over.ended, over.over) == ("over", True)
    # a policy that decides at the end of its duration (the watch's `passed`) is told the duration is over
    at_end = poll_live(serving, lambda: 7, lambda _, is_over: is_over, None, 0, lambda: False, 0)
    assert (at_end.ended, at_end.over) == ("decided", True)
