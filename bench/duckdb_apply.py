"""A single-process apply of a folder of pairs with DuckDB: the baseline of issue 16.

``python -m bench.duckdb_apply INTERMEDIATE_DIR TARGET_DIR [--through-seq N] [--result FILE]``
applies the complete pairs 1..N of ``INTERMEDIATE_DIR`` (up to the first gap)
to new Delta tables ``TARGET_DIR/<schema>/<table>``, as a user comparing tools
would write it: DuckDB reads the ``.trn`` events and the ``.dat`` Parquet
files, keeps the committed transactions in commit order (rolled-back and
still-open ones are not applied), and computes per key the final state:

- a keyed table: every image gives its key alone (``json_transform`` of the
  key columns); per key, the last event in (commit lsn, lsn) order wins, the
  ``before`` of an update or delete counting as a delete just before its
  ``after``, so a key move deletes the old key and sets the new one. Only the
  winning ``after`` images are fully parsed;
- a table without a key: a multiset; ``after`` counts +1 and ``before`` -1 of
  its whole row, and rows left with a positive count are written that many
  times;
- a truncate drops every earlier change of its table.

It shares no code with ``include/applier`` (like ``tests/reference/``): it is a
check on the engine as much as a measure of it. The Delta tables are typed as
the engine types them (``int`` int32, ``bigint`` int64, ``decimal(p,s)``
decimal128, ``timestamp`` microseconds in UTC, ``binary`` bytes; the
definitions' nullability), so the two targets compare equal.

What it skips, compared with the engine:

- the spec's strict checks (section 6): headers, sizes and digests, lsn order,
  ``op`` values, begin/end pairing, and every image against its types (a value
  that does not fit becomes NULL or is rounded rather than refusing its pair);
  only the key columns and the final images are read at all;
- schema changes other than the latest definition winning (no refusal of an
  incompatible change);
- cycles, cycle size limits and buffering: everything is read at once, in
  DuckDB's memory (spilling as DuckDB decides);
- open transactions carried across runs and their spill files: they are
  dropped, as is everything else at the end;
- checkpoints, the run lock, exactly-once resumption, the target's copy of the
  checkpoint and drift checks: it writes new tables once and refuses existing
  ones;
- applying to tables that hold rows (net deletes and updates of rows from
  before the pairs), error actions, exception stores, validation, reports.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

DUCKDB_TYPES = {"boolean": "BOOLEAN", "int": "INTEGER", "bigint": "BIGINT", "double": "DOUBLE",
                "string": "VARCHAR", "date": "DATE", "timestamp": "TIMESTAMPTZ", "binary": "VARCHAR"}  # fmt: skip
ARROW_TYPES = {"boolean": pa.bool_(), "int": pa.int32(), "bigint": pa.int64(), "double": pa.float64(),
               "string": pa.string(), "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"),
               "binary": pa.binary()}  # fmt: skip
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")


class BaselineError(Exception):
    """The pairs cannot be applied by the baseline (a missing pair, an existing table, a row deleted twice)."""


def pair_paths(folder: Path, through_seq: int | None) -> list[tuple[Path, Path]]:
    """The ``.dat`` and ``.trn`` of the complete pairs 1..N: up to ``through_seq``, or up to the first gap."""
    pairs: list[tuple[Path, Path]] = []
    while through_seq is None or len(pairs) < through_seq:
        stem = folder / f"{len(pairs) + 1:012d}"
        if not stem.with_suffix(".trn").is_file():
            break
        pairs.append((stem.with_suffix(".dat"), stem.with_suffix(".trn")))
    if through_seq is not None and len(pairs) < through_seq:
        raise BaselineError(f"{folder}: pairs 1..{through_seq} asked for, only 1..{len(pairs)} are complete")
    return pairs


def table_definitions(dats: list[Path]) -> dict[str, dict[str, Any]]:
    """Each table's latest definition (``columns``, ``primary_key``) from the ``.dat`` files' ``cdc.tables``."""
    defs: dict[str, dict[str, Any]] = {}
    for dat in dats:
        metadata = pq.read_metadata(dat).metadata or {}
        if b"cdc.tables" not in metadata:
            raise BaselineError(f"{dat}: no cdc.tables metadata")
        defs.update(json.loads(metadata[b"cdc.tables"]))
    return defs


def arrow_schema(definition: dict[str, Any]) -> pa.Schema:
    """The table's Arrow schema, typed as the engine types spec columns."""
    fields = []
    for c in definition["columns"]:
        decimal = _DECIMAL.fullmatch(c["type"])
        kind = pa.decimal128(int(decimal[1]), int(decimal[2])) if decimal else ARROW_TYPES[c["type"]]
        fields.append(pa.field(c["name"], kind, nullable=bool(c["nullable"])))
    return pa.schema(fields)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _shape(columns: list[dict[str, Any]]) -> str:
    """The ``json_transform`` structure typing ``columns`` (binary stays base64 text until :func:`_columns`)."""
    return _text(json.dumps({c["name"]: DUCKDB_TYPES.get(c["type"], c["type"].upper()) for c in columns}))


def _columns(columns: list[dict[str, Any]]) -> str:
    """The select list turning the typed struct ``r`` into the table's columns, base64 decoded."""
    return ", ".join(
        f"from_base64(r.{_quote(c['name'])}) AS {_quote(c['name'])}" if c["type"] == "binary"
        else f"r.{_quote(c['name'])}"
        for c in columns
    )  # fmt: skip


def load_changes(con: Any, pairs: list[tuple[Path, Path]]) -> int:
    """The committed transactions' changes, as table ``changes``, ordered by ``pos`` (commit lsn, then lsn).

    ``pos`` is ``commit_lsn * 2**64 + lsn * 2``, a HUGEINT: an order without a
    sort (a window's would hold every image twice), even, so an image's
    ``after`` can rank just above its ``before``.

    Returns the number of changes kept.
    """
    trns = "[" + ", ".join(_text(str(trn)) for _, trn in pairs) + "]"
    dats = "[" + ", ".join(_text(str(dat)) for dat, _ in pairs) + "]"
    events = "{'record': 'VARCHAR', 'xid': 'VARCHAR', 'lsn': 'BIGINT'}"
    con.sql(
        f"CREATE TEMP TABLE commits AS SELECT xid, lsn AS commit_lsn FROM read_json({trns}, "
        f"format='newline_delimited', columns={events}) WHERE record = 'commit'"
    )
    con.sql(
        f'CREATE TEMP TABLE changes AS SELECT c."table" AS tbl, c.op, c.before, c.after, c.lsn, '
        f"t.commit_lsn::HUGEINT * {2**64} + c.lsn * 2 AS pos "
        f"FROM read_parquet({dats}) c JOIN commits t USING (xid)"
    )
    return int(con.sql("SELECT count(*) FROM changes").fetchall()[0][0])


def final_rows(con: Any, name: str, definition: dict[str, Any]) -> pa.Table:
    """The table's rows after every kept change, applied to an empty table."""
    columns, key = definition["columns"], definition["primary_key"]
    since = (
        f"tbl = {_text(name)} AND pos > (SELECT coalesce(max(pos), 0) FROM changes "
        f"WHERE tbl = {_text(name)} AND op = 'T')"
    )
    if key:
        key_columns = [next(c for c in columns if c["name"] == k) for k in key]
        key_shape = _shape(key_columns)
        # A before counts as a delete at pos, an after as a set at pos + 1: the last event of each key wins.
        events = (
            f"SELECT json_transform(before, {key_shape}) AS k, pos AS o, lsn FROM changes "
            f"WHERE {since} AND op IN ('U', 'D') "
            f"UNION ALL SELECT json_transform(after, {key_shape}), pos + 1, lsn FROM changes "
            f"WHERE {since} AND op IN ('I', 'U')"
        )
        query = (
            f"WITH last AS (SELECT arg_max(lsn, o) AS lsn FROM ({events}) GROUP BY k HAVING max(o) % 2 = 1) "
            f"SELECT json_transform(c.after, {_shape(columns)}) AS r FROM last JOIN changes c ON c.lsn = last.lsn"
        )
    else:
        shape = _shape(columns)
        counted = (
            f"SELECT json_transform(before, {shape}) AS r, -1 AS d FROM changes WHERE {since} AND op IN ('U', 'D') "
            f"UNION ALL SELECT json_transform(after, {shape}), 1 FROM changes WHERE {since} AND op IN ('I', 'U')"
        )
        con.sql(f"CREATE OR REPLACE TEMP TABLE counted AS SELECT r, sum(d)::BIGINT AS n FROM ({counted}) GROUP BY r")
        negative = con.sql("SELECT count(*) FROM counted WHERE n < 0").fetchall()[0][0]
        if negative:
            raise BaselineError(f"table {name}: {negative} row values are deleted more often than inserted")
        query = "SELECT r FROM counted, range(counted.n)"
    rows = con.sql(f"SELECT {_columns(columns)} FROM ({query})").to_arrow_table()
    schema = arrow_schema(definition)
    arrays = [rows.column(i).cast(field.type) for i, field in enumerate(schema)]
    return pa.Table.from_arrays(arrays, schema=schema)


def write_table(target: Path, name: str, rows: pa.Table) -> None:
    """A new Delta table ``target/<schema>/<table>`` holding ``rows``."""
    from deltalake import DeltaTable, write_deltalake

    path = target.joinpath(*name.split("."))
    if DeltaTable.is_deltatable(str(path)):
        raise BaselineError(f"table {name}: {path} already holds a Delta table; the baseline writes new tables only")
    path.mkdir(parents=True, exist_ok=True)
    write_deltalake(str(path), rows, mode="error", name=name)


def apply_folder(
    intermediate: Path, target: Path, through_seq: int | None = None, threads: int | None = None
) -> dict[str, Any]:
    """Apply the pairs of ``intermediate`` to new Delta tables under ``target``; figures of the apply.

    Raises:
        BaselineError: a pair asked for is missing, a table exists, or a row is deleted that was never inserted.
    """
    import duckdb

    started = time.perf_counter()
    pairs = pair_paths(intermediate, through_seq)
    defs = table_definitions([dat for dat, _ in pairs])
    con = duckdb.connect()
    con.sql("SET TimeZone = 'UTC'")
    if threads:
        con.sql(f"SET threads = {int(threads)}")
    kept = load_changes(con, pairs) if pairs else 0
    seconds = {"read": time.perf_counter() - started, "net": 0.0, "write": 0.0}
    rows: dict[str, int] = {}
    for name, definition in sorted(defs.items()):
        t0 = time.perf_counter()
        table = final_rows(con, name, definition)
        t1 = time.perf_counter()
        write_table(target, name, table)
        seconds["net"] += t1 - t0
        seconds["write"] += time.perf_counter() - t1
        rows[name] = table.num_rows
    con.close()
    return {"pairs": len(pairs), "changes_kept": kept, "rows": rows, "seconds": seconds,
            "total_s": time.perf_counter() - started, "duckdb": duckdb.__version__}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """The command line; exit code 0, or 1 with one line on stderr when the pairs cannot be applied."""
    p = argparse.ArgumentParser(prog="python -m bench.duckdb_apply", description=__doc__.splitlines()[0])
    p.add_argument("intermediate", type=Path, help="the folder of pairs")
    p.add_argument("target", type=Path, help="the folder the Delta tables are written under (new tables only)")
    p.add_argument("--through-seq", type=int, help="apply pairs 1..N (default: up to the first gap)")
    p.add_argument("--threads", type=int, help="DuckDB's threads (default: one per core)")
    p.add_argument("--result", type=Path, help="write the figures of the apply here as JSON")
    args = p.parse_args(argv)
    try:
        result = apply_folder(args.intermediate, args.target, args.through_seq, args.threads)
    except BaselineError as e:
        print(f"duckdb_apply: error: {e}", file=sys.stderr)
        return 1
    text = json.dumps(result, indent=1)
    if args.result:
        args.result.write_text(text, encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
