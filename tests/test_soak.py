"""The soak's machinery: its criteria judge synthetic series, and a short soak measures rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak.run import Soak
from bench.soak.verdict import Ended, Minute, Verdict, check_ended, check_minutes, judged


def minutes(grow: float, count: int = 9) -> list[Minute]:
    """`count` rows whose Redis memory, keys, RSS and descriptors rise by `grow` a row."""
    return [
        Minute(m, int(50e6 * (1 + grow * m)), int(4_000 * (1 + grow * m)),
               int(300e6 * (1 + grow * m)), int(50 * (1 + grow * m)), 1_000_000 * m, 30.0)
        for m in range(1, count + 1)
    ]  # fmt: skip


def ended(per_superstep: int) -> list[Ended]:
    """Nine succeeded tasks of 10 to 30 supersteps, leaving `per_superstep` keys a superstep."""
    return [
        Ended(f"t{n}", steps, "succeeded", {"run": 1, "spend:*": per_superstep * steps},
              40_000, 5)
        for n, steps in enumerate(range(10, 31, 2)[:9])
    ]  # fmt: skip


def test_a_flat_series_passes() -> None:
    """Steady memory, keys, RSS, descriptors and rate meet every minute criterion."""
    verdict = Verdict()
    check_minutes(minutes(0.0), verdict)
    assert [] == verdict.failed
    assert 6 == len(verdict.passed)


def test_a_growing_series_fails_each_level_it_breaks() -> None:
    """5% a minute: Redis memory, keys, RSS and descriptors each fail; the rate does not."""
    verdict = Verdict()
    check_minutes(minutes(0.05), verdict)
    failed = {line.split(":")[0] for line in verdict.failed}
    assert {"Redis used_memory", "Redis keys", "VmRSS of the Cairn processes",
            "open descriptors"} == failed  # fmt: skip


def test_a_stall_fails() -> None:
    """One judged minute under half the median rate fails the stall criterion."""
    rows = minutes(0.0)
    rows[6] = Minute(7, rows[6].used_memory, rows[6].keys, rows[6].rss, rows[6].fds, 0, 5.0)
    verdict = Verdict()
    check_minutes(rows, verdict)
    assert "no stall" in [line.split(":")[0] for line in verdict.failed]


def test_the_halves_hold_each_fault_of_a_round_equally_often() -> None:
    """A dip in descriptors every third minute (a worker replaced) fails no steady series.

    15 minutes of 50 descriptors, 20 in each minute a worker is killed (1, 4, 7, ...).
    Halves of every minute after the warm-up (6-10 against 11-15) hold two such minutes
    against one and fail; the judged rounds (10-12 against 13-15) hold one each and pass.
    """
    rows = [
        Minute(m, 50_000_000, 4_000, 300_000_000, 20 if m % 3 == 1 else 50, m, 30.0)
        for m in range(1, 16)
    ]
    assert [10, 11, 12, 13, 14, 15] == [r.minute for r in judged(rows, cycle=3)]
    aligned, unaligned = Verdict(), Verdict()
    check_minutes(rows, aligned, cycle=3)
    check_minutes(rows, unaligned, cycle=1)
    assert [] == aligned.failed
    assert ["open descriptors"] == [line.split(":")[0] for line in unaligned.failed]


def test_keys_that_grow_with_a_task_length_fail_and_name_their_kind() -> None:
    """A key a superstep left behind by an ended task is a leak; a key a task is not."""
    verdict = Verdict()
    check_ended(ended(1), cold_bound=6, verdict=verdict)
    assert 1 == len(verdict.failed)
    assert "'spend:*'" in verdict.failed[0]
    flat = Verdict()
    check_ended(ended(0), cold_bound=6, verdict=flat)
    assert [] == flat.failed


def test_an_archive_past_cold_keep_and_a_failed_task_fail() -> None:
    """More archived GCs than the bound, or a task that did not succeed, fail the soak."""
    tasks = ended(0)
    tasks[0] = Ended("fat", 10, "failed", {"run": 1}, 40_000, 9)
    verdict = Verdict()
    check_ended(tasks, cold_bound=6, verdict=verdict, stuck=["t3"])
    assert 3 == len(verdict.failed)


@pytest.mark.slow
def test_a_short_soak_on_real_processes_measures_a_row_a_minute(tmp_path: Path) -> None:
    """Three 15 s "minutes": a row each, tasks that end and are removed, faults landed."""
    rows: list[Minute] = []
    soak = Soak(tmp_path, minutes=3, minute_s=15.0)
    soak.run(lambda row, processes, rq, fault: rows.append(row))
    assert [1, 2, 3] == [r.minute for r in rows]
    assert all(r.used_memory > 0 and r.keys > 0 and r.rss > 0 and r.fds > 0 for r in rows)
    assert all(r.steps_per_s > 0 for r in rows)
    assert soak.ended, "no task ended in 45 s"
    assert all(e.status == "succeeded" for e in soak.ended)
    assert 3 == len(soak.faults)
    assert soak.faults[0].startswith("kill_worker")
    assert len(soak.processes[-1]) == 4  # two coordinators and two workers, alive
