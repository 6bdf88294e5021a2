"""moto's server, answering one request at a time.

moto's own `moto_server` serves requests on many threads, and its DynamoDB backend evaluates a
condition and writes the item without a lock: two conditional PutItems of one key can then both
succeed, which DynamoDB never allows. idem's tests rely on that atomicity, so this launcher wraps
moto's WSGI app in one lock: a request is handled whole before the next one starts (connections
are still accepted and read on many threads). SQS requests are left out of the lock (see
`Serialized`), and a TransactWriteItems whose conditions all hold runs without moto's copies of
its tables (see `transactions_without_table_copies`).

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


def transactions_without_table_copies():
    """moto's TransactWriteItems deep-copies every table it touches before writing, to roll back
    if one of its writes is refused: each transaction costs time in proportion to the tables'
    sizes, and a run that fills a table with 10,000 records (steps and their records are
    written by transactions) slows to a crawl. A write is refused by its condition (writes of
    one transaction are on distinct items, so each condition can be judged before any write),
    so: when every condition holds now, the transaction runs without the copies (nothing will be
    rolled back); otherwise it runs as moto wrote it, copies and all. Requests are serialized
    (`Serialized`), so nothing changes between the check and the writes."""
    import copy

    import moto.dynamodb.models as models

    original = models.DynamoDBBackend.transact_write_items

    class TablesUncopied:
        @staticmethod
        def deepcopy(value, memo=None):
            return value if isinstance(value, models.Table) else copy.deepcopy(value, memo)

    def conditions_hold(backend, transact_items):
        for item in transact_items:
            op_type, op = next(iter(item.items()))
            condition = op.get("ConditionExpression")
            if condition is None:
                continue
            table = backend.get_table(op["TableName"])
            if op_type == "Put":
                attrs = op["Item"]
                key = {table.hash_key_attr: attrs[table.hash_key_attr]}
                if table.range_key_attr is not None:
                    key[table.range_key_attr] = attrs[table.range_key_attr]
            else:
                key = op["Key"]
            current = backend.get_item(op["TableName"], key)
            check = models.get_filter_expression(
                condition, op.get("ExpressionAttributeNames"), op.get("ExpressionAttributeValues")
            )
            if not check.expr(current):
                return False
        return True

    def transact_write_items(self, transact_items):
        try:
            fast = len(transact_items) <= 100 and conditions_hold(self, transact_items)
        except Exception:
            fast = False
        if not fast:
            return original(self, transact_items)
        models.copy = TablesUncopied
        try:
            return original(self, transact_items)
        finally:
            models.copy = copy

    models.DynamoDBBackend.transact_write_items = transact_write_items


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    transactions_without_table_copies()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = DomainDispatcherApplication(create_backend_app)
    # moto answers `Connection: close`, so every request is a new connection: a storm of
    # clients overflows werkzeug's listen backlog of 128 (dropped SYNs, retried a second later).
    serving.BaseWSGIServer.request_queue_size = 4096
    serving.run_simple(host, port, Serialized(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
