"""A cycle's ``.dat`` files read for the driver by Spark's executors, on a cluster.

Before a cycle is planned, the driver checks its pairs in order: their
transaction events (the ``.trn`` files) and, for each ``.dat``, its columns
lsn, xid, table and op (nulls, lsn order, operations, described tables, the
header's counts) and every row against its transaction, judged on a few rows
per transaction and table (:func:`~applier.intermediate.row_facts.transaction_tables`).
Reading and grouping those columns is the part of the driver's work that
grows with rows rather than transactions: on a cluster it is a fifth of the
driver's CPU per cycle, on one machine whatever the executors.

So on a cluster, in every cycle after a run's first (which the driver reads
while Spark starts: a job would wait for it), a job of one task per pair reads them
(:func:`read_dat_facts`: exactly the reading and
checks of :func:`~applier.intermediate.reader.read_pair`, images and digest
aside) and sends back per pair its table definitions, what its rows say
per transaction (:class:`~applier.intermediate.row_facts.RowFacts`) and its
``.trn``'s header and events (msgpack, which the driver decodes in a third
of the time it took to read them from the ``.trn``), or the refusal
:func:`~applier.intermediate.reader.read_pair` would raise. The driver then
checks the pairs in order as before: a refused pair stops the cycle at its
turn, in the same words. Only a pair with
a defect in its transactions has its rows read again by the driver, to name
the defect. With a local master the executors are the driver's machine, and a
job would only add its cost: the driver reads them (``apply.executor_reads``;
by default the running application's master decides, spark-submit's
``--master`` included).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from applier.engine.reading import DatReader, longest_images_in
from applier.engine.session import is_ready, local_master, session_of, task_per_number
from applier.engine.worker_path import prepare_worker
from applier.errors import IntermediateFileError
from applier.intermediate.events import packed
from applier.intermediate.pairs import PairRef
from applier.intermediate.reader import read_pair
from applier.intermediate.row_facts import DatFacts


def executors_read(setting: bool | None, master: str) -> bool:
    """Whether Spark's executors read a cycle's ``.dat`` files for the driver: ``setting``, or (None) on a cluster."""
    return setting if setting is not None else not local_master(master)


def reads_on_executors(setting: bool | None, spark: Any) -> bool:
    """Whether the executors of ``spark`` (a session, or a starting one) read the ``.dat`` files of a cycle now.

    A cycle read while Spark starts (a run's first) is read by the driver: a
    job would wait for Spark. Once it is up, its own master decides (under
    spark-submit, ``--master``, which the configuration does not see).
    """
    if setting is False or not is_ready(spark):
        return False
    return executors_read(setting, session_of(spark).sparkContext.master)


def dat_reader(session: Callable[[], Any]) -> DatReader:
    """A :data:`~applier.engine.reading.DatReader` running a job on the Spark application ``session()`` gives.

    The application is asked for only when pairs are read: a run's first
    cycle waits there for Spark to start.
    """

    def read(refs: list[PairRef], measure: bool) -> dict[int, DatFacts | IntermediateFileError]:
        if not refs:
            return {}
        return dict(
            task_per_number(session().sparkContext, len(refs), functools.partial(_read_pairs, list(refs), measure))
        )

    return read


def _read_pairs(
    refs: Sequence[PairRef], measure: bool, numbers: Iterable[int]
) -> Iterator[tuple[int, DatFacts | IntermediateFileError]]:
    """A task's pairs read (the function each Spark task runs)."""
    prepare_worker()
    for number in numbers:
        ref = refs[number]
        yield ref.seq, read_dat_facts(ref, measure)


def read_dat_facts(ref: PairRef, measure: bool = False) -> DatFacts | IntermediateFileError:
    """What a pair's ``.dat`` holds, read and checked as :func:`read_pair` does (images and digest aside), or why not.

    An executor's part of :func:`read_pair` with ``read_elsewhere``, whose
    driver reads the ``.trn`` again for its events: a refusal is the one
    :func:`read_pair` would raise, ``.trn`` or ``.dat``. With ``measure``, its
    images are measured too (:func:`~applier.engine.reading.longest_images_in`,
    which the driver would otherwise run on them, reading them whole).
    """
    try:
        pair = read_pair(ref, check_rows=False, check_digest=False)
    except IntermediateFileError as e:
        return e
    longest = longest_images_in(ref.dat_path) if measure and pair.facts.count else None
    return DatFacts(pair.tables, pair.autocorrect, pair.facts, longest, pair.header, packed(pair.events))
