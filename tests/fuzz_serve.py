"""``envelope serve`` with a populated cluster view, for tests/test_fuzz_http.py:
``python tests/fuzz_serve.py VIEW.json serve --host ... --cluster-view none``.

Everything is the real command (``app.cli.main``: flags, TLS, limits, uvicorn, the
FastAPI app, logs) except where the view comes from: instead of an empty view (``none``)
or watches of a real API server (``live``), the objects in VIEW.json (a JSON list) in
the StaticView that ``envelope check`` judges files against — so 5,000 Nodes, quotas,
LimitRanges and KAI objects cost no API server to fill.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import app.cli
import app.cli.serve
from app.cluster.view import StaticView


def main(argv: list[str]) -> int:
    objects = orjson.loads(Path(argv[0]).read_bytes())

    def view(args: Any, rules: Any, policy: Any, *where: Any) -> tuple[StaticView, dict[str, Any]]:
        return StaticView(objects, indexes=rules.indexes), {}

    app.cli.serve._cluster_view = view  # type: ignore[assignment]
    return app.cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
