"""Where the suite's CPU goes, test by test: with RECIPES_CPU_PROFILE=FILE, every test appends
one JSON line to FILE (the pytest workers of a run all append to it):

    {"test": NODEID, "wall": seconds, "own": CPU seconds of the pytest process,
     "children": CPU seconds of the processes it started and waited for,
     "forked": CPU seconds of its runs forked by tests/forked_ranks.py's server}

    RECIPES_CPU_PROFILE=/tmp/cpu.jsonl bash launch/test.sh
    python tests/cpu_profile.py /tmp/cpu.jsonl        # the files and tests that cost the most

The suite is bound by the CPU (docs/testing.md), so these seconds, not the wall times that the
other worker's load stretches, say what a change to a test saves. A process the test does not
wait for (a daemon's, one it orphans) is not counted.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from typing import Iterable, List, Tuple

import pytest

ENV = "RECIPES_CPU_PROFILE"


def _cpu() -> Tuple[float, float, float]:
    """(this process's CPU seconds, its waited-for children's, its forked runs')."""
    from forked_ranks import forked_cpu

    t = os.times()
    return t.user + t.system, t.children_user + t.children_system, forked_cpu()


def cost(record: dict) -> float:
    """A test's CPU seconds: its own, its children's and its forked runs'."""
    return record["own"] + record["children"] + record.get("forked", 0.0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    out = os.environ.get(ENV)
    if not out:
        yield
        return
    # Unset while the test runs: a pytest that the test starts (the GPU tier's, in a fresh
    # clone) would record its own tests again, inside this one's children
    del os.environ[ENV]
    (own, children, forked), started = _cpu(), time.monotonic()
    try:
        yield
    finally:
        os.environ[ENV] = out
    (own_after, children_after, forked_after), wall = _cpu(), time.monotonic() - started
    record = {"test": item.nodeid, "wall": round(wall, 2), "own": round(own_after - own, 2),
              "children": round(children_after - children, 2),
              "forked": round(forked_after - forked, 2)}
    with open(out, "a") as f:  # one short line per write: the workers' lines do not interleave
        f.write(json.dumps(record) + "\n")


def by_file(records: Iterable[dict]) -> List[Tuple[str, float, float]]:
    """(test file, CPU seconds, wall seconds) of each file, the most CPU first."""
    cpu, wall = Counter(), Counter()
    for r in records:
        name = r["test"].split("::")[0]
        cpu[name] += cost(r)
        wall[name] += r["wall"]
    return [(name, cpu[name], wall[name]) for name, _ in cpu.most_common()]


def main(path: str, top: int = 25) -> None:
    records = [json.loads(line) for line in open(path)]
    total = sum(cost(r) for r in records)
    print(f"{len(records)} tests: {total:.0f} CPU s, {sum(r['wall'] for r in records):.0f} "
          "s of the workers' wall time")
    print(f"\n{'CPU s':>8} {'wall s':>8}  file")
    for name, cpu, wall in by_file(records)[:top]:
        print(f"{cpu:8.0f} {wall:8.0f}  {name}")
    print(f"\n{'CPU s':>8} {'wall s':>8}  test")
    for r in sorted(records, key=lambda r: -cost(r))[:top]:
        print(f"{cost(r):8.0f} {r['wall']:8.0f}  {r['test']}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: RECIPES_CPU_PROFILE=FILE pytest ...; then python {sys.argv[0]} FILE")
    main(sys.argv[1])
