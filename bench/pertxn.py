"""The per-transaction baselines: each source transaction applied on its own (parts ``pertxn`` and ``pg-pertxn``).

**Delta** (:class:`DeltaPerTransaction`): per transaction and touched table,
one delta-rs commit: a ``merge`` on the key (the transaction's net upserts and
deletes), for a table without a key an append, or a rewrite of the table when
the transaction removes rows; a truncate is a ``delete()``. Into new empty
tables.

**PostgreSQL** (:class:`PgPerTransaction`): per transaction, each touched
table's net change (:func:`bench.source.transaction_net`) is COPYed into a
staging table and applied set-wise with one ``pg_sql.merge_keyed`` (the
target's statement before it counted collisions, and the faster form:
``pg-forms``), or ``delete_copies`` and ``insert_copies`` without a key (a
truncate as ``TRUNCATE``), in one database transaction per source
transaction. The staging tables are created once (temporary, shaped by the
target's ``create_staging``), emptied by a ``DELETE`` in each transaction
(``ON COMMIT DELETE ROWS`` costs a truncate of every staging table at every
commit, several times more) and vacuumed every thousand transactions; a
statement with nothing to do is not sent. The baseline gets every advantage a
careful per-transaction applier could take.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from psycopg import sql

from bench.measure import BenchError
from bench.source import (
    Change,
    Prefix,
    Segment,
    Typed,
    copy_data,
    create_tables,
    load_prefix,
    net_keyed,
    run_prefix,
    same_key,
    transaction_net,
)

VACUUM_EVERY = 1000  # transactions; the PostgreSQL staging tables' emptied pages are reclaimed this often


def _remove_rows(name: str, current: list[dict[str, Any]], removals: list[dict[str, Any]], names: list[str]) -> Any:
    """``current`` without one row per removal, matched on every column (NaN and -0.0 compare as values)."""
    gone: dict[tuple[Any, ...], int] = defaultdict(int)
    for r in removals:
        gone[tuple(same_key(r[c]) for c in names)] += 1
    kept = []
    for r in current:
        k = tuple(same_key(r[c]) for c in names)
        if gone.get(k, 0) > 0:
            gone[k] -= 1
        else:
            kept.append(r)
    if any(gone.values()):
        raise BenchError(f"{name}: a transaction deletes a row value the table does not hold")
    return kept


class DeltaPerTransaction:
    """Applies transactions one by one as their own delta-rs commits, counting commits and the time they take."""

    def __init__(self, defs: dict[str, Any], root: Path) -> None:
        from deltalake import DeltaTable

        self.typed = {name: Typed(t) for name, t in defs.items()}
        self.tables: dict[str, Any] = {}
        for name, t in self.typed.items():
            path = str(root / name.replace(".", "/"))
            DeltaTable.create(path, t.schema, mode="error")
            self.tables[name] = DeltaTable(path)
        self.commits = 0
        self.prepare_s = self.delta_s = 0.0

    def _keyed(self, name: str, segment: list[Segment]) -> float:
        """One merge on the key: the segment's net upserts and deletes."""
        t = self.typed[name]
        key_of = t.table.primary_key
        final = net_keyed(key_of, segment)
        images = [img if img is not None else dict(zip(key_of, key, strict=True)) for key, img in final.items()]
        source = t.arrow(t.rows(images), {"__op": ["U" if img is not None else "D" for img in final.values()]})
        prepared = time.perf_counter()
        (
            self.tables[name]
            .merge(source, " AND ".join(f't."{k}" = s."{k}"' for k in key_of), source_alias="s", target_alias="t")
            .when_matched_delete("s.__op = 'D'")
            .when_matched_update_all("s.__op = 'U'", except_cols=["__op"])
            .when_not_matched_insert_all("s.__op = 'U'", except_cols=["__op"])
            .execute()
        )
        return prepared

    def _counted(self, name: str, segment: list[Segment]) -> float:
        """A table without a key: an append, or a rewrite of the whole table when the segment removes rows."""
        from deltalake import write_deltalake

        t = self.typed[name]
        inserts = t.rows([a for op, _, a in segment if op in ("I", "U")])
        removals = t.rows([b for op, b, _ in segment if op in ("D", "U")])
        if removals:
            current = self.tables[name].to_pyarrow_table().to_pylist()
            inserts = _remove_rows(name, current, removals, t.loose.names) + inserts
        data = t.arrow(inserts)
        prepared = time.perf_counter()
        write_deltalake(self.tables[name], data, mode="overwrite" if removals else "append")
        self.tables[name].update_incremental()
        return prepared

    def _commit(self, name: str, segment: list[Segment] | None) -> None:
        """One commit: a segment of changes, or a truncate (``None``)."""
        started = time.perf_counter()
        if segment is None:
            self.tables[name].delete()
            prepared = started
        else:
            apply = self._keyed if self.typed[name].table.primary_key else self._counted
            prepared = apply(name, segment)
        self.commits += 1
        self.prepare_s += prepared - started
        self.delta_s += time.perf_counter() - prepared

    def apply_transaction(self, changes: list[Change]) -> None:
        """Per touched table, its changes between truncates as one commit each, and each truncate as its own."""
        touched: dict[str, list[Segment]] = {}
        for table, op, before, after in changes:
            touched.setdefault(table, []).append((op, before, after))
        for name, table_changes in touched.items():
            segment: list[Segment] = []
            for op, before, after in table_changes:
                if op != "T":
                    segment.append((op, before, after))
                    continue
                if segment:
                    self._commit(name, segment)
                    segment = []
                self._commit(name, None)
            if segment:
                self._commit(name, segment)


class PgPerTransaction:
    """Applies source transactions one by one through staging tables, counting statements and time.

    Args:
        conn: an autocommit psycopg connection to an empty database.
        defs: every table's latest definition (the tables are created here).
    """

    def __init__(self, conn: Any, defs: dict[str, Any]) -> None:
        from applier.targets import pg_sql as q

        self.conn, self.cur = conn, conn.cursor()
        self.typed = {name: Typed(t) for name, t in defs.items()}
        self.stage: dict[str, sql.Identifier] = {}
        create_tables(conn, defs)
        with conn.transaction():
            conn.execute(q.create_schema("bench_staging"))
            for n, (name, table) in enumerate(defs.items()):
                template = sql.Identifier("bench_staging", f"stage_{n}")
                conn.execute(q.create_staging(template, table))
                conn.execute(
                    sql.SQL("CREATE TEMPORARY TABLE {} (LIKE {})").format(sql.Identifier(f"stage_{n}"), template)
                )
                self.stage[name] = sql.Identifier("pg_temp", f"stage_{n}")
        self.commits = self.statements = self.copies = 0
        self.prepare_s = self.database_s = 0.0

    def apply_transaction(self, changes: list[Change]) -> None:
        """One source transaction: its net changes staged and applied, in one database transaction."""
        from applier.targets.pg_load import staging_rows

        started = time.perf_counter()
        nets = transaction_net(changes, self.typed)
        staged = [(net, rows.num_rows, copy_data(rows)) for net in nets.values() for rows in [staging_rows(net)]]
        prepared = time.perf_counter()
        with self.conn.transaction():
            for net, rows, data in staged:
                self._apply_table(net, rows, data)
        self.commits += 1
        if self.commits % VACUUM_EVERY == 0:
            for stage in self.stage.values():
                self.cur.execute(sql.SQL("VACUUM {}").format(stage))
        self.prepare_s += prepared - started
        self.database_s += time.perf_counter() - prepared

    def _run(self, statement: Any) -> int:
        self.statements += 1
        self.cur.execute(statement, prepare=True)
        return int(self.cur.rowcount)

    def _apply_table(self, net: Any, rows: int, data: bytes) -> None:
        """Truncate, COPY into the staging table, then the target's set-wise statements for this table."""
        from applier.targets import pg_sql as q

        table = net.table
        ident, stage = q.target_table(table, {}), self.stage[table.name]
        if net.truncate:
            self._run(q.truncate(ident))
        if not rows:
            return
        with self.cur.copy(q.copy_into(stage, q.staging_columns(table))) as copy:
            copy.write(data)
        self.copies += 1
        if table.primary_key:
            self._run(q.merge_keyed(ident, stage, table))
        else:
            if net.stats["D"] and (deleted := self._run(q.delete_copies(ident, stage, table))) != net.stats["D"]:
                raise BenchError(f"{table.name}: {net.stats['D']} rows to delete, {deleted} found")
            if net.stats["I"]:
                self._run(q.insert_copies(ident, stage, table))
        self._run(sql.SQL("DELETE FROM {}").format(stage))


def apply_prefix(url: str, prefix: Prefix) -> dict[str, Any]:
    """Apply every transaction of ``prefix`` on its own to the (empty) PostgreSQL database at ``url``; the figures."""
    import psycopg

    with psycopg.connect(url, autocommit=True, application_name="cdc-bench per-transaction") as conn:
        applier = PgPerTransaction(conn, prefix.defs)
        timed = run_prefix(prefix, applier.apply_transaction)
    counts = {k: getattr(applier, k) for k in ("commits", "copies", "statements", "prepare_s", "database_s")}
    return {**timed, **counts}


def part_pertxn(params: dict[str, Any]) -> dict[str, Any]:
    """Apply each of the first ``prefix`` committed transactions as its own Delta commits, with delta-rs.

    Args:
        params: ``intermediate_dir``, ``out_dir`` (the new tables) and ``prefix`` (transactions to apply).

    Returns:
        What :func:`bench.source.run_prefix` returns, the commits, the seconds typing the images and in
        delta-rs, and the rows each table ends with.
    """
    prefix = load_prefix(Path(params["intermediate_dir"]), params["prefix"])
    writer = DeltaPerTransaction(prefix.defs, Path(params["out_dir"]))
    timed = run_prefix(prefix, writer.apply_transaction)
    return {
        **timed,
        "commits": writer.commits,
        "prepare_s": writer.prepare_s,
        "delta_s": writer.delta_s,
        "final_rows": {name: t.to_pyarrow_dataset().count_rows() for name, t in writer.tables.items()},
    }


def part_pg_pertxn(params: dict[str, Any]) -> dict[str, Any]:
    """Apply each of the first ``prefix`` committed transactions on its own, staged and set-wise, at ``url``."""
    return apply_prefix(params["url"], load_prefix(Path(params["intermediate_dir"]), params["prefix"]))
