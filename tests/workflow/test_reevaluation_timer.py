"""The scheduler's re-evaluation timer (workflow/rules/common.smk, OneReevaluationTimer): at most one pending, however
many scheduling rounds ask for one, and each round after it fires may start the next."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

COMMON_SMK = (Path(__file__).resolve().parents[2] / "workflow" / "rules" / "common.smk").read_text()


def timer_class():
    """The class's source from common.smk (plain Python: it runs without Snakemake)."""
    source = re.search(r"^class OneReevaluationTimer:\n(?:(?:    .*)?\n)+", COMMON_SMK, re.MULTILINE).group(0)
    namespace = {"threading": threading}
    exec(source, namespace)
    return namespace["OneReevaluationTimer"]


class FakeScheduler:
    def __init__(self):
        self._open_jobs = threading.Semaphore(0)
        self.own_timers = 0

    def _schedule_reevalutation(self, delay):
        self.own_timers += 1


def test_many_rounds_start_one_timer_and_its_round_starts_the_next():
    scheduler = FakeScheduler()
    timer_class().install(scheduler)
    for _ in range(50):  # every round ends asking for a re-evaluation
        scheduler._schedule_reevalutation(0.05)
    assert sum(isinstance(t, threading.Timer) for t in threading.enumerate()) >= 1
    assert scheduler._open_jobs.acquire(timeout=5)  # the one timer woke the scheduler
    time.sleep(0.2)
    assert not scheduler._open_jobs.acquire(blocking=False)  # once only
    scheduler._schedule_reevalutation(0.05)  # the round it started asks again: a new timer
    assert scheduler._open_jobs.acquire(timeout=5)
    assert scheduler.own_timers == 0


def test_a_scheduler_without_the_internals_keeps_its_own_timers():
    class Other:
        def _schedule_reevalutation(self, delay):
            pass

    scheduler = Other()
    own = scheduler._schedule_reevalutation
    timer_class().install(scheduler)
    assert scheduler._schedule_reevalutation == own
