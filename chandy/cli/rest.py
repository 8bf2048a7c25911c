"""A small client of a running job's REST API (Flink's routes and JSON shapes, served by ``chandy.web``).

Every way a request can fail becomes one :class:`~chandy.cli.errors.CliError` that names
the address and the fix: nothing listening there, a token required or rejected, an
unknown job, an error the server reported.
"""

from __future__ import annotations

import hmac
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

import httpx

from chandy.cli.errors import CliError
from chandy.web.auth import IDENTITY_PATH, token_proof

DEFAULT_ADDRESS = "127.0.0.1:8081"
TOKEN_ENV_VAR = "CHANDY_REST_TOKEN"

_JOB_ID = re.compile(r"^[0-9a-fA-F]{32}$")


def check_job_id(job_id: str) -> str:
    """``job_id`` if it is a Flink JobID (32 hex digits), else a clear error."""
    if not _JOB_ID.match(job_id):
        raise CliError(
            f"'{job_id}' is not a job id: a job id is 32 hexadecimal digits, as `chandy list` shows them"
        )
    return job_id.lower()


def base_url(address: str) -> str:
    """``http://host:port`` for ``host:port`` (what ``-m`` takes, as Flink's CLI); a URL is kept."""
    address = address.strip().rstrip("/")
    if "://" in address:
        return address
    if not re.match(r"^[^:/\s]+:\d+$", address) and not re.match(r"^\[[0-9a-fA-F:]+\]:\d+$", address):
        raise CliError(f"-m/--jobmanager takes HOST:PORT (e.g. {DEFAULT_ADDRESS}), got '{address}'")
    return f"http://{address}"


class ApiUnreachable(CliError):
    """Nothing answers at the address (never did, or the job's process ended meanwhile)."""


@dataclass(frozen=True)
class SavepointOutcome:
    """The end of an asynchronous savepoint or stop operation: its path, or why it failed."""

    location: str | None
    failure: str | None


class RestClient:
    """Requests to one REST address, with Flink's versioned paths (``/v1/...``).

    With a token, the first request asks the server to prove it holds the same token
    (``GET /v1/chandy/identity``: an HMAC of a fresh nonce, see
    :func:`chandy.web.auth.token_proof`) and sends the token only if it does: whatever
    else may listen at the address (another job, another program on a port a job used to
    have) never gets it. A server that needs no token gets none."""

    def __init__(self, address: str, token: str | None, timeout: float = 30.0) -> None:
        self.address = address
        self._token = token
        self._token_checked = not token
        self._client = httpx.Client(
            base_url=base_url(address), headers={"Accept": "application/json"}, timeout=timeout
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ requests

    def request(
        self,
        method: str,
        path: str,
        *,
        json: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        job_id: str | None = None,
    ) -> Any:
        """The decoded JSON answer of ``method path``; any failure is a :class:`CliError`.

        Every request but a GET carries a JSON body (``{}`` if none), as Flink's client's do:
        the server refuses a state-changing request of another type."""
        headers = self._authorization()
        if json is None and method != "GET":
            json = {}
        response = self._send(method, path, json=json, params=params, headers=headers)
        return self._decode(response, method, path, job_id)

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        try:
            return self._client.request(method, "/v1" + path, json=json, params=params, headers=headers)
        except httpx.ConnectError as exc:
            raise ApiUnreachable(
                f"no chandy REST API at {self.address} ({_reason(exc)}): start a job there "
                "(`chandy run job.py`), or pass -m/--jobmanager HOST:PORT of a running job's REST API"
            ) from None
        except httpx.TimeoutException:
            raise CliError(
                f"the REST API at {self.address} did not answer {method} {path} in time: the job's "
                "driver may be overloaded or stuck; try again, or check the job's log"
            ) from None
        except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as exc:
            raise ApiUnreachable(
                f"the REST API at {self.address} dropped the connection during {method} {path} "
                f"({_reason(exc)}): the job's process may have ended; `chandy list -m {self.address}` tells"
            ) from None
        except httpx.HTTPError as exc:
            raise CliError(f"{method} {path} at {self.address} failed: {_reason(exc)}") from None

    def _authorization(self) -> dict[str, str]:
        """The ``Authorization`` header, once the server proved it holds the token."""
        if not self._token_checked:
            self._check_identity()
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def _check_identity(self) -> None:
        assert self._token is not None
        nonce = secrets.token_hex(16)
        response = self._send("GET", IDENTITY_PATH, params={"nonce": nonce})
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if response.status_code != 200 or not isinstance(answer, dict) or answer.get("service") != "chandy":
            raise CliError(
                f"{self.address} does not answer as a chandy REST API (GET /v1{IDENTITY_PATH}: "
                f"{response.status_code}), so the token was not sent: is -m the address of a running "
                "chandy job's REST API (its rest.port)?"
            )
        if answer.get("token-required") is not True:
            self._token = None  # this server needs none: nothing secret goes out
        elif not hmac.compare_digest(str(answer.get("proof")), token_proof(self._token, nonce)):
            raise CliError(
                f"the REST API at {self.address} does not hold the token you passed (it could not prove "
                "it has it), so the token was not sent: another job or program may be listening there. "
                f"Check -m/--jobmanager, and --token (or {TOKEN_ENV_VAR})"
            )
        self._token_checked = True

    def _decode(self, response: httpx.Response, method: str, path: str, job_id: str | None) -> Any:
        status = response.status_code
        if status == 401:
            if self._token:
                raise CliError(
                    f"the REST API at {self.address} rejected the token (401 Unauthorized): pass the "
                    f"job's rest.auth.token with --token (or in {TOKEN_ENV_VAR})"
                )
            raise CliError(
                f"the REST API at {self.address} requires a token (401 Unauthorized): pass --token "
                f"TOKEN (or set {TOKEN_ENV_VAR}) with the job's rest.auth.token"
            )
        body: Any = None
        if response.content:
            try:
                body = response.json()
            except ValueError:
                body = None
        if status == 404 and job_id is not None:
            raise CliError(
                f"no job {job_id} at {self.address}: `chandy list -m {self.address}` shows the jobs "
                "there (a job's REST API lives as long as the process that runs it)"
            )
        if status >= 400:
            if not isinstance(body, dict):
                raise CliError(
                    f"{method} {path} at {self.address} failed ({status}) without a JSON error: is "
                    "this the REST API of a chandy job (its rest.port)?"
                )
            raise CliError(f"{method} {path} at {self.address} failed ({status}): {_server_errors(body)}")
        if body is None and response.content:
            raise CliError(
                f"{self.address} answered {method} {path} with something that is not JSON: is this "
                "the REST API of a chandy job (rest.port)?"
            )
        return body if body is not None else {}

    # ------------------------------------------------------------------ operations

    def jobs_overview(self) -> list[dict[str, Any]]:
        jobs = self.request("GET", "/jobs/overview").get("jobs", [])
        return list(jobs)

    def trigger_savepoint(self, job_id: str, directory: str | None, format_type: str) -> str:
        body = {"target-directory": directory, "cancel-job": False, "formatType": format_type}
        answer = self.request("POST", f"/jobs/{job_id}/savepoints", json=body, job_id=job_id)
        return str(answer["request-id"])

    def stop_with_savepoint(self, job_id: str, directory: str | None, drain: bool, format_type: str) -> str:
        body = {"targetDirectory": directory, "drain": drain, "formatType": format_type}
        answer = self.request("POST", f"/jobs/{job_id}/stop", json=body, job_id=job_id)
        return str(answer["request-id"])

    def cancel(self, job_id: str) -> None:
        self.request("PATCH", f"/jobs/{job_id}", params={"mode": "cancel"}, job_id=job_id)

    def await_savepoint(self, job_id: str, trigger_id: str, timeout: float) -> SavepointOutcome:
        """Poll ``GET /jobs/:jobid/savepoints/:triggerid`` until the operation completed."""
        deadline = time.monotonic() + timeout
        pause = 0.05
        while True:
            answer = self.request("GET", f"/jobs/{job_id}/savepoints/{trigger_id}", job_id=job_id)
            if answer.get("status", {}).get("id") == "COMPLETED":
                operation = answer.get("operation") or {}
                if "location" in operation and operation["location"] is not None:
                    return SavepointOutcome(str(operation["location"]), None)
                return SavepointOutcome(None, failure_reason(operation.get("failure-cause")))
            if time.monotonic() >= deadline:
                raise CliError(
                    f"the savepoint of job {job_id} did not complete within {timeout:g} s (it may still "
                    f"complete: GET /jobs/{job_id}/savepoints/{trigger_id} at {self.address} tells); "
                    "pass a longer --timeout"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.5)


def failure_reason(cause: Any) -> str:
    """The reason in Flink's ``failure-cause`` (a serialized throwable): its message (chandy sends
    it), else the outermost exception's line of the stack trace (the first of a Java trace, the
    last of a Python traceback)."""
    if not isinstance(cause, dict):
        return "the server gave no reason"
    message = str(cause.get("message") or "").strip()
    if message:
        return " ".join(message.split())
    trace = str(cause.get("stack-trace") or "").strip()
    lines = [line for line in trace.splitlines() if line.strip() and not line.startswith(("\t", " "))]
    if trace.startswith("Traceback"):
        lines = [
            line for line in lines if not line.startswith(("Traceback ", "During handling", "The above"))
        ]
        return lines[-1] if lines else trace
    if lines:
        return lines[0]
    return str(cause.get("class") or "the server gave no reason")


def _server_errors(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("errors"), list) and body["errors"]:
        return "; ".join(str(e).strip().splitlines()[0] for e in body["errors"] if str(e).strip())
    return "the server gave no reason"


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    if "refused" in text.lower():
        return "connection refused"
    return text or type(exc).__name__
