"""The local stack: background processes, `ragwarm up|down|status`, and the demo."""
