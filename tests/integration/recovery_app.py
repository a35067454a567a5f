"""A one-table Faust app for `test_recovery_watch`, run as its own process.

Its table recovers from a changelog the test wrote. With `SABOTAGE_SEEK=n`, table
recovery's first seek of its changelog goes to offset n instead (past every record): what a
fetch whose records Faust then dropped leaves behind, a position past records the table
never applied. Faust waits for them for good; only the watchdog
(`streams.shell.recovery_watch`, quiet period `STALL_S`) seeks back.

`/state` answers the table's size, whether recovery runs, and the watchdog's counters.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import faust
from faust.worker import Worker

from streams.shell.recovery_watch import register_recovery_watch


def build(env: dict[str, str]) -> faust.App:
    app = faust.App(
        env["APP_ID"], broker=f"kafka://{env['BOOTSTRAP']}", store="memory://",
        topic_partitions=1, table_standby_replicas=0, datadir=env["DATA_DIR"],
        web_host="127.0.0.1", web_bind="127.0.0.1", web_port=int(env["PORT"]),
        key_serializer="json", value_serializer="json", consumer_auto_offset_reset="earliest",
    )
    table = app.Table("items", default=None, partitions=1)
    stats: Counter[str] = Counter()
    register_recovery_watch(app, float(env["STALL_S"]), stats)
    if "SABOTAGE_SEEK" in env:
        _sabotage_first_changelog_seek(app, int(env["SABOTAGE_SEEK"]))

    @app.page("/state")
    async def state(web: Any, request: Any) -> Any:
        return web.json({"count": len(table), "in_recovery": bool(app.in_recovery),
                         **stats})

    return app


def _sabotage_first_changelog_seek(app: faust.App, offset: int) -> None:
    consumer = app.consumer
    seek_wait = consumer.seek_wait
    armed = [True]

    async def sabotaged(partitions: Any) -> None:
        if armed[0] and any(tp.topic.endswith("-changelog") for tp in partitions):
            armed[0] = False
            partitions = {tp: offset for tp in partitions}
        await seek_wait(partitions)

    consumer.seek_wait = sabotaged  # type: ignore[method-assign]


if __name__ == "__main__":
    Worker(build(dict(os.environ)), loglevel="info").execute_from_commandline()
