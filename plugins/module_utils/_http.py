# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's one HTTP client: JSON over ``ansible.module_utils.urls.Request``.

Private to this collection: no compatibility promise. Used by the server probes, the router
client and the benchmark. It never raises for network outcomes: every exchange is a Response
whose ``kind`` says what happened (``http`` with a status, ``refused``, ``timeout``, ``error``).
The API key travels only in the Authorization header and is never part of a Response.
"""
from __future__ import annotations

import errno
import json
import socket

from urllib.error import HTTPError, URLError

HTTP = "http"
REFUSED = "refused"
TIMEOUT = "timeout"
ERROR = "error"


class Response(object):
    """Outcome of one request: ``kind`` is http (a status arrived), refused, timeout or error."""

    def __init__(self, kind, status=None, body=None, error=None):
        self.kind = kind
        self.status = status if kind == HTTP else None
        self.body = body or ""
        self.error = error

    @property
    def text(self):
        return self.body

    @property
    def port_open(self):
        """Something accepted the connection (any answer, or a request that hung)."""
        return self.kind in (HTTP, TIMEOUT)

    def json(self):
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None

    def describe(self):
        if self.kind == HTTP:
            excerpt = (self.body or "").strip().replace("\n", " ")
            return "HTTP %s%s" % (self.status, " " + excerpt[:300] if excerpt and self.status >= 400 else "")
        if self.kind == REFUSED:
            return "connection refused"
        if self.kind == TIMEOUT:
            return "no answer within the request timeout"
        return "error: %s" % self.error


def text_of(body):
    if isinstance(body, bytes):
        return body.decode("utf-8", "replace")
    return body or ""


def _is_timeout(exc):
    return isinstance(exc, socket.timeout) or "timed out" in str(exc).lower()


def _is_refused(exc):
    return isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == errno.ECONNREFUSED \
        or "refused" in str(exc).lower()


def _classify(exc):
    if _is_timeout(exc):
        return Response(TIMEOUT, error=str(exc))
    if _is_refused(exc):
        return Response(REFUSED, error=str(exc))
    return Response(ERROR, error="%s: %s" % (type(exc).__name__, exc))


_CONTEXTS = {}  # validate_certs -> SSL context, for every transport of this process


def open_url_transport(validate_certs=True):
    """``(method, url, payload, headers, timeout) -> Response`` over ansible's urls.Request.

    One SSL context per process and ``validate_certs``, made at the first request: ``open_url``
    makes a new one (and loads the system's CA certificates) for every request, also for plain
    http, which cost 20-50 ms of CPU per poll of the router or the server.
    """
    from ansible.module_utils.urls import Request, make_context

    def transport(method, url, payload, headers, timeout):
        data = None
        headers = dict(headers or {})
        if payload is not None:
            data = json.dumps(payload)
            headers["Content-Type"] = "application/json"
        try:
            if validate_certs not in _CONTEXTS:
                _CONTEXTS[validate_certs] = make_context(validate_certs=validate_certs)
            resp = Request(context=_CONTEXTS[validate_certs]).open(
                method, url, data=data, headers=headers, timeout=max(float(timeout), 0.1),
                validate_certs=validate_certs, follow_redirects="none")
            return Response(HTTP, getattr(resp, "status", None) or resp.getcode(), text_of(resp.read()))
        except HTTPError as exc:
            try:
                body = exc.read()
            except Exception:  # pylint: disable=broad-except
                body = b""
            return Response(HTTP, exc.code, text_of(body))
        except URLError as exc:
            reason = exc.reason
            return _classify(reason if isinstance(reason, Exception) else exc)
        except Exception as exc:  # pylint: disable=broad-except
            return _classify(exc)

    return transport


def auth_headers(api_key=None):
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer %s" % api_key
    return headers


class HttpClient(object):
    """JSON requests against one base URL, with an optional Bearer key."""

    def __init__(self, base_url, api_key=None, validate_certs=True, transport=None, timeout=30.0):
        self.base_url = (base_url or "").strip().rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.transport = transport or open_url_transport(validate_certs)

    def request(self, method, path, payload=None, timeout=None):
        return self.transport(method, self.base_url + path, payload, auth_headers(self.api_key),
                              self.timeout if timeout is None else timeout)

    def get(self, path, timeout=None):
        return self.request("GET", path, None, timeout)

    def post(self, path, payload, timeout=None):
        return self.request("POST", path, payload, timeout)

    def delete(self, path, timeout=None):
        return self.request("DELETE", path, None, timeout)
