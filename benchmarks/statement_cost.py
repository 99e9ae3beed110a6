"""What a statement and a transaction cost the API process's CPU, through the stack it uses.

The request paths run SQLAlchemy Core statements on an async engine (asyncpg); this prints,
measured side by side in one run against a PostgreSQL server, the process CPU per
`SELECT 1 + $1`:

- a statement on an open connection, through SQLAlchemy's async engine, and through asyncpg
  alone (a prepared statement);
- a transaction of that one statement (connection from the pool, BEGIN, the statement,
  COMMIT, back to the pool), through each, and through SQLAlchemy's sync API in one greenlet
  (`greenlet_spawn`), as `AsyncDatabase` runs its programs (api/transactions.py), where the
  async API spawns a greenlet for each call.

The difference is what a group commit (`api/transactions.py: Database.run_grouped`) saves
when it runs one transaction for many requests.

    PYTHONPATH=. python benchmarks/statement_cost.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import asyncpg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.util import greenlet_spawn


async def measure(url: str, n: int) -> dict[str, float]:
    engine = create_async_engine(sa.engine.make_url(url).set(drivername="postgresql+asyncpg"))
    statement = sa.select(sa.literal(1) + sa.bindparam("x", type_=sa.Integer))
    figures: dict[str, float] = {}
    async with engine.connect() as connection:
        for _ in range(100):  # compiled, prepared
            await connection.execute(statement, {"x": 1})
        started = time.process_time()
        for _ in range(n):
            (await connection.execute(statement, {"x": 1})).scalar()
        figures["sqlalchemy_statement_ms"] = (time.process_time() - started) / n * 1000
    started = time.process_time()
    for _ in range(n):
        async with engine.connect() as connection:
            (await connection.execute(statement, {"x": 1})).scalar()
            await connection.commit()
    figures["sqlalchemy_transaction_ms"] = (time.process_time() - started) / n * 1000

    def transaction() -> None:
        with engine.sync_engine.connect() as connection:
            connection.execute(statement, {"x": 1}).scalar()
            connection.commit()

    started = time.process_time()
    for _ in range(n):
        await greenlet_spawn(transaction)
    figures["sqlalchemy_one_greenlet_transaction_ms"] = (time.process_time() - started) / n * 1000
    await engine.dispose()

    dsn = sa.engine.make_url(url).set(drivername="postgresql").render_as_string(False)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    async with pool.acquire() as raw:
        prepared = await raw.prepare("SELECT 1 + $1::integer")
        for _ in range(100):
            await prepared.fetchval(1)
        started = time.process_time()
        for _ in range(n):
            await prepared.fetchval(1)
        figures["asyncpg_statement_ms"] = (time.process_time() - started) / n * 1000
    started = time.process_time()
    for _ in range(n):
        async with pool.acquire() as raw, raw.transaction():
            await raw.fetchval("SELECT 1 + $1::integer", 1)
    figures["asyncpg_transaction_ms"] = (time.process_time() - started) / n * 1000
    await pool.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="statements or transactions each")
    parser.add_argument(
        "--postgres",
        default=os.environ.get(
            "COLDBENCH_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args()
    figures = asyncio.run(measure(args.postgres, args.n))
    for name, cpu_ms in figures.items():
        print(f"{name:28s} {cpu_ms:6.3f} ms CPU")
    statement = figures["sqlalchemy_statement_ms"] / figures["asyncpg_statement_ms"]
    transaction = figures["sqlalchemy_transaction_ms"] / figures["asyncpg_transaction_ms"]
    greenlet = figures["sqlalchemy_one_greenlet_transaction_ms"] / figures["asyncpg_transaction_ms"]
    print(
        f"SQLAlchemy/asyncpg: statement {statement:.2f}x, transaction {transaction:.2f}x, "
        f"transaction in one greenlet {greenlet:.2f}x"
    )


if __name__ == "__main__":
    main()
