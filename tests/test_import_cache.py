"""The cached transformers import table is the one transformers builds itself."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

PROBE = """
import json, sys, hashlib
import mlxbun_cli
import transformers
from transformers import AutoTokenizer  # loads transformers.models, the second table
from mlxbun_cli import import_cache
tables = [sys.modules["transformers"], sys.modules["transformers.models"]]
digest = hashlib.sha256(
    repr([sorted(m._class_to_module.items()) for m in tables]).encode()
).hexdigest()
print(json.dumps({"digest": digest, **import_cache.stats}))
"""


def _probe(home, **env) -> dict:
    full = {**os.environ, "MLXBUN_HOME": str(home), "TRANSFORMERS_VERBOSITY": "error", **env}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cache_gives_transformers_own_table_and_is_reused(tmp_path):
    uncached = _probe(tmp_path / "off", MLXBUN_IMPORT_CACHE="0")
    assert uncached["hits"] == uncached["misses"] == 0
    assert not (tmp_path / "off" / "cache").exists()

    cold = _probe(tmp_path)
    (table_file,) = (tmp_path / "cache" / "transformers-imports").glob("*.pickle")
    warm = _probe(tmp_path)
    assert cold["misses"] >= 2 and cold["hits"] == 0
    assert warm["hits"] == cold["misses"] and warm["misses"] == 0
    assert cold["digest"] == warm["digest"] == uncached["digest"]

    # A changed folder (its mtime) means that table is scanned again and rewritten.
    tables = pickle.loads(table_file.read_bytes())
    key = next(iter(tables))
    stamp, table = tables[key]
    tables[key] = (stamp - 1, {"stale": "table"})
    table_file.write_bytes(pickle.dumps(tables))
    again = _probe(tmp_path)
    assert again["misses"] == 1 and again["digest"] == uncached["digest"]
    assert pickle.loads(table_file.read_bytes())[key] == (stamp, table)


def test_a_broken_cache_file_is_scanned_over(tmp_path):
    uncached = _probe(tmp_path / "off", MLXBUN_IMPORT_CACHE="0")
    _probe(tmp_path)
    (table_file,) = (tmp_path / "cache" / "transformers-imports").glob("*.pickle")
    table_file.write_bytes(b"not a pickle")
    broken = _probe(tmp_path)
    assert broken["hits"] == 0 and broken["digest"] == uncached["digest"]
    assert _probe(tmp_path)["misses"] == 0  # and it was written back whole
