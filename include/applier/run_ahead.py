"""``applier run``'s driver JVM, launched as the process starts: before the commands' and the engine's imports.

Those imports (pyarrow, the readers, the engine: some 0.6 s) and the JVM's
start (about 2 s) happen at once. This module imports only what deciding
needs (the configuration, the checkpoint, the pairs' listing), so the JVM is
launched about 0.4 s sooner than after them, and it starts what the run's
application would (:mod:`applier.engine.jvm_launch`, :mod:`applier.engine.daemon_ahead`).
"""

from __future__ import annotations

import argparse

from applier.config import load_config
from applier.engine.checkpoint import CheckpointStore
from applier.engine.jvm_launch import LaunchedJvm, launch
from applier.intermediate.pairs import list_pairs


def launch_for(args: argparse.Namespace) -> LaunchedJvm | None:
    """The JVM for ``applier run`` with ``args``, launched when a pair waits after the checkpoint.

    None when none waits, or when the run will refuse to start (a bad option,
    configuration, checkpoint or folder). It never raises: it runs before the
    command's own error handling, and a run that cannot start meets the same
    problem there and says so in its words, without a JVM.
    """
    if args.max_cycles is not None and args.max_cycles < 0:
        return None
    try:
        config = load_config(args.config, args.overrides)
        applied = CheckpointStore(config.work_dir).load().applied_seq
        if not list_pairs(config.intermediate_dir, applied + 1).pairs:
            return None
        from applier.engine.session import application_conf

        return launch(application_conf(config))
    except Exception:  # see above: the run reports it
        return None
