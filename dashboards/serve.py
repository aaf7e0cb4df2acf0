"""``autotune dashboard --serve``: the report on http://127.0.0.1:PORT/, rebuilt on each request.

Listens on the loopback interface only, and answers only requests addressed to 127.0.0.1 or
localhost (the report shows a database's contents; nothing else on the network, nor a web page
that rebinds its own name to 127.0.0.1, should read it). ``/`` builds the report from the
database as it is now; ``/state`` answers a short fingerprint of the study's trials, which the
page polls every few seconds and reloads on a change, so the page follows a search that is
still running. Readers never block the search's writes (SQLite WAL, see ``db.storage``).
"""

from __future__ import annotations

import hashlib
import html
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TextIO

from autotune.errors import AutotuneError
from dashboards.data import latest_study_name, load_study
from dashboards.report import REFRESH_S, build_report
from db import Database
from db.errors import StorageError, hide_password

HOST = "127.0.0.1"
LOCAL_NAMES = (HOST, "localhost")
"""Host header names the server answers; any other is refused."""
DEFAULT_PORT = 8050


def study_state(database: Database, study_id: int) -> str:
    """Changes whenever a trial is added, changes status, or is measured again."""
    key = repr(
        [
            (t.id, t.status, len(t.metrics.get("remeasured_throughputs", ())))
            for t in database.list_trials(study_id)
        ]
    )
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def make_server(
    database: Database, study_name: str, port: int = DEFAULT_PORT
) -> ThreadingHTTPServer:
    """A server for one study (not yet serving); ``port`` 0 takes any free port."""
    study_id = database.get_study(study_name).id  # an unknown name fails here, naming the others

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            try:
                if self.headers.get("Host", "").rsplit(":", 1)[0] not in LOCAL_NAMES:
                    # A page elsewhere may point a name at 127.0.0.1 (DNS rebinding) to read
                    # this one; the browser then sends that name as the Host.
                    self._send(
                        403,
                        "text/plain",
                        "forbidden: open the dashboard as "
                        f"http://{HOST}:{self.server.server_port}/",
                    )
                elif path == "/state":
                    self._send(200, "text/plain", study_state(database, study_id))
                elif path in ("/", "/index.html"):
                    state = study_state(database, study_id)
                    self._send(
                        200,
                        "text/html",
                        build_report(load_study(database, study_name), live_state=state),
                    )
                else:
                    self._send(404, "text/plain", "not found: the dashboard is at /")
            except (AutotuneError, StorageError) as e:  # e.g. the database is busy: retry soon
                self._send(
                    503,
                    "text/html",
                    _ERROR_PAGE.format(
                        message=html.escape(hide_password(str(e))), seconds=REFRESH_S
                    ),
                )

        def _send(self, code: int, kind: str, text: str) -> None:
            body = text.encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - quiet
            pass

    try:
        return ThreadingHTTPServer((HOST, port), Handler)
    except OSError as e:
        raise AutotuneError(
            f"cannot listen on {HOST}:{port}: {e.strerror}; choose another "
            "--port (0 takes any free one)"
        ) from None


def serve(
    database: Database,
    study_name: str | None,
    *,
    port: int = DEFAULT_PORT,
    out: TextIO = sys.stderr,
) -> int:
    """Serves until interrupted (Ctrl-C stops it and returns 0)."""
    name = study_name or latest_study_name(database)
    server = make_server(database, name, port)
    print(
        f"serving study '{name}' from {database.url_for_display} at "
        f"http://{HOST}:{server.server_port}/ (refreshes while the search runs; Ctrl-C stops)",
        file=out,
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


_ERROR_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{seconds}">
<title>autotune dashboard</title></head>
<body><p>The dashboard could not be built: {message}</p><p>Retrying every {seconds} s.</p>
</body></html>
"""
