"""moto's server, answering one request at a time.

moto's own `moto_server` serves requests on many threads, and its DynamoDB backend evaluates a
condition and writes the item without a lock: two conditional PutItems of one key can then both
succeed, which DynamoDB never allows. idem's tests rely on that atomicity, so this launcher wraps
moto's WSGI app in one lock: a request is handled whole before the next one starts (connections
are still accepted and read on many threads). SQS requests are left out of the lock (see
`Serialized`).

    python moto-serial.py HOST PORT
"""

import signal
import sys
import threading

from werkzeug import serving

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)


class Serialized:
    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        # SQS is left out: a long poll (ReceiveMessage with WaitTimeSeconds) waits inside its
        # request, and under the lock it would hold every other request for as long; moto's
        # SQS guards its queues itself, and what a race there can do (deliver a message twice)
        # SQS does too.
        if environ.get("HTTP_X_AMZ_TARGET", "").startswith("AmazonSQS."):
            return list(self.app(environ, start_response))
        with self.lock:
            # Produce the whole body under the lock: moto builds it eagerly anyway.
            return list(self.app(environ, start_response))


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = DomainDispatcherApplication(create_backend_app)
    # moto answers `Connection: close`, so every request is a new connection: a storm of
    # clients overflows werkzeug's listen backlog of 128 (dropped SYNs, retried a second later).
    serving.BaseWSGIServer.request_queue_size = 4096
    serving.run_simple(host, port, Serialized(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
