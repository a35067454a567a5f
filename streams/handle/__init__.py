"""The handlers over ports: decisions run against tables and ports, knowing no Faust."""
