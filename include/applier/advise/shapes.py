"""Row sizes of a workload's tables, observed in the row images of its pairs (reads files).

A table's expanded row size is what ER's arithmetic needs: every fixed-width
column at its width and every variable-length column (``string``,
``binary``) at the largest value observed in any ``before`` or ``after``
image of the pairs read. A ``string`` counts its UTF-8 bytes, a ``binary``
its decoded bytes (the base64 text is about 4/3 of them). A variable-length
column never seen with a value counts 0, and the report names it.

Pairs are read one at a time, and of each only the ``table``, ``before``
and ``after`` columns, in batches of rows, so memory follows the largest
Parquet row group (at most a pair), not the backlog. The images of a batch are parsed together by pyarrow's JSON reader
(in C++), keeping only the variable-length columns; images it cannot parse
that way are decoded one by one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from applier.advise.arithmetic import column_bytes, expanded_row_size
from applier.errors import InvalidChangeError
from applier.intermediate.pairs import PairRef
from applier.intermediate.reader import read_pair
from applier.intermediate.schema import TableDef

_IMAGE_COLUMNS = ("table", "before", "after")
_BATCH_ROWS = 65_536  # rows read at a time: memory follows this, not the pair


@dataclass
class TableShape:
    """What the pairs read say about one table's rows.

    Attributes:
        definition: the table's latest definition (columns only grow, by the spec).
        maxima: the largest byte length observed per variable-length column.
        rows: the table's rows in the pairs read.
    """

    definition: TableDef
    maxima: dict[str, int] = field(default_factory=dict)
    rows: int = 0

    @property
    def variable_columns(self) -> tuple[str, ...]:
        """The variable-length (string, binary) columns, in table order."""
        return tuple(c.name for c in self.definition.columns if column_bytes(c.type) is None)

    @property
    def fixed_bytes(self) -> int:
        """The sum of the fixed-width columns' widths."""
        return sum(column_bytes(c.type) or 0 for c in self.definition.columns)

    @property
    def variable_bytes(self) -> int:
        """The sum of the variable-length columns at their observed maxima."""
        return sum(self.maxima.get(name, 0) for name in self.variable_columns)

    @property
    def unseen_columns(self) -> tuple[str, ...]:
        """Variable-length columns never observed with a value (counted 0)."""
        return tuple(name for name in self.variable_columns if name not in self.maxima)

    @property
    def row_size(self) -> int:
        """The expanded row size in bytes."""
        return expanded_row_size(((c.name, c.type) for c in self.definition.columns), self.maxima)


def value_bytes(type_name: str, value: object) -> int:
    """The byte length of a variable-length value as JSON carries it (0 for null or a mismatched value).

    Args:
        type_name: ``string`` (UTF-8 bytes) or ``binary`` (bytes the standard base64 text decodes to).
        value: the JSON value.

    Returns:
        Its byte length.
    """
    if not isinstance(value, str):
        return 0
    if type_name == "binary":
        padding = len(value) - len(value.rstrip("="))
        return len(value) * 3 // 4 - padding
    return len(value.encode("utf-8"))


def _longest(type_name: str, values: pa.Array | pa.ChunkedArray) -> int | None:
    """The longest of ``values`` (one column's JSON strings, parsed) in bytes; None when all are null."""
    values = values.drop_null()
    if not len(values):
        return None
    lengths = pc.binary_length(values)
    if type_name == "binary":  # bytes the base64 text decodes to: 3 per 4 characters, less the padding
        ends = [pc.cast(pc.ends_with(values, pad), pa.int64()) for pad in ("=", "==")]
        lengths = pc.subtract(pc.divide(pc.multiply(pc.cast(lengths, pa.int64()), 3), 4), pc.add(*ends))
    longest: int = pc.max(lengths).as_py()
    return longest


def _parse_images(texts: pa.Array, columns: list[str]) -> pa.Table | None:
    """Parse JSON images, one per line, with pyarrow's JSON reader, keeping ``columns`` as strings.

    Returns:
        One row per image, or None when pyarrow cannot (a value that is not a
        string, an image spread over lines): the caller then decodes them one by one.
    """
    lines = pc.binary_join_element_wise(texts, "\n", "")
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(lines)], pa.int32()), lines), "")
    longest = pc.max(pc.binary_length(lines)).as_py()
    schema = pa.schema([(name, pa.string()) for name in columns])
    try:
        return pa_json.read_json(
            pa.BufferReader(joined[0].as_buffer()),
            read_options=pa_json.ReadOptions(block_size=max(1 << 20, 2 * longest)),
            parse_options=pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except pa.ArrowInvalid:
        return None


def _decode_images(ref: PairRef, shape: TableShape, texts: list[str]) -> None:
    """Raise ``shape.maxima`` image by image (the slow path, for images pyarrow cannot parse).

    Raises:
        InvalidChangeError: an image is not a JSON object.
    """
    types = {name: shape.definition.column(name).type for name in shape.variable_columns}
    decoder = msgspec.json.Decoder()
    for text in texts:
        try:
            image = decoder.decode(text)
        except msgspec.DecodeError as e:
            raise InvalidChangeError(ref.dat_path, ref.seq, "image-not-object", f"an image is not JSON: {e}") from e
        if not isinstance(image, dict):
            raise InvalidChangeError(ref.dat_path, ref.seq, "image-not-object", "an image is not a JSON object")
        for name, type_name in types.items():
            value = image.get(name)
            if value is not None:
                shape.maxima[name] = max(shape.maxima.get(name, 0), value_bytes(type_name, value))


def _measure_images(ref: PairRef, shape: TableShape, texts: pa.Array) -> None:
    """Raise ``shape.maxima`` to the longest variable-length values of ``texts`` (non-null images of one table)."""
    columns = list(shape.variable_columns)
    parsed = _parse_images(texts, columns)
    if parsed is None:
        _decode_images(ref, shape, texts.to_pylist())
        return
    for name in columns:
        longest = _longest(shape.definition.column(name).type, parsed.column(name))
        if longest is not None:
            shape.maxima[name] = max(shape.maxima.get(name, 0), longest)


def _add_pair(shapes: dict[str, TableShape], ref: PairRef) -> None:
    """Read pair ``ref`` (checked against the spec, images unchecked) into ``shapes``, a batch of rows at a time."""
    pair = read_pair(ref, check_rows=False)
    for name, definition in pair.tables.items():
        if name in shapes:
            shapes[name].definition = definition
        else:
            shapes[name] = TableShape(definition)
    if not pair.facts.count:
        return
    for entry in pc.value_counts(pair.stream_rows().column("table")).to_pylist():
        shapes[entry["values"]].rows += entry["counts"]
    measured = [name for name in pair.tables if shapes[name].variable_columns]
    if not measured:
        return
    for batch in pq.ParquetFile(ref.dat_path).iter_batches(batch_size=_BATCH_ROWS, columns=list(_IMAGE_COLUMNS)):
        for name in measured:
            rows = batch.filter(pc.equal(batch.column("table"), name))
            for column in ("before", "after"):
                texts = rows.column(column).drop_null()
                if len(texts):
                    _measure_images(ref, shapes[name], texts)


def observe_shapes(refs: Iterable[PairRef]) -> dict[str, TableShape]:
    """The row sizes the pairs ``refs`` show, per table, reading one pair at a time.

    Args:
        refs: complete pairs, in sequence order.

    Returns:
        ``schema.table`` -> its shape, sorted by name.

    Raises:
        IntermediateFileError: a pair breaks the spec (naming the pair and the defect).
    """
    shapes: dict[str, TableShape] = {}
    for ref in refs:
        _add_pair(shapes, ref)
    return dict(sorted(shapes.items()))
