"""``cuvil dashboard``: a local web page over a results database, updating while a run progresses.

The standard library's threaded HTTP server, read-only over SQLite (``mode=ro``: the dashboard can
never write to the results), bound to 127.0.0.1 unless told otherwise. Pages are rendered on the
server (tables, and charts by matplotlib as SVG); the one script, ``dashboard.js``, asks every two
seconds whether the database changed and then swaps in the page's fresh content. No build step, no
CDN: it works offline. Requests whose Host header names neither an IP address, this machine nor the
address served are refused (a web page elsewhere cannot read the fleet through DNS rebinding, which
needs a name the attacker owns). A connection that sends nothing for REQUEST_TIMEOUT_S is closed, and
past MAX_CONNECTIONS at once a new one is closed unanswered, so idle or half-sent requests cannot
hold every thread and file descriptor of the server.

Routes: ``/`` runs and the fleet inventory · ``/run/<id>`` one run · ``/device/<id>`` a device's
history · ``?fragment=1`` a page's content only · ``/api/version`` the database's change marker ·
``/api/runs`` and ``/api/run/<id>`` the JSON of ``cuvil results --json``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from . import html_views, report
from .store import ResultsStore, StoreError

POLL_MS = 2000
REQUEST_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64
_RUN_NUMBER = re.compile(r"[0-9]{1,18}")  # ASCII digits only: str.isdigit takes '²', which int() refuses
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; img-src 'self' data:; "
                               "style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class Page:
    status: int
    body: bytes
    content_type: str = "text/html; charset=utf-8"


class Dashboard:
    """The pages of one database; each request opens its own read-only connection."""

    def __init__(self, db: str | os.PathLike):
        self.db = Path(db)
        ResultsStore.open_read_only(self.db).close()  # refuse a missing or unreadable database at start

    def _store(self) -> ResultsStore:
        return ResultsStore.open_read_only(self.db)

    def handle(self, target: str) -> Page:
        url = urlsplit(target)
        fragment = parse_qs(url.query).get("fragment") == ["1"]
        parts = [unquote(p) for p in url.path.split("/") if p]
        if parts == ["static", "dashboard.js"]:
            return Page(200, _script(), "text/javascript; charset=utf-8")
        store = self._store()
        try:
            return self._route(store, parts, fragment)
        except StoreError as e:
            return Page(404, html_views.document("not found", f"<p>{html_views.esc(e)}</p>").encode())
        finally:
            store.close()

    def _route(self, store: ResultsStore, parts: list[str], fragment: bool) -> Page:
        version = store.change_marker()
        routes: dict[str, Callable[[list[str]], Page]] = {
            "api": lambda rest: self._api(store, rest, version),
            "run": lambda rest: self._html(html_views.run_content(store, _int(rest), "/"), f"run {rest[0]}", fragment,
                                           version),
            "device": lambda rest: self._html(html_views.device_content(store, _one(rest), "/"), f"device {rest[0]}",
                                              fragment, version),
        }
        if not parts:
            return self._html(html_views.overview_content(store, "/"), "fleet", fragment, version)
        handler = routes.get(parts[0])
        if handler is None or (parts[0] != "api" and len(parts) != 2):
            return _not_found()
        return handler(parts[1:])

    @staticmethod
    def _html(content: str, title: str, fragment: bool, version: str) -> Page:
        if fragment:
            return Page(200, content.encode())
        nav = ("<nav><a href='/'>runs and fleet</a><span id='live' data-poll-ms='%d'>live</span></nav>" % POLL_MS)
        body = f"{nav}<main id='content'>{content}</main>"
        return Page(200, html_views.document(f"Cuvil dashboard: {title}", body, "/static/dashboard.js",
                                             version).encode())

    @staticmethod
    def _api(store: ResultsStore, rest: list[str], version: str) -> Page:
        if rest == ["version"]:
            text = json.dumps({"version": version})
        elif rest == ["runs"]:
            text = report.history_json(store)
        elif len(rest) == 2 and rest[0] == "run":
            text = report.history_json(store, _int(rest[1:]))
        else:
            return _not_found()
        return Page(200, text.encode(), "application/json")


def _int(rest: list[str]) -> int:
    if len(rest) != 1 or not _RUN_NUMBER.fullmatch(rest[0]):
        raise StoreError("a run is named by its number")
    return int(rest[0])


def _one(rest: list[str]) -> str:
    if len(rest) != 1:
        raise StoreError("one device id expected")
    return rest[0]


def _not_found() -> Page:
    return Page(404, html_views.document("not found", "<p>not found</p>").encode())


def _script() -> bytes:
    return resources.files(__package__).joinpath("dashboard.js").read_bytes()


def host_allowed(header: str, port: int, names: frozenset[str]) -> bool:
    """Whether a request's Host header names this server: the port served (80 when the header has none)
    and an IP address literal or one of ``names`` (lowercase)."""
    header = header.strip().lower()
    if header.startswith("["):  # an IPv6 literal, [::1]:8050
        host, _, rest = header[1:].partition("]")
        given = rest[1:] if rest.startswith(":") else ("" if not rest else None)
    else:
        host, _, given = header.partition(":") if header.count(":") == 1 else (header, "", "")
    if given is None or not (given == "" or given.isascii() and given.isdigit()) or not host:
        return False
    if (int(given) if given else 80) != port:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return host in names


def _handler(dash: Dashboard, port: int, names: frozenset[str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "cuvil-dashboard"
        sys_version = ""
        timeout = REQUEST_TIMEOUT_S  # a connection that sends nothing this long is closed

        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            if not host_allowed(self.headers.get("Host", ""), port, names):
                page = Page(HTTPStatus.MISDIRECTED_REQUEST, b"unexpected Host header", "text/plain; charset=utf-8")
            else:
                try:
                    page = dash.handle(self.path)
                except Exception as e:  # one bad page never stops the server: say so, keep serving
                    text = f"<p>error: {html_views.esc(type(e).__name__)}: {html_views.esc(e)}</p>"
                    page = Page(500, html_views.document("error", text).encode())
            self.send_response(page.status)
            self.send_header("Content-Type", page.content_type)
            self.send_header("Content-Length", str(len(page.body)))
            for k, v in SECURITY_HEADERS.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(page.body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (the standard library's name)
            pass  # a dashboard's terminal shows its address, not every poll

    return Handler


class _Server(ThreadingHTTPServer):
    """A thread per connection, at most MAX_CONNECTIONS at once: one more is closed unanswered (an
    unbounded server ran out of file descriptors under idle connections and spun on accept)."""

    daemon_threads = True

    def __init__(self, address: tuple, handler: type[BaseHTTPRequestHandler], family: int):
        self.address_family = family
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        """ThreadingMixIn's, with the slot given back before the connection closes: a client that saw its
        connection closed and connected again found the slot still held and was turned away."""
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 — as ThreadingMixIn: reported by handle_error, the server serves on
            self.handle_error(request, client_address)
        finally:
            self._slots.release()
            self.shutdown_request(request)


class DashboardServer:
    """A running dashboard: ``url``, and ``close()``; serves in a daemon thread from ``start()``."""

    def __init__(self, db: str | os.PathLike, host: str = "127.0.0.1", port: int = 8050):
        self.dashboard = Dashboard(db)
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]  # IPv4 or IPv6, as host names
            self.httpd = _Server((host, port), BaseHTTPRequestHandler, family)
        except OSError as e:
            raise StoreError(f"cannot serve on {host}:{port}: {e.strerror or e}") from None
        real_port = self.httpd.server_address[1]
        names = frozenset(n.lower() for n in (host, "localhost", socket.gethostname(), socket.getfqdn()))
        self.httpd.RequestHandlerClass = _handler(self.dashboard, real_port, names)
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{real_port}/"
        self._thread: threading.Thread | None = None

    def start(self) -> DashboardServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="cuvil-dashboard", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join()
        self.httpd.server_close()
