"""The console's pages: a request's path and query in, a status and an HTML page out (no I/O here).

    /                         the broker: listeners, connections, store, counts
    /topics                   every topic: partitions, records, bytes, produce rate
    /topics/NAME              its partitions, configs, produce and consume rates (plots), and a form for
                              its messages
    /topics/NAME/messages     ?partition=P&offset=O|time=ISO-or-ms&count=N&format=text|json|hex
    /groups                   every group: state, lag
    /groups/NAME              members and their partitions, committed offset and lag per partition, lag
                              over time (a plot)
    /login, /logout           where a broker that checks its clients (ACLs, SASL) asks who looks

Templates live in ``templates/`` and are rendered with autoescaping: every key, value and name a client
sent is escaped, whatever it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from stratalog.console.login import COOKIE, SESSION_S, Sessions, Viewer
from stratalog.console.plots import line_plot
from stratalog.console.views import FORMATS, MESSAGES_MAX, ConsoleData, ConsoleError, ConsoleForbiddenError, Formats

HTTP_OK, HTTP_SEE_OTHER = 200, 303
HTTP_BAD_REQUEST, HTTP_UNAUTHORIZED, HTTP_FORBIDDEN, HTTP_NOT_FOUND, HTTP_METHOD_NOT_ALLOWED = 400, 401, 403, 404, 405
#: Seconds between reloads of the pages that watch things move (lists, a topic, a group).
REFRESH_S = 10
KIB = 1024
#: Records a messages page shows unless asked for another count.
MESSAGES_DEFAULT = 20


@dataclass(frozen=True)
class Request:
    """What the server read of an HTTP request."""

    method: str
    target: str
    #: The client's address: the host its ACLs are matched against.
    host: str
    cookies: dict[str, str] = field(default_factory=dict)
    #: A POST's form, already parsed.
    form: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Page:
    status: int
    body: str
    headers: tuple[tuple[str, str], ...] = ()


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("stratalog.console", "templates"),
                      autoescape=select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True)
    env.filters["time"] = lambda ms: "-" if ms is None else \
        datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    env.filters["count"] = lambda n: "-" if n is None else f"{n:,}"
    env.filters["bytes"] = _bytes
    env.filters["rate"] = lambda r: "-" if r is None else f"{r:,.1f}/s"
    return env


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < KIB or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= KIB
    return f"{n} B"


class ConsoleApp:
    """Routes requests to pages over ``data``; ``sessions`` says who is logged in."""

    def __init__(self, data: ConsoleData, sessions: Sessions, *, secure: bool = False) -> None:
        self.data = data
        self.sessions = sessions
        #: Served over HTTPS: the session cookie is sent over HTTPS only.
        self._cookie_attributes = "Path=/; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")
        self._env = _environment()

    def handle(self, request: Request) -> Page:
        """The page for a request (``GET /topics/x?partition=0``, ``POST /login``)."""
        parts = urlsplit(request.target)
        path = [unquote(p) for p in parts.path.split("/") if p]
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if path == ["login"]:
            return self._login(request, query)
        if path == ["logout"]:
            self.sessions.logout(request.cookies.get(COOKIE))
            return _redirect("/login", (("Set-Cookie", f"{COOKIE}=; Max-Age=0; {self._cookie_attributes}"),))
        if request.method != "GET":
            return self._render(HTTP_METHOD_NOT_ALLOWED, "error.html", title="not allowed",
                                message="the console is read-only")
        principal = self.sessions.principal(request.cookies.get(COOKIE))
        if self.sessions.required and principal is None:
            return _redirect("/login?" + urlencode({"next": request.target}))
        return self._viewed(Viewer(principal, request.host), path, query)

    def _viewed(self, viewer: Viewer, path: list[str], query: dict[str, str]) -> Page:
        try:
            return self._route(viewer, path, query)
        except ConsoleError as e:
            return self._render(HTTP_NOT_FOUND, "error.html", title="not found", message=str(e), viewer=viewer)
        except ConsoleForbiddenError as e:
            return self._render(HTTP_FORBIDDEN, "error.html", title="not allowed", message=str(e), viewer=viewer)
        except ValueError as e:
            return self._render(HTTP_BAD_REQUEST, "error.html", title="bad request", message=str(e), viewer=viewer)

    def _login(self, request: Request, query: dict[str, str]) -> Page:
        if not self.sessions.required:
            return _redirect("/")
        wanted = request.form.get("next") or query.get("next") or "/"
        if not wanted.startswith("/") or wanted.startswith("//"):   # only pages of this console
            wanted = "/"
        if request.method != "POST":
            return self._render(HTTP_OK, "login.html", title="log in", next=wanted)
        token = self.sessions.login(request.form.get("user", ""), request.form.get("password", ""))
        if token is None:
            return self._render(HTTP_UNAUTHORIZED, "login.html", title="log in", next=wanted,
                                failed="unknown user or wrong password", user=request.form.get("user", ""))
        cookie = f"{COOKIE}={token}; Max-Age={int(SESSION_S)}; {self._cookie_attributes}"
        return _redirect(wanted, (("Set-Cookie", cookie),))

    def _route(self, viewer: Viewer, path: list[str], query: dict[str, str]) -> Page:
        if not path:
            return self._render(HTTP_OK, "overview.html", title="broker", refresh=REFRESH_S, viewer=viewer,
                                broker=self.data.overview(viewer))
        match path:
            case ["topics"]:
                return self._render(HTTP_OK, "topics.html", title="topics", refresh=REFRESH_S, viewer=viewer,
                                    **self.data.topics(viewer))
            case ["topics", name]:
                topic = self.data.topic(viewer, name)
                return self._render(HTTP_OK, "topic.html", title=f"topic {name}", refresh=REFRESH_S, t=topic,
                                    viewer=viewer,
                                    formats=FORMATS, count=MESSAGES_DEFAULT,
                                    produced=Markup(line_plot(topic["produced"], "records/s", "produced")),
                                    consumed=Markup(line_plot(topic["consumed"], "records/s",
                                                              "consumed (offsets committed)")))
            case ["topics", name, "messages"]:
                return self._messages(viewer, name, query)
            case ["groups"]:
                return self._render(HTTP_OK, "groups.html", title="groups", refresh=REFRESH_S, viewer=viewer,
                                    **self.data.groups(viewer))
            case ["groups", name]:
                group = self.data.group(viewer, name)
                return self._render(HTTP_OK, "group.html", title=f"group {name}", refresh=REFRESH_S, g=group,
                                    viewer=viewer,
                                    lag=Markup(line_plot(group["lag_series"], "records", "lag")))
        raise ConsoleError(f"no page {'/' + '/'.join(path)}")

    def _messages(self, viewer: Viewer, topic: str, query: dict[str, str]) -> Page:
        partition = _int(query.get("partition", "0"), "partition")
        count = _int(query.get("count", str(MESSAGES_DEFAULT)), "count")
        offset = _int(query["offset"], "offset") if query.get("offset") else None
        when = _time_ms(query["time"]) if query.get("time") else None
        fmt = query.get("format", "text")
        if fmt not in FORMATS:
            raise ValueError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
        found = self.data.messages(viewer, topic, partition, offset, when, count, Formats(fmt))
        return self._render(HTTP_OK, "messages.html", title=f"{topic}/{partition} messages", m=found, viewer=viewer,
                            formats=FORMATS, count=count, count_max=MESSAGES_MAX)

    def _render(self, status: int, template: str, **context: Any) -> Page:
        return Page(status, self._env.get_template(template).render(**context))


def _redirect(location: str, headers: tuple[tuple[str, str], ...] = ()) -> Page:
    return Page(HTTP_SEE_OTHER, "", (("Location", location), *headers))


def _int(text: str, name: str) -> int:
    if not text.strip().isdigit():
        raise ValueError(f"{name} {text!r}: expected a whole number")
    return int(text)


def _time_ms(text: str) -> int:
    """Milliseconds since 1970, or an ISO 8601 time (UTC unless it names its zone)."""
    if text.strip().isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"time {text!r}: expected ms since 1970 or an ISO 8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)
