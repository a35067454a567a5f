"""The Faust shell: the app, its topics, tables, agents, timers and web views."""
