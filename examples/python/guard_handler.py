"""Guard a handler with idem-server: the work runs once per key, and a retry gets its answer.

Two ways: plain httpx (the fenced extension: the claim's token fences complete and abort), and
Diom's Python client (`pip install diom==0.2.6`, which brings httpx). Set IDEM_SERVER_URL and
IDEM_TOKEN (a token the server was started with).
"""

import os
from datetime import timedelta

import httpx
from diom import Diom, DiomOptions
from diom.models import IdempotencyCompleteIn, IdempotencyStartIn

SERVER = os.environ.get("IDEM_SERVER_URL", "http://127.0.0.1:8624")
TOKEN = os.environ["IDEM_TOKEN"]


class Busy(Exception):
    """Another request holds the key: answer 409 and let the client retry."""


def guarded(key: str, work) -> bytes:
    """Runs `work()` (which returns the response's bytes) once per `key`, with httpx."""
    headers = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    with httpx.Client(base_url=SERVER, headers=headers) as http:
        started = http.post(
            "/api/v1.idempotency.start",
            json={"key": key, "lock_period_ms": 30_000, "fenced": True},
        )
        started.raise_for_status()
        answer = started.json()
        if answer["status"] == "completed":
            return bytes(answer["data"]["response"])  # a retry: the first answer
        if answer["status"] == "locked":
            raise Busy(key)
        token = answer["token"]  # fences complete and abort to this claim
        try:
            response = work()
        except Exception:
            http.post("/api/v1.idempotency.abort", json={"key": key, "token": token})
            raise  # the key is free again: a retry runs the work
        http.post(
            "/api/v1.idempotency.complete",
            json={"key": key, "token": token, "response": list(response), "ttl_ms": 86_400_000},
        ).raise_for_status()
        return response


def guarded_with_diom(key: str, work) -> bytes:
    """The same with Diom's client, which sends no token: complete and abort are not fenced."""
    idem = Diom(TOKEN, DiomOptions(server_url=SERVER)).idempotency
    answer = idem.start(key, IdempotencyStartIn(lock_period=timedelta(seconds=30)))
    if answer.status == "completed":
        return answer.data.response
    if answer.status == "locked":
        raise Busy(key)
    try:
        response = work()
    except Exception:
        idem.abort(key)
        raise
    # diom 0.2.6 drops a timedelta's whole days: timedelta(days=1) goes out as 0 ms (refused)
    # and timedelta(hours=25) as one hour. Keep it under a day, or complete with httpx.
    idem.complete(key, IdempotencyCompleteIn(response=response, ttl=timedelta(hours=23)))
    return response


if __name__ == "__main__":
    charged = []

    def charge() -> bytes:
        charged.append(42)
        return b'{"receipt": %d}' % len(charged)

    for guard in (guarded, guarded_with_diom):
        key = f"order-1001-{guard.__name__}"
        first, retry = guard(key, charge), guard(key, charge)
        assert first == retry, (first, retry)
        print(f"{guard.__name__}: {first.decode()} (a retry got the same answer)")
    assert len(charged) == 2, charged  # once per key
    print("the card was charged once per order")
