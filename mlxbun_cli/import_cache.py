"""A disk cache for the table transformers builds of its own source tree at import.

transformers 5 makes its lazy-import table on every import by reading each of
its ~3,300 model files for their `__all__`: about half of `import mlx_lm`,
0.4-0.5 s of every process that loads a model (a CLI run, a server worker,
a job). The table depends only on those files, so it is kept per transformers
version under the cache dir, with the newest mtime of the scanned folders: an
upgrade, or a file added or removed anywhere in them, scans again (a
development version, which can change in place, is not cached). Anything
unexpected (another transformers layout, an unreadable cache) leaves
transformers' own scan to run as usual. `MLXBUN_IMPORT_CACHE=0` turns it off.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

_MODULE = "transformers.utils.import_utils"
_FUNCTION = "create_import_structure_from_path"

stats = {"hits": 0, "misses": 0}


def install() -> None:
    """Wrap transformers' scan when it is imported; call before anything imports it."""
    if os.environ.get("MLXBUN_IMPORT_CACHE", "1") == "0" or "transformers" in sys.modules:
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


class _Finder:
    """Finds `transformers.utils.import_utils` as usual, then wraps its scan after it runs."""

    done = False  # once only; left in sys.meta_path, which importlib may be iterating

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _MODULE or self.done:
            return None
        self.done = True
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            try:
                _wrap(module)
            except Exception:  # never worse than transformers' own scan
                pass

        loader.exec_module = exec_module
        return spec


def _wrap(module: Any) -> None:
    scan = getattr(module, _FUNCTION, None)
    version = getattr(sys.modules.get("transformers"), "__version__", None)
    if not callable(scan) or not isinstance(version, str) or "dev" in version:
        return  # a development checkout can change under the same version
    store = _Store(version)
    inner = threading.local()  # the scan recurses into subfolders; only the outer call is cached

    def cached_scan(module_path: Any) -> Any:
        if getattr(inner, "active", False):
            return scan(module_path)
        key = str(module_path)
        stamp = _stamp(key)
        found = store.get(key, stamp)
        if found is not None:
            stats["hits"] += 1
            return found
        stats["misses"] += 1
        inner.active = True
        try:
            result = scan(module_path)
        finally:
            inner.active = False
        store.put(key, stamp, result)
        return result

    cached_scan.__wrapped__ = scan  # type: ignore[attr-defined]
    setattr(module, _FUNCTION, cached_scan)


def _stamp(path: str) -> int | None:
    """The newest mtime of the scanned folder and its subfolders (files added or removed)."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    try:
        newest, pending = os.stat(folder).st_mtime_ns, [folder]
        while pending:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False) and entry.name != "__pycache__":
                        newest = max(newest, entry.stat(follow_symlinks=False).st_mtime_ns)
                        pending.append(entry.path)
        return newest
    except OSError:
        return None


class _Store:
    """{path: (stamp, table)} in one pickle per transformers version."""

    def __init__(self, version: str) -> None:
        from mlxbun_cli import paths

        safe = "".join(c if c.isalnum() or c in ".-+" else "_" for c in version)
        self.file = paths.cache_dir() / "transformers-imports" / f"{safe}.pickle"
        self._tables: dict[str, tuple[int, Any]] | None = None

    def _load(self) -> dict[str, tuple[int, Any]]:
        if self._tables is None:
            import pickle

            try:
                with open(self.file, "rb") as fh:
                    tables = pickle.load(fh)
                self._tables = tables if isinstance(tables, dict) else {}
            except Exception:  # missing, torn or from another Python: scan again
                self._tables = {}
        return self._tables

    def get(self, key: str, stamp: int | None) -> Any:
        if stamp is None:
            return None
        entry = self._load().get(key)
        if isinstance(entry, tuple) and len(entry) == 2 and entry[0] == stamp:
            return entry[1]
        return None

    def put(self, key: str, stamp: int | None, table: Any) -> None:
        if stamp is None:
            return
        import pickle

        tables = self._load()
        partial = self.file.with_name(f"{self.file.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tables[key] = (stamp, pickle.loads(pickle.dumps(table)))  # a copy callers cannot change
            self.file.parent.mkdir(parents=True, exist_ok=True)
            with open(partial, "wb") as fh:
                pickle.dump(tables, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(partial, self.file)  # readers see the old file or the new one
        except Exception:  # a read-only cache dir: this process still has the table
            partial.unlink(missing_ok=True)
