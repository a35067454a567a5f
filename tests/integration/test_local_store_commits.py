"""Qdrant local mode with the SQLite files in WAL (rag.store.relax_local_commits):
points written are there after the client is closed and opened again."""

from __future__ import annotations

import sqlite3

import pytest
from qdrant_client import QdrantClient
from qdrant_client import models as qm

from rag.store import relax_local_commits

pytestmark = pytest.mark.integration


def test_wal_store_keeps_every_point_across_a_reopen(tmp_path):
    client = QdrantClient(path=str(tmp_path / "q"))
    for name in ("a", "b"):
        client.create_collection(name, vectors_config=qm.VectorParams(size=2,
                                                                      distance=qm.Distance.DOT))
    assert relax_local_commits(client) == 2
    points = [qm.PointStruct(id=i, vector=[1.0, float(i)], payload={"i": i}) for i in range(50)]
    for point in points:  # one commit each, as the store writes them
        client.upsert("a", [point])
    client.close()
    files = list((tmp_path / "q").rglob("storage.sqlite"))
    assert files and all(
        sqlite3.connect(f).execute("PRAGMA journal_mode").fetchone()[0] == "wal" for f in files
    )
    again = QdrantClient(path=str(tmp_path / "q"))
    assert again.count("a").count == 50
    assert again.retrieve("a", [49])[0].payload == {"i": 49}
    again.close()


def test_a_client_without_local_files_is_left_alone():
    assert relax_local_commits(object()) == 0
