"""Diom's published Python client (PyPI `diom` 0.2.6, unchanged) against idem-server.

Run by tests/diom_python_client.rs, which starts the server and passes its URL and tokens in
IDEM_SERVER_URL, IDEM_ADMIN, IDEM_ALICE and IDEM_BOB. Every check is an assert: the script
exits non-zero at the first that fails.
"""

import asyncio
import os
import time
from datetime import timedelta

import httpx
import msgpack
from diom import Diom, DiomAsync, DiomOptions, InvalidInputError, OperationError
from diom.internal.errors import ErrorBody
from diom.models import (
    IdempotencyAbortIn,
    IdempotencyCompleteIn,
    IdempotencyConfigureNamespaceIn,
    IdempotencyGetNamespaceIn,
    IdempotencyStartIn,
    IdempotencyStartOut,
)

URL = os.environ["IDEM_SERVER_URL"]
ADMIN, ALICE, BOB = (os.environ[v] for v in ("IDEM_ADMIN", "IDEM_ALICE", "IDEM_BOB"))


def client(token):
    return Diom(token, DiomOptions(server_url=URL))


def lock(ms, namespace=None):
    return IdempotencyStartIn(namespace=namespace, lock_period=timedelta(milliseconds=ms))


def done(response, ttl_ms=3_600_000, context=None):
    return IdempotencyCompleteIn(response=response, context=context, ttl=timedelta(milliseconds=ttl_ms))


def started_within(idem, key, seconds=5.0):
    """Polls start until it answers started, for a bounded time."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if idem.start(key, lock(10_000)).status == "started":
            return True
        time.sleep(0.02)
    return False


def raises(kind, code, call):
    try:
        call()
    except kind as e:
        assert e.code == code, (e.code, code, e.detail)
        return e
    raise AssertionError(f"expected {kind.__name__} {code}")


def raw(path, body, token=ALICE, encoding="msgpack"):
    """A request the client cannot send (the fenced extension, JSON), with httpx."""
    if encoding == "msgpack":
        content, mime = msgpack.packb(body), "application/msgpack"
    else:
        content, mime = None, "application/json"
    r = httpx.post(
        URL + path,
        content=content,
        json=body if encoding == "json" else None,
        headers={"authorization": f"Bearer {token}", "content-type": mime, "accept": mime},
    )
    decoded = msgpack.unpackb(r.content) if encoding == "msgpack" else r.json()
    return r.status_code, r.headers["content-type"], decoded


checks = 0


def check(name):
    global checks
    checks += 1
    print(f"ok {checks} {name}", flush=True)


alice, bob, admin = client(ALICE), client(BOB), client(ADMIN)
idem = alice.idempotency

assert alice.health.ping().ok
check("ping")

# start, locked, complete, replay with context
assert idem.start("order-1001", lock(15_000)).status == "started"
assert idem.start("order-1001", lock(15_000)).status == "locked"
idem.complete("order-1001", done(b"\x00charged\xff", context={"status_code": "201"}))
replay = idem.start("order-1001", lock(15_000))
assert replay.status == "completed", replay
assert replay.data.response == b"\x00charged\xff"
assert replay.data.context == {"status_code": "201"}
check("start, locked, complete, replay with context")

# abort frees the key; a completed response survives an abort
assert idem.start("refund-7", lock(15_000)).status == "started"
idem.abort("refund-7", IdempotencyAbortIn())
assert idem.start("refund-7", lock(15_000)).status == "started"
idem.complete("refund-7", done(b"ok"))
idem.abort("refund-7")
assert idem.start("refund-7", lock(15_000)).status == "completed"
check("abort")

# a lock and a response expire
assert idem.start("crashed", lock(150)).status == "started"
assert idem.start("crashed", lock(150)).status == "locked"
assert started_within(idem, "crashed"), "the lock never expired"
assert idem.start("short", lock(15_000)).status == "started"
idem.complete("short", done(b"r", ttl_ms=150))
assert idem.start("short", lock(15_000)).status == "completed"
assert started_within(idem, "short"), "the response never expired"
check("expiry")

# namespaces
raises(OperationError, "not_found", lambda: idem.start("k", lock(15_000, "orders")))
made = admin.idempotency.namespace.configure(IdempotencyConfigureNamespaceIn(name="orders"))
assert made.name == "orders"
got = admin.idempotency.namespace.get(IdempotencyGetNamespaceIn(name="orders"))
assert (got.name, got.created) == ("orders", made.created)
raises(OperationError, "not_found", lambda: admin.idempotency.namespace.get(IdempotencyGetNamespaceIn(name="nope")))
raises(OperationError, "forbidden", lambda: idem.namespace.configure(IdempotencyConfigureNamespaceIn(name="x")))
assert idem.start("k", lock(15_000, "orders")).status == "started"
assert idem.start("k", lock(15_000)).status == "started"
check("namespaces")

# callers never meet each other's keys
assert idem.start("shared", lock(15_000)).status == "started"
assert bob.idempotency.start("shared", lock(15_000)).status == "started"
bob.idempotency.complete("shared", done(b"bob's"))
bob.idempotency.abort("shared")
assert idem.start("shared", lock(15_000)).status == "locked"
check("key spaces")

# errors
e = raises(InvalidInputError, "invalid_data", lambda: idem.start("foo bar", lock(1_000)))
assert e.location == "key", e.location
e = raises(InvalidInputError, "invalid_data", lambda: idem.start("zero", lock(0)))
assert e.location == "lock_period_ms", e.location
e = raises(InvalidInputError, "invalid_data", lambda: idem.complete("zero", done(b"", ttl_ms=0)))
assert e.location == "ttl_ms", e.location
raises(OperationError, "invalid_token", lambda: client("not-a-known-token-at-all").idempotency.start("zero", lock(1_000)))
assert idem.start("zero", lock(1_000)).status == "started", "a refused request claimed the key"
check("errors")

# JSON, which the client does not speak: the same shapes
status, mime, body = raw("/api/v1.idempotency.start", {"key": "json-1", "lock_period_ms": 15000}, encoding="json")
assert (status, mime, body) == (200, "application/json", {"status": "started"}), (status, mime, body)
assert IdempotencyStartOut.model_validate(body).status == "started"
status, _, body = raw(
    "/api/v1.idempotency.complete",
    {"key": "json-1", "response": [104, 105], "context": {"a": "b"}, "ttl_ms": 60000},
    encoding="json",
)
assert (status, body) == (200, {}), body
status, _, body = raw("/api/v1.idempotency.start", {"key": "json-1", "lock_period_ms": 15000}, encoding="json")
assert body == {"status": "completed", "data": {"response": [104, 105], "context": {"a": "b"}}}, body
assert idem.start("json-1", lock(15_000)).data.response == b"hi"
status, _, body = raw("/api/v1.idempotency.start", {"key": "bad key", "lock_period_ms": 1}, encoding="json")
assert status == 422 and ErrorBody.model_validate(body).type == "invalid-input", body
check("JSON")

# the fenced extension's answers parse with the client's models
status, _, body = raw("/api/v1.idempotency.start", {"key": "fenced", "lock_period_ms": 15000, "fenced": True, "fingerprint": "a"})
token = body["token"]
assert status == 200 and len(token) == 32
assert IdempotencyStartOut.model_validate(body).status == "started"
status, _, body = raw("/api/v1.idempotency.start", {"key": "fenced", "lock_period_ms": 15000, "fenced": True})
assert body["retry_after_ms"] >= 1 and IdempotencyStartOut.model_validate(body).status == "locked"
status, _, body = raw("/api/v1.idempotency.start", {"key": "fenced", "lock_period_ms": 15000, "fingerprint": "b"})
assert status == 422 and ErrorBody.model_validate(body).code == "fingerprint_mismatch", body
status, _, body = raw("/api/v1.idempotency.renew", {"key": "fenced", "token": token, "lock_period_ms": 30000})
assert (status, body) == (200, {}), body
status, _, body = raw("/api/v1.idempotency.complete", {"key": "fenced", "token": "0" * 32, "response": b"x", "ttl_ms": 60000})
assert status == 409 and ErrorBody.model_validate(body).code == "stale_holder", body
status, _, body = raw("/api/v1.idempotency.complete", {"key": "fenced", "token": token, "response": b"x", "ttl_ms": 60000})
assert (status, body) == (200, {}), body
assert idem.start("fenced", lock(15_000)).data.response == b"x"
check("fenced answers")


async def with_async_client():
    diom = DiomAsync(ALICE, DiomOptions(server_url=URL))
    out = await diom.idempotency.start("async-1", lock(15_000))
    assert out.status == "started"
    await diom.idempotency.complete("async-1", done(b"a"))
    assert (await diom.idempotency.start("async-1", lock(15_000))).data.response == b"a"


asyncio.run(with_async_client())
check("async client")
print(f"all {checks} checks passed")
