"""The lab's web app: a Starlette app serving one static page and a two-call JSON API, on the loopback
interface only. Starlette rather than Gradio: the page is one HTML file and a script with no build step,
no CDN and no analytics, and the app is two routes; Gradio would bring a front-end bundle and its own
network calls for a page this small.

    GET  /            the page          GET /api/state   baseline, variables, history
    POST /api/run     {text, change: {variable, value, block}, prediction: {direction, amount_percent}}

A request the lab refuses (no prediction, two variables, a value out of range, a text too long, another run
in progress) is answered {"error": sentence} with status 200: it is the lab's answer, shown in the page,
and the browser logs nothing for it. A request that is not the page's (not JSON, nested too deep, an oversized
body: refused by its declared length, else as soon as the bytes read pass the limit) gets 400 / 413. A request
naming another site in Host or Origin (a page elsewhere, or a DNS name rebound to the loopback) gets 403. A
run happens in a worker thread, so the server keeps answering meanwhile."""

from __future__ import annotations

import json
import math
import socket
from importlib import resources
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ...errors import ReskipError
from .session import LabSession
from .variables import LabError

MAX_BODY = 64 * 1024  # bytes: a text of MAX_TOKENS tokens is far smaller
HOST = "127.0.0.1"
LOOPBACK_NAMES = (HOST, "localhost")  # what Host and Origin may name: the address served on, by number or name
REQUEST_KEYS = {"text", "change", "prediction"}  # a run request's fields (each typed by the session)


class TooLarge(Exception):
    pass


async def _bounded_body(request: Request) -> bytes:
    """The body, read no further than MAX_BODY bytes (a declared length above it is refused unread)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise TooLarge(int(declared))
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise TooLarge(len(body))
    return bytes(body)


def _foreign(request: Request) -> str | None:
    """Why a request comes from another site, or None: its Host must name the loopback and the port the lab is
    served on (no DNS rebinding), and its Origin, when a browser sends one, be the lab's own whole origin: scheme
    http, the loopback by number or name, and that port (a page from another port of 127.0.0.1 is another site)."""
    served = (request.scope.get("server") or (HOST, None))[1]  # the port the socket is bound to, not a header's
    host = urlsplit("//" + request.headers.get("host", ""))
    if host.hostname not in LOOPBACK_NAMES or (served is not None and _port(host) not in (served, None)):
        return f"the lab answers requests for {HOST}:{served} only, not {request.headers.get('host', '')[:80]!r}"
    origin = request.headers.get("origin")
    if origin is None:
        return None
    o = urlsplit(origin)
    if o.scheme != "http" or o.hostname not in LOOPBACK_NAMES or (served is not None and _port(o) != served):
        return f"the lab answers its own page only (http://{HOST}:{served}), not one from {origin[:80]!r}"
    return None


def _port(parts) -> int | None:
    """A URL's port, None when it names none or one that is not a number."""
    try:
        return parts.port
    except ValueError:
        return -1


def _static(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def build_app(session: LabSession) -> Starlette:
    async def page(request: Request) -> Response:
        return HTMLResponse(_static("index.html"))

    async def script(request: Request) -> Response:
        return Response(_static("lab.js"), media_type="text/javascript")

    async def state(request: Request) -> Response:
        if why := _foreign(request):
            return JSONResponse({"error": why}, status_code=403)
        return JSONResponse(session.state())

    async def run(request: Request) -> Response:
        if why := _foreign(request):
            return JSONResponse({"error": why}, status_code=403)
        try:
            body = await _bounded_body(request)
        except TooLarge as e:
            return JSONResponse({"error": f"the request is {e.args[0]:,} bytes or more; at most {MAX_BODY:,}"},
                                status_code=413)
        try:
            data = json.loads((body or b"{}").decode("utf-8"), parse_constant=_no_constant, parse_float=_finite)
        except UnicodeDecodeError:
            return JSONResponse({"error": "the request is not UTF-8 text"}, status_code=400)
        except RecursionError:
            return JSONResponse({"error": "the request is nested too deeply"}, status_code=400)
        except (json.JSONDecodeError, ValueError) as e:
            return JSONResponse({"error": f"the request is not standard JSON ({e})"}, status_code=400)
        if not isinstance(data, dict):
            return JSONResponse({"error": "the request must be a JSON object"}, status_code=400)
        unknown = sorted(set(data) - REQUEST_KEYS)
        if unknown:
            return JSONResponse({"error": f"unknown request field(s) {', '.join(map(repr, unknown))[:200]}; a run takes "
                                          f"{', '.join(sorted(REQUEST_KEYS))}"}, status_code=400)
        try:
            result = await run_in_threadpool(session.run, data.get("text"), data.get("change"), data.get("prediction"))
        except LabError as e:
            return JSONResponse({"error": str(e)})
        return JSONResponse(result)

    async def no_icon(request: Request) -> Response:
        return Response(status_code=204)  # the browser asks for one; the page has none

    return Starlette(routes=[Route("/", page), Route("/lab.js", script), Route("/api/state", state),
                             Route("/api/run", run, methods=["POST"]),
                             Route("/favicon.ico", no_icon)])


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"{text} is too large for a number")
    return x


def check_port(port: int) -> None:
    """Refuse a port another program holds, before any URL is printed. With SO_REUSEADDR, as the server binds:
    a port a stopped lab left in TIME-WAIT is free to it, and so to this check."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError as e:
            raise ReskipError(f"port {port} on {HOST} is in use ({e.strerror}): stop what holds it or pass --port") from None


def serve(session: LabSession, port: int) -> None:
    import uvicorn  # lazy: only the serving command needs it

    check_port(port)
    print(f"reskip lab on http://{HOST}:{port}/ (loopback only; Ctrl-C stops it)", flush=True)
    uvicorn.run(build_app(session), host=HOST, port=port, log_level="warning")
