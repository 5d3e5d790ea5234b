"""The driver's peak memory in cycle reports is its own, not that of the process that started it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from applier.engine.report import peak_rss_mib, reset_peak_rss

CHILD = (
    "import resource; from applier.engine.report import peak_rss_mib; "
    "print(peak_rss_mib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
)


def test_a_run_started_by_a_large_process_reports_its_own_peak_not_the_parents(tmp_path: Path) -> None:
    ballast = bytearray(400 * 1024 * 1024)  # the parent: 400 MiB resident (every page touched)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    out = tmp_path / "out.txt"
    pid = os.fork()  # fork then exec, as a scheduler or harness starts `applier run`
    if pid == 0:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.execv(sys.executable, [sys.executable, "-c", CHILD])
    _, status = os.waitpid(pid, 0)
    del ballast
    assert os.waitstatus_to_exitcode(status) == 0
    own, carried = (float(v) for v in out.read_text().split())
    assert carried >= 400, "Linux carries ru_maxrss across exec: the child would report the parent's 400 MiB"
    assert own < 200, f"the child's own peak is an interpreter's, not the parent's: {own} MiB"


def test_the_peak_is_read_from_vm_hwm_and_falls_back_without_proc(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t  999999 kB\nVmHWM:\t  524288 kB\nVmRSS:\t  1024 kB\n")
    assert peak_rss_mib(status) == 512.0
    assert peak_rss_mib(tmp_path / "missing") > 0  # getrusage's figure where /proc is not there


CYCLES = (
    "from applier.engine.report import peak_rss_mib, reset_peak_rss\n"
    "ballast = bytearray(300 * 1024 * 1024)\n"
    "for i in range(0, len(ballast), 4096): ballast[i] = 1\n"
    "del ballast\n"  # a first cycle's spike, freed (a block this large goes back to the system at once)
    "spiked = peak_rss_mib(); reset_peak_rss(); after = peak_rss_mib()\n"
    "print(spiked, after)\n"
)


def test_each_cycle_reports_its_own_peak_after_the_mark_is_restarted(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", CYCLES], capture_output=True, text=True, check=True).stdout
    spiked, after = (float(v) for v in out.split())
    assert spiked >= 300, "the spike is the first cycle's peak"
    assert after < spiked - 250, f"the next cycle's peak starts from what is resident now, not the spike: {after}"
    reset_peak_rss(tmp_path / "no-such-dir" / "clear_refs")  # where /proc is not there: nothing, no error


POOL_CHILD = """
import os, sys
from applier.engine.driver_memory import choose_system_pool
chose = choose_system_pool()
import pyarrow as pa, pyarrow.parquet as pq
table = pa.table({"xid": [str(i % 97) for i in range(50_000)], "n": list(range(50_000))})
pq.write_table(table, sys.argv[1], row_group_size=5_000)
batches = list(pq.ParquetFile(sys.argv[1]).iter_batches(batch_size=5_000))
counted = pa.Table.from_batches(batches).group_by("xid").aggregate([("n", "sum")])
print(chose, choose_system_pool(), pa.default_memory_pool().backend_name, os.environ.get("ARROW_DEFAULT_MEMORY_POOL"),
      pa.mimalloc_memory_pool().bytes_allocated() if "mimalloc" in pa.supported_memory_backends() else 0, len(batches))
"""


def test_a_runs_entry_point_gives_pyarrow_the_system_pool_for_parquet_batches_and_group_bys(tmp_path: Path) -> None:
    """set_memory_pool alone leaves Parquet's batch reader and Acero on pyarrow's C++ default (mimalloc) pool."""
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    done = subprocess.run(
        [sys.executable, "-c", POOL_CHILD, str(tmp_path / "rows.parquet")], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    chose, again, backend, variable, mimalloc_bytes, batches = done.stdout.split()
    assert (chose, again, backend, variable, batches) == ("True", "False", "system", "None", "10")
    assert int(mimalloc_bytes) == 0, "the batch reader or the group-by allocated from mimalloc"
