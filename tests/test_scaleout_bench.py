"""The scale-out step's measuring (bench/scaleout.py): the executors' CPU seconds.

The step itself needs a Spark cluster and minutes; here its sampler must count
the CPU of the processes below a daemon (its children's children too) and
nothing of the daemon's own. Its report is tested with the others
(tests/test_bench_report.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.scaleout import ExecutorCpu  # noqa: E402

BURN = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass\n"


def test_the_sampler_counts_the_cpu_of_the_processes_below_a_daemon_and_not_the_daemons(tmp_path: Path) -> None:
    # A "worker daemon" starts an "executor" whose "Python worker" burns a CPU second; then it burns a second itself.
    (tmp_path / "burn.py").write_text(BURN)
    run = f"import subprocess, sys\nsubprocess.run([sys.executable, {str(tmp_path / '{}')!r}])\n"
    (tmp_path / "executor.py").write_text(run.format("burn.py"))
    (tmp_path / "daemon.py").write_text(run.format("executor.py") + BURN)
    daemon = subprocess.Popen([sys.executable, str(tmp_path / "daemon.py")])
    sampler = ExecutorCpu([daemon.pid])
    daemon.wait(timeout=60)
    counted = sampler.stop()
    assert 0.7 <= counted <= 1.3  # the grandchild's second (less its last sample), not the daemon's
