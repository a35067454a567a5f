"""What the kafka-python clients here share: quiet logs, the unreachable error, Kafka times."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_ms(moment: datetime) -> int:
    """Milliseconds since the epoch, exactly (a naive time is read as UTC), as Kafka stamps."""
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return (aware - _EPOCH) // timedelta(milliseconds=1)


def unreachable_message(bootstrap: str, detail: object = "") -> str:
    """What to tell a user whose Kafka does not answer, naming the two ways to fix it."""
    why = f" ({detail})" if detail else ""
    return (
        f"Kafka is not reachable at {bootstrap}{why}. Start the local broker with "
        "`ragwarm kafka start`, or point RAGWARM_KAFKA_BOOTSTRAP at your cluster."
    )


def quiet_client_logs() -> None:
    """Keep kafka-python's connection chatter out of command output unless at DEBUG.

    The commands report every failure themselves, with a hint on how to fix it.
    """
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger("kafka").setLevel(logging.CRITICAL)


class KafkaUnreachable(RuntimeError):
    """No broker answered at the bootstrap servers."""

    def __init__(self, bootstrap: str, detail: object = "") -> None:
        super().__init__(unreachable_message(bootstrap, detail))
        self.bootstrap = bootstrap
