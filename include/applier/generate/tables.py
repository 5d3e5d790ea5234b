"""The generated shop schema: table definitions and how each table logs its changes.

Six tables cover every column type of the spec and every key shape: single
keys (``customers``, ``products``, ``orders``), composite keys
(``order_lines``, ``cart_items``) and a log without a primary key
(``events``), which holds duplicate rows.
"""

from __future__ import annotations

from applier.intermediate.schema import Column, TableDef

CUSTOMERS = "shop.customers"
PRODUCTS = "shop.products"
ORDERS = "shop.orders"
ORDER_LINES = "shop.order_lines"
CART = "shop.cart_items"
EVENTS = "shop.events"


def _table(name: str, columns: list[tuple[str, str, bool]], key: tuple[str, ...]) -> TableDef:
    return TableDef(name, tuple(Column(n, t, nullable) for n, t, nullable in columns), key)


TABLE_DEFS: tuple[TableDef, ...] = (
    _table(
        CUSTOMERS,
        [
            ("id", "bigint", False),
            ("name", "string", False),
            ("email", "string", True),
            ("birth_date", "date", True),
            ("vip", "boolean", False),
            ("balance", "decimal(12,2)", False),
            ("loyalty_points", "int", False),
            ("avatar", "binary", True),
            ("created_at", "timestamp", False),
        ],
        ("id",),
    ),
    _table(
        PRODUCTS,
        [
            ("id", "int", False),
            ("sku", "string", False),
            ("name", "string", False),
            ("price", "decimal(10,2)", False),
            ("rating", "double", True),
            ("in_stock", "boolean", False),
            ("stock", "int", False),
            ("thumbnail", "binary", True),
            ("updated_at", "timestamp", False),
        ],
        ("id",),
    ),
    _table(
        ORDERS,
        [
            ("id", "bigint", False),
            ("customer_id", "bigint", False),
            ("status", "string", False),
            ("total", "decimal(14,2)", False),
            ("ordered_at", "timestamp", False),
            ("ship_date", "date", True),
            ("note", "string", True),
        ],
        ("id",),
    ),
    _table(
        ORDER_LINES,
        [
            ("order_id", "bigint", False),
            ("line_no", "int", False),
            ("product_id", "int", False),
            ("qty", "int", False),
            ("unit_price", "decimal(10,2)", False),
            ("discount", "double", False),
        ],
        ("order_id", "line_no"),
    ),
    _table(
        CART,
        [
            ("session_id", "string", False),
            ("product_id", "int", False),
            ("qty", "int", False),
            ("added_at", "timestamp", False),
        ],
        ("session_id", "product_id"),
    ),
    _table(
        EVENTS,
        [
            ("at", "timestamp", False),
            ("kind", "string", False),
            ("entity_id", "bigint", False),
            ("score", "double", True),
            ("payload", "string", True),
        ],
        (),
    ),
)

# Tables whose source logs the whole old row in U and D before-images (like
# PostgreSQL's REPLICA IDENTITY FULL); the others log only the key. A table
# without a primary key always logs the whole row.
FULL_BEFORE_TABLES = frozenset({CUSTOMERS, ORDERS, EVENTS})

# The column ``shop.customers`` gains mid-stream when the profile evolves the schema.
ADDED_COLUMN = Column("phone", "string", True)


def table_def(name: str) -> TableDef:
    """The initial definition of the table ``name`` (``schema.table``).

    Args:
        name: one of the table name constants of this module.

    Returns:
        Its definition as the stream starts.
    """
    for definition in TABLE_DEFS:
        if definition.name == name:
            return definition
    raise KeyError(name)


def with_column(definition: TableDef, column: Column) -> TableDef:
    """``definition`` with ``column`` appended (the one schema change version 1 allows).

    Args:
        definition: the table as defined so far.
        column: a nullable column not yet in the table.

    Returns:
        The evolved definition.
    """
    if not column.nullable or column.name in definition.column_names:
        raise ValueError(f"cannot add column {column.name} to {definition.name}")
    return TableDef(definition.name, (*definition.columns, column), definition.primary_key)
