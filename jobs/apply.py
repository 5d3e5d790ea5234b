"""spark-submit entry point for one Applier run.

    spark-submit jobs/apply.py --config FILE [--set KEY=VALUE]... [--max-cycles N] [--run-key KEY]

Parses arguments, builds the configuration, runs the cycles in this Spark
application and exits with the Applier's exit code (0, 2, 3, 4, 6: another run holds the lock, 7: a
damaged state file, or 1: a bug, its traceback written to a file). Everything that needs no Spark is
checked before the session is created, and a run with nothing to do creates none.
"""

from __future__ import annotations

import argparse
import logging
import sys

from applier.engine.driver_memory import choose_system_pool

choose_system_pool()  # the driver's Arrow pool, chosen before anything below loads pyarrow

from applier.config import load_config  # noqa: E402
from applier.engine.api import configure_logging, run_applier  # noqa: E402
from applier.errors import PERMANENT_LINE, ApplierError, TargetError  # noqa: E402
from applier.exits import error_line, report_unexpected  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jobs/apply.py", description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--max-cycles", type=int)
    parser.add_argument("--run-key", help="the run's key in the run ledger; a finished run's key replays it")
    args = parser.parse_args(argv)
    configure_logging()
    try:
        config = load_config(args.config, args.overrides)
        summary = run_applier(config, max_cycles=args.max_cycles, set_master=False, run_key=args.run_key)
    except ApplierError as e:
        print(error_line(e), file=sys.stderr)
        if isinstance(e, TargetError) and not e.transient:
            print(PERMANENT_LINE, file=sys.stderr)  # the apply task then fails without a retry
        return e.exit_code
    except Exception as e:  # a bug: one line naming the file that holds its traceback
        return report_unexpected(e, "apply-job")
    logging.getLogger("applier").info(
        "run done: %d cycles%s", summary.cycles_run, f" (replay of run {summary.run_key})" if summary.replay else ""
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
