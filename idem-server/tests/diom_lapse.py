"""Diom's published Python client (PyPI `diom` 0.2.6, unchanged) past the lease.

Run by tests/lapse.rs, which starts the server, makes IDEM_UNCERTAIN_KEY uncertain (a fenced
start with `on_lapse: uncertain` whose lock ran out) and IDEM_TOMBSTONE_KEY a tombstone (a
fenced complete with `key_retention_ms` whose ttl ended), both as IDEM_ALICE, and passes the
server's URL. Every check is an assert: the script exits non-zero at the first that fails.
"""

import asyncio
import os
from datetime import timedelta

from diom import Diom, DiomAsync, DiomOptions, OperationError
from diom.models import IdempotencyAbortIn, IdempotencyCompleteIn, IdempotencyStartIn

URL = os.environ["IDEM_SERVER_URL"]
ALICE = os.environ["IDEM_ALICE"]
UNCERTAIN, TOMBSTONE = os.environ["IDEM_UNCERTAIN_KEY"], os.environ["IDEM_TOMBSTONE_KEY"]
LOCK = IdempotencyStartIn(lock_period=timedelta(seconds=30))

checks = 0


def check(name):
    global checks
    checks += 1
    print(f"ok {checks} {name}", flush=True)


idem = Diom(ALICE, DiomOptions(server_url=URL)).idempotency

# Neither key runs again: Diom's client is told `locked`, the status it knows for "not now".
for key in (UNCERTAIN, TOMBSTONE):
    for _ in range(2):
        out = idem.start(key, LOCK)
        assert out.status == "locked", (key, out)
check("an uncertain key and a tombstone are locked")

# Its token-less complete and abort cannot end an uncertain key: a typed operation error.
for call in (
    lambda: idem.complete(UNCERTAIN, IdempotencyCompleteIn(response=b"x", ttl=timedelta(minutes=1))),
    lambda: idem.abort(UNCERTAIN, IdempotencyAbortIn()),
):
    try:
        call()
    except OperationError as e:
        assert e.code == "uncertain", (e.code, e.detail)
    else:
        raise AssertionError("a token-less complete or abort ended an uncertain key")
# A tombstone keeps its place as a completed key does: complete is accepted and changes nothing.
idem.complete(TOMBSTONE, IdempotencyCompleteIn(response=b"again", ttl=timedelta(minutes=1)))
assert idem.start(TOMBSTONE, LOCK).status == "locked"
check("complete and abort past the lease")


async def with_async_client():
    diom = DiomAsync(ALICE, DiomOptions(server_url=URL))
    for key in (UNCERTAIN, TOMBSTONE):
        assert (await diom.idempotency.start(key, LOCK)).status == "locked"


asyncio.run(with_async_client())
check("async client")
print(f"all {checks} checks passed")
