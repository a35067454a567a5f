"""The Faust app: agents, tables, timers and web views that decide what to warm."""
