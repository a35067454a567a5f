"""The pure decision layer: events and state in, commands out; no Faust, Kafka or I/O."""
