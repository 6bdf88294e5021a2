# Diom's published Python client (PyPI `diom`, pinned, which brings httpx) for idem-server's
# wire-contract test and docs/server.md's Python example (tests/python_example.rs).
# Source it after scripts/pg-cluster.sh (it uses its `say` and `venv_install`); it
# defines one function and runs nothing:
#
#   diom_install   makes a Python venv with diom==$DIOM_VERSION in the cache dir
#                  (${XDG_CACHE_HOME:-$HOME/.cache}/idem/diom-$DIOM_VERSION) when missing, from
#                  PyPI, and exports IDEM_DIOM_PYTHON (its python) and IDEM_REQUIRE_DIOM=1, so
#                  idem-server's tests/diom_python_client.rs and python_example.rs fail instead
#                  of skipping without it

DIOM_VERSION=0.2.6

diom_install() {
    local cache="${XDG_CACHE_HOME:-$HOME/.cache}/idem/diom-$DIOM_VERSION"
    venv_install "$cache" "diom==$DIOM_VERSION" "diom, httpx, msgpack"
    say "diom $DIOM_VERSION (Python client): $cache"
    export IDEM_DIOM_PYTHON="$cache/bin/python"
    export IDEM_REQUIRE_DIOM=1
}
