"""The scale-out step's measuring (bench/measure.py's sampler): the driver's and the executors' CPU seconds.

The step itself needs a Spark cluster and minutes; here its sampler must count
the CPU of the processes below a daemon (its children's children too) and
nothing of the daemon's own, and a driver's own CPU in a window of time (a
cycle's). Its report is tested with the others (tests/test_bench_report.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.measure import TreeCpu  # noqa: E402

BURN = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass\n"


def test_the_sampler_counts_the_cpu_of_the_processes_below_a_daemon_and_not_the_daemons(tmp_path: Path) -> None:
    # A "worker daemon" starts an "executor" whose "Python worker" burns a CPU second; then it burns a second itself.
    (tmp_path / "burn.py").write_text(BURN)
    run = f"import subprocess, sys\nsubprocess.run([sys.executable, {str(tmp_path / '{}')!r}])\n"
    (tmp_path / "executor.py").write_text(run.format("burn.py"))
    (tmp_path / "daemon.py").write_text(run.format("executor.py") + BURN)
    daemon = subprocess.Popen([sys.executable, str(tmp_path / "daemon.py")])
    sampler = TreeCpu([daemon.pid], with_roots=False)
    daemon.wait(timeout=60)
    counted = sampler.stop()
    assert 0.7 <= counted <= 1.3  # the grandchild's second (less its last sample), not the daemon's


def test_the_sampler_counts_a_roots_cpu_in_a_window_of_time(tmp_path: Path) -> None:
    # A "driver" burns a second, rests a second, and burns another: the rest costs nothing, the second burn a second.
    marks = tmp_path / "marks"
    script = f"import time\n{BURN}m1 = time.time()\ntime.sleep(1.0)\nm2 = time.time()\n{BURN}"
    script += f"open({str(marks)!r}, 'w').write(f'{{m1}} {{m2}} {{time.time()}}')\n"
    (tmp_path / "driver.py").write_text(script)
    sampler = TreeCpu([], with_roots=True)
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py")])
    sampler.add_root(driver.pid)
    driver.wait(timeout=60)
    counted = sampler.stop()
    rest_start, rest_end, end = map(float, marks.read_text().split())
    assert 1.5 <= counted <= 2.3  # both seconds and the interpreter's start, less its last sample
    assert sampler.between(rest_start + 0.2, rest_end - 0.2) < 0.1
    assert 0.6 <= sampler.between(rest_end, end) <= 1.3
